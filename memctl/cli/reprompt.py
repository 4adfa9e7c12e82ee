"""`memctl reprompt`: rewrite the cloze prompts that older rules wrote (memctl.train.reprompt)."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import BankOpt, JsonOpt, NoWaitOpt, app, out, print_json, run


@app.command()
def reprompt(
    bank: BankOpt,
    all_windows: Annotated[
        bool, typer.Option("--all", help="Every window's prompts, not only those written by older rules.")
    ] = False,
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete the cloze and paraphrase prompts that older prompt rules wrote (and their teacher cache), with
    the echo questions that ask them back (`train --echo`), so that the next `memctl train` writes them with
    this memctl's rules and retrains every unit (all trained blocks become stale; they serve until
    retrained). Self-study continuations and anchor-written questions are kept, but
    for a document of sections (a register, minutes) whose seeds named its title: the next `train` samples
    its continuations again, one seed per section. A window whose prompts this memctl's rules write the same
    is kept as it is and recorded as written by them."""
    from ..train.reprompt import reprompt_bank

    rep = run(lambda: reprompt_bank(bank, all_windows=all_windows), no_wait)
    if as_json:
        print_json(rep.__dict__)
        return
    if not rep.windows:
        out.print(f"every window of bank {bank} has prompts from this memctl's rules: nothing to rewrite")
        return
    out.print(
        f"deleted {rep.prompts_deleted:,} prompts of {rep.windows:,} windows; {len(rep.stale_blocks)} trained "
        f"block(s) are now stale"
        + (f"; {rep.checkpoints_dropped} interrupted checkpoint(s) dropped" if rep.checkpoints_dropped else "")
        + f". `memctl train --bank {bank}` writes the prompts again and retrains.",
        highlight=False,
        soft_wrap=True,
    )
