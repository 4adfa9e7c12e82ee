"""`memctl chat`: a Textual app over memctl.chat.

Type a message and press Enter: the reply streams in, followed by the path that was fetched (with a
label per node), what was retrieved, and how long routing, fetching and the first token took.
Keys switch the memory mode (fetched, generic, anchor alone), RAG and what routing reads (the message
or the whole conversation); F7 answers the last message in every mode side by side.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer, Header, Input, Static

from ..chat import Chat, ChatSettings, Turn, describe
from ..errors import MemctlError

MODE_NAMES = {"fetched": "fetched memories", "generic": "generic memory", "none": "anchor alone"}


class Message(Static):
    DEFAULT_CSS = """
    Message { padding: 0 1; margin: 1 0 0 0; }
    Message.user { color: $text; background: $boost; }
    Message.assistant { color: $text; }
    Message.info { color: $text-muted; margin: 0; }
    Message.error { color: $error; }
    """


class ChatApp(App[None]):
    TITLE = "memctl chat"
    CSS = """
    #log { height: 1fr; }
    .compare { height: auto; }
    .compare > Message { width: 1fr; border: round $primary; }
    """
    BINDINGS = [
        Binding("f2", "mode('fetched')", "Fetched"),
        Binding("f3", "mode('generic')", "Generic"),
        Binding("f4", "mode('none')", "Anchor"),
        Binding("f5", "toggle_rag", "RAG"),
        Binding("f6", "toggle_route", "Route on"),
        Binding("f7", "compare", "Compare"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    def __init__(self, chat: Chat) -> None:
        super().__init__()
        self.chat = chat
        self.busy = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield VerticalScroll(id="log")
        yield Input(placeholder="Ask the bank…", id="input")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"bank {self.chat.session.reg.name}"
        self._status()
        self.query_one(Input).focus()

    # ---- settings ---------------------------------------------------------------------------------------
    def _status(self) -> None:
        st = self.chat.settings
        self.sub_title = (
            f"bank {self.chat.session.reg.name} · {MODE_NAMES[st.mode]} · RAG {'on' if st.rag else 'off'} · "
            f"routing on the {st.route_on}"
        )

    def _set(self, **changes: Any) -> None:
        from dataclasses import replace

        self.chat.settings = replace(self.chat.settings, **changes)
        self._status()

    def action_mode(self, mode: str) -> None:
        self._set(mode=mode)

    def action_toggle_rag(self) -> None:
        self._set(rag=not self.chat.settings.rag)

    def action_toggle_route(self) -> None:
        self._set(route_on="conversation" if self.chat.settings.route_on == "message" else "message")

    # ---- turns ---------------------------------------------------------------------------------------------
    async def _add(self, widget: Static) -> None:
        log = self.query_one("#log", VerticalScroll)
        await log.mount(widget)
        log.scroll_end(animate=False)

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text or self.busy:
            return
        event.input.value = ""
        await self._add(Message(escape(text), classes="user"))
        reply = Message("…", classes="assistant")
        await self._add(reply)
        self.busy = True
        self.answer(text, reply)

    @work(thread=True, exclusive=True)
    def answer(self, text: str, reply: Message) -> None:
        pieces: list[str] = []

        def on_text(piece: str) -> None:
            pieces.append(piece)
            self.call_from_thread(reply.update, escape("".join(pieces)))

        try:
            turn = self.chat.turn(text, on_text)
            self.call_from_thread(self._finish, reply, turn)
        except MemctlError as e:
            self.call_from_thread(self._fail, reply, str(e))

    async def _finish(self, reply: Message, turn: Turn) -> None:
        reply.update(escape(turn.reply) or "(no reply)")
        await self._add(Message(escape(describe(turn)), classes="info"))
        self.busy = False

    async def _fail(self, reply: Message, error: str) -> None:
        reply.update(escape(f"error: {error}"))
        reply.add_class("error")
        self.busy = False

    def action_compare(self) -> None:
        if self.busy or not self.chat.history:
            self.notify("ask something first", severity="warning")
            return
        self.busy = True
        self.compare(self.chat.history[-1].user)

    @work(thread=True, exclusive=True)
    def compare(self, text: str) -> None:
        try:
            turns = self.chat.compare()
        except MemctlError as e:
            self.call_from_thread(self.notify, str(e), severity="error")
            turns = []
        self.call_from_thread(self._show_compare, text, turns)

    async def _show_compare(self, text: str, turns: list[Turn]) -> None:
        if turns:
            await self._add(Message(escape(f"side by side: {text}"), classes="info"))
            row = Horizontal(classes="compare")
            await self._add(row)
            for t in turns:
                await row.mount(
                    Message(
                        f"[b]{MODE_NAMES[t.settings.mode]}[/b]\n{escape(t.reply)}\n[dim]{escape(describe(t))}[/dim]"
                    )
                )
        self.busy = False


def run_chat(chat: Chat) -> None:
    ChatApp(chat).run()


__all__ = ["ChatApp", "ChatSettings", "run_chat"]
