"""Training one unit: the step loop (batches, losses, optimizer, checkpoints, early stopping) and the
anchor and prompts it needs; the events it reports are memctl.train.events. memctl.train.run runs it
for every unit of a bank in one process; memctl.train.distributed across ranks.
"""

from __future__ import annotations

import ctypes
import dataclasses
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.config import TrainConfig
from ..core.errors import BankStateError
from ..core.placement import CPU, Placement
from ..model.anchor import Anchor, attention, load_anchor, training_attention
from ..model.prefix import head_split_matches
from ..registry import Registry, dumps
from ..registry.checkpoints import checkpoint_path
from .batches import (
    Sample,
    batch_loss,
    build_prefix_cache,
    collate,
    epoch_batches,
    load_samples,
    loss_positions,
    preserve_samples,
    unit_seed,
)
from .checkpoint import TrainState, read_checkpoint, save_checkpoint
from .checkpoint import decode as decode_checkpoint
from .dataparallel import DataParallel
from .distill import PrepareReport, generate_prompts, heldout_accuracy, heldout_loss, heldout_prompts, prepare
from .diverge import STATES, diverged, epoch_means, kind_counts
from .events import TrainEvent
from .keepstates import read_pool_states
from .optim import BlockAdamW, clip_grad_norm, lr_at
from .preserve import own_window_samples, prepare_pool
from .records import TrainedUnit, UnitResult
from .retire import Retired, epoch_plan, retire, sits_out
from .stopping import should_stop
from .study import hidden_layers
from .units import UnitParams, unit_of


