"""A unit whose training loss diverges starts over from its seeded initial state with half the
learning rate.

At memctl's learning rate (1e-2, chosen for speed on a CPU) a unit's loss can climb away and stay
there: seen once in ten self-study runs of benchmarks/corpora.py (FOLDOC, `--study 2`), where the
distillation loss rose from 1.7 to 6.7 within 40 steps of epoch 5 and the preservation loss from 1.6
to 5.2, leaving blocks that answered nothing and made unrelated text 4.8x as perplexing. After each
epoch the loop compares each batch kind's mean loss with that kind's best earlier epoch; a mean that
is not finite or more than DIVERGED_RATIO times the best means the unit diverged. Starting over
(rather than rolling back to an earlier epoch) keeps resuming exact: the restart count is all a
checkpoint needs to carry."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

DIVERGED_RATIO = 2.0  # an epoch's mean loss this many times the kind's best earlier epoch: diverged
MAX_RESTARTS = 2  # then the unit trains on as it is (the result records the restarts)


def kind_counts(schedule: Sequence[Sequence[str]]) -> list[dict[str, int]]:
    """Batches of each kind per epoch, from each epoch's batch kinds in training order."""
    return [dict(Counter(kinds)) for kinds in schedule]


def epoch_means(losses: dict[str, list[float]], counts: Sequence[dict[str, int]], epoch: int) -> dict[str, float]:
    """Each kind's mean batch loss in `epoch`; `losses` holds every batch loss of the kind so far, in
    training order, epoch after epoch."""
    out = {}
    for kind, values in losses.items():
        start = sum(c.get(kind, 0) for c in counts[:epoch])
        part = values[start : start + counts[epoch].get(kind, 0)]
        if part:
            out[kind] = math.fsum(part) / len(part)
    return out


def diverged(losses: dict[str, list[float]], counts: Sequence[dict[str, int]], epoch: int) -> bool:
    """Whether `epoch` (just finished) diverged: some kind's mean loss is not finite, or more than
    DIVERGED_RATIO times its best mean in an earlier epoch."""
    now = epoch_means(losses, counts, epoch)
    if any(not math.isfinite(v) for v in now.values()):
        return True
    for kind, value in now.items():
        earlier = [m[kind] for e in range(epoch) if kind in (m := epoch_means(losses, counts, e))]
        if earlier and value > DIVERGED_RATIO * min(earlier):
            return True
    return False
