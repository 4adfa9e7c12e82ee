"""`memctl chat`: a Textual app over memctl.serve.chat.

Type a message and press Enter: the reply streams in, followed by the path that was fetched (with a
label per node), what was retrieved, and how long routing, fetching and the first token took. Beside
the conversation, the path view of `memctl browse`: where the message routed, each level's similarity,
the relevance gate's verdict, the nearest windows in the leaf, and the blocks served.
Keys switch the memory mode (fetched, generic, anchor alone), RAG and what routing reads (the message
or the whole conversation); F7 answers the last message in every mode side by side.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, Input, Static

from ..core.errors import MemctlError
from ..ops.browse import RouteView, route_view
from ..serve.chat import Chat, ChatSettings, Turn, describe
from .base import MemctlApp, run_app
from .widgets import HelpScreen, PathView

MODE_NAMES = {"fetched": "fetched memories", "generic": "generic memory", "none": "anchor alone"}


HELP = "\n\n".join(
    [
        "[b]memctl chat[/b]: each message routes through the bank's tree and fetches only its path's blocks.",
        "[b]F2[/b] fetched memories · [b]F3[/b] the generic memory · [b]F4[/b] the anchor alone · [b]F5[/b] RAG on/off"
        " · [b]F6[/b] route on the message or the whole conversation · [b]F7[/b] the last message in every mode"
        " · [b]F1[/b] this help · [b]Ctrl+Q[/b] quit",
        "The path view beside the conversation shows where the message routed: each level's node with its "
        "similarity and label, the relevance gate's verdict (a message unrelated to the bank fetches nothing), "
        "the nearest windows in the leaf, and the blocks served or withheld.",
    ]
)


class Message(Static):
    pass


def served(turn: Turn) -> str:
    """What a turn's path view notes under the route: the blocks served, or why none were."""
    st = turn.settings
    if turn.unrelated:
        return "[b]anchor alone[/b]: the gate fetched nothing"
    if st.mode == "none":
        return "[b]anchor alone[/b] (F4): nothing fetched"
    if st.mode == "generic":
        return "[b]generic memory[/b] (F3): the path is not used"
    note = f"served {', '.join(turn.blocks) or 'no trained block'}"
    return note + (f"; [b red]withheld[/b red] {', '.join(turn.withheld)}" if turn.withheld else "")


class ChatApp(MemctlApp):
    TITLE = "memctl chat"
    CSS_PATH = "memctl.tcss"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("f1", "help", "Help", show=False),  # the input's placeholder says so
        Binding("f2", "mode('fetched')", "Fetched"),
        Binding("f3", "mode('generic')", "Generic"),
        Binding("f4", "mode('none')", "Anchor"),
        Binding("f5", "toggle_rag", "RAG"),
        Binding("f6", "toggle_route", "Route"),
        Binding("f7", "compare", "Compare"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    def __init__(self, chat: Chat) -> None:
        super().__init__()
        self.chat = chat
        self.busy = False

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            with Vertical(id="conversation"):
                yield VerticalScroll(id="log")
                yield Input(placeholder="Ask the bank… (F1: help)", id="input")
            yield PathView(id="path")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"bank {self.chat.session.reg.name}"
        self._status()
        self.query_one("#path", PathView).show(None, "[dim]where each message routes shows here[/dim]")
        self.query_one(Input).focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(HELP))

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

        path = self.query_one("#path", PathView)
        try:
            rv = self._route(text)
            self.call_from_thread(path.show, rv, "[dim]answering…[/dim]")
            turn = self.chat.turn(text, on_text)
            self.call_from_thread(path.show, rv, served(turn))
            self.call_from_thread(self._finish, reply, turn)
        except MemctlError as e:
            self.call_from_thread(self._fail, reply, str(e))
        except Exception as e:  # a bug: one line, as the CLI says it
            first = (str(e).strip().splitlines() or [""])[0]
            self.call_from_thread(self._fail, reply, f"internal error: {type(e).__name__}: {first}")

    def _route(self, text: str) -> RouteView:
        """Where the turn about to be answered routes: what `Chat.turn` routes, judged as it judges."""
        st = self.chat.settings
        routed = text if st.route_on == "message" else "\n".join([t.user for t in self.chat.history] + [text])
        return route_view(self.chat.session, routed, self.chat.label, judge=st.mode != "none" or st.rag)

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
        except Exception as e:  # a bug: one line, as the CLI says it
            first = (str(e).strip().splitlines() or [""])[0]
            self.call_from_thread(self.notify, f"internal error: {type(e).__name__}: {first}", severity="error")
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
    run_app(ChatApp(chat))


__all__ = ["ChatApp", "ChatSettings", "run_chat"]
