"""Pieces the bank browser and the chat share: the routed-path view, a stacked bar, the progress
line of a running action, and the modal screens (confirm, ask, answers, help)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, ProgressBar, Static

from ..ops.browse import AskResult, RouteView
from ..registry import block_id


class StackedBar:
    """A one-line bar split into coloured parts, as wide as it is given (each non-empty part gets
    at least one cell)."""

    def __init__(self, parts: Sequence[tuple[int, str]], empty: str = "grey30") -> None:
        self.parts = [(n, s) for n, s in parts if n > 0]
        self.empty = empty

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(4, options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(1, options.max_width)
        total = sum(n for n, _ in self.parts)
        if not total:
            yield Segment("░" * width, Style.parse(self.empty))
            return
        cells = [max(1, int(width * n / total)) for n, _ in self.parts]
        while sum(cells) > width and max(cells) > 1:  # more parts than cells: the widest give way
            cells[cells.index(max(cells))] -= 1
        i = 0
        while sum(cells) < width:  # rounding: the remainder goes to the parts in turn, largest first
            order = sorted(range(len(cells)), key=lambda j: -self.parts[j][0])
            cells[order[i % len(order)]] += 1
            i += 1
        for c, (_, style) in zip(cells, self.parts, strict=True):
            yield Segment("█" * c, Style.parse(style))


def fit(text: str, n: int) -> str:
    """`text` on one line, cut to `n` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: max(0, n - 1)] + "…"


def duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def gate_line(rv: RouteView) -> Text:
    if rv.floor <= 0:
        return Text.from_markup(f"gate off · relevance {rv.relevance:.2f}")
    if rv.unrelated:
        return Text.from_markup(
            f"[b red]unrelated[/b red] · relevance {rv.relevance:.2f} < floor {rv.floor:.2f}: "
            "nothing fetched, the anchor answers alone"
        )
    return Text.from_markup(f"[b green]related[/b green] · relevance {rv.relevance:.2f} ≥ floor {rv.floor:.2f}")


def route_renderable(rv: RouteView, note: str = "") -> Group:
    """The path with each level's similarity and label, the gate's verdict, the leaf's nearest windows."""
    hops = Table.grid(padding=(0, 1), expand=True)
    hops.add_column(no_wrap=True)
    hops.add_column(justify="right", no_wrap=True)
    hops.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
    for h in rv.hops:
        state = "[b red]BLOCKED[/b red]" if h.blocked else "" if h.state == "trained" else f"[dim]{h.state}[/dim]"
        hops.add_row(f"[b]{h.id}[/b]", f"{h.similarity:.2f}", Text.from_markup(f"{state} {escape(h.label)}".strip()))
    near = Table.grid(padding=(0, 1), expand=True)
    near.add_column(justify="right", no_wrap=True)
    near.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
    for w in rv.windows:
        near.add_row(f"{w.score:.2f}", Text.from_markup(f"[b]{escape(w.doc_id)}[/b] {escape(w.snippet)}"))
    leaf = rv.hops[-1].id if rv.hops else "-"
    parts: list[Text | Table] = [gate_line(rv), hops]
    if note:
        parts.append(Text.from_markup(note))
    parts.append(
        Text.from_markup(f"[dim]nearest windows in {leaf}[/dim]" if rv.windows else "[dim]leaf is empty[/dim]")
    )
    parts.append(near)
    return Group(*parts)


class PathView(Static):
    """Where a text routes: shown by the browser's search and beside the chat."""

    def show(self, rv: RouteView | None, note: str = "") -> None:
        self.route = rv
        if rv is None:
            self.update(note or "[dim]no route yet[/dim]")
            self.border_title = "route"
            return
        self.border_title = f"route: {fit(rv.text, 40)}"
        self.update(route_renderable(rv, note))


class TaskBar(Horizontal):
    """The running action and its progress (hidden when idle)."""

    def compose(self) -> ComposeResult:
        yield Label("", id="task-label")
        yield ProgressBar(total=1, show_eta=False, id="task-progress")

    def start(self, title: str) -> None:
        self._title = title
        self.query_one("#task-label", Label).update(escape(title))
        self.query_one(ProgressBar).update(total=None, progress=0)
        self.add_class("-busy")

    def step(self, stage: str, done: int, total: int) -> None:
        self.query_one("#task-label", Label).update(escape(f"{self._title}: {stage}"))
        self.query_one(ProgressBar).update(total=max(total, 1), progress=done)

    def stop(self) -> None:
        self.remove_class("-busy")


class ConfirmScreen(ModalScreen[bool]):
    """A question with Yes / Cancel (keys y and n or Escape); Cancel has the focus."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "Cancel")]

    def __init__(self, title: str, body: str, yes: str = "Yes") -> None:
        super().__init__(classes="modal")
        self.title_text, self.body, self.yes = title, body, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as d:
            d.border_title = self.title_text
            yield Static(self.body, classes="body")
            with Horizontal(classes="buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="yes")
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class AskScreen(ModalScreen[str | None]):
    """A question to answer through a node's path (Enter asks, Escape cancels)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, node: str, label: str) -> None:
        super().__init__(classes="modal")
        self.node, self.label = node, label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as d:
            d.border_title = f"ask through {self.node}"
            yield Static(
                f"The question is answered with the blocks on the path through [b]{escape(self.node)}[/b] "
                f"({escape(fit(self.label, 60))}), forced, and by the anchor alone. Enter asks, Escape cancels.",
                classes="body",
            )
            yield Input(placeholder="question…", id="question")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


class AnswerScreen(ModalScreen[None]):
    """A forced-path answer beside the anchor alone's."""

    BINDINGS = [Binding("escape,enter,q", "close", "Close")]

    def __init__(self, res: AskResult) -> None:
        super().__init__(classes="modal")
        self.res = res

    def compose(self) -> ComposeResult:
        r = self.res
        if r.mode == "generic":
            how = "the generic memory"
        else:
            nodes = " / ".join(block_id(lv + 1, n) for lv, n in enumerate(r.path))
            how = f"path {nodes}; served {', '.join(r.blocks) or 'nothing'}"
            how += f"; withheld {', '.join(r.withheld)}" if r.withheld else ""
        with Vertical(classes="dialog wide") as d:
            d.border_title = f"{r.node}: {fit(r.question, 50)}"
            with Horizontal(classes="answers"):
                with VerticalScroll(classes="answer") as a:
                    a.border_title = "through the path"
                    yield Static(f"[dim]{escape(how)}[/dim]\n{escape(r.answer) or '(no answer)'}", id="path-answer")
                with VerticalScroll(classes="answer") as b:
                    b.border_title = "anchor alone"
                    yield Static(escape(r.anchor_answer) or "(no answer)", id="anchor-answer")
            same = "the same answer as the anchor alone; " if r.answer == r.anchor_answer else ""
            yield Static(f"[dim]{same}Escape closes[/dim]")

    def action_close(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, text: str) -> None:
        super().__init__(classes="modal")
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide") as d:
            d.border_title = "help (Escape closes)"
            yield Static(self.text, classes="body")

    def action_close(self) -> None:
        self.dismiss(None)
