"""Commands that answer and measure: ask, eval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from .common import BankOpt, JsonOpt, app, err, out, run, stage_progress


@app.command()
def ask(
    prompt: Annotated[str, typer.Argument(help="The question or text to continue.")],
    bank: BankOpt,
    no_memory: Annotated[bool, typer.Option("--no-memory", help="Anchor alone.")] = False,
    generic: Annotated[bool, typer.Option("--generic", help="The generic memory instead of routed blocks.")] = False,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the anchor's chat template.")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 32,
    allow: Annotated[
        str | None,
        typer.Option(help="TAG,...: fetch only blocks whose every training document has one of these tags."),
    ] = None,
    cache_mb: Annotated[float, typer.Option(help="Byte budget of loaded blocks (MiB).")] = 512,
    as_json: JsonOpt = False,
) -> None:
    """Answer with the memory blocks the prompt routes to (only those are read)."""
    from ..errors import InputError
    from ..privacy import parse_tags
    from ..serve import ask as do_ask

    def go() -> Any:
        if no_memory and generic:
            raise InputError("--no-memory and --generic exclude each other")
        if max_new_tokens < 1:
            raise InputError("--max-new-tokens must be at least 1")
        mode = "none" if no_memory else "generic" if generic else "fetched"
        tags = parse_tags(allow) if allow is not None else None
        return do_ask(bank, prompt, mode=mode, max_new_tokens=max_new_tokens, chat=chat, allow=tags, cache_mb=cache_mb)

    d = run(go)
    if as_json:
        out.print_json(json.dumps(d))
        return
    out.print(d["answer"].strip(), highlight=False)
    where = {"none": "anchor alone", "generic": "generic memory"}.get(d["mode"])
    if where is None:
        where = f"path {'/'.join(map(str, d['path']))}, blocks {', '.join(d['blocks']) or 'none trained'}"
        if d["withheld"]:
            where += f" (withheld: {', '.join(d['withheld'])})"
    t = d["timings"]
    err.print(
        f"[dim]{where}; route {1e3 * t['route_s']:.0f} ms, fetch {1e3 * t['fetch_s']:.0f} ms, "
        f"generate {1e3 * t['generate_s']:.0f} ms[/dim]",
        highlight=False,
    )


@app.command("eval")
def eval_cmd(
    bank: BankOpt,
    probes: Annotated[Path, typer.Option(help="Probe JSONL: {doc, kind, prompt, answers}.")],
    setups: Annotated[
        str, typer.Option(help="Comma-separated: anchor, generic, fetched, oracle-rag (own document in the prompt).")
    ] = "anchor,generic,fetched",
    limit: Annotated[int | None, typer.Option(help="Evaluate a reproducible sample of N probes.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the --limit sample.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Probes per generation batch.")] = 16,
    as_json: JsonOpt = False,
) -> None:
    """Probe accuracy (with 95% Wilson intervals) of the anchor alone, the generic memory and fetched memories."""
    from ..evaluate import evaluate, load_probes, sample_probes, wilson
    from ..serve import BankSession

    def go() -> Any:
        ps = sample_probes(load_probes(probes), limit, seed)
        names = [s.strip() for s in setups.split(",") if s.strip()]
        with BankSession(bank) as session, stage_progress(not as_json) as progress:
            return evaluate(session, ps, names, batch_size=batch_size, progress=progress)

    results = run(go)
    if as_json:
        out.print_json(json.dumps({"bank": bank, "probes": str(probes), "results": [r.to_dict() for r in results]}))
        return
    kinds = sorted({k for r in results for k in r.per_kind})
    table = Table(title=f"probe accuracy on {bank} ({results[0].n} probes)")
    table.add_column("setup")
    table.add_column("accuracy", justify="right")
    table.add_column("95% CI", justify="right")
    for k in kinds:
        table.add_column(k, justify="right")
    table.add_column("time", justify="right")
    for r in results:
        lo, hi = wilson(r.correct, r.n)
        cells = [f"{100 * c / n:.1f}%" if n else "-" for c, n in (r.per_kind.get(k, (0, 0)) for k in kinds)]
        table.add_row(
            r.setup, f"{100 * r.accuracy:.1f}%", f"{100 * lo:.1f}–{100 * hi:.1f}%", *cells, f"{r.seconds:.0f}s"
        )
    out.print(table)
