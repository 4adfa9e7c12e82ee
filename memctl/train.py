"""Train memory blocks on a frozen anchor, one isolated unit at a time.

A unit is a level-1 subtree (its level-1 block and every deeper block under it) or the generic
memory. Each unit has its own data order, RNG stream, optimizer state and gradient clipping, so a
unit can be (re)trained alone with identical results: the basis of exact forgetting, resumption
and distributed training. Checkpoints are written every few steps; a rerun resumes from them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .anchor import Anchor, attach, load_anchor
from .config import BankConfig, TrainConfig, train_config_from_json
from .errors import BankStateError, InputError, MemctlError
from .memory import PARTS, Fetched, LevelFetch, block_generator, init_block
from .optim import BlockAdamW, clip_grad_norm, lr_at
from .prefix import CACHE_BYTES, prefix_states, suffix_logits, suffix_matches
from .registry import Registry, block_id, dumps, memctl_home, now

GENERIC = "generic"


@dataclass
class TrainEvent:
    unit: str
    unit_no: int
    n_units: int
    step: int
    total_steps: int
    epoch: int
    loss: float
    tokens: int  # tokens trained so far in this unit
    tokens_per_s: float


@dataclass
class UnitResult:
    unit: str
    steps: int
    tokens: int
    loss_first: float
    loss_last: float
    seconds: float
    resumed_from: int


@dataclass
class TrainResult:
    bank: str
    units: list[UnitResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def tokens(self) -> int:
        return sum(u.tokens for u in self.units)


class TrainingInterrupted(MemctlError):
    """Ctrl-C during training: the last step was checkpointed."""

    exit_code = 130


# ---- units and their blocks ---------------------------------------------------------------------
@dataclass
class Unit:
    name: str  # level-1 node index as text, or "generic"
    levels: list[tuple[int, int, int]]  # (level, first node index, n blocks) owned by this unit

    def local(self, level_pos: int, node: int) -> int:
        return node - self.levels[level_pos][1]


def unit_of(cfg: BankConfig, name: str) -> Unit:
    if name == GENERIC:
        return Unit(GENERIC, [(0, 0, 1)])
    u, k = int(name), cfg.tree.k
    return Unit(name, [(lvl, u * k ** (lvl - 1), k ** (lvl - 1)) for lvl in range(1, cfg.tree.p + 1)])


def units_to_train(reg: Registry, subtree: int | None, retrain: bool) -> tuple[list[str], list[str]]:
    """(units needing training, units already trained). A unit needs training when one of its blocks
    that has data is not trained, or when a checkpoint of it exists."""
    cfg = reg.config
    l1s = sorted({r["l1"] for r in reg.db.query("select distinct l1 from windows")})
    if subtree is not None:
        if not 0 <= subtree < cfg.tree.k:
            raise InputError(f"--subtree must be in 0..{cfg.tree.k - 1}")
        if subtree not in l1s:
            raise InputError(f"subtree {subtree} has no documents")
        candidates = [str(subtree)]
    else:
        candidates = [str(u) for u in l1s] + [GENERIC]
    todo, done = [], []
    for name in candidates:
        if retrain or (reg.checkpoint_dir() / f"unit-{name}.pt").exists():
            todo.append(name)
            continue
        if name == GENERIC:
            row = reg.block(0, 0)
            pending = row is not None and row["state"] != "trained"
        else:
            pending = _unit_pending(reg, cfg, int(name))
        (todo if pending else done).append(name)
    return todo, done


def _unit_pending(reg: Registry, cfg: BankConfig, u: int) -> bool:
    k = cfg.tree.k
    for lvl in range(1, cfg.tree.p + 1):
        lo, n = u * k ** (lvl - 1), k ** (lvl - 1)
        if reg.db.execute(
            "select count(*) from blocks b join nodes n on n.level = b.level and n.idx = b.idx "
            "where b.level = ? and b.idx >= ? and b.idx < ? and n.n_windows > 0 and b.state != 'trained'",
            [lvl, lo, lo + n],
        ).fetchone()[0]:
            return True
    return False


class UnitParams:
    """The unit's blocks, stacked per level: gate/up/down (n_blocks, L, r, d), trainable."""

    def __init__(self, cfg: BankConfig, unit: Unit) -> None:
        mem = cfg.memory
        self.unit = unit
        self.tensors: list[dict[str, torch.Tensor]] = []
        for level, first, n in unit.levels:
            rank = mem.fetched_rank if level == 0 else mem.ranks[level - 1]
            blocks = [init_block(len(mem.layers), rank, mem.hidden, mem.std, block_generator(cfg.seed, level, first + i))
                      for i in range(n)]
            self.tensors.append({p: torch.stack([b[p] for b in blocks]).requires_grad_(True) for p in PARTS})

    def flat(self) -> list[torch.Tensor]:
        return [t[p] for t in self.tensors for p in PARTS]

    def fetched(self, local_index: list[torch.Tensor]) -> Fetched:
        levels = [LevelFetch(t["gate"], t["up"], t["down"], idx) for t, idx in zip(self.tensors, local_index, strict=True)
                  if t["gate"].shape[2] > 0]
        return Fetched(levels=levels, batch=int(local_index[0].shape[0]))

    def block(self, level_pos: int, local: int) -> dict[str, torch.Tensor]:
        return {p: self.tensors[level_pos][p][local].detach().clone() for p in PARTS}


