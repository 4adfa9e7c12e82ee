"""Reliability: `memctl doctor` finds and repairs what killed commands and damage leave behind; one
writer at a time per bank (a second waits or fails with --no-wait); concurrent forgets lose no
update; two retrains at once do the work once; a sweep never takes another writer's files; readers
never see a torn block while training replaces them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from test_security import invoke, one_error_line

from memctl.build.ingest import ingest
from memctl.core.errors import InputError
from memctl.ops.doctor import doctor
from memctl.privacy.forget import forget, plan_forget
from memctl.registry import Registry
from memctl.registry.lock import BankBusy, bank_lock, policy
from memctl.serve.store import BlockStore
from memctl.train.run import train

FAST = {"epochs": 1, "batch_size": 4, "objective": "lm", "preserve": 0.0}
D1, D2 = "metals/0.txt", "metals/1.txt"  # same topic: they share blocks (the generic memory at least)


@pytest.fixture(autouse=True)
def _own_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor reports dead temp directories under TMPDIR: these tests look only at their own."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))


def _bank(corpus: Path, anchor: Path, home: Path, name: str = "b", trained: bool = True) -> Registry:
    ingest(name, [corpus], anchor=str(anchor), embedder="hash", tree=(2, 2), home=home)
    if trained:
        train(name, FAST, home=home)
    return Registry.open(name, home)


def _tensors(reg: Registry) -> dict[str, dict[str, torch.Tensor]]:
    """Copies: a block's tensors map its file, which the tests damage in place."""
    return {r["id"]: {k: v.clone() for k, v in reg.read_block(r).items()} for r in reg.blocks("file is not null")}


def _same(a: dict[str, dict[str, torch.Tensor]], b: dict[str, dict[str, torch.Tensor]]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k][p], b[k][p]) for k in a for p in a[k])


