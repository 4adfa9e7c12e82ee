"""Commands that build banks: ingest, train."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..core.errors import InputError
from .common import (
    BankOpt,
    JsonOpt,
    NoWaitOpt,
    Rates,
    app,
    epoch_line,
    err,
    out,
    print_json,
    run,
    stage_progress,
)


@app.command()
def ingest(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Directories of .txt/.md, or .jsonl/.json/.csv/.parquet files (hidden files and folders in a "
            "directory are left out)."
        ),
    ],
    bank: BankOpt,
    text_field: Annotated[str, typer.Option(help="Text column of table files.")] = "text",
    id_field: Annotated[str | None, typer.Option(help="Id column of table files (default: file:row).")] = None,
    window: Annotated[int | None, typer.Option(help="Max anchor tokens per window (new bank; default 512).")] = None,
    tree: Annotated[
        str | None,
        typer.Option(help="K,P: children per node, levels (new bank; default from corpus size and the bank budget)."),
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
    routing: Annotated[
        str | None,
        typer.Option(help="How a context finds its blocks (new bank): 'nearest' window (default) or 'tree' descent."),
    ] = None,
    lexical: Annotated[
        float | None,
        typer.Option(
            help="Weight of the words a context shares with a window beside the embeddings' cosine, in `nearest` "
            "routing (new bank; default 0.3, 0: cosine alone)."
        ),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(help="Label the documents (repeatable or comma-separated); `--allow` rules read the labels."),
    ] = None,
    reference: Annotated[
        bool,
        typer.Option(help="Store the documents as never-trained references: the 'unseen' baseline of forget proofs."),
    ] = False,
    allow_large_bank: Annotated[
        bool, typer.Option(help="Allow --ranks/--tree that make a bank beyond 64 GiB (fp32) (new bank).")
    ] = False,
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Read documents, window, embed, cluster into a tree and register them in a bank."""
    from ..build.ingest import ingest as do_ingest
    from ..core.config import allow_large_bank as large_ok
    from ..core.config import check_seed, parse_int_list, parse_tree
    from ..registry.access import parse_tags

    def go() -> Any:
        tags = parse_tags(tag)
        t = parse_tree(tree) if tree else None
        r = parse_int_list(ranks, "--ranks") if ranks else None
        if window is not None and window < 16:  # 0 is not "the default"
            raise InputError(f"--window must be at least 16 tokens, got {window}")
        check_seed(seed)
        large_ok.set(allow_large_bank)
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
                routing=routing,
                lexical=lexical,
                tags=tags,
                reference=reference,
                progress=progress,
            )

    res = run(go, no_wait)
    if as_json:
        print_json(res.__dict__)
        return
    if reference:
        out.print(
            f"bank [bold]{res.bank}[/bold]: {res.references_added} reference document(s) added "
            f"({res.docs_skipped} already stored); they are never trained or served"
        )
    else:
        verb = "created" if res.created else "updated"
        out.print(
            f"bank [bold]{res.bank}[/bold] {verb}: {res.docs_added} document(s) added, {res.docs_skipped} already "
            f"present, {res.windows_added} window(s); tree {res.tree[0]}x{res.tree[1]}"
            + (" (re-clustered)" if res.reclustered else " (routed into the existing tree)")
        )
        if res.tagged:
            out.print(f"{res.tagged} document(s) already in the bank received the tag(s)")
    if res.hidden_left_out:
        out.print(f"{res.hidden_left_out} hidden file(s) or folder(s) left out (a name that starts with '.')")
    if res.stale_blocks:
        out.print(f"{len(res.stale_blocks)} trained block(s) are now stale; `memctl train --bank {bank}` retrains them")


