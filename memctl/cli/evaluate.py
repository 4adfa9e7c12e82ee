"""`memctl eval`: the comparison table, full vs blocked banks, perplexity, reports and history."""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..core.errors import InputError, check_path
from ..core.probes import PROBE_TOKENS
from ..eval.report import ci, gate_line, missed, pct, write_report
from .common import (
    AnchorMixOpt,
    BankOpt,
    DeviceOpt,
    DtypeOpt,
    Int8Opt,
    JsonOpt,
    LexicalOpt,
    MinRelevanceOpt,
    RelevanceRampOpt,
    app,
    err,
    human_params,
    out,
    print_json,
    readable,
    run,
    stage_progress,
)


def parse_fractions(text: str | None) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InputError(f"--block-fraction takes comma-separated numbers in [0, 1], got {text!r}") from None
    return values


@app.command("eval")
def eval_cmd(
    bank: BankOpt,
    probes: Annotated[Path | None, typer.Option(help="Probe JSONL: {doc, kind, prompt, answers} per line.")] = None,
    setups: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated, default all: anchor, generic, fetched, rag, rag+fetched, oracle-rag, "
            "fetched-corrupted."
        ),
    ] = None,
    beam: Annotated[int, typer.Option(help="Also fetch the N best leaves and their ancestors (N > 1).")] = 1,
    block_fraction: Annotated[
        str | None,
        typer.Option(help="e.g. 0,0.0625,0.125,0.25: block the best-matching fraction of the bank per probe."),
    ] = None,
    blocking: Annotated[
        str, typer.Option(help="reroute (route around blocked nodes, the paper) or withhold (drop them).")
    ] = "reroute",
    perplexity: Annotated[
        Path | None, typer.Option(help="Documents (a file or directory, as ingest reads them): perplexity per setup.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Evaluate a reproducible sample of N probes.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the --limit sample.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Probes per generation batch.")] = 16,
    answer_tokens: Annotated[
        int,
        typer.Option(
            help="Greedy new tokens per probe answer; an answer counts when it appears in them "
            "(question-form probes, answered in a sentence that often says the question again first, want 32 or so)."
        ),
    ] = PROBE_TOKENS,
    chat: Annotated[
        bool,
        typer.Option(
            "--chat",
            help="Ask each probe in the anchor's chat template, as `memctl chat` does (its context too, in "
            "rag and oracle-rag): for question-form probes, with --answer-tokens 32 or so.",
        ),
    ] = False,
    allow: Annotated[
        str | None,
        typer.Option(help="TAG,...: evaluate what these access tags may see (blocks and RAG windows)."),
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option(
            help="Write report.md (with the probes the memories miss), PNG plots and answers.jsonl "
            "(every probe's answers) into this directory."
        ),
    ] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Start a new run instead of resuming a stopped one.")] = False,
    history: Annotated[bool, typer.Option("--history", help="Show the bank's past evaluation runs.")] = False,
    int8: Int8Opt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    min_relevance: MinRelevanceOpt = None,
    relevance_ramp: RelevanceRampOpt = None,
    lexical: LexicalOpt = None,
    anchor_mix: AnchorMixOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Probe accuracy (95% Wilson intervals) of every setup, routing agreement, beam, blocked fractions,
    perplexity. Runs are stored in the bank: the same command resumes a stopped run."""
    from ..core.config import check_seed
    from ..core.placement import CPU, placement
    from ..core.probes import load_probes, sample_probes
    from ..eval.evaluate import run_eval
    from ..eval.options import SETUPS, EvalOptions
    from ..registry.access import allow_tags
    from ..serve.session import BankSession

    if history:
        rows = run(lambda: _history(bank))
        if as_json:
            print_json(rows)
        else:
            _print_history(bank, rows)
        return

    def go() -> dict[str, Any]:
        if probes is None and perplexity is None:
            raise InputError("give --probes FILE and/or --perplexity FILE (or --history)")
        check_seed(seed)
        names = tuple(s.strip() for s in setups.split(",") if s.strip()) if setups else SETUPS
        opts = EvalOptions(
            names, beam, parse_fractions(block_fraction), blocking, batch_size, setups is not None, answer_tokens, chat
        )
        opts.check()
        if perplexity is not None and not perplexity.exists():
            raise InputError(f"--perplexity {perplexity}: no such file or directory")
        if report is not None:
            check_path(report, "--report")
            if report.exists() and not report.is_dir():
                raise InputError(f"--report {report}: exists and is not a directory")
        ps = sample_probes(load_probes(readable(probes, "--probes")), limit, seed) if probes is not None else []
        tags = allow_tags(allow)
        params = {"probes": str(probes) if probes else None, "limit": limit, "seed": seed,
                  "allow": sorted(tags) if tags is not None else None}  # fmt: skip
        if int8:
            params["int8"] = True  # runs without it keep their old parameters, and so resume
        place = placement(device, dtype)
        if place != CPU:
            params["device"] = place.label  # likewise: only another placement starts a new run
        session = BankSession(
            bank, allow=tags, int8=int8, place=place, min_relevance=min_relevance, anchor_mix=anchor_mix,
            relevance_ramp=relevance_ramp, lexical=lexical,
        )  # fmt: skip
        with session, stage_progress(not as_json) as progress:
            if report is not None:  # made once every option has passed: an eval never runs for a report it cannot write
                try:
                    report.mkdir(parents=True, exist_ok=True)
                    tempfile.NamedTemporaryFile(dir=report, prefix=".memctl-").close()
                except OSError as e:
                    why = e.strerror or type(e).__name__
                    raise InputError(f"--report {report}: cannot write there ({why})") from None
            res = run_eval(session, ps, opts, probes_path=probes, perplexity=perplexity, params=params,
                           fresh=fresh, progress=progress)  # fmt: skip
        res["probes"] = str(probes or "")
        if report is not None:
            parts = ["memctl", "eval", "--bank", bank]
            for flag, value in (("--probes", probes), ("--setups", setups), ("--beam", beam if beam > 1 else None),
                                ("--block-fraction", block_fraction),
                                ("--blocking", blocking if blocking != "reroute" else None),
                                ("--perplexity", perplexity), ("--allow", allow), ("--limit", limit),
                                ("--min-relevance", min_relevance), ("--relevance-ramp", relevance_ramp),
                                ("--lexical", lexical),
                                ("--anchor-mix", anchor_mix),
                                ("--seed", seed if limit is not None else None), ("--report", report)):  # fmt: skip
                if value is not None:
                    parts += [flag, str(value)]
            parts += ["--int8"] if int8 else []
            parts += ["--device", device] if device else []
            parts += ["--dtype", dtype] if dtype else []
            command = " ".join(shlex.quote(a) for a in parts)
            res["report"] = [str(p) for p in write_report(res, report, command)]
        return res

    res = run(go)
    if as_json:
        print_json(res)
        return
    _print_results(res)


def _history(bank: str) -> list[dict[str, Any]]:
    from ..eval.runs import EvalRuns
    from ..registry import Registry

    reg = Registry.open(bank)
    try:
        return EvalRuns(reg).history()
    finally:
        reg.close()


def _pct(r: dict[str, Any]) -> str:
    return pct(r["accuracy"])


def _print_results(res: dict[str, Any]) -> None:
    if res["n"]:
        _print_probes(res)
        found = missed(res.get("answers", []))
        if found and found[0]:
            where = "the report lists them" if res.get("report") else "--report DIR lists them, with each answer"
            err.print(f"open book answers {len(found[0])} probe(s) the fetched memories miss ({where})")
    if "perplexity" in res:
        _print_perplexity(res["perplexity"])
    for n in res.get("notes", []):
        err.print(f"[yellow]note:[/yellow] {n}", highlight=False)
    if res.get("report"):
        err.print(f"[dim]report: {', '.join(res['report'])}[/dim]", highlight=False)


def _print_probes(res: dict[str, Any]) -> None:
    kinds = sorted({k for r in res["setups"] for k in r["per_kind"]})
    resumed = f", resumed with {res['resumed_answers']} stored answers" if res.get("resumed") else ""
    table = Table(title=f"probe accuracy on {res['bank']} ({res['n']} probes; run {res.get('run', '-')}{resumed})")
    table.add_column("setup")
    table.add_column("accuracy", justify="right")
    table.add_column("95% CI", justify="right")
    for k in kinds:
        table.add_column(k, justify="right")
    table.add_column("routed right", justify="right")
    table.add_column("routed wrong", justify="right")
    table.add_column("time", justify="right")
    for r in res["setups"]:
        cells = [_pct(r["per_kind"][k]) if k in r["per_kind"] else "-" for k in kinds]
        split = [f"{_pct(x)} ({x['n']})" if x["n"] else "-" for x in (r["routed_right"], r["routed_wrong"])]
        name = r["setup"] + (" [dim](probe × sibling)[/dim]" if r["setup"] == "fetched-corrupted" else "")
        table.add_row(name, _pct(r), ci(r), *cells, *split, f"{r['seconds']:.0f}s")
    out.print(table)
    rt = res["routing"]
    if rt["n"]:
        share = ", ".join(f"level {lv['level']} {100 * lv['share']:.1f}%" for lv in rt["levels"])
        out.print(f"routing agreement ({rt['n']} probes with their document in the bank): {share}", highlight=False)
    if "beam" in res:
        t = Table(title="beam: the N best leaves and their ancestors")
        for c in ("beam", "accuracy", "95% CI", "blocks/probe", "params fetched/probe", "s/probe"):
            t.add_column(c, justify="right")
        for b in res["beam"]:
            t.add_row(str(b["beam"]), _pct(b), ci(b), f"{b['blocks_per_probe']:.2f}",
                      human_params(b["params_per_probe"]), f"{b['seconds_per_probe']:.3f}")  # fmt: skip
        out.print(t)
    if "blocking" in res:
        blk = res["blocking"]
        how = "routing goes around them" if blk["mode"] == "reroute" else "they are withheld"
        t = Table(title=f"full vs blocked bank: the best-matching fraction of the bank blocked per probe ({how})")
        for c in ("blocked", "nodes per level", "bank share", "accuracy", "95% CI", "change"):
            t.add_column(c, justify="right")
        for r in blk["rows"]:
            t.add_row(
                "full bank" if r["fraction"] == 0 else f"{r['fraction']:g}",
                ", ".join(map(str, r["nodes_per_level"])),
                f"{100 * r['bank_share']:.1f}%",
                _pct(r),
                ci(r),
                "-" if r["fraction"] == 0 else f"{100 * r['change']:+.1f} pts",
            )
        out.print(t)


def _print_perplexity(pp: dict[str, Any]) -> None:
    t = Table(title=f"perplexity on {pp['docs']} documents (memories routed on the whole document)")
    for c in ("setup", "perplexity", "vs anchor", "tokens"):
        t.add_column(c, justify="right")
    for r in pp["rows"]:
        ratio = r["ratio_to_anchor"]
        vs = "-" if ratio is None else f"{100 * (ratio - 1):+.1f}%"
        vs += " [red](over the limit)[/red]" if r["worse_than_limit"] else ""
        t.add_row(r["setup"], f"{r['perplexity']:.2f}", vs, f"{r['tokens']:,}")
    out.print(t)
    if line := gate_line(pp):
        out.print(line, markup=False)


def _print_history(bank: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        out.print(f"no evaluation runs in bank {bank!r} yet")
        return
    names = [s for s in ("anchor", "generic", "fetched", "rag", "rag+fetched", "oracle-rag", "fetched-corrupted")
             if any(r["results"] and any(x["setup"] == s for x in r["results"]["setups"]) for r in rows)]  # fmt: skip
    t = Table(title=f"evaluation runs of {bank} (newest first)")
    for c in ("run", "finished", "probes", "n", *names, "blocked (max)", "status"):
        t.add_column(c, justify="right")
    for r in rows:
        res = r["results"] or {}
        by = {x["setup"]: x for x in res.get("setups", [])}
        blk = res.get("blocking", {}).get("rows", [])
        worst = f"{blk[-1]['fraction']:g}: {_pct(blk[-1])}" if blk else "-"
        status = r["status"] if r["status"] == "done" else f"stopped ({r['answers_stored']} answers stored)"
        t.add_row(
            str(r["id"]),
            (r["finished"] or r["started"] or "")[:16].replace("T", " "),
            Path(r["probes"]).name + (f" (limit {r['params'].get('limit')})" if r["params"].get("limit") else ""),
            str(res.get("n", r["params"].get("n_probes", ""))),
            *(_pct(by[s]) if s in by else "-" for s in names),
            worst,
            status,
        )
    out.print(t)
