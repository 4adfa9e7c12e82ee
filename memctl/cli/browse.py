"""`memctl browse`: the bank browser (cluster tree, documents, blocks)."""

from __future__ import annotations

import sys

from ..errors import InputError
from .common import BankOpt, app, run


@app.command()
def browse(bank: BankOpt) -> None:
    """Browse the cluster tree, the documents that shaped each block, and the blocks each document
    shaped; `b` blocks or unblocks the selected block."""
    from ..browse import BankView

    def open_view() -> BankView:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise InputError("the browser needs a terminal; use `memctl info` and `memctl audit` in scripts")
        return BankView(bank)

    view = run(open_view)
    try:
        from ..tui.browse import run_browse

        run_browse(view)
    finally:
        view.close()
