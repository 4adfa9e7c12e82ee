"""`memctl doctor`: check a bank (and repair it with --repair); the exit code says whether it is healthy."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import BankOpt, JsonOpt, NoWaitOpt, app, err, out, print_json, run, stage_progress


@app.command()
def doctor(
    bank: BankOpt,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Fix what can be fixed safely: remove leftovers and orphan files, re-queue damaged blocks for "
            "retraining, mark dead runs interrupted; the exact command is printed for the rest.",
        ),
    ] = False,
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Check the registry, every block file against its checksum, orphan files, runs, checkpoints and
    leftovers of killed commands. Exit 0: healthy; 1: a problem remains."""
    from ..ops.doctor import doctor as do_doctor

    def go():  # noqa: ANN202
        with stage_progress(not as_json) as progress:
            return do_doctor(bank, repair=repair, progress=progress)

    report = run(go, no_wait)
    if as_json:
        print_json(report.to_dict())
    else:
        if report.busy:
            err.print(
                f"[yellow]{report.busy} is writing to bank {bank}: checks that need a quiet bank were skipped[/yellow]"
            )
        for f in report.findings:
            if f.repaired:
                mark = "[green]repaired[/green]"
            elif f.problem:
                mark = "[red]problem[/red] "
            else:
                mark = "[dim]note[/dim]    "
            out.print(f"{mark}  {f.check}: {f.message}", highlight=False, soft_wrap=True)
            if f.fix and not f.repaired:
                out.print(f"          fix: {f.fix}", highlight=False, soft_wrap=True)
        checked = ", ".join(f"{n} {k}" for k, n in report.checked.items())
        left = sum(1 for f in report.findings if f.problem and not f.repaired)
        fixed = sum(1 for f in report.findings if f.repaired)
        if report.healthy:
            verdict = f"bank {bank} is healthy" + (f" ({fixed} problem(s) repaired)" if fixed else "")
            out.print(f"[green]{verdict}[/green]" + (f"; checked {checked}" if checked else ""), highlight=False)
        else:
            hint = "" if repair else f"; `memctl doctor --bank {bank} --repair` fixes what it safely can"
            out.print(f"[red]bank {bank} has {left} problem(s){hint}[/red]", highlight=False, soft_wrap=True)
    if not report.healthy:
        raise typer.Exit(1)
