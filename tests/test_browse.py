"""The bank browser: the tree with labels and block states, provenance both ways, blocking from the
app (under Textual's pilot, on the tiny model)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memctl.bank import ingest
from memctl.browse import BankView
from memctl.cli import app
from memctl.privacy import audit_doc, privacy_log
from memctl.registry import Registry
from memctl.train import train


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
                tree = app_.query_one("#tree", Tree)
                assert [str(c.label).split()[0] for c in tree.root.children] == ["1:0", "1:1", "generic"]
                await pilot.press("down")  # highlight 1:0
                await pilot.pause()
                assert app_.selected == (1, 0)
                assert "1:0" in str(app_.query_one("#block", Static).render())
                table = app_.query_one("#docs", DataTable)
                assert table.row_count == len(audit_node_docs(home, "1:0"))
                await pilot.press("b")
                await pilot.pause()
                assert bank.block(1, 0)["blocked"] == 1 and "BLOCKED" in str(tree.cursor_node.label)
                await pilot.press("b")
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
    from memctl.privacy import audit_node

    return audit_node("v", node, home)["documents"]


def test_browse_needs_a_terminal(home: Path, bank: Registry) -> None:
    res = CliRunner().invoke(app, ["browse", "--bank", "v"])
    assert res.exit_code == 2 and "needs a terminal" in res.output
