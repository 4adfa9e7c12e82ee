"""Mixing the memories' next-token distribution with the anchor's (pure torch; knows no files).

    p(token) = (1 - w) p_memories(token) + w p_anchor(token)

Memories trained in every layer also read their corpus's vocabulary into neighbouring text the
corpus does not cover (foldoc's near-domain docstrings: "using the z|lib" -> "iv", from Lempel-Ziv).
The anchor's share puts back a floor under what the anchor expects, so such text is scored and
continued much as the anchor alone would. It also takes a share away from every fact the memories
recall: an answer survives only where the memories' token outweighs the anchor's own guess, which
for facts the anchor cannot know (invented names, dates) it often does not. docs/history.md measures
both sides on three corpora; memctl serves the memories alone unless asked, except near the relevance
gate's floor, where the gate's ramp gives each context a share of its own (memctl.core.relevance.anchor_share).

The anchor's distribution comes from the same forward pass: the batch is doubled, the second half
of the rows fetching nothing (`with_anchor_rows`), so one batched pass gives both and generation
keeps one KV cache per row as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from ..core.errors import InputError
from .memory import Fetched

# The anchor's share of each next-token distribution when memories are fetched (`--anchor-mix`): 0 serves the
# memories alone. 0.5 took foldoc's near-domain docstrings from +24% to +1.9% but cost fictional 19 of its 47
# recalled statements (docs/history.md), so memctl does not mix unless asked.
DEFAULT_ANCHOR_MIX = 0.0


def check_mix(weight: float) -> float:
    if not 0 <= weight <= 1:  # NaN fails too
        raise InputError(f"--anchor-mix is the anchor's share of each next-token distribution, 0 to 1; got {weight}")
    return float(weight)


Weights = float | Sequence[float]  # one share for the batch, or one per row


def row_weights(weight: Weights, rows: int) -> list[float]:
    """One share per row (a single share for every row)."""
    if isinstance(weight, int | float):
        return [float(weight)] * rows
    out = [float(w) for w in weight]
    if len(out) != rows:
        raise ValueError(f"{len(out)} anchor shares for {rows} rows")
    return out


def mixes(weight: Weights) -> bool:
    """Whether any row takes a share of the anchor (the batch must run twice over)."""
    return any(w > 0 for w in ([weight] if isinstance(weight, int | float) else weight))


def mixed_logprobs(memories: torch.Tensor, anchor: torch.Tensor, weight: Weights) -> torch.Tensor:
    """log((1 - w) softmax(memories) + w softmax(anchor)), from two (B, ..., V) logit tensors of one shape
    (float32); `weight` one share for every row or one per row."""
    m = torch.log_softmax(memories.float(), -1)
    w = row_weights(weight, m.shape[0])
    if all(v <= 0 for v in w):
        return m
    a = torch.log_softmax(anchor.float(), -1)
    if all(v >= 1 for v in w):
        return a
    wt = torch.tensor(w, dtype=torch.float32, device=m.device).clamp(0, 1).view(-1, *([1] * (m.dim() - 1)))
    # log(0) = -inf where a row takes none of one side: logaddexp then returns the other side exactly
    return torch.logaddexp(m + torch.log1p(-wt), a + torch.log(wt))


def with_anchor_rows(fetched: Fetched) -> Fetched:
    """The same blocks for the first `batch` rows, and `batch` more rows that fetch nothing: run the
    batch twice over (rows i and batch + i the same input) to get both distributions in one pass."""
    levels = [replace(lv, index=torch.cat([lv.index, torch.full_like(lv.index, -1)]), _views=lv._views)
              for lv in fetched.levels]  # fmt: skip
    # int8 packs name the rows they serve: the added rows are in none of them, so they get no memory
    return Fetched(levels, 2 * fetched.batch, fetched.packed)


def split_mix(logits: torch.Tensor, weight: Weights) -> torch.Tensor:
    """(2B, ..., V) logits of a doubled batch (with_anchor_rows) -> (B, ..., V) mixed log-probabilities."""
    half = logits.shape[0] // 2
    return mixed_logprobs(logits[:half], logits[half:], weight)


class AnchorMix:
    """A logits processor (transformers' LogitsProcessorList calls it) for generation on a doubled
    batch: both halves get the mixed log-probabilities of their row, so greedy decoding picks one token
    for rows i and B + i. `weight`: one share, or one per row of the (undoubled) batch."""

    def __init__(self, weight: Weights) -> None:
        self.weight = check_mix(weight) if isinstance(weight, int | float) else [check_mix(w) for w in weight]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        mixed = split_mix(scores, self.weight)
        return torch.cat([mixed, mixed]).to(scores.dtype)
