"""`memctl browse`: the bank owner's console (overview, tree, search, block, ask, forget)."""

from __future__ import annotations

import json
import sys

from ..core.errors import InputError
from .common import BankOpt, JsonOpt, app, print_json, run


@app.command()
def browse(bank: BankOpt, as_json: JsonOpt = False) -> None:
    """A console over a bank: its overview (anchor, sizes, coverage, blocks per level, last evaluation,
    privacy log), its tree, live search routed as `ask` routes it, and actions (block, unblock, ask a
    node's path, forget), each confirmed and written to the privacy log. `?` lists the keys.
    --json prints the overview as JSON instead."""
    from ..ops.browse import BankView, overview_json

    if as_json:
        print_json(json.loads(run(lambda: overview_json(bank))))  # NaN as null
        return

    def open_view() -> BankView:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise InputError(
                "the browser needs a terminal; use `memctl browse --json`, `memctl info` and `memctl audit` in scripts"
            )
        return BankView(bank)

    view = run(open_view)
    try:
        from ..tui.browse import run_browse

        run(lambda: run_browse(view))  # an error in the app: one line once the screen is restored
    finally:
        view.close()
