"""Prompts written by older cloze rules: the bank says so, `memctl reprompt` deletes them, and the next
`memctl train` writes them again with this memctl's rules and retrains every unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.registry import Registry
from memctl.train import reprompt as reprompt_module
from memctl.train.kinds import RULE_KINDS
from memctl.train.prompts import RULES
from memctl.train.reprompt import outdated_note, reprompt, rules_state, settle
from memctl.train.run import train

runner = CliRunner()
TRAIN = {"epochs": 1, "objective": "distill", "preserve": 0.0, "study": 1}


def _rule_prompts(reg: Registry, windows: list[int] | None = None) -> list[tuple[int, str, str]]:
    kinds = ", ".join(f"'{k}'" for k in RULE_KINDS)
    rows = reg.db.execute(f"select window_id, kind, text from prompts where kind in ({kinds}) order by id").fetchall()
    return sorted((r[0], r[1], r[2]) for r in rows if windows is None or r[0] in windows)


def test_reprompt_rewrites_what_older_rules_wrote_and_retrains(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest("r", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    train("r", TRAIN, home=home)
    reg = Registry.open("r", home)
    n = reg.count("windows")
    assert rules_state(reg).to_dict() == {"current": RULES, "windows": n, "outdated": 0, "oldest": None}
    assert outdated_note(reg) is None and reprompt(reg).windows == 0  # nothing to rewrite: nothing changes
    assert reg.db.execute("select count(*) from blocks where state = 'stale'").fetchone()[0] == 0

    original = _rule_prompts(reg)
    old = [r[0] for r in reg.db.execute("select id from windows order by id limit 3")]
    reg.db.execute(f"update windows set prompt_rules = 0 where id in ({old[0]}, {old[1]}, {old[2]})")
    for w in old[:2]:  # as an older memctl: other rules wrote one prompt of each of two windows otherwise
        reg.db.execute(
            "update prompts set text = text || ' (older rules)' where id = "
            "(select min(id) from prompts where window_id = ? and kind = 'cloze')",
            [w],
        )
    # the registry alone counts all three; the third's prompts are what these rules write: `reprompt` keeps them
    assert rules_state(reg).outdated == 3 and rules_state(reg).oldest == 0
    assert f"3 of {n} windows have cloze prompts written by older rules (v0; memctl now writes v{RULES})" in (
        outdated_note(reg) or ""
    )
    info = json.loads(runner.invoke(app, ["info", "--bank", "r", "--json"]).output)
    assert info["prompt_rules"]["outdated"] == 3 and "memctl reprompt --bank r" in info["prompt_rules"]["note"]
    old = old[:2]
    # settle records the third as current and that these rules were run on the other two, which no later
    # settle runs them on again (train settles every time: a large bank would pay for it at every run)
    assert settle(reg) == 1 and rules_state(reg).outdated == 2
    checked = reg.db.execute("select id from windows where rules_checked = ? order by id", [RULES]).fetchall()
    assert [r[0] for r in checked] == old
    calls: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(reprompt_module, "window_prompts", lambda *a: calls.append(a[0]) or [])
        assert settle(reg) == 0 and calls == [] and rules_state(reg).outdated == 2

    before = _rule_prompts(reg)
    theirs = _rule_prompts(reg, old)
    study = reg.db.execute("select count(*) from prompts where kind = 'study'").fetchone()[0]
    trained = reg.db.execute("select count(*) from blocks where state = 'trained'").fetchone()[0]
    assert theirs and study > 0 and trained > 0
    res = runner.invoke(app, ["reprompt", "--bank", "r", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["windows"] == 2 and rep["prompts_deleted"] == len(theirs) and len(rep["stale_blocks"]) == trained
    reg = Registry.open("r", home)
    assert _rule_prompts(reg, old) == [] and _rule_prompts(reg) == [p for p in before if p not in theirs]
    assert reg.db.execute("select count(*) from windows where prompt_rules = 0").fetchone()[0] == 2  # settled
    assert reg.db.execute("select count(*) from prompts where kind = 'study'").fetchone()[0] == study  # kept
    assert reg.db.execute("select count(*) from blocks where state = 'trained'").fetchone()[0] == 0
    assert rules_state(reg).outdated == 0  # no longer prompted: the next train writes them

    res = train("r", TRAIN, home=home)  # writes the two windows' prompts again and retrains every unit
    reg = Registry.open("r", home)
    assert _rule_prompts(reg) == original  # the same rules write the same prompts
    assert rules_state(reg).to_dict() == {"current": RULES, "windows": n, "outdated": 0, "oldest": None}
    assert reg.db.execute("select count(*) from blocks where state = 'trained'").fetchone()[0] == trained
    # the two windows' cloze prompts, and the echo questions that ask them back (memctl's default)
    marks = ",".join("?" * len(old))
    echoes = reg.db.execute(f"select count(*) from prompts where kind = 'echo' and window_id in ({marks})", old)
    assert res.units and res.prepare is not None and res.prepare.prompts_added == len(theirs) + echoes.fetchone()[0]


def test_reprompt_all_and_the_cli_lines(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    ingest("a", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    res = runner.invoke(app, ["reprompt", "--bank", "a"])
    assert res.exit_code == 0 and "nothing to rewrite" in res.output  # never prompted: nothing written yet
    train("a", {**TRAIN, "study": 0}, home=home)
    res = runner.invoke(app, ["reprompt", "--bank", "a"])
    assert res.exit_code == 0 and "nothing to rewrite" in res.output
    reg = Registry.open("a", home)
    n, prompts = reg.count("windows"), len(_rule_prompts(reg))
    res = runner.invoke(app, ["reprompt", "--bank", "a", "--all"])
    assert res.exit_code == 0, res.output
    assert f"deleted {prompts:,} prompts of {n:,} windows" in res.output and "memctl train --bank a" in res.output
    assert Registry.open("a", home).count("prompts") == 0
    res = runner.invoke(app, ["reprompt", "--bank", "nope"])
    assert res.exit_code != 0 and "Traceback" not in res.output
