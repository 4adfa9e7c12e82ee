"""`memctl chat` under Textual's pilot: the path view beside the conversation shows where each message
routed (as `ask` routes it), each level's similarity, the gate's verdict and the blocks served."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_browse import console_home
from test_tui_browse import plain
from textual.widgets import Input

from memctl.registry import Registry
from memctl.serve.chat import Chat, ChatSettings
from memctl.serve.session import BankSession
from memctl.tui.chat import ChatApp, Message
from memctl.tui.widgets import HelpScreen, PathView


@pytest.fixture()
def console(tmp_path_factory: pytest.TempPathFactory, tiny_anchor: Path, home: Path) -> Registry:
    return console_home(tmp_path_factory, tiny_anchor, home)


def test_chat_shows_the_path_beside_the_conversation(home: Path, console: Registry) -> None:
    async def go() -> None:
        session = BankSession("v", home)
        chat = Chat(session, ChatSettings(max_new_tokens=4))
        app_ = ChatApp(chat)
        try:
            async with app_.run_test(size=(120, 36)) as pilot:
                path = app_.query_one("#path", PathView)
                assert "where each message routes" in plain(path)
                assert app_.focused is app_.query_one("#input", Input)
                await pilot.press(*"Helium is a light gas", "enter")
                await app_.workers.wait_for_complete()
                await pilot.pause()
                turn = chat.history[-1]
                assert path.route is not None and path.route.path == turn.path
                shown = plain(path)
                assert all(f"{h.id}" in shown and f"{h.similarity:.2f}" in shown for h in path.route.hops)
                assert "nearest windows" in shown and ("served" in shown or "anchor alone" in shown)
                if not turn.unrelated:
                    assert "served " + ", ".join(turn.blocks) in shown
                assert any("user" in m.classes for m in app_.query(Message))
                await pilot.press("f4")  # the anchor alone
                await pilot.press(*"Neon glows red", "enter")
                await app_.workers.wait_for_complete()
                await pilot.pause()
                assert "anchor alone" in plain(path) and chat.history[-1].blocks == []
                assert path.route is not None and path.route.text == "Neon glows red"
                await pilot.press("f1")
                assert isinstance(app_.screen, HelpScreen)
                await pilot.press("escape")
                assert not isinstance(app_.screen, HelpScreen)
        finally:
            session.close()

    asyncio.run(go())


def test_an_error_in_the_app_is_one_line(
    home: Path, console: Registry, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """An unhandled error inside the app ends it and reaches the command, which says it in one line; Textual
    alone would print a traceback with locals."""
    import typer

    from memctl.cli.common import run
    from memctl.tui.base import run_app

    def broken(self: ChatApp) -> None:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setattr(ChatApp, "on_mount", broken)
    monkeypatch.delenv("MEMCTL_DEBUG", raising=False)
    session = BankSession("v", home)
    try:
        app_ = ChatApp(Chat(session, ChatSettings(max_new_tokens=4)))
        with pytest.raises(typer.Exit) as ended:
            run(lambda: run_app(app_, headless=True))
    finally:
        session.close()
    assert ended.value.exit_code == 3 and isinstance(app_.failure, RuntimeError)
    out = capfd.readouterr()
    assert "Traceback" not in out.out + out.err and "a bug in a handler" not in out.out
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert lines == ["internal error: RuntimeError: a bug in a handler (MEMCTL_DEBUG=1 shows the traceback)"]