# ---- doctor -----------------------------------------------------------------------------------------
def test_doctor_finds_repairs_and_training_restores(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg = _bank(corpus, tiny_anchor, home)
    before = _tensors(reg)
    res = invoke("doctor", "--bank", "b")
    assert res.exit_code == 0 and "healthy" in res.output, res.output
    rows = reg.blocks("file is not null")
    (reg.path / rows[0]["file"]).unlink()  # a missing block file
    (reg.path / rows[1]["file"]).write_bytes(b"\0" * 64)  # a corrupt one
    (reg.blocks_dir / "L1-000009.0123456789abcdef.safetensors").write_bytes(b"orphan")
    (reg.blocks_dir / ".L1-000000.x.safetensors.tmp999999").write_bytes(b"tmp of a dead pid")
    (home / "banks" / ".b.staging999998").mkdir()  # a killed ingest's staging directory
    (home / "banks" / ".b.staging999998" / "registry.db").write_bytes(b"")
    (reg.path / ".export999997").mkdir()
    reg.db["runs"].insert({"started": "2020", "status": "running", "unit": "0"})
    reg.close()
    old, dead, live = (
        Path(tempfile.gettempdir()) / n for n in ("memctl-ingest-x1", "memctl-ingest-999996-y", "memctl-ingest-z")
    )
    for d in (old, dead, live):
        d.mkdir()
        (d / "embeddings.f32").write_bytes(b"\0" * 16)
    os.utime(old, (time.time() - 600, time.time() - 600))  # unused for 10 minutes: a killed ingest's

    listed = invoke("list")
    assert listed.stdout.split() == ["b"], listed.output  # no staging directory shown as a bank
    info = invoke("info", "--bank", "b")
    assert info.exit_code == 0 and "damaged" in info.output and "memctl doctor --bank b" in info.output
    assert "training  trained" not in info.output

    res = invoke("doctor", "--bank", "b")
    assert res.exit_code == 1, res.output
    for what in ("missing", "checksum", "no block points to", "tmp999999", "staging999998", "export999997", "running"):
        assert what in res.output, (what, res.output)
    assert "ingest-x1" in res.output and "999996" in res.output and "ingest-z" not in res.output  # z: just made
    res = invoke("train", "--bank", "b")  # nothing to train by the rows, but it says what is missing
    assert res.exit_code == 0 and "memctl doctor --bank b --repair" in res.stderr, res.output
    res = invoke("doctor", "--bank", "b", "--repair", "--json")
    assert res.exit_code == 0, res.output
    assert not (home / "banks" / ".b.staging999998").exists() and not (home / "banks" / "b" / ".export999997").exists()
    assert not old.exists() and not dead.exists() and live.exists()
    res = invoke("doctor", "--bank", "b")
    assert res.exit_code == 0 and "memctl train --bank b" in res.output, res.output
    assert invoke("train", "--bank", "b", "--epochs", "1", "--batch-size", "4").exit_code == 0
    assert _same(_tensors(Registry.open("b", home)), before)  # the re-queued units retrained alike
    assert doctor("b", home).healthy


def test_forgotten_influence_is_found_and_withdrawn(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    """A block still shaped by a document the bank no longer holds (the lost forget of the issue)."""
    reg = _bank(corpus, tiny_anchor, home)
    with reg.db.atomic():  # what a lost update left: the document gone, its blocks not retrained
        reg.db.execute("pragma defer_foreign_keys = on")
        for table, col in (("prompts", "doc_id"), ("windows", "doc_id"), ("documents", "id")):
            reg.db.execute(f"delete from {table} where {col} = ?", [D1])
    report = doctor("b", home)
    assert not report.healthy and any(f.check == "provenance" for f in report.findings)
    assert doctor("b", home, repair=True).healthy
    assert not reg.db.execute("select count(*) from block_docs where doc_id = ?", [D1]).fetchone()[0]
    assert reg.db.execute("select count(*) from blocks where state = 'damaged'").fetchone()[0]


@pytest.mark.parametrize("damage", ["empty", "garbage", "no bank row"])
def test_a_broken_registry_is_a_one_line_error(home: Path, corpus: Path, tiny_anchor: Path, damage: str) -> None:
    reg = _bank(corpus, tiny_anchor, home, trained=False)
    db = reg.path / "registry.db"
    if damage == "no bank row":
        reg.db.execute("delete from banks")
        reg.close()
    else:
        reg.close()
        for p in (db.with_name("registry.db-wal"), db.with_name("registry.db-shm")):
            p.unlink(missing_ok=True)
        db.write_bytes(b"" if damage == "empty" else b"this is not a database at all" * 200)
    for cmd in (["info"], ["ask", "What is iron?"], ["train"]):
        line = one_error_line(invoke(*cmd, "--bank", "b"))
        assert "memctl doctor --bank b" in line, line
    res = invoke("doctor", "--bank", "b", "--repair")
    assert res.exit_code == 1 and "fix: mv" in res.output, res.output


def test_doctor_of_a_bank_that_is_not_there(home: Path) -> None:
    line = one_error_line(invoke("doctor", "--bank", "nope"))
    assert "no bank named 'nope'" in line


def test_doctor_names_a_lost_table_or_column(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    """A registry missing a table (or a column) of its schema version: every command fails on it, so doctor
    says what is gone and how to rebuild, instead of the error that sends the user back to doctor."""
    import sqlite3

    _bank(corpus, tiny_anchor, home, trained=False).close()
    assert not [f for f in doctor("b", home).findings if f.problem]
    db = home / "banks" / "b" / "registry.db"
    conn = sqlite3.connect(db)
    conn.execute("alter table prompts drop column answer")
    conn.execute("drop table documents")
    conn.commit()
    conn.close()
    found = [f for f in doctor("b", home).findings if f.problem]
    assert len(found) == 1 and found[0].check == "schema", found
    assert "has lost table documents, column prompts.answer of its schema" in found[0].message
    assert "memctl import ARCHIVE --bank b" in (found[0].fix or "")
    res = invoke("doctor", "--bank", "b")
    assert res.exit_code != 0 and "table documents" in res.output and "Traceback" not in res.output
    conn = sqlite3.connect(db)
    conn.execute("drop table banks")
    conn.commit()
    conn.close()
    (found,) = [f for f in doctor("b", home).findings if f.problem]
    assert "has lost table banks, table documents, column prompts.answer" in found.message


# ---- the writer lock ----------------------------------------------------------------------------------
def _hold(name: str, home: Path, release: threading.Event, seconds: float = 60.0) -> threading.Thread:
    """Another writer: holds the bank's lock until `release` is set (or `seconds` pass)."""
    started = threading.Event()

    def hold() -> None:
        with bank_lock(name, home, what="memctl test-holder"):
            started.set()
            release.wait(seconds)

    t = threading.Thread(target=hold)
    t.start()
    assert started.wait(10)
    return t


def test_a_second_writer_waits_or_fails_at_once(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memctl.cli.common as common

    _bank(corpus, tiny_anchor, home, trained=False).close()
    release = threading.Event()
    t = _hold("b", home, release, seconds=30)
    line = one_error_line(invoke("block", "--bank", "b", "--node", "1:0", "--no-wait"))
    assert "memctl test-holder" in line and "being written" in line
    assert invoke("block", "--bank", "b", "--node", "1:0", "--no-wait").exit_code == 75
    said = common._waiting
    monkeypatch.setattr(common, "_waiting", lambda msg: (said(msg), release.set()))  # the holder ends once told
    res = invoke("block", "--bank", "b", "--node", "1:0")
    assert res.exit_code == 0 and "waiting" in res.stderr and "test-holder" in res.stderr, res.output
    t.join()
    assert Registry.open("b", home).block(1, 0)["blocked"] == 1
    res = invoke("doctor", "--bank", "b", "--no-wait")
    assert res.exit_code == 0, res.output


def test_readers_never_take_the_lock(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    _bank(corpus, tiny_anchor, home).close()
    release = threading.Event()
    t = _hold("b", home, release)
    try:  # the writer holds the lock until the readers are done: a reader that waited would never finish
        res = invoke("ask", "What is iron?", "--bank", "b", "--max-new-tokens", "2")
        assert res.exit_code == 0, res.output
        report = doctor("b", home)  # doctor without --repair reads, and says a writer is busy
        assert report.busy and "test-holder" in report.busy
        assert t.is_alive()
    finally:
        release.set()
        t.join()


def test_concurrent_forgets_lose_no_update(home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path) -> None:
    """Two forgets planned before either commits, run at once: the end state is that of forgetting one
    after the other (the issue: one document's provenance and influence survived)."""
    other = tmp_path / "other"
    ref = _bank(corpus, tiny_anchor, other, "a")
    reg = _bank(corpus, tiny_anchor, home, "a")
    shared = {r[0] for r in reg.db.execute("select block_id from block_docs where doc_id = ?", [D1])}
    assert shared & {r[0] for r in reg.db.execute("select block_id from block_docs where doc_id = ?", [D2])}
    plans = [plan_forget("a", docs=[d], home=home) for d in (D1, D2)]
    errors: list[BaseException] = []

    def run(plan) -> None:  # noqa: ANN001
        try:
            forget(plan, home=home)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for d in (D1, D2):
        forget(plan_forget("a", docs=[d], home=other), home=other)
    left = reg.db.execute("select count(*) from block_docs where doc_id in (?, ?)", [D1, D2]).fetchone()[0]
    assert left == 0
    assert _same(_tensors(reg), _tensors(ref))
    assert doctor("a", home).healthy


def test_two_retrains_at_once_train_once(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    _bank(corpus, tiny_anchor, home).close()
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(train("b", FAST, retrain=True, home=home))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2
    trained = sorted(len(r.units) for r in results)
    assert trained[0] == 0 and trained[1] == 3, trained  # the second found every unit freshly retrained
    assert sorted(next(r for r in results if not r.units).skipped) == ["0", "1", "generic"]


def test_a_sweep_never_takes_another_writers_files(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg = _bank(corpus, tiny_anchor, home)
    row = reg.blocks("file is not null")[0]
    written, release = threading.Event(), threading.Event()
    new: list[tuple[str, str]] = []

    def writer() -> None:
        mine = Registry.open("b", home)
        with bank_lock("b", home):
            new.append(mine.write_block(row["level"], row["idx"], {k: v + 1 for k, v in mine.read_block(row).items()}))
            written.set()
            release.wait(10)
            with mine.db.atomic():
                mine.db["blocks"].update(row["id"], {"file": new[0][0], "sha256": new[0][1]})
            mine.sweep_orphans()
        mine.close()

    t = threading.Thread(target=writer)
    t.start()
    assert written.wait(10)
    with policy(wait=False), pytest.raises(BankBusy):
        reg.sweep_orphans()  # another writer is mid-way: no sweep
    assert (reg.path / new[0][0]).is_file()
    release.set()
    t.join()
    reg.sweep_orphans()
    assert reg.block(row["level"], row["idx"])["file"] == new[0][0] and (reg.path / new[0][0]).is_file()
    assert doctor("b", home).healthy


def test_readers_see_no_torn_block_while_training(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    """A reader loop checks every block it reads against the registry's checksum while another process
    retrains (and replaces) every block."""
    reg = _bank(corpus, tiny_anchor, home)
    env = {**os.environ, "MEMCTL_HOME": str(home)}
    cmd = [sys.executable, "-m", "memctl", "train", "--bank", "b", "--retrain", "--epochs", "2", "--batch-size", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    store = BlockStore(Registry.open("b", home), pin_levels=0, cache_bytes=0)
    reads, replaced, shas = 0, 0, set()
    try:
        while proc.poll() is None or reads == 0:
            for row in reg.blocks("file is not null"):
                try:
                    reg.read_block(row)  # verifies the file against the row's sha256
                except Exception:
                    again = reg.block(row["level"], row["idx"])
                    assert again is not None and again["sha256"] != row["sha256"], "a torn or damaged block"
                    replaced += 1
                    continue
                shas.add(row["sha256"])
                reads += 1
                assert store.get(row["level"], row["idx"]) is not None
            time.sleep(0.02)  # leave the CPU to the writer
    finally:
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert reads > 0
    after = {r["sha256"] for r in reg.blocks("file is not null")}
    assert after and doctor("b", home).healthy
    print(f"reader/writer: {reads} block reads, {replaced} replaced mid-read, {len(shas)} versions, no torn read")


def test_two_ingests_creating_one_bank_take_turns(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    results, errors = [], []

    def go() -> None:
        try:
            results.append(ingest("n", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home))
        except InputError as e:
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the second waited, then found the bank made: its creation options are refused in one line
    assert [r.created for r in results] == [True] and results[0].docs_added == 12
    assert len(errors) == 1 and "exists" in str(errors[0]) and "--tree" in str(errors[0])
    assert doctor("n", home).healthy


def test_train_closes_runs_a_killed_train_left_running(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg = _bank(corpus, tiny_anchor, home)
    dead = reg.db["runs"].insert({"started": "2020", "status": "running", "unit": "0"}).last_pk
    assert not train("b", FAST, home=home).units  # nothing to train, and the dead run is closed
    assert reg.db["runs"].get(dead)["status"] == "interrupted"


def test_doctor_on_checkpoints(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    from memctl.registry.checkpoints import checkpoint_path

    reg = _bank(corpus, tiny_anchor, home, trained=False)
    assert train("b", FAST, home=home, max_steps=1).interrupted
    report = doctor("b", home)  # an interrupted training is pending work, not damage
    assert report.healthy and any("memctl train --bank b` resumes" in f.message for f in report.findings)
    ckpt = checkpoint_path(reg.checkpoint_dir(), "0")
    ckpt.write_bytes(ckpt.read_bytes()[:100])  # truncated
    (reg.checkpoint_dir() / "unit-1.pt").write_bytes(b"a pickle of an older memctl")
    (reg.checkpoint_dir() / f".{ckpt.name}.tmp999995").write_bytes(b"half-written")
    report = doctor("b", home)
    assert not report.healthy and len([f for f in report.findings if f.problem]) == 3
    assert doctor("b", home, repair=True).healthy
    left = sorted(p.name for p in reg.checkpoint_dir().iterdir())
    assert left == ["unit-1.safetensors", "unit-generic.safetensors"]  # the sound ones stay, to resume
    assert [u.resumed_from for u in train("b", FAST, home=home).units] == [0, 1, 1]  # unit 0 from the start


# ---- export and import take the writer lock -----------------------------------------------------------
def test_export_and_import_take_the_writer_lock(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memctl.ops.transfer import export_bank, import_bank

    _bank(corpus, tiny_anchor, home, trained=False).close()
    archive = tmp_path / "b.memctl"
    release = threading.Event()
    t = _hold("b", home, release)
    try:
        with policy(wait=False), pytest.raises(BankBusy, match="test-holder"):
            export_bank("b", archive, home=home)
        assert invoke("export", "--bank", "b", str(archive), "--no-wait").exit_code == 75
        assert not archive.exists()
    finally:
        release.set()
        t.join()
    res = invoke("export", "--bank", "b", str(archive), "--no-wait")  # the CLI's lock, re-entered by export_bank
    assert res.exit_code == 0 and archive.is_file(), res.output

    other = tmp_path / "other"  # a second home, where the archive's own name is free
    release = threading.Event()
    t = _hold("b", other, release)
    try:
        with policy(wait=False), pytest.raises(BankBusy, match="test-holder"):
            import_bank(archive, home=other)  # no name given: locked under the archive's
        assert not (other / "banks" / "b").exists() and not list((other / "banks").glob(".b.import*"))
    finally:
        release.set()
        t.join()
    monkeypatch.setenv("MEMCTL_HOME", str(other))
    res = invoke("import", str(archive), "--no-wait")  # no --bank: the library's lock alone
    assert res.exit_code == 0, res.output
    res = invoke("import", str(archive), "--bank", "c", "--no-wait")  # --bank: the CLI's lock, re-entered
    assert res.exit_code == 0, res.output
    for name in ("b", "c"):
        assert Registry.open(name, other).count("documents") == 12 and doctor(name, other).healthy
    assert sorted(p.name for p in (other / "banks").iterdir()) == [".b.lock", ".c.lock", "b", "c"]
