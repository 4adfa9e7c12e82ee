"""Retiring learned prompts (`train --retire N`): a prompt the memories already answer as the teacher
does sits out the next N epochs, then trains once more and is checked again.

Every epoch trains every prompt, though most cloze answers are learned long before the last epoch;
the tokens spent on them after that buy nothing the memories do not already say. A distillation
sample (cloze prompt, question or self-study continuation) counts as learned when, in the step that
just trained it, the student's most likely next token equals the teacher's at every one of its
target positions (read from the training forward: checking costs nothing). It then sits out epochs
e+1 .. e+N; in epoch e+N+1 it trains again, and learned again it sits out again. A sample the
memories have forgotten meanwhile trains on until it is learned again.

Preservation keeps its share: an epoch whose distillation tokens fall to a share s of their full
count trains each preservation sequence with probability s (seeded by epoch), so the anchor's own
text stays `--preserve` times the tokens actually trained.

Pure bookkeeping: which samples an epoch trains follows from the seed and the sit-outs recorded so
far, so a resumed run (memctl.train.checkpoint) rebuilds every past epoch's batches exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .batches import Sample

# sample index -> the epochs it sits out, as [first, end) intervals
Retired = dict[int, list[tuple[int, int]]]


def sits_out(retired: Retired, i: int, epoch: int) -> bool:
    return any(a <= epoch < b for a, b in retired.get(i, ()))


def retire(retired: Retired, i: int, epoch: int, epochs_out: int) -> None:
    """Sample `i`, learned in `epoch`, sits out the next `epochs_out` epochs."""
    if epochs_out > 0:
        retired.setdefault(i, []).append((epoch + 1, epoch + 1 + epochs_out))


def epoch_plan(
    samples: Sequence[Sample], batches: Sequence[Sequence[int]], retired: Retired, epoch: int, seed: Sequence[int]
) -> list[list[int]]:
    """The batches `epoch` trains: its scheduled `batches` without the distillation samples sitting it
    out, and with preservation thinned to the share of distillation tokens that still train. A batch
    may come out empty (its step is skipped). `seed` (the unit's) seeds the thinning."""
    if not retired:
        return [list(b) for b in batches]
    full = active = 0
    for b in batches:
        for i in b:
            if samples[i].kind == "kd":
                n = len(samples[i].ids)
                full += n
                active += 0 if sits_out(retired, i, epoch) else n
    share = active / full if full else 1.0
    rng = np.random.default_rng([*seed, epoch, 11])
    out = []
    for b in batches:
        draws = rng.random(len(b))  # one draw per row whatever its kind: the stream never shifts
        out.append(
            [
                i
                for i, u in zip(b, draws.tolist(), strict=True)
                if not (samples[i].kind == "kd" and sits_out(retired, i, epoch))
                and not (samples[i].keep and u >= share)
            ]
        )
    return out


def encode(retired: Retired) -> list[list[int]]:
    """JSON-ready: [[sample, first, end], ...]."""
    return [[i, a, b] for i, spans in sorted(retired.items()) for a, b in spans]


def decode(rows: Sequence[Sequence[int]]) -> Retired:
    out: Retired = {}
    for i, a, b in rows:
        out.setdefault(int(i), []).append((int(a), int(b)))
    return out