# ---- the loop ---------------------------------------------------------------------------------------
@contextmanager
def sigint_flag() -> Iterator[dict[str, bool]]:
    flag = {"stop": False}
    try:
        previous = signal.signal(signal.SIGINT, lambda *_: flag.__setitem__("stop", True))
    except ValueError:  # not the main thread (TUI worker): no handler
        yield flag
        return
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def train_unit(
    reg: Registry,
    anchor: Anchor,
    handle: Any,
    name: str,
    tcfg: TrainConfig,
    unit_no: int,
    n_units: int,
    progress: Callable[[TrainEvent], None] | None,
    flag: dict[str, bool],
    max_steps: int | None = None,
    split_head: bool = False,
    exclude: frozenset[str] = frozenset(),
    checkpoints: bool = True,
    dp: DataParallel | None = None,
) -> TrainedUnit | None:
    """Train one unit from its seeded initial state (or its checkpoint). Returns None when stopped
    before the end (Ctrl-C or `max_steps`). Documents in `exclude` are left out as if never ingested
    (exact forgetting); with `checkpoints=False` nothing is written to disk. With `dp`, this rank
    trains the unit together with the other ranks of its group (memctl.train.dataparallel): each computes
    its share of every batch, and the group's leader alone writes checkpoints and scores held-out prompts.

    The unit's prefix cache is built from the unit's own samples, so its numbers never depend on
    which other units are trained in the same run."""
    cfg = reg.config
    unit = unit_of(cfg, name)
    samples = [
        s
        for s in load_samples(
            reg,
            anchor,
            name,
            tcfg.objective,
            questions=tcfg.questions > 0,
            study=tcfg.study > 0,
            hidden=tcfg.match_hidden > 0,
            echo=tcfg.echoes,
            echo_answer=tcfg.echo_answer,
            named=tcfg.event_names,
        )
        if s.doc_id not in exclude
    ]
    trained = samples
    per = tcfg.study_per_epoch
    samples = trained + preserve_samples(reg, name, tcfg.preserve, trained, tcfg.seed, tcfg.preserve_pool, per)
    if tcfg.preserve_own > 0:
        with handle.using(None):  # the anchor alone
            samples += own_window_samples(reg, anchor, name, tcfg.preserve_own, trained, tcfg.seed, exclude, per)
    params = UnitParams(cfg, unit, anchor.device)
    if not samples:
        return TrainedUnit(UnitResult(name, 0, 0, float("nan"), float("nan"), 0.0, 0), unit, params, {})
    pool_states = None  # `--preserve-by states`: the pool's hidden states, read once (memctl.train.keepstates)
    if tcfg.preserve_by == "states" and any(s.kind == "keep" and not s.doc_id for s in samples):
        seqs = {s.key: s.ids for s in samples if s.kind == "keep" and not s.doc_id}
        pool_states = read_pool_states(anchor.model, handle, seqs)
    start = min(cfg.memory.layers)
    through = [s for s in samples if pool_states is None or s.key not in pool_states.states]  # run the model
    prefix_cache = build_prefix_cache(anchor, start, through, _prefix_progress(progress, n_units))
    if prefix_cache is not None:
        for smp in samples:
            smp.states = prefix_cache.get(smp.key)
    epochs = [epoch_batches(samples, name, cfg.tree.k, tcfg, e) for e in range(tcfg.epochs)]
    total = sum(len(e) for e in epochs)
    retired: Retired = {}  # samples sitting epochs out (memctl.train.retire)
    plans: dict[int, list[list[int]]] = {}  # the batches each epoch trains, made as it starts

    def plan(e: int) -> list[list[int]]:
        if e not in plans:
            plans[e] = epoch_plan(samples, epochs[e], retired, e, unit_seed(tcfg.seed, name))
        return plans[e]

    def kind(batch: list[Sample]) -> str:  # what a batch trains: its samples' kind, or the states loss
        k = batch[0].kind
        return STATES if pool_states is not None and k == "keep" and not batch[0].doc_id else k

    def counts(upto: int) -> list[dict[str, int]]:  # batches of each kind per epoch, for memctl.train.diverge
        return kind_counts([[kind([samples[b[0]]]) for b in plan(e) if b] for e in range(upto + 1)])

    restarts = 0
    mark: TrainState | None = None  # `--on-drift rollback`: the end of the last epoch the guard passed
    opt = _optimizer(params, tcfg)
    heldout = heldout_prompts(reg, name, exclude=exclude)
    ckpt = checkpoint_path(reg.checkpoint_dir(), name)
    step, tokens, seconds = 0, 0, 0.0
    losses: dict[str, list[float]] = {}  # by batch kind (lm, kd, keep): their losses differ in scale
    seen: dict[tuple[int, int], dict[str, int]] = {}  # (level, node) -> doc -> tokens trained
    scores: list[float] = []  # held-out prompt accuracy after each epoch
    held_losses: list[float] = []  # held-out distillation loss after each epoch (with a teacher cache)
    lead = dp is None or dp.leader
    found, error = None, None  # the checkpoint's bytes, or why they could not be read
    if checkpoints and lead and ckpt.exists():
        try:
            found = read_checkpoint(ckpt)
        except BankStateError as e:
            error = str(e)
    if dp is not None:  # bytes and a string: the group's other ranks unpickle no object of ours
        found, error = dp.broadcast((found, error))
    if error is not None:
        raise BankStateError(error)
    if found is not None:
        state = decode_checkpoint(found, ckpt, name)
        state.restore(params.flat(), opt, ckpt)
        step, tokens, losses, seconds = state.step, state.tokens, state.losses, state.seconds
        seen, scores, held_losses, restarts = state.seen, state.scores, state.heldout_loss, state.restarts
        retired, mark = state.retired, state.mark
    resumed_from = step
    deep = (hidden_layers(cfg.memory.layers), tcfg.match_hidden)  # deep context distillation (study)
    pad = anchor.tokenizer.pad_token_id
    t_start = time.perf_counter() - seconds

    def current() -> TrainState:
        return TrainState(
            params=[p.detach().to("cpu") for p in params.flat()],  # no copy on the CPU: copy() it to keep it
            opt={k: [t.cpu() for t in v] for k, v in opt.state_dict().items()},
            step=step,
            tokens=tokens,
            losses=losses,
            seen=seen,
            scores=scores,
            heldout_loss=held_losses,
            unit=name,
            seconds=time.perf_counter() - t_start,
            config=dumps(dataclasses.asdict(tcfg)),
            placement=Placement(anchor.device, anchor.dtype).kind,
            restarts=restarts,
            retired=retired,
            mark=mark,
        )

    def checkpoint() -> None:
        save_checkpoint(ckpt, current())  # serialised at once

    flat_batches = [(e, j) for e, bs in enumerate(epochs) for j in range(len(bs))]
    stopped_early = False
    last_loss = float("nan")
    while step < total:
        epoch, j = flat_batches[step]
        batch_idx = plan(epoch)[j]
        batch = [samples[i] for i in batch_idx]
        if batch:  # else every sample of this scheduled batch sits the epoch out (memctl.train.retire)
            touched = params.touched(unit.local_index([s.path for s in batch]))
            opt.lr = lr_at(step, total, tcfg.lr * 0.5**restarts, tcfg.warmup, tcfg.min_lr_ratio)
            rows = list(range(len(batch))) if dp is None else dp.shard(list(range(len(batch))))
            mine = [batch[r] for r in rows]
            check = tcfg.retire > 0 and batch[0].kind == "kd"
            agree: list[torch.Tensor] | None = [] if check and mine else None
            loss_value, agreed = 0.0, [0.0] * (len(batch) if check else 0)
            if mine:
                if pool_states is not None and kind(mine) == STATES:
                    fetched = params.fetched(unit.local_index([s.path for s in mine]))
                    loss = pool_states.loss(fetched, [s.key for s in mine])
                else:
                    mix = tcfg.anchor_mix
                    loss = _loss(anchor, handle, unit, params, mine, pad, start, split_head, deep, mix, agree)
                if dp is not None:  # this rank's share of the batch's mean: the group's sum is the mean
                    loss = loss * (loss_positions(mine) / loss_positions(batch))
                loss.backward()
                loss_value = float(loss.detach())
            if agree:
                for r, ok in zip(rows, agree[0].tolist(), strict=True):
                    agreed[r] = float(ok)
            stop_now = flag["stop"]
            if dp is not None:  # each rank's share of the agreements: the group's sum is all of them
                numbers = dp.reduce(params.flat(), touched, [loss_value, float(stop_now), *agreed])
                loss_value, stop_now, agreed = numbers[0], numbers[1] > 0, numbers[2:]
                flag["stop"] = flag["stop"] or stop_now  # one rank's Ctrl-C stops its whole group
            clip_grad_norm(params.flat(), tcfg.grad_clip)
            opt.step(touched)
            opt.zero_grad()
            if kind(batch) != STATES:  # student tokens: those that ran through the model
                tokens += sum(len(s.ids) for s in batch)
            losses.setdefault(kind(batch), []).append(loss_value)
            last_loss = loss_value
            for i, ok in zip(batch_idx, agreed, strict=False):
                if ok > 0.5:
                    retire(retired, i, epoch, tcfg.retire)
        else:
            stop_now = flag["stop"]
        step += 1
        for smp in batch:
            if smp.keep and not smp.doc_id:  # the anchor's own text: no document shaped the block through it
                continue
            for level, _first, _n in unit.levels:
                d = seen.setdefault((level, 0 if level == 0 else smp.path[level - 1]), {})
                d[smp.doc_id] = d.get(smp.doc_id, 0) + len(smp.ids)
        epoch_done = step == total or flat_batches[step][0] != epoch
        if epoch_done and heldout:
            score = (
                (
                    heldout_accuracy(anchor, handle, unit, params, heldout, mix=tcfg.anchor_mix),
                    heldout_loss(anchor, handle, unit, params, heldout, mix=tcfg.anchor_mix),
                )
                if lead
                else None
            )
            acc, held_loss = dp.broadcast(score) if dp is not None else score
            scores.append(acc)
            if held_loss is not None:
                held_losses.append(held_loss)
            stopped_early = step < total and should_stop(
                scores, held_losses, len(heldout.prompts), tcfg.epochs, tcfg.patience
            )
        restart = diverged(losses, counts(epoch), epoch) if epoch_done and restarts < tcfg.max_restarts else None
        kept = _epochs_before(flat_batches, mark.step) if restart and mark is not None else 0
        sitting = sum(sits_out(retired, i, epoch + 1) for i in retired) if epoch_done and tcfg.retire else None
        if progress:
            el = time.perf_counter() - t_start
            progress(
                TrainEvent(
                    name,
                    unit_no,
                    n_units,
                    step,
                    total,
                    epoch,
                    last_loss,
                    tokens,
                    tokens / max(el, 1e-9),
                    scores[-1] if scores else None,
                    epoch_means(losses, counts(epoch), epoch) if epoch_done else None,
                    restart,
                    kept=kept,
                    sitting=sitting,
                )
            )
        if restart:
            # start over from the seeded initial state (`--on-drift rollback`: go back to the end of the last epoch
            # the guard passed, if one has) and on with half the learning rate; the tokens already trained still
            # count (they were spent), the provenance and scores are those of the state gone back to
            restarts += 1
            if mark is None:  # also a rollback unit resumed from a checkpoint written before marks existed
                params = UnitParams(cfg, unit, anchor.device)
                opt = _optimizer(params, tcfg)
                step, losses, seen, scores, held_losses, retired = 0, {}, {}, [], [], {}
            else:
                back = mark.copy()  # the mark stays as it is: a later epoch may go back to it again
                back.restore(params.flat(), opt, ckpt)
                step, losses, seen, retired = back.step, back.losses, back.seen, back.retired
                scores, held_losses = back.scores, back.heldout_loss
            stopped_early = False
            for e in [e for e in plans if e >= kept]:  # plans of the epochs to train again follow `retired`
                del plans[e]
            if restarts >= tcfg.max_restarts:
                mark = None  # nothing goes back to it any more: checkpoints need not carry it
            continue
        if tcfg.on_drift == "rollback" and epoch_done and restarts < tcfg.max_restarts and not stopped_early:
            mark = current().copy()
        stopping = stop_now or (max_steps is not None and step >= max_steps)
        if checkpoints and lead and (step % tcfg.checkpoint_every == 0 or stopping) and not stopped_early:
            checkpoint()
        if stopping:
            return None
        if stopped_early:
            break
    seconds = time.perf_counter() - t_start
    first, last = _ends({k: v for k, v in losses.items() if k not in ("keep", STATES)})
    keep = _ends({"keep": losses.get("keep", losses.get(STATES, []))})
    res = UnitResult(
        name, step, tokens, first, last, seconds, resumed_from, scores, stopped_early, *keep, held_losses, restarts
    )
    return TrainedUnit(res, unit, params, seen)


