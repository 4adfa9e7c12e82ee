"""What `memctl train` prints when it is done: the prompts prepared, their coverage, and a row per unit."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.table import Table

from .common import coverage_line, err, out, print_json, run

if TYPE_CHECKING:
    from ..train.events import TrainResult


def report_training(bank: str, res: TrainResult, as_json: bool) -> None:
    """The report of a finished `memctl train` of `bank`, as JSON with
    `as_json`, else the prompts prepared and a table of the units trained, with the notes a user should see."""
    from ..ops.info import bank_missing_files
    from ..train.reprompt import bank_rules_note

    note = None if as_json else run(lambda: bank_rules_note(bank))
    if note:
        err.print(f"[yellow]note:[/yellow] {note}", highlight=False, soft_wrap=True)
    if as_json:
        print_json(
            {
                "bank": res.bank,
                "units": [u.__dict__ for u in res.units],
                "skipped": res.skipped,
                "tokens": res.tokens,
                "placement": res.placement,
                "prepare": res.prepare.__dict__ if res.prepare else None,
            }
        )
        return
    if not res.units:
        out.print(f"nothing to train: every unit of bank {bank!r} is trained (use --retrain to train again)")
        missing = run(lambda: bank_missing_files(bank))
        if missing:
            err.print(
                f"[yellow]but {len(missing)} block file(s) are missing ({', '.join(missing[:3])}): "
                f"`memctl doctor --bank {bank} --repair` re-queues them, then `memctl train` retrains them[/yellow]",
                highlight=False,
                soft_wrap=True,
            )
        return
    if res.prepare:
        p = res.prepare
        out.print(
            f"prompts: {p.prompts_total} ({p.prompts_added} new); routed to another leaf than their window: "
            f"{100 * p.route_differs_leaf:.0f}% (another level-1 subtree: {100 * p.route_differs_l1:.0f}%), "
            f"both paths trained; teacher cache {p.teacher_seconds:.0f}s"
            + (f"; self-study {p.study_added} new continuations, {p.study_seconds:.0f}s" if p.study_added else "")
        )
        if p.coverage:
            out.print(coverage_line(p.coverage))
        for note in p.notes:
            out.print(f"[yellow]{note}[/yellow]", highlight=False)
    table = Table(title=f"trained {len(res.units)} unit(s) of {bank} ({res.placement})")
    for col in (
        "unit",
        "steps",
        "tokens",
        "loss first→last",
        "preserve first→last",
        "held-out acc by epoch",
        "held-out loss first→best",
        "tok/s",
        "time",
    ):
        table.add_column(col, justify="right")
    for u in res.units:
        resumed = f" (resumed at {u.resumed_from})" if u.resumed_from else ""
        if u.restarts:  # memctl.train.diverge
            resumed += f" (loss diverged or drifted: restarted {u.restarts}x at a lower learning rate)"
        held = " ".join(f"{100 * h:.0f}" for h in u.heldout) + ("% (early stop)" if u.stopped_early else "%")
        table.add_row(
            u.unit,
            f"{u.steps}{resumed}",
            f"{u.tokens:,}",
            f"{u.loss_first:.3f} → {u.loss_last:.3f}",
            "-" if math.isnan(u.preserve_first) else f"{u.preserve_first:.3f} → {u.preserve_last:.3f}",
            held if u.heldout else "-",
            f"{u.heldout_loss[0]:.3f} → {min(u.heldout_loss):.3f}" if u.heldout_loss else "-",
            f"{u.tokens / max(u.seconds, 1e-9):.0f}",
            f"{u.seconds:.0f}s",
        )
    out.print(table)
