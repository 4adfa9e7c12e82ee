"""The bank browser: the tree with labels and block states, provenance both ways, blocking from the
app (under Textual's pilot, on the tiny model); the console's library calls (overview, search routed
as `ask` routes it, node and document detail, asking a node's path); `browse --json`, `chat --json`.

`console_home` builds the bank the console tests share (tests/test_tui_*.py): distillation-trained
(so it has coverage), with an evaluation run and a document whose id and title are long."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from conftest import TOPICS
from rich.console import Console
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.ops.browse import BankView, forced_path, level_states
from memctl.privacy.controls import audit_doc, privacy_log
from memctl.registry import Registry
from memctl.train.run import train
from memctl.tui.overview import coverage_renderable

LONG_ID = "gases/a_very_long_document_name_about_the_noble_gases_and_the_signs_they_light_up_at_night.txt"
LONG_TITLE = "The noble gases glow in many colours when a current runs through them in sealed glass"
PROBES = [
    {"doc": "metals/0.txt", "kind": "use", "prompt": "Iron is a strong metal used in", "answers": ["steel"]},
    {"doc": "gases/0.txt", "kind": "use", "prompt": "Helium is a light gas used in", "answers": ["balloons"]},
    {"doc": "animals/3.txt", "kind": "size", "prompt": "The whale is the largest animal in the", "answers": ["sea"]},
]
_TEMPLATES: dict[str, Path] = {}


def _build_console_bank(root: Path, anchor: Path) -> Path:
    from memctl.core.probes import load_probes
    from memctl.eval.evaluate import EvalOptions, run_eval
    from memctl.serve.session import BankSession

    docs = root / "docs"
    for topic, sents in TOPICS.items():
        (docs / topic).mkdir(parents=True)
        for i, s in enumerate(sents):
            (docs / topic / f"{i}.txt").write_text(f"{s}\n\nMore about {topic}: note {i} of the {topic} notes.\n")
    (docs / LONG_ID).write_text(f"{LONG_TITLE}\n\nNeon and argon light up the signs of the city at night.\n")
    home = root / "home"
    ingest("v", [docs], anchor=str(anchor), embedder="hash", tree=(2, 2), home=home)
    # no echo questions: on the tiny random model they change what the chat snapshot's bank replies, the
    # snapshots' subject being the layout
    train("v", {"epochs": 1, "objective": "distill", "echo": 0}, home=home)
    probes = root / "probes.jsonl"
    probes.write_text("".join(json.dumps(d) + "\n" for d in PROBES))
    with BankSession("v", home) as s:
        run_eval(s, load_probes(probes), EvalOptions(setups=("anchor", "fetched")), probes_path=probes,
                 params={"probes": str(probes)})  # fmt: skip
    return home


def console_home(tmp_path_factory: pytest.TempPathFactory, anchor: Path, home: Path) -> Registry:
    """A copy of the console bank (built once per session) as bank 'v' under `home`."""
    if "v" not in _TEMPLATES:
        _TEMPLATES["v"] = _build_console_bank(tmp_path_factory.mktemp("console"), anchor)
    shutil.copytree(_TEMPLATES["v"] / "banks" / "v", home / "banks" / "v")
    return Registry.open("v", home)


def normalise(reg: Registry) -> None:
    """Fixed times and relative sources: what a snapshot shows must not depend on when or where it ran."""
    stamp = "2026-01-02T03:04:05+00:00"
    with reg.db.atomic():
        reg.db.execute("update privacy_log set at = ?", [stamp])
        reg.db.execute("update eval_runs set started = ?, finished = ?", [stamp, stamp])
        reg.db.execute("update blocks set updated = ?", [stamp])
        reg.db.execute("update blocks set blocked_at = ? where blocked_at is not null", [stamp])
        reg.db.execute("update documents set source = id")


@pytest.fixture()
def bank(home: Path, corpus: Path, tiny_anchor: Path) -> Registry:
    ingest("v", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    train("v", {"epochs": 1, "batch_size": 4, "objective": "lm"}, home=home)
    return Registry.open("v", home)


def test_bank_view_tree_and_provenance(home: Path, bank: Registry) -> None:
    view = BankView("v", home)
    try:
        top = view.children(0, 0)
        assert [n.id for n in top] == ["1:0", "1:1"]
        leaves = [leaf for n in top for leaf in view.children(n.level, n.idx)]
        assert [n.id for n in leaves] == ["2:0", "2:1", "2:2", "2:3"]
        assert sum(n.windows for n in leaves) == bank.count("windows") == sum(n.windows for n in top)
        assert all(n.state == "trained" for n in top + leaves if n.windows)
        assert view.children(2, 0) == []
        for n in leaves:
            if n.windows:
                titles = {r["title"] for r in bank.db.query("select title from documents")}
                assert set(n.label.split(", ")) <= titles
        busy = max(leaves, key=lambda n: n.windows)
        block = view.block_detail(busy.level, busy.idx)
        assert block["block"] == busy.id and block["documents"]
        doc = block["documents"][0]["id"]
        d = view.doc_detail(doc)
        assert busy.id in [b["block"] for b in d["blocks"] if b["tokens"]]
        assert d["preview"] and d["preview"][:20] in bank.windows("doc_id = ?", [doc])[0]["text"]
        assert view.toggle_block(busy.level, busy.idx) is True
        assert view.node(busy.level, busy.idx).blocked
        assert view.toggle_block(busy.level, busy.idx) is False
        assert [e["action"] for e in privacy_log("v", home)] == ["block", "unblock"]
    finally:
        view.close()


def test_browse_app_under_the_pilot(home: Path, bank: Registry) -> None:
    from textual.widgets import DataTable, Static, Tree

    from memctl.tui.browse import BrowseApp

    async def scenario() -> None:
        view = BankView("v", home)
        app_ = BrowseApp(view)
        try:
            async with app_.run_test(size=(160, 48)) as pilot:
                await pilot.press("t")  # the overview comes first
                tree = app_.query_one("#tree", Tree)
                assert [str(c.label).split()[0] for c in tree.root.children] == ["1:0", "1:1", "generic"]
                await pilot.press("down")  # highlight 1:0
                await pilot.pause()
                assert app_.selected == (1, 0)
                assert "1:0" in str(app_.query_one("#block", Static).render())
                table = app_.query_one("#docs", DataTable)
                assert table.row_count == len(audit_node_docs(home, "1:0"))
                await pilot.press("b", "y")  # block, confirmed
                await app_.workers.wait_for_complete()
                await pilot.pause()
                assert bank.block(1, 0)["blocked"] == 1 and "BLOCKED" in str(tree.cursor_node.label)
                await pilot.press("b", "y")
                await app_.workers.wait_for_complete()
                await pilot.pause()
                assert bank.block(1, 0)["blocked"] == 0
                table.focus()
                await pilot.press("enter")
                await pilot.pause()
                first = str(table.get_row_at(0)[0])
                shown = str(app_.query_one("#doctext", Static).render())
                assert first in shown and "shaped: " in shown
                assert "1:0" in [b["block"] for b in audit_doc("v", first, home)["blocks"]]
        finally:
            view.close()

    asyncio.run(scenario())


def audit_node_docs(home: Path, node: str) -> list:
    from memctl.privacy.controls import audit_node

    return audit_node("v", node, home)["documents"]


def test_browse_needs_a_terminal(home: Path, bank: Registry) -> None:
    res = CliRunner().invoke(app, ["browse", "--bank", "v"])
    assert res.exit_code == 2 and "needs a terminal" in res.output and "--json" in res.output


# ---- the console's library calls ------------------------------------------------------------------
@pytest.fixture()
def console(tmp_path_factory: pytest.TempPathFactory, tiny_anchor: Path, home: Path) -> Registry:
    return console_home(tmp_path_factory, tiny_anchor, home)


def test_overview_holds_what_the_owner_asks_for(home: Path, console: Registry) -> None:
    view = BankView("v", home)
    try:
        d = view.overview()
        assert d["anchor"]["name"] == "llama" and d["anchor"]["layers"] == 3
        assert d["config"]["tree"]["k"] == 2 and d["documents"] == 13 and d["bytes_on_disk"] > 0
        assert d["fetched_bytes"] == 4 * d["fetched_params"] and 0 < d["fetched_ratio"] < 1
        assert 0 < d["coverage"]["mean"] <= 1
        assert [lv["level"] for lv in d["levels"]] == [1, 2, 0]
        assert all(lv["trained"] + lv["stale"] + lv["untrained"] + lv["blocked"] == lv["blocks"] for lv in d["levels"])
        assert d["last_eval"]["n"] == len(PROBES) and [s["setup"] for s in d["last_eval"]["setups"]] == [
            "anchor", "fetched"]  # fmt: skip
        assert d["privacy_log"] == [] and d["privacy_log_total"] == 0
        view.toggle_block(2, 1, reason="why")
        d = view.overview()
        assert d["levels"][1]["blocked"] == 1 and d["privacy_log"][-1]["action"] == "block"
        assert d["privacy_log"][-1]["target"] == "2:1" and d["privacy_log"][-1]["reason"] == "why"
        assert level_states(console)[1]["blocked"] == 1
        assert d["prompt_rules_note"] is None
        console.db.execute("update windows set prompt_rules = 0 where id = (select min(id) from windows)")
        note = view.overview()["prompt_rules_note"]
        assert note and note.startswith("1 of ") and "memctl reprompt --bank v" in note
        shown = Console(width=200, record=True)
        shown.print(coverage_renderable(d["coverage"], note))
        text = " ".join(shown.export_text().split())
        assert "`memctl reprompt --bank v` rewrites those" in text and "content words" in text
    finally:
        view.close()


def test_search_routes_as_ask_does(home: Path, console: Registry) -> None:
    from memctl.serve.api import Memories

    view = BankView("v", home)
    try:
        text = "Iron is a strong metal used in steel and bridges."
        rv = view.search(text)
        with Memories("v", home) as mem:
            r = mem.route_gated([text])
            assert rv.path == [int(v) for v in r.paths[0]] and rv.unrelated == bool(r.off[0])
            assert rv.floor == pytest.approx(mem.relevance_floor) and rv.relevance == pytest.approx(r.relevance[0])
        assert not rv.unrelated and all(-1 <= h.similarity <= 1 for h in rv.hops)
        assert rv.windows and rv.windows[0].doc_id == "metals/0.txt"  # the window itself is nearest
        leaf = ",".join(map(str, rv.path))
        assert all(console.windows("id = ?", [w.window_id])[0]["path"] == leaf for w in rv.windows)
        assert view.search("zzzz qqqq xxxx").unrelated  # nothing like the bank: the gate says so
        with pytest.raises(Exception, match="type something"):
            view.search("  ")
    finally:
        view.close()


def test_node_and_document_detail(home: Path, console: Registry) -> None:
    view = BankView("v", home)
    try:
        d = view.block_detail(1, 0)
        assert d["windows"] == console.db.execute("select count(*) from windows where l1 = 0").fetchone()[0]
        assert d["n_documents"] >= 1 and d["window_tokens"] > 0 and d["rank"] == console.config.memory.ranks[0]
        assert d["bytes"] > 0 and d["trained_tokens"] > 0 and d["trained_at"]
        g = view.block_detail(0, 0)
        assert g["windows"] == console.count("windows") and g["n_documents"] == console.count("documents")
        doc = view.doc_detail(LONG_ID)
        assert [w["text"] for w in doc["window_texts"]] == [r["text"] for r in console.windows("doc_id = ?", [LONG_ID])]
        assert doc["paths"] == [w["path"] for w in doc["window_texts"]] and doc["blocked"] is False
        assert any(b["tokens"] and b["share"] > 0 for b in doc["blocks"])
        assert view.toggle_doc(LONG_ID) is True and view.doc_blocked(LONG_ID)
        assert view.toggle_doc(LONG_ID) is False and not view.doc_blocked(LONG_ID)
        log = privacy_log("v", home)
        assert [e["action"] for e in log] == ["block", "unblock"]
        assert json.loads(log[0]["detail"])["selector"]["docs"] == [LONG_ID]  # as `memctl block --doc`
    finally:
        view.close()


def test_ask_a_nodes_path_beside_the_anchor(home: Path, console: Registry) -> None:
    view = BankView("v", home)
    try:
        tree = view.tree
        x = view.memories().embedder.encode(["Helium is a light gas"])[0]
        path = forced_path(tree, x, 1, 1, console)
        assert path[0] == 1 and path[1] // tree.k == 1  # through 1:1, whatever the text's own route
        steps: list[str] = []
        res = view.ask_path(1, 1, "Helium is a light gas", lambda s, n, t: steps.append(s))
        assert res.path == path and res.blocks == ["1:1", f"2:{path[1]}"] and res.mode == "fetched"
        assert res.answer is not None and res.anchor_answer is not None and steps[-1] == "done"
        g = view.ask_path(0, 0, "Helium is a light gas")
        assert g.mode == "generic" and g.blocks == ["generic"]
        assert privacy_log("v", home) == []  # asking changes nothing
    finally:
        view.close()


def test_browse_json_prints_the_overview(home: Path, console: Registry) -> None:
    res = CliRunner().invoke(app, ["browse", "--bank", "v", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["bank"] == "v" and d["levels"] and d["last_eval"]["n"] == len(PROBES)
    res = CliRunner().invoke(app, ["browse", "--bank", "nope", "--json"])
    assert res.exit_code != 0 and "no bank named 'nope'" in res.output and "Traceback" not in res.output


def test_chat_json_answers_lines_as_json(home: Path, console: Registry) -> None:
    lines = "Iron is a strong metal\n/mode none\n/rag maybe\nHelium\n/quit\nnever read\n"
    res = CliRunner().invoke(app, ["chat", "--bank", "v", "--json", "--max-new-tokens", "4"], input=lines)
    assert res.exit_code == 0, res.output
    out = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(out) == 4
    assert (
        out[0]["user"] == "Iron is a strong metal"
        and len(out[0]["path"]) == 2
        and out[0]["settings"]["mode"] == "fetched"
    )
    assert out[1] == {"settings": {"mode": "none", "rag": False, "route_on": "message", "max_new_tokens": 4}}
    assert "unknown command" in out[2]["error"]
    assert out[3]["settings"]["mode"] == "none" and out[3]["blocks"] == []