def _epochs_before(flat_batches: list[tuple[int, int]], step: int) -> int:
    """Epochs finished when `step` batches have run (`step` at an epoch's end)."""
    return flat_batches[step - 1][0] + 1 if step > 0 else 0


def _optimizer(params: UnitParams, tcfg: TrainConfig) -> BlockAdamW:
    """A fresh optimizer over the unit's blocks: at the start, and when a unit starts over."""
    return BlockAdamW(params.flat(), lr=tcfg.lr, betas=tcfg.betas, eps=tcfg.eps, weight_decay=tcfg.weight_decay)


def _loss(
    anchor: Anchor,
    handle: Any,
    unit: Any,
    params: UnitParams,
    batch: list[Any],
    pad: int,
    start: int,
    split_head: bool,
    deep: tuple[tuple[int, ...], float] = ((), 0.0),
    mix: float = 0.0,
    agree: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """The batch's mean loss with each sample's own blocks fetched (from the cached prefix states
    when memories start past layer 0); `deep` = (layers, weight) of the hidden-state term; `agree` as
    in `memctl.train.batches.kd_loss`."""
    ids, mask, labels = collate(batch, pad)
    states = None
    if start > 0 and batch[0].states is not None:
        first = batch[0].states  # the cache's device and dtype (the anchor's)
        states = torch.zeros(ids.shape[0], ids.shape[1], anchor.hidden, dtype=first.dtype, device=first.device)
        for i, smp in enumerate(batch):
            states[i, : len(smp.ids)] = smp.states
    fetched = params.fetched(unit.local_index([s.path for s in batch]))
    with handle.using(fetched), attention(anchor.model, training_attention(anchor)):
        return batch_loss(
            anchor.model,
            batch,
            ids,
            mask,
            labels,
            states,
            start,
            split_head,
            *deep,
            mix,
            lambda: handle.using(None),
            agree=agree,
        )


def _ends(losses: dict[str, list[float]]) -> tuple[float, float]:
    """Mean of the first and of the last 5% of the losses of each batch kind, averaged over the kinds
    (next-token and distillation losses differ in scale: first and last compare like with like)."""
    ends = [
        (float(np.mean(v[: max(1, len(v) // 20)])), float(np.mean(v[-max(1, len(v) // 20) :])))
        for v in losses.values()
        if v
    ]
    if not ends:
        return float("nan"), float("nan")
    return float(np.mean([f for f, _ in ends])), float(np.mean([la for _, la in ends]))


def load_bank_anchor(reg: Registry, home: Path, place: Placement = CPU) -> Anchor:
    """The bank's anchor, refused when its file is not the one the bank was built on."""
    anchor = load_anchor(reg.config.anchor, home, place)
    if anchor.digest != reg.bank["anchor_sha256"]:
        raise BankStateError(
            f"the anchor at {anchor.path} is not the one bank {reg.name!r} was built on (sha256 differs)"
        )
    return anchor


def prepare_training(
    reg: Registry, anchor: Anchor, tcfg: TrainConfig, todo: list[str], progress: Callable[[TrainEvent], None] | None
) -> tuple[PrepareReport | None, bool]:
    """Prompts (and the teacher cache, for distill and mix) in the registry; whether the vocabulary
    head may run on labelled positions only."""
    stage = _stage_progress(progress, len(todo))
    report = None
    if tcfg.objective == "lm":  # prompts only to score held-out accuracy while training
        generate_prompts(reg, stage)
    else:
        report = prepare(
            reg,
            anchor,
            stage,
            tcfg.questions,
            tcfg.study,
            todo,
            tcfg.match_hidden > 0,
            tcfg.ground_study,
            tcfg.echo,
            tcfg.echo_kinds,
            tcfg.event_names,
            tcfg.echo_names,
        )
    if tcfg.preserve > 0:
        prepare_pool(reg, anchor, stage, tcfg.preserve_pool)
    split_head = head_split_ok(reg, anchor, todo, tcfg.objective)
    _keep_freed_memory()
    return report, split_head


def head_split_ok(reg: Registry, anchor: Anchor, units: list[str], objective: str) -> bool:
    """Whether the vocabulary head may run on labelled positions only (checked on two samples)."""
    for u in units:
        samples = load_samples(reg, anchor, u, objective)
        if samples:
            ids, mask, _ = collate(samples[:2], anchor.tokenizer.pad_token_id)
            return head_split_matches(anchor.model, ids, mask)
    return False


def _keep_freed_memory() -> None:
    """Let glibc reuse freed blocks instead of returning big buffers to the OS at every step
    (each step allocates and frees the same few hundred MB; page faults otherwise cost ~20%)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: big buffers from the heap, not fresh mmaps
        libc.mallopt(-1, 1 << 31)  # M_TRIM_THRESHOLD: keep freed heap for the next step
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def _prefix_progress(
    progress: Callable[[TrainEvent], None] | None, n_units: int
) -> Callable[[int, int, int, float], None] | None:
    if progress is None:
        return None
    return lambda done, total, tokens, tps: progress(
        TrainEvent("prefix", -1, n_units, done, total, 0, 0.0, tokens, tps)
    )


def _stage_progress(progress: Callable[[TrainEvent], None] | None, n_units: int) -> Callable[[str, int, int], None]:
    def report(stage: str, done: int, total: int) -> None:
        if progress:
            progress(TrainEvent(stage, -1, n_units, done, total, 0, 0.0, 0, 0.0))

    return report
