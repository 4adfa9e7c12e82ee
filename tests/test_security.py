"""Reliability and security: no pickle anywhere, a registry that waits for other writers, private
files on disk, and bank names that cannot leave the banks directory."""

from __future__ import annotations

import ast
import math
import os
import pickle
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.core.config import BankConfig, MemoryConfig, TreeConfig
from memctl.ops.transfer import export_bank, import_bank
from memctl.registry import Registry
from memctl.registry.checkpoints import checkpoint_path
from memctl.train.checkpoint import TrainState, decode, encode
from memctl.train.distributed import decode_message, encode_message
from memctl.train.merge import train_out
from memctl.train.records import TrainedUnit, UnitResult
from memctl.train.run import train
from memctl.train.units import UnitParams, unit_of

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
FAST = {"epochs": 1, "batch_size": 4}


def invoke(*args: str):  # noqa: ANN201
    return runner.invoke(app, list(args))


def one_error_line(res) -> str:  # noqa: ANN001
    assert res.exit_code != 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    return lines[0]


def _bank(corpus: Path, anchor: Path, home: Path, name: str = "b") -> Registry:
    ingest(name, [corpus], anchor=str(anchor), embedder="hash", tree=(2, 2), home=home)
    return Registry.open(name, home)


class _Planted:
    """Unpickling this creates `marker`: what a planted checkpoint would do with a shell instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


def _plant(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(_Planted(marker)))
    pickle.loads(path.read_bytes()).close()  # the payload works: unpickling it creates the marker
    assert marker.exists()
    marker.unlink()


# ---- 1. no pickle ---------------------------------------------------------------------------------
def _python_files() -> Iterator[Path]:
    for top in ("memctl", "benchmarks", "examples"):
        yield from sorted((ROOT / top).rglob("*.py"))


def _kw(call: ast.Call, name: str) -> object:
    for k in call.keywords:
        if k.arg == name and isinstance(k.value, ast.Constant):
            return k.value.value
    return None


def test_no_pickle_in_the_source_tree() -> None:
    """No module imports a pickler, `torch.load` always says weights_only=True, `np.load` always
    allow_pickle=False, and nothing passes allow_pickle=True."""
    picklers = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
    found = []
    files = list(_python_files())
    assert len(files) > 20
    for path in files:
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{where}:{node.lineno}: imports {m}" for m in mods if m.split(".")[0] in picklers]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pickle":
                found.append(f"{where}:{node.lineno}: pickle.{node.attr}")
            elif isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                if func.endswith("torch.load") and _kw(node, "weights_only") is not True:
                    found.append(f"{where}:{node.lineno}: torch.load without weights_only=True")
                if func in ("np.load", "numpy.load") and _kw(node, "allow_pickle") is not False:
                    found.append(f"{where}:{node.lineno}: np.load without allow_pickle=False")
                if _kw(node, "allow_pickle") is True:
                    found.append(f"{where}:{node.lineno}: allow_pickle=True")
                if func.endswith("read_pickle"):
                    found.append(f"{where}:{node.lineno}: {func}")
    assert not found, "\n".join(found)


def test_checkpoint_and_rank_message_round_trip_exactly() -> None:
    """Checkpoints and rank messages are tensors plus JSON; both come back bit for bit, NaN and
    the order of provenance included."""
    params = [torch.randn(2, 3), torch.randn(4)]
    state = TrainState(
        params=params,
        opt={"m": [torch.randn(2, 3), torch.randn(4)], "v": [torch.rand(2, 3), torch.rand(4)], "steps": [
            torch.tensor([3.0, 0.0]), torch.tensor([1.0, 2.0, 0.0, 5.0])
        ]},
        step=7,
        tokens=123,
        losses={"lm": [1.5, float("nan")], "keep": [0.1]},
        seen={(2, 3): {"b.txt": 4, "a.txt": 9}, (1, 0): {"a.txt": 13}},
        scores=[0.25],
        heldout_loss=[],
        unit="0",
        seconds=1.25,
        config='{"epochs": 1}',
        placement="cpu/float32",
    )  # fmt: skip
    got = decode(encode(state), Path("unit-0.safetensors"), "0")
    assert all(torch.equal(a, b) for a, b in zip(got.params, params, strict=True))
    assert all(torch.equal(a, b) for k in ("m", "v", "steps") for a, b in zip(got.opt[k], state.opt[k], strict=True))
    assert list(got.seen.items()) == list(state.seen.items())
    assert got.losses["lm"][0] == 1.5 and math.isnan(got.losses["lm"][1])
    assert (got.step, got.tokens, got.scores, got.seconds, got.placement) == (7, 123, [0.25], 1.25, "cpu/float32")

    memory = MemoryConfig(ranks=(2, 2), layers=(0,), hidden=4)
    cfg = BankConfig(anchor="x", embedder="hash", window=64, tree=TreeConfig(k=2, p=2), memory=memory)
    unit = unit_of(cfg, "1")
    tu = TrainedUnit(UnitResult("1", 3, 30, 2.0, float("nan"), 0.5, 0, [0.5]), unit, UnitParams(cfg, unit), state.seen)
    kind, back = decode_message(encode_message(("done", tu)))
    assert kind == "done" and back.unit == unit and list(back.seen.items()) == list(tu.seen.items())
    assert back.result.loss_first == 2.0 and math.isnan(back.result.loss_last) and back.result.heldout == [0.5]
    for mine, theirs in zip(tu.params.tensors, back.params.tensors, strict=True):
        assert all(torch.equal(mine[p].detach(), theirs[p]) for p in ("gate", "up", "down"))
    assert decode_message(encode_message(("error", ("InputError", "bad")))) == ("error", ("InputError", "bad"))
    assert decode_message(encode_message(("stopped", None))) == ("stopped", None)


def test_a_planted_pickle_checkpoint_is_never_loaded(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path
) -> None:
    """A pickle at the old checkpoint path (the bank's, or `train --out DIR`'s) is refused without
    being read; --restart deletes it."""
    reg = _bank(corpus, tiny_anchor, home)
    marker = tmp_path / "pwned"
    planted = reg.path / "checkpoints" / "unit-0.pt"
    _plant(planted, marker)
    line = one_error_line(invoke("train", "--bank", "b", "--epochs", "1"))
    assert "unit-0.pt" in line and "--restart" in line
    assert not marker.exists()
    assert "--restart" in invoke("info", "--bank", "b").stdout  # info says so too, and loads nothing
    assert not marker.exists()
    res = invoke("train", "--bank", "b", "--epochs", "1", "--batch-size", "4", "--restart")
    assert res.exit_code == 0, res.output
    assert not marker.exists() and not planted.exists()

    out = tmp_path / "u0"
    assert train_out("b", out, FAST, subtree=0, home=home, max_steps=1).result is None  # leaves DIR/work
    _plant(out / "work" / "checkpoints" / "unit-0.pt", marker)
    line = one_error_line(invoke("train", "--bank", "b", "--subtree", "0", "--out", str(out)))
    assert "unit-0.pt" in line and "--restart" in line and not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_a_damaged_checkpoint_is_a_one_line_error(home: Path, corpus: Path, tiny_anchor: Path, damage: str) -> None:
    reg = _bank(corpus, tiny_anchor, home)
    assert train("b", FAST, home=home, max_steps=1).interrupted
    ckpts = [checkpoint_path(reg.checkpoint_dir(), "0")]
    assert ckpts[0].is_file()
    data = ckpts[0].read_bytes()
    ckpts[0].write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x00" * 64, "empty": b""}[damage])
    line = one_error_line(invoke("train", "--bank", "b"))
    assert ckpts[0].name in line and "memctl train --restart" in line
    res = invoke("train", "--bank", "b", "--restart", "--epochs", "1", "--batch-size", "4")
    assert res.exit_code == 0, res.output


# ---- 2. WAL and busy timeout ----------------------------------------------------------------------
def test_block_waits_for_another_writer_instead_of_failing(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg = _bank(corpus, tiny_anchor, home)
    conn = reg.db.conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 30_000
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    reg.close()
    holding, failure = threading.Event(), []

    def hold() -> None:
        other = sqlite3.connect(reg.path / "registry.db", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("insert into privacy_log (at, action, target, reason, detail) values ('', 'x', '', '', '{}')")
            holding.set()
            time.sleep(1.0)
            other.execute("COMMIT")
        except sqlite3.Error as e:  # pragma: no cover - reported below
            failure.append(e)
            holding.set()
        finally:
            other.close()

    t = threading.Thread(target=hold)
    t.start()
    assert holding.wait(10)
    started = time.perf_counter()
    res = invoke("block", "--bank", "b", "--node", "1:0", "--reason", "test")
    waited = time.perf_counter() - started
    t.join()
    assert not failure and res.exit_code == 0, res.output
    assert waited > 0.5  # it waited for the other writer
    reg = Registry.open("b", home)
    assert reg.block(1, 0)["blocked"] == 1 and reg.count("privacy_log") == 2


# ---- 3. privacy on disk ---------------------------------------------------------------------------
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_bank_directories_and_files_are_private(home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path) -> None:
    old = os.umask(0o022)  # a common, lax umask: the modes must not depend on it
    try:
        reg = _bank(corpus, tiny_anchor, home)
        assert train("b", FAST, home=home, max_steps=1).interrupted
        ckpts = list((reg.path / "checkpoints").glob("unit-*.safetensors"))
        assert ckpts and all(_mode(p) == 0o600 for p in ckpts)
        train("b", FAST, home=home)
        archive = tmp_path / "b.memctl"
        export_bank("b", archive, home=home)
        imported = import_bank(archive, name="c", home=home).path
    finally:
        os.umask(old)
    assert _mode(home / "banks") == 0o700
    assert _mode(archive) == 0o600
    for bank in (reg.path, imported):
        files = [bank / "registry.db", *(p for p in (bank / "blocks").iterdir())]
        assert len(files) > 3
        assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
        dirs = [bank, bank / "blocks"] + ([bank / "checkpoints"] if (bank / "checkpoints").exists() else [])
        assert {str(d): _mode(d) for d in dirs} == {str(d): 0o700 for d in dirs}


# ---- 4. bank names --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["a/b", "a\\b", "..", "a..b", "../x", ".hidden", ""])
def test_bad_bank_names_are_one_line_errors(home: Path, corpus: Path, tiny_anchor: Path, name: str) -> None:
    args = ["--anchor", str(tiny_anchor), "--embedder", "hash", "--tree", "2,2"]
    line = one_error_line(invoke("ingest", str(corpus), "--bank", name, *args))
    assert "bad bank name" in line
    assert "bad bank name" in one_error_line(invoke("info", "--bank", name))
    assert not (home / "banks").exists() or not list((home / "banks").iterdir())
    assert not (home / "x").exists() and not (home.parent / "x").exists()
