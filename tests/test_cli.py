"""The CLI: the happy path on the tiny model, and bad inputs that must fail cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tree_digest
from typer.testing import CliRunner

from memctl.cli import app, common
from memctl.cli.common import epoch_line
from memctl.train.loop import TrainEvent

runner = CliRunner()


def invoke(*args: str):  # noqa: ANN201
    return runner.invoke(app, list(args))


def make_bank(corpus: Path, anchor: Path, name: str = "b", *extra: str):  # noqa: ANN201
    res = invoke(
        "ingest", str(corpus), "--bank", name, "--anchor", str(anchor), "--embedder", "hash", "--tree", "2,2", *extra
    )
    assert res.exit_code == 0, res.output
    return res


def test_ingest_train_info_ask(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    make_bank(corpus, tiny_anchor)
    again = invoke("ingest", str(corpus), "--bank", "b", "--json")
    assert again.exit_code == 0
    assert json.loads(again.stdout)["docs_added"] == 0  # same content twice: a no-op
    res = invoke("train", "--bank", "b", "--epochs", "2", "--batch-size", "4", "--json")
    assert res.exit_code == 0, res.output
    units = json.loads(res.stdout)["units"]
    assert {u["unit"] for u in units} >= {"generic"} and all(u["tokens"] > 0 for u in units)
    info = json.loads(invoke("info", "--bank", "b", "--json").stdout)
    assert info["training"] == "trained"
    assert info["documents"] == 12 and info["bytes_on_disk"] > 0
    text = invoke("info", "--bank", "b")
    assert "fetched" in text.stdout and "tree" in text.stdout
    ans = json.loads(invoke("ask", "--bank", "b", "Iron is a metal", "--max-new-tokens", "3", "--json").stdout)
    assert len(ans["path"]) == 2 and ans["blocks"] == [f"1:{ans['path'][0]}", f"2:{ans['path'][1]}"]
    assert ans["store"]["misses"] == 2  # only the two blocks on the path were read
    generic = json.loads(invoke("ask", "--bank", "b", "Iron is a metal", "--generic", "--json").stdout)
    assert generic["blocks"] == ["generic"] and generic["path"] is None
    assert invoke("train", "--bank", "b").stdout.startswith("nothing to train")


def test_train_into_a_log_writes_a_line_per_epoch_with_each_kind_of_loss(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    make_bank(corpus, tiny_anchor)
    res = invoke("train", "--bank", "b", "--epochs", "2", "--subtree", "0", "--study", "0")
    assert res.exit_code == 0, res.output
    ends = [line for line in res.output.splitlines() if " done: mean loss " in line]
    assert [line.split(" done")[0] for line in ends] == ["unit 0 epoch 1", "unit 0 epoch 2"]
    for line in ends:
        means = dict(part.rsplit(" ", 1) for part in line.split("mean loss ")[1].split(", held-out")[0].split(", "))
        assert set(means) == {"distillation", "preservation"} and all(float(v) > 0 for v in means.values())
    assert "starting over" not in res.output


def test_an_epoch_line_says_when_a_unit_starts_over() -> None:
    why = "preservation loss 2.410 > 1.2x the first epoch's 1.670"
    ev = TrainEvent("3", 0, 1, 40, 80, 1, 2.0, 100, 9.0, 0.25, {"kd": 1.5, "keep": 2.41}, why)
    assert epoch_line(ev) == (
        "epoch 2 done: mean loss distillation 1.500, preservation 2.410, held-out 25%; "
        "preservation loss 2.410 > 1.2x the first epoch's 1.670: starting over at half the learning rate"
    )


def test_a_counter_that_goes_back_gets_its_rate_and_eta_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 10.0, 20.0, 30.0, 40.0])
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    rates = common.Rates()
    assert rates("unit 0", 10, 100) == " (0.00/s)"
    assert rates("unit 0", 30, 100) == " (2.00/s, ETA 35s)"
    assert rates("unit 0", 5, 100) == " (0.00/s)"  # the unit started over: no rate from its first start
    assert rates("unit 0", 15, 100) == " (1.00/s, ETA 85s)"


def test_new_documents_in_a_trained_bank_are_routed_and_mark_blocks_stale(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path
) -> None:
    make_bank(corpus, tiny_anchor)
    assert invoke("train", "--bank", "b", "--epochs", "1").exit_code == 0
    nodes_before = tree_digest(home / "banks" / "b" / "blocks")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "cobalt.txt").write_text("Cobalt is a metal used in magnets and batteries.")
    res = json.loads(invoke("ingest", str(extra), "--bank", "b", "--json").stdout)
    assert res["docs_added"] == 1 and not res["reclustered"] and 1 <= len(res["stale_blocks"]) <= 2
    info = json.loads(invoke("info", "--bank", "b", "--json").stdout)
    assert "stale" in info["training"]
    assert tree_digest(home / "banks" / "b" / "blocks") == nodes_before
    retrain = json.loads(invoke("train", "--bank", "b", "--epochs", "1", "--json").stdout)
    assert len(retrain["units"]) == 1  # only the subtree holding the new document
    assert json.loads(invoke("info", "--bank", "b", "--json").stdout)["training"] == "trained"


def one_error_line(res) -> str:  # noqa: ANN001
    assert res.exit_code != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.output
    return lines[0]


@pytest.mark.parametrize(
    "args,message",
    [
        (["ingest", "{tmp}/missing", "--bank", "b"], "no such file"),
        (["ingest", "{tmp}/empty.txt", "--bank", "b"], "empty"),
        (["ingest", "{tmp}/bin.txt", "--bank", "b"], "binary"),
        (["ingest", "{tmp}/latin.txt", "--bank", "b"], "not UTF-8"),
        (["info", "--bank", "nobank"], "no bank named"),
        (["train", "--bank", "nobank"], "no bank named"),
        (["ask", "hello", "--bank", "nobank"], "no bank named"),
        (
            [
                "ingest",
                "{corpus}",
                "--bank",
                "b",
                "--anchor",
                "{anchor}",
                "--embedder",
                "hash",
                "--tree",
                "2,2",
                "--ranks",
                "4,4,4",
            ],
            "--ranks has 3 values but the tree has 2 levels",
        ),
        (["ingest", "{corpus}", "--bank", "b", "--anchor", "{tmp}/no-model", "--embedder", "hash"], "bad anchor"),
        (
            [
                "ingest",
                "{corpus}",
                "--bank",
                "b",
                "--anchor",
                "{anchor}",
                "--embedder",
                "hash",
                "--memory-layers",
                "last:99",
            ],
            "last:N",
        ),
        (["ingest", "{corpus}", "--bank", "b/../x"], "bad bank name"),
    ],
)
def test_bad_input_fails_with_one_line_and_leaves_registry_unchanged(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "bin.txt").write_bytes(b"\x7fELF\x00\x00\x01")
    (tmp_path / "latin.txt").write_bytes("na\xefve caf\xe9".encode("latin-1"))
    before = tree_digest(home)
    res = invoke(*(a.format(tmp=tmp_path, corpus=corpus, anchor=tiny_anchor) for a in args))
    assert message in one_error_line(res)
    assert tree_digest(home) == before


def test_bad_input_to_an_existing_bank_changes_nothing(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path
) -> None:
    make_bank(corpus, tiny_anchor)
    before = tree_digest(home / "banks")
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    good = tmp_path / "good.txt"
    good.write_text("A perfectly fine new document about tin.")
    # one good file and one bad file: the good one must not be half-added
    one_error_line(invoke("ingest", str(good), str(tmp_path / "latin.txt"), "--bank", "b"))
    one_error_line(invoke("ingest", str(good), "--bank", "b", "--tree", "3,3"))
    one_error_line(invoke("train", "--bank", "b", "--epochs", "0"))
    assert "--preserve-pool" in one_error_line(invoke("train", "--bank", "b", "--preserve-pool", "0"))
    one_error_line(invoke("ask", "", "--bank", "b"))
    assert tree_digest(home / "banks") == before


@pytest.mark.parametrize(("columns", "width"), [(None, "160"), ("100", "100")])
def test_output_into_a_log_is_wide_enough_for_whole_numbers(columns: str | None, width: str) -> None:
    """Into a pipe rich would print 80 columns and cut a table's numbers ("152,9…"); memctl's consoles take
    LOG_WIDTH there, unless COLUMNS says otherwise."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    code = "from memctl.cli.common import err, out; print(out.width, err.width)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [width, width]