@app.command()
def train(
    bank: BankOpt,
    epochs: Annotated[int | None, typer.Option(help="Passes over each unit's windows (default 12).")] = None,
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
    preserve: Annotated[
        float | None,
        typer.Option(
            help="Share of each unit's tokens spent keeping the anchor unchanged on text it writes itself, "
            "so memories leave unrelated text alone; 0 turns it off (default 1)."
        ),
    ] = None,
    preserve_own: Annotated[
        float | None,
        typer.Option(
            help="Share of each unit's tokens spent keeping the anchor unchanged on the unit's own windows, "
            "their facts left out, so memories leave text like the bank's alone (default 0: off)."
        ),
    ] = None,
    preserve_pool: Annotated[
        int | None,
        typer.Option(
            help="Sequences the anchor writes for preservation, once per bank (default 1024; "
            "fewer is quicker to make and preserves less)."
        ),
    ] = None,
    preserve_by: Annotated[
        str | None,
        typer.Option(
            help="How preservation keeps the anchor: 'output' (the memories' next-token distribution on the "
            "pool matches the anchor's) or 'states' (the memory neurons add nothing to the anchor's hidden "
            "states on the pool, read once per unit: no pass through the model; default output)."
        ),
    ] = None,
    questions: Annotated[
        int | None,
        typer.Option(
            help="Questions per window the anchor writes about it, in its chat template, and answers from "
            "the window (distill and mix; written once per window; default 0: off, cloze prompts only)."
        ),
    ] = None,
    echo: Annotated[
        int | None,
        typer.Option(
            help="Cloze statements per window asked back as questions in the anchor's chat template "
            "('The Group 4 protocol was published by whom?', 'zoo was released when?'; else '... what?'): times and "
            "people first, then other names and numbers, one per sentence before any gets a second; answered as the "
            "teacher reading the window answers (distill and mix; default 4 for a new bank, a trained bank keeps "
            "its own; none for an anchor without a chat template)."
        ),
    ] = None,
    echo_kinds: Annotated[
        int | None,
        typer.Option(
            help="Cloze answers per window asked by the words after them that say what they are, of the window's "
            "subject alone ('<subject>: how many minutes?', '<subject>: which data centre?'): a second key for a "
            "fact besides its statement's wording (distill and mix; default 0: off; a trained bank keeps its own)."
        ),
    ] = None,
    echo_names: Annotated[
        int | None,
        typer.Option(
            help="Naming prompts per window of an event (see --event-names) asked back as questions under the "
            "event's name ('Harvion gateway (August 2024): 18:08 Service restored what?') (distill and mix; "
            "default 0: off; a trained bank keeps its own)."
        ),
    ] = None,
    echo_answer: Annotated[
        float | None,
        typer.Option(
            help="The answer's share (0 to 1) in the targets of echo and kind questions, beside the open-book "
            "teacher's distribution, which a small anchor rarely opens with the answer (default 0: the teacher's "
            "alone; a trained bank keeps its own)."
        ),
    ] = None,
    event_names: Annotated[
        bool | None,
        typer.Option(
            "--event-names/--no-event-names",
            help="Ask the cloze prompts of a document titled by an id or a date again under the name a reader "
            "gives its event, what it is about and when ('Harvion gateway (August 2024): Service restored,'): a "
            "second key for its facts besides the title's wording (distill and mix; default on for a new bank, "
            "a trained bank keeps its own; off under --objective lm).",
        ),
    ] = None,
    study: Annotated[
        int | None,
        typer.Option(
            help="Self-study continuations per window: the anchor, reading the window, writes them from seeds "
            "that name its subject, and the memories on the window's path learn their every token (distill and "
            "mix; sampled once per window; default 2 for a new bank, a trained bank keeps its own; 0: off)."
        ),
    ] = None,
    study_per_epoch: Annotated[
        int | None,
        typer.Option(
            help="Self-study continuations per window trained in each epoch: the window's continuations take "
            "turns, so `--study 6 --study-per-epoch 2` trains on three times as many, as varied, for the "
            "tokens of two (default 0: all of them every epoch).",
        ),
    ] = None,
    retire: Annotated[
        int | None,
        typer.Option(
            help="Retire learned prompts: a prompt or continuation whose every target token the memories "
            "already predict as the teacher does sits out this many epochs, then trains once more (preservation "
            "shrinks with it; default 0: every one trains every epoch).",
        ),
    ] = None,
    max_restarts: Annotated[
        int | None,
        typer.Option(
            help="Times a unit whose loss diverges, or whose preservation loss drifts above 1.1x its first "
            "epoch's, starts over (see --on-drift) at half the learning rate; 0 trains on as it is (default 2).",
        ),
    ] = None,
    on_drift: Annotated[
        str | None,
        typer.Option(
            help="What such a unit does: restart (from its seeded initial state) or rollback (to the end of the "
            "last epoch that passed, keeping the epochs before it: fewer tokens, but on foldoc more harm to "
            "unrelated text; default restart).",
        ),
    ] = None,
    match_hidden: Annotated[
        float | None,
        typer.Option(
            help="Deep context distillation: on self-study continuations the memories also match the "
            "open-book teacher's hidden states at 3 memory layers, with this weight beside the logits' "
            "(needs --study; the states are sampled with the continuations; default 0: off)."
        ),
    ] = None,
    ground_study: Annotated[
        bool | None,
        typer.Option(
            "--ground-study/--no-ground-study",
            help="Cut each self-study continuation before the first name or number its window does not give "
            "(continuations sampled from now on; default off).",
        ),
    ] = None,
    anchor_mix: Annotated[
        float | None,
        typer.Option(
            help="Train the memories for serving mixed with the anchor: the student is (1-w) p(memories) + "
            "w p(anchor), and the bank's answers then mix by w unless `--anchor-mix` says otherwise "
            "(0 to below 1; default 0: the memories alone; costs an extra anchor pass per step)."
        ),
    ] = None,
    subtree: Annotated[int | None, typer.Option(help="Train only this level-1 subtree (an isolated unit).")] = None,
    retrain: Annotated[bool, typer.Option(help="Retrain units that are already trained.")] = False,
    restart: Annotated[bool, typer.Option(help="Drop interrupted checkpoints and start over.")] = False,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Train one unit (--subtree or --generic) into this directory, not the bank; see `merge`."
        ),
    ] = None,
    generic: Annotated[bool, typer.Option(help="With --out: train the generic memory.")] = False,
    dp: Annotated[
        int,
        typer.Option(
            "--dp",
            help="Under torchrun: ranks that train each unit together, data-parallel "
            "(WORLD_SIZE must be a multiple; default 1: one rank per unit).",
        ),
    ] = 1,
    device: Annotated[
        str | None,
        typer.Option(
            help="cpu, cuda or cuda:N: where the anchor and the blocks train (default cpu; "
            "under torchrun, cuda is each rank's own GPU)."
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="fp32, bf16 or auto: the anchor's compute dtype; blocks and their optimizer stay "
            "float32 (default: the dtype the bank was last trained in; for a new bank auto: bf16 on a CPU "
            "that multiplies bf16 in hardware, AVX512-BF16 or AMX, fp32 on other CPUs and on GPUs)."
        ),
    ] = None,
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Train memory blocks on the frozen anchor; resumes an interrupted run. Under torchrun, units are
    shared out across the ranks (or groups of --dp ranks) and rank 0 records them."""
    from ..train.distributed import World
    from ..train.run import TrainEvent
    from ..train.run import train as do_train
    from .scale import train_out_command, worker_summary
    from .trainreport import report_training

    overrides = {
        "epochs": epochs,
        "lr": lr,
        "batch_size": batch_size,
        "seed": seed,
        "objective": objective,
        "patience": patience,
        "preserve": preserve,
        "preserve_pool": preserve_pool,
        "preserve_own": preserve_own,
        "preserve_by": preserve_by,
        "questions": questions,
        "echo": echo,
        "echo_kinds": echo_kinds,
        "echo_names": echo_names,
        "echo_answer": echo_answer,
        "event_names": event_names,
        "study": study,
        "study_per_epoch": study_per_epoch,
        "retire": retire,
        "match_hidden": match_hidden,
        "ground_study": ground_study,
        "anchor_mix": anchor_mix,
        "max_restarts": max_restarts,
        "on_drift": on_drift,
    }
    if out_dir is not None or generic:
        train_out_command(bank, out_dir, overrides, subtree, generic, restart, as_json, dp, device, dtype)
        return
    world = run(World.from_env)

    def go() -> Any:
        if as_json or not err.is_terminal or world.size > 1:
            last = [0.0]
            rates = Rates()

            def log(ev: TrainEvent) -> None:
                who = (f"rank {world.rank}: " if world.size > 1 else "") + f"unit {ev.unit} "
                if not as_json and ev.epoch_losses is not None:  # every epoch's end, however soon
                    err.print(who + epoch_line(ev), highlight=False)
                if not as_json and (ev.step == ev.total_steps or time.monotonic() - last[0] > 10):
                    last[0] = time.monotonic()
                    if ev.unit_no < 0:  # a preparation stage: prompts, teacher cache, self-study, prefix cache
                        pace = rates(ev.unit, ev.step, ev.total_steps)
                        err.print(f"{ev.unit} {ev.step}/{ev.total_steps}{pace}", highlight=False)
                        return
                    held = f" held-out {100 * ev.heldout:.0f}%" if ev.heldout is not None else ""
                    pace = rates(f"unit {ev.unit}", ev.step, ev.total_steps)  # steps/s and the unit's ETA
                    err.print(
                        who + f"({ev.unit_no + 1}/{ev.n_units}) step {ev.step}/{ev.total_steps} "
                        f"loss {ev.loss:.3f}{held} {ev.tokens_per_s:.0f} tok/s{pace}",
                        highlight=False,
                    )

            return do_train(
                bank, overrides, subtree=subtree, retrain=retrain, restart=restart, progress=log, dp=dp,
                device=device, dtype=dtype,
            )  # fmt: skip
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
                if ev.restart:
                    bar.console.print(f"unit {ev.unit} {epoch_line(ev)}", highlight=False)
                held = f"{100 * ev.heldout:.0f}%" if ev.heldout is not None else "-"
                bar.update(
                    tasks[ev.unit],
                    completed=ev.step,
                    total=ev.total_steps,
                    loss=ev.loss,
                    tps=ev.tokens_per_s,
                    held=held,
                )

            return do_train(
                bank, overrides, subtree=subtree, retrain=retrain, restart=restart, progress=update, dp=dp,
                device=device, dtype=dtype,
            )  # fmt: skip

    res = run(go, no_wait)
    if worker_summary(res, as_json):
        return
    report_training(bank, res, as_json)
