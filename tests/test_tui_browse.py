"""`memctl browse` under Textual's pilot, on the console bank (tests/test_browse.py): the overview
first, navigation, search highlighting the routed path, and each action with its confirmation (and
its cancellation) and its result in the registry and the privacy log."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text
from test_browse import LONG_ID, console_home
from textual.pilot import Pilot
from textual.widgets import ContentSwitcher, DataTable, Input, Static, Tree

from memctl.ops.browse import BankView
from memctl.privacy.controls import audit_doc, privacy_log
from memctl.registry import Registry
from memctl.tui.browse import BrowseApp
from memctl.tui.overview import Overview
from memctl.tui.widgets import AnswerScreen, AskScreen, ConfirmScreen, HelpScreen, PathView, TaskBar

Scenario = Callable[[BrowseApp, Pilot], Awaitable[None]]


@pytest.fixture()
def console(tmp_path_factory: pytest.TempPathFactory, tiny_anchor: Path, home: Path) -> Registry:
    return console_home(tmp_path_factory, tiny_anchor, home)


def drive(home: Path, scenario: Scenario, size: tuple[int, int] = (160, 48)) -> None:
    async def go() -> None:
        view = BankView("v", home)
        app_ = BrowseApp(view)
        try:
            async with app_.run_test(size=size) as pilot:
                await pilot.pause()
                await scenario(app_, pilot)
        finally:
            view.close()

    asyncio.run(go())


async def settle(app_: BrowseApp, pilot: Pilot) -> None:
    await app_.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


def plain(widget: Static) -> str:
    """What a Static shows, as plain text (markup or a Rich renderable alike)."""
    console = Console(width=200, file=io.StringIO(), record=True, color_system=None)
    content = widget.content
    console.print(Text.from_markup(content) if isinstance(content, str) else content)
    return console.export_text()


def text(app_: BrowseApp, selector: str) -> str:
    return plain(app_.query_one(selector, Static))


def label(app_: BrowseApp, key: tuple[int, int]) -> str:
    return str(app_._tnodes[key].label)


async def to_node(app_: BrowseApp, pilot: Pilot, key: tuple[int, int]) -> None:
    """Keyboard only: open the tree and move the cursor down to the node."""
    await pilot.press("t")
    tree = app_.query_one("#tree", Tree)
    for _ in range(50):
        if tree.cursor_node is not None and tree.cursor_node.data == key:
            break
        node = tree.cursor_node
        if node is not None and node.data is not None and node.data[0] < key[0] and node.allow_expand:
            want = key[1] // app_.view.tree.k ** (key[0] - node.data[0])
            if node.data[1] == want and not node.is_expanded:
                await pilot.press("space")  # open the ancestor
        await pilot.press("down")
    await pilot.pause()
    assert app_.selected == key


def shaped_node(home: Path, doc_id: str) -> tuple[int, int]:
    """A level-1 block the document shaped. Not the generic memory: it trains on a random share of the
    prompts, so whether a document is listed there depends on the seeds."""
    level1 = sorted(b["block"] for b in audit_doc("v", doc_id, home)["blocks"] if b["block"].startswith("1:"))[0]
    level, index = (int(x) for x in level1.split(":"))
    return level, index


async def to_doc(app_: BrowseApp, pilot: Pilot, key: tuple[int, int], doc_id: str) -> None:
    """Keyboard only: the node, then down its document table (bounded) to the document."""
    await to_node(app_, pilot, key)
    await pilot.press("tab")
    table = app_.query_one("#docs", DataTable)
    for _ in range(table.row_count):
        if app_.selected_doc == doc_id:
            break
        await pilot.press("down")
    assert app_.selected_doc == doc_id


def test_overview_first_then_the_tree_and_help(home: Path, console: Registry) -> None:
    async def scenario(app_: BrowseApp, pilot: Pilot) -> None:
        switcher = app_.query_one(ContentSwitcher)
        assert switcher.current == "overview"
        ov = app_.query_one(Overview)
        assert ov.data["bank"] == "v" and ov.data["last_eval"]["n"] == 3
        levels = text(app_, "#ov-levels")
        assert "L1 (2)" in levels and "generic" in levels and "blocked" in levels
        assert "run 1" in text(app_, "#ov-eval") and "fetched" in text(app_, "#ov-eval")
        assert "%" in text(app_, "#ov-coverage") and "no block" in text(app_, "#ov-log")
        assert "llama" in text(app_, "#ov-bank")
        await pilot.press("b")  # tree actions do nothing on the overview
        assert not isinstance(app_.screen, ConfirmScreen)
        await pilot.press("t")
        assert switcher.current == "tree-view" and app_.focused is app_.query_one("#tree", Tree)
        await to_node(app_, pilot, (2, 1))  # opens 1:0 on the way
        assert "2:1" in text(app_, "#block") and "level 2, node 1" in text(app_, "#block")
        assert app_._tnodes[(1, 0)].is_expanded and (1, 1) in app_._tnodes and (2, 2) not in app_._tnodes  # lazy
        await pilot.press("tab")
        table = app_.query_one("#docs", DataTable)
        assert app_.focused is table and table.row_count > 0
        await pilot.pause()
        first = str(table.coordinate_to_cell_key((0, 0)).row_key.value)
        assert app_.selected_doc == first and first in text(app_, "#doctext") and "window 0" in text(app_, "#doctext")
        await pilot.press("question_mark")
        assert isinstance(app_.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app_.screen, HelpScreen)
        await pilot.press("o")
        assert switcher.current == "overview"

    drive(home, scenario)


def test_search_opens_and_marks_the_routed_path(home: Path, console: Registry) -> None:
    query = "Helium is a light gas used in balloons."
    with BankView("v", home) as view:
        expected = view.search(query)

    async def scenario(app_: BrowseApp, pilot: Pilot) -> None:
        await pilot.press("slash")
        assert app_.query_one(ContentSwitcher).current == "tree-view"
        assert app_.focused is app_.query_one("#search", Input)
        await pilot.press(*query)
        await pilot.pause(0.6)  # live: no Enter needed
        await settle(app_, pilot)
        rv = app_.route
        assert rv is not None and rv.path == expected.path and rv.unrelated == expected.unrelated
        panel = app_.query_one("#route", PathView)
        shown = plain(panel)
        assert panel.has_class("-shown") and ("related" in shown) and "nearest windows" in shown
        for h in rv.hops:
            assert "▶" in label(app_, (h.level, h.idx)) and f"{h.similarity:.2f}" in label(app_, (h.level, h.idx))
        assert app_._tnodes[(1, rv.path[0])].is_expanded
        leaf = (len(rv.path), rv.path[-1])
        assert app_.query_one("#tree", Tree).cursor_node.data == leaf and app_.selected == leaf
        others = [k for k in app_._tnodes if k not in {(h.level, h.idx) for h in rv.hops}]
        assert others and all("▶" not in label(app_, k) for k in others)
        await pilot.press("enter")  # Enter: to the tree
        assert app_.focused is app_.query_one("#tree", Tree)
        await pilot.press("escape")  # clears the search
        await pilot.pause()
        assert app_.route is None and not panel.has_class("-shown")
        assert all("▶" not in label(app_, k) for k in app_._tnodes)
        assert app_.query_one("#search", Input).value == ""

    drive(home, scenario)


def test_a_new_search_closes_what_the_last_one_opened_and_late_results_are_dropped(
    home: Path, console: Registry
) -> None:
    """Typing opens the path of each pause's text: a new path closes the nodes the previous search opened
    (not those the user opened), and a search that finishes after the text changed shows nothing."""
    titles = [r["title"] for r in console.db.query("select title from documents order by id")]
    with BankView("v", home) as view:
        routes = {view.search(f"Tell me about {t}.").path[0]: f"Tell me about {t}." for t in titles}
        assert len(routes) >= 2, "the console bank's documents should route under both level-1 nodes"
        (first, text_a), (second, text_b) = sorted(routes.items())[:2]
        stale = view.search(text_a)

    async def live(app_: BrowseApp, pilot: Pilot, text: str) -> None:
        app_.query_one("#search", Input).value = text
        await pilot.pause(0.6)  # the live search's delay
        await settle(app_, pilot)

    async def scenario(app_: BrowseApp, pilot: Pilot) -> None:
        await pilot.press("slash")
        await live(app_, pilot, text_a)
        assert app_.route is not None and app_.route.path[0] == first
        assert app_._tnodes[(1, first)].is_expanded and not app_._tnodes[(1, second)].is_expanded
        await live(app_, pilot, text_b)
        assert app_.route is not None and app_.route.path[0] == second
        assert app_._tnodes[(1, second)].is_expanded and not app_._tnodes[(1, first)].is_expanded
        app_._searched(text_a, stale)  # an older search's result arriving late
        await pilot.pause()
        assert app_.route is not None and app_.route.text == text_b
        assert not app_._tnodes[(1, first)].is_expanded
        app_._tnodes[(1, first)].expand()  # the user opens it
        await live(app_, pilot, text_b + " ")
        assert app_._tnodes[(1, first)].is_expanded  # a search closes only what a search opened
        await pilot.press("escape")  # clearing leaves the tree as it is
        await pilot.pause()
        assert app_.route is None and app_._tnodes[(1, first)].is_expanded and app_._tnodes[(1, second)].is_expanded

    drive(home, scenario)


def test_block_and_unblock_a_node_with_confirmation(home: Path, console: Registry) -> None:
    async def scenario(app_: BrowseApp, pilot: Pilot) -> None:
        await to_node(app_, pilot, (1, 1))
        await pilot.press("b")
        assert isinstance(app_.screen, ConfirmScreen) and "Block 1:1" in Text.from_markup(app_.screen.body).plain
        await pilot.press("n")  # cancelled: nothing happens
        await settle(app_, pilot)
        assert console.block(1, 1)["blocked"] == 0 and privacy_log("v", home) == []
        await pilot.press("b", "y")
        await settle(app_, pilot)
        assert console.block(1, 1)["blocked"] == 1 and "BLOCKED" in label(app_, (1, 1))
        entry = privacy_log("v", home)[-1]
        assert (entry["action"], entry["target"], entry["reason"]) == ("block", "1:1", "memctl browse")
        assert json.loads(entry["detail"])["selector"]["nodes"] == ["1:1"]  # as `memctl block --node 1:1`
        assert "blocked" in text(app_, "#block")
        await pilot.press("b")
        assert "Unblock 1:1" in Text.from_markup(app_.screen.body).plain
        await pilot.press("y")
        await settle(app_, pilot)
        assert console.block(1, 1)["blocked"] == 0 and "BLOCKED" not in label(app_, (1, 1))
        assert [e["action"] for e in privacy_log("v", home)] == ["block", "unblock"]
        assert not app_.query_one(TaskBar).has_class("-busy")

    drive(home, scenario)


def test_block_and_unblock_a_document(home: Path, console: Registry) -> None:
    node = shaped_node(home, LONG_ID)

    async def scenario(app_: BrowseApp, pilot: Pilot) -> None:
        await to_doc(app_, pilot, node, LONG_ID)
        await pilot.press("d")
        assert isinstance(app_.screen, ConfirmScreen)
        await pilot.press("escape")
        assert privacy_log("v", home) == []
        await pilot.press("d", "y")
        await settle(app_, pilot)
        shaped = {b["block"] for b in audit_doc("v", LONG_ID, home)["blocks"]}
        blocked = {r["id"] for r in console.blocks("blocked = 1")}
        assert shaped <= blocked and blocked
        entry = privacy_log("v", home)[-1]
        assert entry["action"] == "block" and json.loads(entry["detail"])["selector"]["docs"] == [LONG_ID]
        assert "BLOCKED" in text(app_, "#doctext")
        await pilot.press("d", "y")
        await settle(app_, pilot)
        assert console.blocks("blocked = 1") == [] and privacy_log("v", home)[-1]["action"] == "unblock"

    drive(home, scenario)


def test_ask_through_a_nodes_path(home: Path, console: Registry) -> None:
    async def scenario(app_: BrowseApp, pilot: Pilot) -> None:
        await to_node(app_, pilot, (1, 0))
        await pilot.press("a")
        assert isinstance(app_.screen, AskScreen)
        await pilot.press("escape")  # cancelled
        assert not isinstance(app_.screen, AskScreen)
        await pilot.press("a", *"Neon is a noble gas", "enter")
        await settle(app_, pilot)
        await settle(app_, pilot)
        assert isinstance(app_.screen, AnswerScreen)
        res = app_.screen.res
        assert res.node == "1:0" and res.path[0] == 0 and res.blocks[0] == "1:0"
        assert "served 1:0" in plain(app_.screen.query_one("#path-answer", Static))
        await pilot.press("escape")
        assert not isinstance(app_.screen, AnswerScreen)
        assert privacy_log("v", home) == []  # asking changes nothing, as `memctl ask`

    drive(home, scenario)


def test_forget_a_document_shows_its_cost_then_forgets(
    home: Path, console: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs_before = console.count("documents")
    stages: list[str] = []
    step = TaskBar.step

    def record(self: TaskBar, stage: str, done: int, total: int) -> None:
        stages.append(stage)
        step(self, stage, done, total)

    monkeypatch.setattr(TaskBar, "step", record)

    node = shaped_node(home, LONG_ID)

    async def scenario(app_: BrowseApp, pilot: Pilot) -> None:
        await to_doc(app_, pilot, node, LONG_ID)
        await pilot.press("f")
        assert isinstance(app_.screen, ConfirmScreen)
        body = Text.from_markup(app_.screen.body).plain
        assert "retrain" in body and "unit(s)" in body and "tokens per epoch" in body and "cannot be undone" in body
        await pilot.press("n")
        await settle(app_, pilot)
        assert console.count("documents") == docs_before
        await pilot.press("f", "y")
        await settle(app_, pilot)
        assert console.count("documents") == docs_before - 1
        assert not console.windows("doc_id = ?", [LONG_ID])
        entry = privacy_log("v", home)[-1]
        assert (entry["action"], entry["target"], entry["reason"]) == ("forget", LONG_ID, "exact")
        assert app_.selected_doc != LONG_ID and LONG_ID not in text(app_, "#doctext")
        assert app_.query_one(Overview).data["documents"] == docs_before - 1
        assert not app_.query_one(TaskBar).has_class("-busy") and not app_.busy
        assert any(s.startswith("retrain unit") for s in stages) and len(set(stages)) > 2  # progress was shown

    drive(home, scenario)


def test_an_error_in_a_worker_is_its_own_line(
    home: Path, console: Registry, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A bug in the live search's worker ends the app; the command names the error itself (Textual hands it
    over wrapped in WorkerFailed), in one line and without a traceback."""
    import typer

    from memctl.cli.common import run
    from memctl.tui.base import run_app

    def broken(self: BankView, text: str) -> None:
        raise KeyError("a bug in search")

    def search_soon(self: BrowseApp) -> None:
        self._search("Helium is a light gas")

    monkeypatch.setattr(BankView, "search", broken)
    monkeypatch.setattr(BrowseApp, "on_ready", search_soon, raising=False)
    monkeypatch.delenv("MEMCTL_DEBUG", raising=False)
    with BankView("v", home) as view:
        app_ = BrowseApp(view)
        with pytest.raises(typer.Exit) as ended:
            run(lambda: run_app(app_, headless=True))
    assert ended.value.exit_code == 3 and isinstance(app_.failure, KeyError)
    out = capfd.readouterr()
    assert "Traceback" not in out.out + out.err and "WorkerFailed" not in out.err
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert lines == ["internal error: KeyError: 'a bug in search' (MEMCTL_DEBUG=1 shows the traceback)"]
