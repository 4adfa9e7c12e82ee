"""SVG snapshots (pytest-textual-snapshot) of the console's overview, its tree with a search, and the
chat with its path view, at 80x24 and 160x48, on the console bank (tests/test_browse.py), whose times
and sources are fixed first and whose chat clock is a counter: nothing rendered depends on when or
where the test ran. Update them with `pytest tests/test_tui_snapshots.py --snapshot-update`."""

from __future__ import annotations

import itertools
import types
from pathlib import Path
from typing import Any

import pytest
from test_browse import console_home, normalise
from textual.pilot import Pilot

from memctl.ops.browse import BankView
from memctl.privacy.controls import set_blocked
from memctl.registry import Registry
from memctl.serve.chat import Chat, ChatSettings
from memctl.serve.session import BankSession
from memctl.tui.browse import BrowseApp
from memctl.tui.chat import ChatApp

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]
QUERY = "Neon is a noble gas that glows red in signs."
LONG_REASON = "withheld at the request of the owner of these notes, until the review of the glowing-sign series ends"


@pytest.fixture()
def console(tmp_path_factory: pytest.TempPathFactory, tiny_anchor: Path, home: Path) -> Registry:
    reg = console_home(tmp_path_factory, tiny_anchor, home)
    set_blocked("v", True, nodes=["2:3"], reason=LONG_REASON, home=home)
    normalise(reg)
    return reg


async def settle(pilot: Pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES)
def test_overview(snap_compare: Any, home: Path, console: Registry, size: tuple[int, int]) -> None:
    with BankView("v", home) as view:
        assert snap_compare(BrowseApp(view), terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
def test_tree_with_a_search(snap_compare: Any, home: Path, console: Registry, size: tuple[int, int]) -> None:
    async def search(pilot: Pilot) -> None:
        await pilot.press("slash", *QUERY, "enter")
        await settle(pilot)

    with BankView("v", home) as view:
        assert snap_compare(BrowseApp(view), terminal_size=size, run_before=search)


@pytest.mark.parametrize("size", SIZES)
def test_chat_with_its_path_view(
    snap_compare: Any, home: Path, console: Registry, size: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import memctl.serve.chat

    ticks = itertools.count()
    monkeypatch.setattr(memctl.serve.chat, "time", types.SimpleNamespace(perf_counter=lambda: 0.01 * next(ticks)))

    async def talk(pilot: Pilot) -> None:
        await pilot.press(*QUERY, "enter")
        await settle(pilot)

    session = BankSession("v", home)
    try:
        app_ = ChatApp(Chat(session, ChatSettings(max_new_tokens=8)))
        assert snap_compare(app_, terminal_size=size, run_before=talk)
    finally:
        session.close()