# ---- data -----------------------------------------------------------------------------------------
@dataclass
class Sample:
    window_id: int
    doc_id: str
    ids: list[int]
    path: tuple[int, ...]
    states: torch.Tensor | None = None  # cached input of the first memory layer, (T, d)


def load_samples(reg: Registry, anchor: Anchor, unit: str) -> list[Sample]:
    rows = reg.windows() if unit == GENERIC else reg.windows("l1 = ?", [int(unit)])
    tok = anchor.tokenizer
    out = []
    for r in rows:
        ids = tok(r["text"], add_special_tokens=False)["input_ids"]
        if len(ids) >= 2:
            out.append(Sample(r["id"], r["doc_id"], ids, tuple(int(v) for v in r["path"].split(","))))
    return out


def _unit_seed(seed: int, unit: str) -> list[int]:
    return [seed, 1_000_000 if unit == GENERIC else int(unit)]


def epoch_batches(samples: list[Sample], unit: str, k: int, tcfg: TrainConfig, epoch: int) -> list[list[int]]:
    """Seeded order of one epoch. The generic memory sees each window with probability 1/(k+1)."""
    rng = np.random.default_rng(_unit_seed(tcfg.seed, unit) + [epoch])
    order = rng.permutation(len(samples))
    if unit == GENERIC:
        keep = rng.random(len(samples)) < 1.0 / (k + 1)
        order = order[keep[order]]
    bs = tcfg.batch_size
    return [order[i : i + bs].tolist() for i in range(0, len(order), bs)]


