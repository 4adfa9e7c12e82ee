"""Hostile archives (issue 26): a sparse-file bomb, block sizes beyond the manifest, and a killed export.
The command line's hostile input: test_hostile.py."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from memctl.build.ingest import ingest
from memctl.core.errors import InputError, IntegrityError
from memctl.ops.leftovers import export_leftovers
from memctl.ops.transfer import export_bank, import_bank
from memctl.registry import Registry


def test_a_sparse_archive_is_refused_before_writing(home: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "manifest.json").write_text(json.dumps({"format": "memctl-bank", "version": 1}))
    with (src / "registry.db").open("wb") as f:
        f.truncate(512 * 2**20)  # a hole: no disk, and a few bytes once archived sparse
    archive = tmp_path / "bomb.memctl"
    subprocess.run(
        ["tar", "--sparse", "--format=gnu", "-cf", str(archive), "-C", str(src), "manifest.json", "registry.db"],
        check=True,
    )
    assert archive.stat().st_size < 64 * 1024
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="sparse file"):
        import_bank(archive, name="x", home=home)
    assert time.perf_counter() - t0 < 5
    assert not (home / "banks").exists() or not any((home / "banks").iterdir())


def _export_fixture(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    from memctl.train.run import train

    ingest("b", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), home=home)
    train("b", {"epochs": 1, "batch_size": 4, "objective": "lm", "preserve": 0}, home=home)


def test_block_sizes_beyond_the_manifest_are_refused(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path
) -> None:
    _export_fixture(home, corpus, tiny_anchor)
    good = tmp_path / "b.memctl"
    export_bank("b", good, home=home)
    bad = tmp_path / "bad.memctl"
    padded = False
    with tarfile.open(good) as src, tarfile.open(bad, "w", format=tarfile.PAX_FORMAT) as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()  # type: ignore[union-attr]
            if m.name.startswith("blocks/") and not padded:
                data += b"\0" * (1 << 20)  # one block claims a MiB more than the manifest says
                padded = True
            m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    with pytest.raises(IntegrityError, match="bytes but the manifest says"):
        import_bank(bad, name="c", home=home)
    assert not Registry.exists("c", home)


def test_a_killed_export_leaves_no_archive_part_and_its_snapshot_is_swept(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path
) -> None:
    _export_fixture(home, corpus, tiny_anchor)
    out = tmp_path / "out"
    out.mkdir()
    child = f"""
import sys, time
from pathlib import Path
import memctl.ops.transfer as t
real = t._add
def slow(tar, arc, src, size):
    real(tar, arc, src, size)
    if arc.startswith("blocks/"):
        print("ready", flush=True)
        time.sleep(60)
t._add = slow
t.export_bank("b", Path({str(out / "b.memctl")!r}), home=Path({str(home)!r}))
"""
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    bank_dir = home / "banks" / "b"
    assert list(out.iterdir()) == []  # the half-written archive had no name: nothing of it is left
    left = export_leftovers(bank_dir)
    assert [p.name for p in left] == [f".export{proc.pid}"]  # the snapshot (full text) is; a sweep finds it
    stale_part = out / f".b.memctl.part{proc.pid}"  # as an export without unnamed files leaves
    stale_part.write_bytes(b"private")
    export_bank("b", out / "b.memctl", home=home)
    assert not list(bank_dir.glob(".export*")) and not stale_part.exists()
    assert [p.name for p in out.iterdir()] == ["b.memctl"]
