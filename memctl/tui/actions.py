"""The browser's actions: each behind a confirmation, run in a worker with the TaskBar's progress, and
written to the privacy log by the library call its CLI command makes (memctl.ops.browse.BankView)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.markup import escape
from textual import work
from textual.widgets import Static

from ..core.errors import MemctlError
from ..ops.browse import AskResult, BankView
from .base import MemctlApp
from .widgets import AnswerScreen, AskScreen, ConfirmScreen, TaskBar, duration, fit

Key = tuple[int, int]


class BrowseActions(MemctlApp):
    """Block/unblock a node (`b`) or a document (`d`), ask through a node's path (`a`), forget a
    document (`f`). The app (memctl.tui.browse.BrowseApp) provides the state and the views below."""

    view: BankView
    selected: Key | None
    selected_doc: str | None
    busy: bool

    def _relabel(self, key: Key) -> None:
        raise NotImplementedError

    def _all_keys(self) -> list[Key]:
        raise NotImplementedError

    def show_block(self, key: Key) -> None:
        raise NotImplementedError

    def show_doc(self, doc_id: str) -> None:
        raise NotImplementedError

    def _build(self) -> None:
        raise NotImplementedError

    def _overview(self) -> None:
        raise NotImplementedError

    # ---- actions ------------------------------------------------------------------------------------------
    def _start(self, title: str, fn: Callable[[Callable[[str, int, int], None]], Any],
               done: Callable[[Any], None]) -> None:  # fmt: skip
        if self.busy:
            self.notify("an action is still running", severity="warning")
            return
        self.busy = True
        bar = self.query_one(TaskBar)
        bar.start(title)
        self._worker(fn, done, bar)

    @work(thread=True, exclusive=True, group="action")
    def _worker(
        self, fn: Callable[[Callable[[str, int, int], None]], Any], done: Callable[[Any], None], bar: TaskBar
    ) -> None:
        def progress(stage: str, n: int, total: int) -> None:
            self.call_from_thread(bar.step, stage, n, total)

        try:
            result = fn(progress)
        except MemctlError as e:
            self.call_from_thread(self._finish, None, str(e))
            return
        except Exception as e:  # a bug: one line, as the CLI says it
            first = (str(e).strip().splitlines() or [""])[0]
            self.call_from_thread(self._finish, None, f"internal error: {type(e).__name__}: {first}")
            return
        self.call_from_thread(self._finish, lambda: done(result), None)

    def _finish(self, then: Callable[[], None] | None, error: str | None) -> None:
        self.busy = False
        self.query_one(TaskBar).stop()
        if error is not None:
            self.notify(error, severity="error")
        elif then is not None:
            then()

    def _confirm(self, title: str, body: str, yes: str, then: Callable[[], None]) -> None:
        if self.busy:
            self.notify("an action is still running", severity="warning")
            return

        def answered(ok: bool | None) -> None:
            if ok:
                then()

        self.push_screen(ConfirmScreen(title, body, yes), answered)

    def action_block_node(self) -> None:
        if self.selected is None:
            self.notify("select a node first", severity="warning")
            return
        key = self.selected
        info = self.view.node(*key)
        verb = "unblock" if info.blocked else "block"
        what = (
            "It is served again to every answer whose path crosses it."
            if info.blocked
            else "It is never read again until unblocked; answers use the other levels of their path."
        )
        body = (
            f"{verb.capitalize()} [b]{info.id}[/b] ({escape(fit(info.label, 60))})?\n{what}\n"
            "Recorded in the privacy log."
        )

        def go() -> None:
            self._start(f"{verb} {info.id}", lambda _: self.view.toggle_block(*key, reason="memctl browse"),
                        lambda now: self._blocked_node(key, now))  # fmt: skip

        self._confirm(f"{verb} node", body, verb.capitalize(), go)

    def _blocked_node(self, key: Key, now_blocked: bool) -> None:
        self._relabel(key)
        self.show_block(key)
        self.sub_title = self.view.summary()
        self.notify(f"{'blocked' if now_blocked else 'unblocked'} {self.view.node(*key).id}")

    def action_block_doc(self) -> None:
        doc = self.selected_doc
        if doc is None:
            self.notify("highlight a document first (Tab moves to the documents)", severity="warning")
            return
        verb = "unblock" if self.view.doc_blocked(doc) else "block"
        body = (
            f"{verb.capitalize()} every block document [b]{escape(doc)}[/b] shaped (as `memctl {verb} --doc`)?\n"
            "Recorded in the privacy log."
        )

        def go() -> None:
            self._start(f"{verb} {doc}", lambda _: self.view.toggle_doc(doc, reason="memctl browse"),
                        lambda now: self._blocked_doc(doc, now))  # fmt: skip

        self._confirm(f"{verb} document", body, verb.capitalize(), go)

    def _blocked_doc(self, doc: str, now_blocked: bool) -> None:
        for key in self._all_keys():
            self._relabel(key)
        if self.selected is not None:
            self.show_block(self.selected)
        self.show_doc(doc)
        self.sub_title = self.view.summary()
        self.notify(f"{'blocked' if now_blocked else 'unblocked'} the blocks {doc} shaped")

    def action_ask(self) -> None:
        if self.selected is None:
            self.notify("select a node first", severity="warning")
            return
        if self.busy:
            self.notify("an action is still running", severity="warning")
            return
        key = self.selected
        info = self.view.node(*key)

        def asked(question: str | None) -> None:
            if question:
                self._start(f"ask through {info.id}", lambda p: self.view.ask_path(*key, question, p),
                            self._answered)  # fmt: skip

        self.push_screen(AskScreen(info.id, info.label), asked)

    def _answered(self, res: AskResult) -> None:
        self.push_screen(AnswerScreen(res))

    def action_forget(self) -> None:
        doc = self.selected_doc
        if doc is None:
            self.notify("highlight a document first (Tab moves to the documents)", severity="warning")
            return
        try:
            plan = self.view.plan_forget(doc)
        except MemctlError as e:
            self.notify(str(e), severity="error")
            return
        if plan.units:
            est = f"about {duration(plan.est_seconds)}, as last time" if plan.est_seconds else "time unknown"
            cost = (
                f"retrain {len(plan.units)} unit(s) ({', '.join(plan.units)}) over {plan.tokens:,} tokens per epoch: "
                f"{est}"
            )
        else:
            cost = "no trained block to redo"
        body = (
            f"Forget [b]{escape(doc)}[/b]: {plan.windows} window(s), {plan.prompts} prompt(s); it shaped "
            f"{len(plan.shaped_blocks)} block(s).\nCost: {escape(cost)}.\n"
            "Then the proof of forgetting runs. [b]This cannot be undone.[/b] Recorded in the privacy log."
        )

        def go() -> None:
            def work_(p: Callable[[str, int, int], None]) -> Any:
                return self.view.forget_doc(
                    plan, p, lambda e: p(f"retrain unit {e.unit} ({e.unit_no + 1}/{e.n_units})", e.step, e.total_steps)
                )

            self._start(f"forget {doc}", work_, self._forgot)

        self._confirm("forget document", body, "Forget", go)

    def _forgot(self, report: Any) -> None:
        self.selected_doc = None
        self.query_one("#doctext", Static).update("")
        self._build()
        self._overview()
        if self.selected is not None:
            self.show_block(self.selected)
        self.notify(
            f"forgot {', '.join(report.docs)}: {report.blocks_replaced} block(s) retrained in {report.seconds:.0f} s; "
            f"report #{report.report_id}"
        )