def collate(batch: list[Sample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) ids, attention mask, labels (-100 on padding). One window per row, so
    attention and loss never cross documents."""
    t = max(len(s.ids) for s in batch)
    ids = torch.full((len(batch), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), t), dtype=torch.long)
    for i, s in enumerate(batch):
        ids[i, : len(s.ids)] = torch.tensor(s.ids)
        mask[i, : len(s.ids)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def lm_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
            states: torch.Tensor | None = None, start: int = 0) -> torch.Tensor:
    """Mean next-token loss; with `states` (B, T, d) only layers[start:] and the head run."""
    if states is None:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (B, T, V)
    else:
        logits = suffix_logits(model, states, mask, start)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                           ignore_index=-100)


# ---- the loop ---------------------------------------------------------------------------------------
@contextmanager
def _sigint_flag() -> Iterator[dict[str, bool]]:
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


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


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
    max_steps: int | None,
    prefix_cache: dict[int, torch.Tensor] | None = None,
) -> UnitResult | None:
    cfg = reg.config
    unit = unit_of(cfg, name)
    samples = load_samples(reg, anchor, name)
    if prefix_cache is not None:
        for smp in samples:
            smp.states = prefix_cache.get(smp.window_id)
    start = min(cfg.memory.layers)
    epochs = [epoch_batches(samples, name, cfg.tree.k, tcfg, e) for e in range(tcfg.epochs)]
    total = sum(len(e) for e in epochs)
    params = UnitParams(cfg, unit)
    opt = BlockAdamW(params.flat(), lr=tcfg.lr, betas=tcfg.betas, eps=tcfg.eps, weight_decay=tcfg.weight_decay)
    ckpt = reg.checkpoint_dir() / f"unit-{name}.pt"
    step, tokens, losses, seconds = 0, 0, [], 0.0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        with torch.no_grad():
            for dst, src in zip(params.flat(), state["params"], strict=True):
                dst.copy_(src)
        opt.load_state_dict(state["opt"])
        step, tokens, losses, seconds = state["step"], state["tokens"], state["losses"], state["seconds"]
    resumed_from = step
    pad = anchor.tokenizer.pad_token_id
    t_start = time.perf_counter() - seconds

    def checkpoint() -> None:
        _save_checkpoint(ckpt, {"params": [p.detach().clone() for p in params.flat()], "opt": opt.state_dict(),
                                "step": step, "tokens": tokens, "losses": losses, "unit": name,
                                "seconds": time.perf_counter() - t_start, "config": dumps(dataclasses.asdict(tcfg))})

    flat_batches = [(e, b) for e, bs in enumerate(epochs) for b in bs]
    while step < total:
        epoch, batch_idx = flat_batches[step]
        batch = [samples[i] for i in batch_idx]
        ids, mask, labels = collate(batch, pad)
        local = []
        for pos, (level, first, _n) in enumerate(unit.levels):
            col = [0 if level == 0 else s.path[level - 1] - first for s in batch]
            local.append(torch.tensor(col, dtype=torch.long))
        opt.lr = lr_at(step, total, tcfg.lr, tcfg.warmup, tcfg.min_lr_ratio)
        states = None
        if start > 0 and batch[0].states is not None:
            states = torch.zeros(ids.shape[0], ids.shape[1], anchor.hidden)
            for i, smp in enumerate(batch):
                states[i, : len(smp.ids)] = smp.states
        with handle.using(params.fetched(local)):
            loss = lm_loss(anchor.model, ids, mask, labels, states, start)
        loss.backward()
        clip_grad_norm(params.flat(), tcfg.grad_clip)
        opt.step([local[i // len(PARTS)] for i in range(len(params.flat()))])
        opt.zero_grad()
        step += 1
        tokens += int(mask.sum())
        losses.append(float(loss.detach()))
        if progress:
            el = time.perf_counter() - t_start
            progress(TrainEvent(name, unit_no, n_units, step, total, epoch, losses[-1], tokens, tokens / max(el, 1e-9)))
        stopping = flag["stop"] or (max_steps is not None and step >= max_steps)
        if step % tcfg.checkpoint_every == 0 or stopping:
            checkpoint()
        if stopping:
            return None
    seconds = time.perf_counter() - t_start
    _finish_unit(reg, unit, params, samples, tcfg, tokens)
    ckpt.unlink(missing_ok=True)
    first = float(np.mean(losses[: max(1, len(losses) // 20)])) if losses else float("nan")
    last = float(np.mean(losses[-max(1, len(losses) // 20):])) if losses else float("nan")
    return UnitResult(name, step, tokens, first, last, seconds, resumed_from)


def _finish_unit(reg: Registry, unit: Unit, params: UnitParams, samples: list[Sample], tcfg: TrainConfig,
                 tokens: int) -> None:
    """Write the unit's trained blocks, then record them (and provenance) in one transaction."""
    used: dict[tuple[int, int], dict[str, int]] = {}  # (level, node) -> doc -> tokens per epoch
    for s in samples:
        for level, _first, _n in unit.levels:
            node = 0 if level == 0 else s.path[level - 1]
            d = used.setdefault((level, node), {})
            d[s.doc_id] = d.get(s.doc_id, 0) + len(s.ids)
    if unit.name == GENERIC:  # its tokens are a 1/(k+1) sample, not every window
        used = {(0, 0): {doc: n for doc, n in used.get((0, 0), {}).items()}}
    files = {}
    for pos, (level, first, _n) in enumerate(unit.levels):
        for (lvl, node) in used:
            if lvl == level:
                files[(lvl, node)] = reg.write_block(lvl, node, params.block(pos, node - first))
    stamp = now()
    with reg.db.atomic():
        for (lvl, node), (file, sha) in files.items():
            bid = block_id(lvl, node)
            trained = tokens if lvl == 0 else sum(used[(lvl, node)].values()) * tcfg.epochs
            reg.db["blocks"].update(bid, {"file": file, "sha256": sha, "state": "trained", "trained_tokens": trained,
                                          "updated": stamp})
            reg.db.execute("delete from block_docs where block_id = ?", [bid])
            reg.db["block_docs"].insert_all(
                [{"block_id": bid, "doc_id": doc, "tokens": n * (1 if lvl == 0 else tcfg.epochs)}
                 for doc, n in used[(lvl, node)].items()])


def train(
    name: str,
    overrides: dict[str, Any] | None = None,
    *,
    subtree: int | None = None,
    retrain: bool = False,
    restart: bool = False,
    home: Path | None = None,
    progress: Callable[[TrainEvent], None] | None = None,
    max_steps: int | None = None,
) -> TrainResult:
    """Train every unit that needs it (or one `subtree`), resuming from checkpoints.

    `overrides` are TrainConfig fields given by the user. `max_steps` stops each unit after that
    many steps with a checkpoint, as an interruption would (used by tests).
    """
    home = home or memctl_home()
    reg = Registry.open(name, home)
    if reg.count("windows") == 0:
        raise BankStateError(f"bank {name!r} has no documents; ingest some first")
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = set(overrides) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise InputError(f"unknown training option(s): {', '.join(sorted(unknown))}")
    if restart:
        for p in reg.checkpoint_dir().glob("unit-*.pt"):
            p.unlink()
    tcfg = _resolve_config(reg, overrides)
    todo, done = units_to_train(reg, subtree, retrain)
    result = TrainResult(bank=name, skipped=done)
    if not todo:
        return result
    anchor = load_anchor(reg.config.anchor, home)
    if anchor.digest != reg.get_meta("anchor_digest"):
        raise BankStateError(f"the anchor at {anchor.path} is not the one bank {name!r} was built on (sha256 differs)")
    torch.manual_seed(tcfg.seed)
    handle = attach(anchor.model, reg.config.memory.layers)
    reg.set_meta("train_config", dumps(dataclasses.asdict(tcfg)))
    try:
        cache = build_prefix_cache(reg, anchor, todo, progress)
        with _sigint_flag() as flag:
            for i, unit in enumerate(todo):
                run_id = reg.db["runs"].insert({"started": now(), "status": "running", "unit": unit,
                                                "config": dumps(dataclasses.asdict(tcfg))}).last_pk
                res = train_unit(reg, anchor, handle, unit, tcfg, i, len(todo), progress, flag, max_steps, cache)
                if res is None:
                    reg.db["runs"].update(run_id, {"status": "interrupted", "finished": now()})
                    result.interrupted = True
                    if flag["stop"]:
                        raise TrainingInterrupted("training interrupted; checkpoint saved, run `memctl train` to resume")
                    continue
                reg.db["runs"].update(run_id, {"status": "done", "finished": now(), "steps": res.steps,
                                               "tokens": res.tokens, "loss_first": res.loss_first,
                                               "loss_last": res.loss_last, "seconds": res.seconds})
                result.units.append(res)
    finally:
        handle.detach()
    return result


def build_prefix_cache(reg: Registry, anchor: Anchor, units: list[str],
                       progress: Callable[[TrainEvent], None] | None) -> dict[int, torch.Tensor] | None:
    """Inputs of the first memory layer for every window the units train on, computed once.

    None when memories start at layer 0, when the cache would pass CACHE_BYTES, or when this
    architecture's suffix forward does not reproduce its full forward."""
    start = min(reg.config.memory.layers)
    if start == 0:
        return None
    where = "" if GENERIC in units else f"l1 in ({','.join(str(int(u)) for u in units)})"
    n_tokens = reg.db.execute("select coalesce(sum(n_tokens), 0) from windows" + (f" where {where}" if where else ""))
    if n_tokens.fetchone()[0] * anchor.hidden * 4 > CACHE_BYTES:
        return None
    samples = load_samples(reg, anchor, GENERIC) if not where else [
        s for u in units for s in load_samples(reg, anchor, u)]
    samples.sort(key=lambda s: len(s.ids))  # little padding
    pad = anchor.tokenizer.pad_token_id
    ids, mask, _ = collate(samples[:2], pad)
    if not suffix_matches(anchor.model, ids, mask, start):
        return None
    cache: dict[int, torch.Tensor] = {}
    t0, done_tokens, bs = time.perf_counter(), 0, 16
    for i in range(0, len(samples), bs):
        batch = samples[i : i + bs]
        ids, mask, _ = collate(batch, pad)
        h = prefix_states(anchor.model, ids, mask, start)  # (B, T, d)
        for j, smp in enumerate(batch):
            cache[smp.window_id] = h[j, : len(smp.ids)].clone()
        done_tokens += int(mask.sum())
        if progress:
            el = time.perf_counter() - t0
            progress(TrainEvent("prefix", -1, len(units), min(i + bs, len(samples)), len(samples), 0, 0.0,
                                done_tokens, done_tokens / max(el, 1e-9)))
    return cache


def _resolve_config(reg: Registry, overrides: dict[str, Any]) -> TrainConfig:
    """A pending checkpoint fixes the configuration; otherwise defaults plus the user's options."""
    pending = sorted(reg.checkpoint_dir().glob("unit-*.pt"))
    if pending:
        saved = train_config_from_json(torch.load(pending[0], weights_only=False)["config"])
        clash = {k: v for k, v in overrides.items() if getattr(saved, k) != (tuple(v) if isinstance(v, list) else v)}
        if clash:
            raise InputError(
                f"an interrupted run with other settings is pending ({', '.join(f'{k}={getattr(saved, k)}' for k in clash)}); "
                "rerun without them to resume, or pass --restart")
        return saved
    if "betas" in overrides:
        overrides["betas"] = tuple(overrides["betas"])
    tcfg = TrainConfig(**overrides)
    tcfg.validate()
    return tcfg


def describe(tcfg: TrainConfig) -> str:
    return json.dumps(dataclasses.asdict(tcfg))
