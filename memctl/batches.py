"""Training data: windows as token samples, the seeded order of an epoch, collation, the loss."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .anchor import Anchor
from .config import TrainConfig
from .prefix import CACHE_BYTES, masked_lm_loss, prefix_states, suffix_logits, suffix_matches
from .registry import Registry
from .units import GENERIC


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
    # length buckets: sort runs of 8 batches by length so little compute goes to padding,
    # then shuffle the batches themselves
    batches: list[list[int]] = []
    span = 8 * bs
    for s in range(0, len(order), span):
        run = sorted(order[s : s + span].tolist(), key=lambda i: len(samples[i].ids))
        batches.extend(run[i : i + bs] for i in range(0, len(run), bs))
    return [batches[i] for i in rng.permutation(len(batches))]


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


def lm_loss(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor,
    states: torch.Tensor | None = None,
    start: int = 0,
    split_head: bool = False,
) -> torch.Tensor:
    """Mean next-token loss; with `states` (B, T, d) only layers[start:] and the head run; with
    `split_head` the head runs on labelled positions only (see prefix.masked_lm_loss)."""
    if split_head:
        return masked_lm_loss(model, ids, mask, labels, states, start)
    if states is None:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (B, T, V)
    else:
        logits = suffix_logits(model, states, mask, start)
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def build_prefix_cache(
    reg: Registry, anchor: Anchor, units: list[str], progress: Callable[[int, int, int, float], None] | None = None
) -> dict[int, torch.Tensor] | None:
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
    samples = (
        load_samples(reg, anchor, GENERIC) if not where else [s for u in units for s in load_samples(reg, anchor, u)]
    )
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
            progress(min(i + bs, len(samples)), len(samples), done_tokens, done_tokens / max(el, 1e-9))
    return cache
