"""A three-level tree, the default shape of most corpora since the tree went one level deeper: every
command that walks a path (train, ask, block, audit, forget) handles the third level as the others."""

from __future__ import annotations

from pathlib import Path

from conftest import grep_files, in_units
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.ops.info import info
from memctl.privacy.controls import audit_doc, set_blocked
from memctl.privacy.forget import forget, plan_forget
from memctl.registry import Registry, block_id
from memctl.serve.session import BankSession
from memctl.train.run import train

runner = CliRunner()
CFG = {"epochs": 2, "batch_size": 2, "objective": "mix"}
DOC = "metals/0.txt"
PROMPT = "Iron is a strong metal used in steel"
SECRET = b"strong metal used in steel and bridges"


def test_a_three_level_bank_trains_answers_blocks_audits_and_forgets(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    ingest("d", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 3), home=home)
    train("d", CFG, home=home)
    reg = Registry.open("d", home)
    summary = info("d", home)
    assert summary["tree"]["p"] == 3 and [lv["level"] for lv in summary["levels"]] == [1, 2, 3]
    trained = {(r["level"], r["idx"]) for r in reg.blocks("file is not null")}
    assert {lvl for lvl, _ in trained} == {0, 1, 2, 3}  # the generic memory and every level

    # a question fetches one block per level, and a blocked leaf is withheld while levels 1 and 2 answer
    with BankSession("d", home) as s:
        path = s.route([PROMPT])
        assert path.shape == (1, 3)
        leaf = (3, int(path[0, 2]))  # a path holds each level's node index
        assert int(path[0, 2]) // 2 == int(path[0, 1]) and int(path[0, 1]) // 2 == int(path[0, 0])
        ans = s.generate([PROMPT], max_new_tokens=2, paths=path)[0]
        assert len(ans.blocks) == 3 and ans.withheld == []
        set_blocked("d", True, nodes=[f"3:{leaf[1]}"], reason="test", home=home)
    with BankSession("d", home) as s:
        ans = s.generate([PROMPT], max_new_tokens=2, paths=path)[0]
        assert ans.withheld == [block_id(*leaf)] and len(ans.blocks) == 2
    res = runner.invoke(app, ["ask", PROMPT, "--bank", "d", "--json", "--max-new-tokens", "2"])
    assert res.exit_code == 0, res.output
    set_blocked("d", False, nodes=[f"3:{leaf[1]}"], home=home)

    # audit: the document's window path names a block on each of the three levels
    doc = audit_doc("d", DOC, home)
    on_path = {b["block"] for b in doc["blocks"] if b["on_window_path"]}
    assert {f"{lvl + 1}:{n}" for lvl, n in enumerate(doc["paths"][0].split(","))} <= on_path
    assert {b.split(":")[0] for b in on_path} >= {"1", "2", "3"}

    # forget: the document's unit retrains, its text leaves every file, the other unit's blocks keep their files
    before = {r["id"]: (r["file"], r["sha256"]) for r in reg.blocks("file is not null")}
    plan = plan_forget("d", docs=[DOC], home=home)
    assert plan.units and plan.windows == 1
    assert grep_files(reg.path, SECRET)
    report = forget(plan, home=home)
    reg = Registry.open("d", home)
    assert report.blocks_replaced > 0 and grep_files(reg.path, SECRET) == []
    assert not reg.db.execute("select count(*) from block_docs where doc_id = ?", [DOC]).fetchone()[0]
    kept = [r["id"] for r in reg.blocks("file is not null") if not in_units(r, plan.units, reg.config.tree.k)]
    assert kept, "the corpus should leave one level-1 subtree untouched"
    now = {r["id"]: (r["file"], r["sha256"]) for r in reg.blocks("file is not null")}
    assert all(now[bid] == before[bid] for bid in kept)
