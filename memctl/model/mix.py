"""Mixing the memories' next-token distribution with the anchor's (pure torch; knows no files).

    p(token) = (1 - w) p_memories(token) + w p_anchor(token)

Memories trained in every layer also read their corpus's vocabulary into neighbouring text the
corpus does not cover (foldoc's near-domain docstrings: "using the z|lib" -> "iv", from Lempel-Ziv).
The anchor's share puts back a floor under what the anchor expects, so such text is scored and
continued much as the anchor alone would. It also takes a share away from every fact the memories
recall: an answer survives only where the memories' token outweighs the anchor's own guess, which
for facts the anchor cannot know (invented names, dates) it often does not. docs/corpora.md measures
both sides on three corpora; memctl serves the memories alone unless asked.

The anchor's distribution comes from the same forward pass: the batch is doubled, the second half
of the rows fetching nothing (`with_anchor_rows`), so one batched pass gives both and generation
keeps one KV cache per row as usual.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..core.errors import InputError
from .memory import Fetched

# The anchor's share of each next-token distribution when memories are fetched (`--anchor-mix`): 0 serves the
# memories alone. 0.5 took foldoc's near-domain docstrings from +24% to +1.9% but cost fictional 19 of its 47
# recalled statements (docs/corpora.md), so memctl does not mix unless asked.
DEFAULT_ANCHOR_MIX = 0.0


def check_mix(weight: float) -> float:
    if not 0 <= weight <= 1:  # NaN fails too
        raise InputError(f"--anchor-mix is the anchor's share of each next-token distribution, 0 to 1; got {weight}")
    return float(weight)


def mixed_logprobs(memories: torch.Tensor, anchor: torch.Tensor, weight: float) -> torch.Tensor:
    """log((1 - w) softmax(memories) + w softmax(anchor)), from two logit tensors of one shape (float32)."""
    m = torch.log_softmax(memories.float(), -1)
    if weight <= 0:
        return m
    a = torch.log_softmax(anchor.float(), -1)
    if weight >= 1:
        return a
    return torch.logaddexp(m + math.log1p(-weight), a + math.log(weight))


def with_anchor_rows(fetched: Fetched) -> Fetched:
    """The same blocks for the first `batch` rows, and `batch` more rows that fetch nothing: run the
    batch twice over (rows i and batch + i the same input) to get both distributions in one pass."""
    levels = [replace(lv, index=torch.cat([lv.index, torch.full_like(lv.index, -1)]), _views=lv._views)
              for lv in fetched.levels]  # fmt: skip
    # int8 packs name the rows they serve: the added rows are in none of them, so they get no memory
    return Fetched(levels, 2 * fetched.batch, fetched.packed)


def split_mix(logits: torch.Tensor, weight: float) -> torch.Tensor:
    """(2B, ..., V) logits of a doubled batch (with_anchor_rows) -> (B, ..., V) mixed log-probabilities."""
    half = logits.shape[0] // 2
    return mixed_logprobs(logits[:half], logits[half:], weight)


class AnchorMix:
    """A logits processor (transformers' LogitsProcessorList calls it) for generation on a doubled
    batch: both halves get the mixed log-probabilities of their row, so greedy decoding picks one token
    for rows i and B + i."""

    def __init__(self, weight: float) -> None:
        self.weight = check_mix(weight)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        mixed = split_mix(scores, self.weight)
        return torch.cat([mixed, mixed]).to(scores.dtype)
