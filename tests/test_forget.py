"""Forgetting: exact retraining equals training without the document, no trace is left, nothing
else moves, an interruption changes nothing, and the proof and its re-check run."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import grep_files, in_units, tree_digest

from memctl.build.ingest import ingest
from memctl.core.errors import InputError
from memctl.privacy.forget import _remove, forget, plan_forget
from memctl.privacy.proof import verify_forgotten
from memctl.registry import Registry
from memctl.train.run import train

DOC = "metals/0.txt"
SECRET = b"strong metal used in steel and bridges"
CFG = {"epochs": 3, "batch_size": 2, "objective": "mix"}  # windows and prompts both train


def _blocks(reg: Registry) -> dict[str, dict[str, torch.Tensor]]:
    return {r["id"]: reg.read_block(r) for r in reg.blocks("file is not null")}


@pytest.fixture()
def twin_banks(home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path) -> tuple[Registry, Registry]:
    """Bank 'a' with every document, and bank 'b': the same bank (same tree, seeds) without DOC.
    Both trained the same way, in train's default dtype (auto: bf16 on a CPU with native bf16)."""
    return _twins(home, corpus, tiny_anchor, tmp_path)


def _twins(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path, dtype: str | None = None
) -> tuple[Registry, Registry]:
    ingest("a", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    refs = tmp_path / "refs"
    refs.mkdir()
    (refs / "r1.txt").write_text("Tin is a soft metal that was once used for cans and toys.")
    (refs / "r2.txt").write_text("The heron is a tall bird that waits in shallow water for fish.")
    (refs / "r3.txt").write_text("Krypton is a rare gas that was found in liquid air in 1898.")
    (refs / ".r4.txt").write_text("An editor's hidden copy: left out, and said so.")
    added = ingest("a", [refs], reference=True, home=home)
    assert (added.references_added, added.hidden_left_out) == (3, 1)
    shutil.copytree(home / "banks" / "a", home / "banks" / "b")
    b = Registry.open("b", home)
    with b.db.atomic():
        _remove(b, [DOC])
    train("a", CFG, home=home, dtype=dtype)
    train("b", CFG, home=home, dtype=dtype)
    return Registry.open("a", home), b


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_exact_forgetting_retrains_in_the_dtype_the_unit_was_trained_in(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path, dtype: str
) -> None:
    """forget serves in fp32, but retrains each unit in the dtype its run recorded: a bf16-trained
    unit is retrained by a second, bf16 anchor, and matches its twin trained without the document."""
    a, b = _twins(home, corpus, tiny_anchor, tmp_path, dtype)
    assert {r[0] for r in a.db.execute("select dtype from runs")} == {dtype}
    plan = plan_forget("a", docs=[DOC], home=home)
    forget(plan, home=home)
    a = Registry.open("a", home)
    got, want = _blocks(a), _blocks(b)
    assert got.keys() == want.keys()
    for bid in want:
        for part in ("gate", "up", "down"):
            assert torch.equal(got[bid][part], want[bid][part]), (bid, part)
    retrained = list(a.db.query("select unit, dtype from runs order by id desc limit ?", [len(plan.units)]))
    assert sorted(r["unit"] for r in retrained) == sorted(plan.units)
    assert {r["dtype"] for r in retrained} == {dtype}  # a later forget retrains it alike again


def test_exact_forgetting_equals_training_without_the_document(home: Path, twin_banks) -> None:  # noqa: ANN001
    a, b = twin_banks
    assert grep_files(a.path, SECRET)  # the text is in the bank before
    before_rows = {r["id"]: r for r in a.blocks("file is not null")}
    pool = [tuple(r) for r in a.db.execute("select * from preserve order by id")]
    assert pool
    with a.db.atomic():  # as in a bank merged from separate jobs: forget makes the pool they made
        a.db.execute("delete from preserve")
    plan = plan_forget("a", docs=[DOC], home=home)
    assert plan.units and "generic" in plan.units and plan.windows == 1 and plan.shaped_blocks
    report = forget(plan, home=home)
    a = Registry.open("a", home)
    assert [tuple(r) for r in a.db.execute("select * from preserve order by id")] == pool
    got, want = _blocks(a), _blocks(b)
    assert set(got) == set(want)
    for bid in want:  # every block: retrained ones and untouched ones alike
        for part in ("gate", "up", "down"):
            assert torch.equal(got[bid][part], want[bid][part]), (bid, part)
    # blocks of units the document never touched kept their very file
    untouched = [r for r in a.blocks("file is not null") if not in_units(r, plan.units, a.config.tree.k)]
    assert untouched, "the test corpus should leave some unit untouched"
    for r in untouched:
        assert (r["file"], r["sha256"]) == (before_rows[r["id"]]["file"], before_rows[r["id"]]["sha256"])
    # no trace: rows, prompts, provenance, files
    assert not a.db.execute("select count(*) from documents where id = ?", [DOC]).fetchone()[0]
    assert not a.db.execute("select count(*) from block_docs where doc_id = ?", [DOC]).fetchone()[0]
    assert not a.db.execute("select count(*) from prompts where doc_id = ?", [DOC]).fetchone()[0]
    assert grep_files(a.path, SECRET) == []
    referenced = {a.path / r["file"] for r in a.blocks("file is not null")}
    assert set((a.path / "blocks").iterdir()) == referenced  # replaced files are deleted
    # the report: in the registry, with the proof
    assert report.report_id and report.blocks_replaced > 0 and report.files_deleted > 0
    proof = report.proofs[0]
    assert proof.doc == DOC and proof.verdict in ("unseen", "SEEN") and math.isfinite(proof.z_after)
    assert proof.gain_after < proof.gain_before  # the memories lost what they knew of the text
    assert report.reference["documents"] == 3
    stored = a.db.execute("select report from forget_reports").fetchone()[0]
    assert DOC in stored and SECRET.decode() not in stored
    (again,) = verify_forgotten("a", [Path(str(home)).parent / "docs" / DOC], home=home)
    assert not again.in_registry and again.traces == [] and again.fragments > 0
    assert again.verdict == proof.verdict


def test_interrupted_forget_changes_nothing(home: Path, twin_banks, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    a, _ = twin_banks
    digest = tree_digest(a.path)
    import memctl.privacy.forget as fg

    calls = {"n": 0}
    real = fg.record_unit

    def flaky(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # mid-commit: one unit already recorded inside the transaction
        return real(*args, **kw)

    monkeypatch.setattr(fg, "record_unit", flaky)
    with pytest.raises(KeyboardInterrupt):
        forget(plan_forget("a", docs=[DOC], home=home), home=home)
    assert calls["n"] == 2
    assert tree_digest(a.path) == digest  # registry and block files exactly as before


def test_drop_mode_deletes_the_units_blocks_and_train_restores_them(home: Path, twin_banks) -> None:  # noqa: ANN001
    a, b = twin_banks
    plan = plan_forget("a", docs=[DOC], mode="drop", home=home)
    report = forget(plan, home=home)
    assert report.blocks_dropped == plan.unit_blocks > 0 and report.blocks_replaced == 0
    a = Registry.open("a", home)
    assert a.db.execute("select count(*) from blocks where state = 'dropped'").fetchone()[0] == plan.unit_blocks
    assert grep_files(a.path, SECRET) == []
    res = train("a", home=home)  # retrains exactly the dropped units, with their own configuration
    assert sorted(u.unit for u in res.units) == sorted(plan.units)
    got, want = _blocks(a), _blocks(b)
    for bid in want:
        assert torch.equal(got[bid]["down"], want[bid]["down"]), bid


def test_forget_rejects_unknown_documents_and_changes_nothing(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    ingest("c", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    digest = tree_digest(home / "banks" / "c")
    with pytest.raises(InputError, match="unknown document id 'nope'"):
        plan_forget("c", docs=["nope"], home=home)
    with pytest.raises(InputError, match="no document .* has tag"):
        plan_forget("c", tags=["secret"], home=home)
    with pytest.raises(InputError, match="say what to forget"):
        plan_forget("c", home=home)
    with pytest.raises(InputError, match="--mode"):
        plan_forget("c", docs=[DOC], mode="soft", home=home)
    assert tree_digest(home / "banks" / "c") == digest
