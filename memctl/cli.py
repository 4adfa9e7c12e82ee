"""memctl command line: parse, call one library function, render with rich.

Library errors become one line on stderr and a non-zero exit, never a traceback
(set MEMCTL_DEBUG=1 to see one for an unexpected error).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import MemctlError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Hierarchical parametric memories for a frozen small language model.",
)
out = Console()
err = Console(stderr=True)
T = TypeVar("T")

BankOpt = Annotated[str, typer.Option("--bank", "-b", help="Bank name (under MEMCTL_HOME, default ~/.memctl).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def run(fn: Callable[[], T]) -> T:
    """Call into the library; turn errors into one clear line and an exit code."""
    try:
        return fn()
    except MemctlError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130) from None
    except Exception as e:  # an unexpected bug: still one line, unless debugging
        if os.environ.get("MEMCTL_DEBUG"):
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        err.print(
            f"[red]internal error:[/red] {type(e).__name__}: {first} (MEMCTL_DEBUG=1 shows the traceback)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(3) from None


@contextmanager
def stage_progress(enabled: bool = True) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar per stage name, driven by the library's (stage, done, total) callback."""
    if not enabled or not err.is_terminal:
        yield lambda *_: None
        return
    with Progress(
        TextColumn("{task.description:>10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield update


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def human_params(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(int(n))


@app.command()
def ingest(
    paths: Annotated[list[str], typer.Argument(help="Directories of .txt/.md, or .jsonl/.json/.csv/.parquet files.")],
    bank: BankOpt,
    text_field: Annotated[str, typer.Option(help="Text column of table files.")] = "text",
    id_field: Annotated[str | None, typer.Option(help="Id column of table files (default: file:row).")] = None,
    window: Annotated[int | None, typer.Option(help="Max anchor tokens per window (new bank; default 512).")] = None,
    tree: Annotated[
        str | None, typer.Option(help="K,P: children per node, levels (new bank; default from corpus size).")
    ] = None,
    ranks: Annotated[
        str | None, typer.Option(help="r1,...,rp memory neurons per level (new bank; default ~10% fetched).")
    ] = None,
    memory_layers: Annotated[str | None, typer.Option(help="'all' or 'last:N' (new bank).")] = None,
    anchor: Annotated[
        str | None, typer.Option(help="GGUF file or HF model directory (new bank; default SmolLM2-135M-Instruct).")
    ] = None,
    embedder: Annotated[
        str | None, typer.Option(help="'minilm' (default) or 'hash' (deterministic test embedder).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the tree and the blocks' initial state.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Read documents, window, embed, cluster into a tree and register them in a bank."""
    from .bank import ingest as do_ingest
    from .config import parse_int_list, parse_tree

    def go() -> Any:
        t = parse_tree(tree) if tree else None
        r = parse_int_list(ranks, "--ranks") if ranks else None
        with stage_progress(not as_json) as progress:
            return do_ingest(
                bank,
                paths,
                text_field=text_field,
                id_field=id_field,
                window=window,
                tree=t,
                ranks=r,
                memory_layers=memory_layers,
                anchor=anchor,
                embedder=embedder,
                seed=seed,
                progress=progress,
            )

    res = run(go)
    if as_json:
        out.print_json(json.dumps(res.__dict__))
        return
    verb = "created" if res.created else "updated"
    out.print(
        f"bank [bold]{res.bank}[/bold] {verb}: {res.docs_added} document(s) added, {res.docs_skipped} already "
        f"present, {res.windows_added} window(s); tree {res.tree[0]}x{res.tree[1]}"
        + (" (re-clustered)" if res.reclustered else " (routed into the existing tree)")
    )
    if res.stale_blocks:
        out.print(f"{len(res.stale_blocks)} trained block(s) are now stale; `memctl train --bank {bank}` retrains them")


@app.command()
def train(
    bank: BankOpt,
    epochs: Annotated[int | None, typer.Option(help="Passes over each unit's windows (default 6).")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (default 1e-2).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Windows per step (default 4).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the data order.")] = None,
    objective: Annotated[
        str | None,
        typer.Option(
            help="lm: next-token on windows; distill: match the open-book anchor on prompts about "
            "each window; mix: both (default distill)."
        ),
    ] = None,
    patience: Annotated[
        int | None, typer.Option(help="Stop a unit after this many epochs without held-out gain (default 3).")
    ] = None,
    subtree: Annotated[int | None, typer.Option(help="Train only this level-1 subtree (an isolated unit).")] = None,
    retrain: Annotated[bool, typer.Option(help="Retrain units that are already trained.")] = False,
    restart: Annotated[bool, typer.Option(help="Drop interrupted checkpoints and start over.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Train memory blocks on the frozen anchor; resumes an interrupted run."""
    from .train import TrainEvent
    from .train import train as do_train

    overrides = {
        "epochs": epochs,
        "lr": lr,
        "batch_size": batch_size,
        "seed": seed,
        "objective": objective,
        "patience": patience,
    }

    def go() -> Any:
        if as_json or not err.is_terminal:
            last = [0.0]

            def log(ev: TrainEvent) -> None:
                if not as_json and (ev.step == ev.total_steps or time.monotonic() - last[0] > 10):
                    last[0] = time.monotonic()
                    if ev.unit_no < 0:  # a preparation stage: prompts, teacher cache, prefix cache
                        err.print(f"{ev.unit} {ev.step}/{ev.total_steps}", highlight=False)
                        return
                    held = f" held-out {100 * ev.heldout:.0f}%" if ev.heldout is not None else ""
                    err.print(
                        f"unit {ev.unit} ({ev.unit_no + 1}/{ev.n_units}) step {ev.step}/{ev.total_steps} "
                        f"loss {ev.loss:.3f}{held} {ev.tokens_per_s:.0f} tok/s",
                        highlight=False,
                    )

            return do_train(bank, overrides, subtree=subtree, retrain=retrain, restart=restart, progress=log)
        with Progress(
            TextColumn("{task.fields[unit]:>12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.3f} held-out {task.fields[held]}  {task.fields[tps]:.0f} tok/s"),
            TimeElapsedColumn(),
            console=err,
        ) as bar:
            tasks: dict[str, Any] = {}

            def update(ev: TrainEvent) -> None:
                if ev.unit not in tasks:
                    tasks[ev.unit] = bar.add_task(
                        "",
                        total=ev.total_steps,
                        unit=ev.unit if ev.unit_no < 0 else f"unit {ev.unit_no + 1}/{ev.n_units}",
                        loss=ev.loss,
                        tps=0.0,
                        held="-",
                    )
                held = f"{100 * ev.heldout:.0f}%" if ev.heldout is not None else "-"
                bar.update(
                    tasks[ev.unit],
                    completed=ev.step,
                    total=ev.total_steps,
                    loss=ev.loss,
                    tps=ev.tokens_per_s,
                    held=held,
                )

            return do_train(bank, overrides, subtree=subtree, retrain=retrain, restart=restart, progress=update)

    res = run(go)
    if as_json:
        out.print_json(
            json.dumps(
                {
                    "bank": res.bank,
                    "units": [u.__dict__ for u in res.units],
                    "skipped": res.skipped,
                    "tokens": res.tokens,
                    "prepare": res.prepare.__dict__ if res.prepare else None,
                }
            )
        )
        return
    if not res.units:
        out.print(f"nothing to train: every unit of bank {bank!r} is trained (use --retrain to train again)")
        return
    if res.prepare:
        p = res.prepare
        out.print(
            f"prompts: {p.prompts_total} ({p.prompts_added} new); routed to another leaf than their window: "
            f"{100 * p.route_differs_leaf:.0f}% (another level-1 subtree: {100 * p.route_differs_l1:.0f}%), "
            f"both paths trained; teacher cache {p.teacher_seconds:.0f}s"
        )
    table = Table(title=f"trained {len(res.units)} unit(s) of {bank}")
    for col in ("unit", "steps", "tokens", "loss first→last", "held-out by epoch", "tok/s", "time"):
        table.add_column(col, justify="right")
    for u in res.units:
        resumed = f" (resumed at {u.resumed_from})" if u.resumed_from else ""
        held = " ".join(f"{100 * h:.0f}" for h in u.heldout) + ("% (early stop)" if u.stopped_early else "%")
        table.add_row(
            u.unit,
            f"{u.steps}{resumed}",
            f"{u.tokens:,}",
            f"{u.loss_first:.3f} → {u.loss_last:.3f}",
            held if u.heldout else "-",
            f"{u.tokens / max(u.seconds, 1e-9):.0f}",
            f"{u.seconds:.0f}s",
        )
    out.print(table)


@app.command()
def info(bank: BankOpt, as_json: JsonOpt = False) -> None:
    """Tree, fetched and bank sizes, blocks per level, anchor and training state."""
    from .bank import info as do_info

    d = run(lambda: do_info(bank))
    if as_json:
        out.print_json(json.dumps(d))
        return
    a = d["anchor"]
    out.print(f"[bold]{d['bank']}[/bold]  {d['path']}")
    out.print(
        f"anchor    {a['path']}  ({human_params(a['params'])} params, {a['layers']} layers, sha256 {a['sha256'][:12]})"
    )
    out.print(
        f"corpus    {d['documents']} documents, {d['windows']} windows, {d['tokens']:,} tokens "
        f"(window ≤ {d['window']} tokens, embedder {d['embedder']})"
    )
    m = d["memory"]
    out.print(f"tree      k={d['tree']['k']}, p={d['tree']['p']}  ({d['tree']['k'] ** d['tree']['p']} leaves)")
    ratio = f" = {100 * d['fetched_ratio']:.1f}% of the anchor" if d["fetched_ratio"] else ""
    out.print(
        f"memory    ranks {tuple(m['ranks'])} on {m['layers']} layers (from layer {m['first_layer']}); "
        f"fetched {human_params(d['fetched_params'])}{ratio}"
    )
    out.print(
        f"bank      {human_params(d['bank_params'])} params ({human_bytes(d['bank_bytes_full'])} fp32 when all "
        f"blocks are trained); {human_bytes(d['bytes_on_disk'])} on disk now"
    )
    table = Table()
    for col in ("level", "rank", "blocks", "params/block", "nodes with data", "windows/node", "trained", "stale"):
        table.add_column(col, justify="right")
    for lv in d["levels"]:
        st = lv["states"]
        table.add_row(
            str(lv["level"]),
            str(lv["rank"]),
            str(lv["blocks"]),
            human_params(lv["block_params"]),
            str(lv["nonempty_nodes"]),
            f"{lv['windows_per_nonempty_node']:.1f}",
            str(st.get("trained", 0)),
            str(st.get("stale", 0)),
        )
    table.add_row(
        "generic",
        str(sum(m["ranks"])),
        "1",
        human_params(d["generic"]["params"]),
        "-",
        "-",
        "1" if d["generic"]["state"] == "trained" else "0",
        "1" if d["generic"]["state"] == "stale" else "0",
    )
    out.print(table)
    out.print(f"training  {d['training']}")


@app.command()
def ask(
    prompt: Annotated[str, typer.Argument(help="The question or text to continue.")],
    bank: BankOpt,
    no_memory: Annotated[bool, typer.Option("--no-memory", help="Anchor alone.")] = False,
    generic: Annotated[bool, typer.Option("--generic", help="The generic memory instead of routed blocks.")] = False,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the anchor's chat template.")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 32,
    as_json: JsonOpt = False,
) -> None:
    """Answer with the memory blocks the prompt routes to (only those are read)."""
    from .errors import InputError
    from .serve import ask as do_ask

    def go() -> Any:
        if no_memory and generic:
            raise InputError("--no-memory and --generic exclude each other")
        if max_new_tokens < 1:
            raise InputError("--max-new-tokens must be at least 1")
        mode = "none" if no_memory else "generic" if generic else "fetched"
        return do_ask(bank, prompt, mode=mode, max_new_tokens=max_new_tokens, chat=chat)

    d = run(go)
    if as_json:
        out.print_json(json.dumps(d))
        return
    out.print(d["answer"].strip(), highlight=False)
    where = {"none": "anchor alone", "generic": "generic memory"}.get(d["mode"])
    if where is None:
        where = f"path {'/'.join(map(str, d['path']))}, blocks {', '.join(d['blocks']) or 'none trained'}"
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
    from .evaluate import evaluate, load_probes, sample_probes, wilson
    from .serve import BankSession

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


@app.command("list")
def list_banks(as_json: JsonOpt = False) -> None:
    """Banks under MEMCTL_HOME."""
    from .registry import memctl_home

    root = memctl_home() / "banks"
    names = sorted(p.name for p in root.iterdir() if (p / "registry.db").is_file()) if root.is_dir() else []
    if as_json:
        out.print_json(json.dumps(names))
    else:
        for n in names:
            out.print(n)
        if not names:
            err.print(f"no banks under {root}")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
