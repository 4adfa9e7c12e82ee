"""What memctl's Textual apps share: an unhandled error ends the app and reaches the command that ran it,
which says it in one line as every command does (Textual itself prints a full traceback with locals)."""

from __future__ import annotations

from textual.app import App
from textual.worker import WorkerFailed


class MemctlApp(App[None]):
    failure: Exception | None = None  # the first unhandled error, raised again by `run_app`

    def _handle_exception(self, error: Exception) -> None:  # Textual's hook for an unhandled error
        if isinstance(error, WorkerFailed) and isinstance(error.error, Exception):
            error = error.error  # a worker's own error: a MemctlError keeps its line and exit code
        self._return_code = 1
        if self.failure is None:
            self.failure = error
            self._exception = error  # kept as Textual keeps it: a test's pilot raises it
            self._exception_event.set()
        self._close_messages_no_wait()


def run_app(app: MemctlApp, headless: bool = False) -> None:
    """Run `app` in the terminal; its unhandled error, if any, is raised here once the screen is restored (the
    command says it in one line; with MEMCTL_DEBUG=1, with its traceback)."""
    app.run(headless=headless)
    if app.failure is not None:
        raise app.failure
