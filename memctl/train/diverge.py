"""A unit whose training loss diverges or drifts starts over from its seeded initial state with half
the learning rate; with `train --on-drift rollback` it goes back to the end of the last epoch that
did not, and on from there at half the rate.

At memctl's learning rate (1e-2, chosen for speed on a CPU) a unit's loss can climb away and stay
there: seen once in ten self-study runs of benchmarks/corpora.py (FOLDOC, `--study 2`), where the
distillation loss rose from 1.7 to 6.7 within 40 steps of epoch 5 and the preservation loss from 1.6
to 5.2, leaving blocks that answered nothing and made unrelated text 4.8x as perplexing. After each
epoch the loop compares each batch kind's mean loss with that kind's best earlier epoch; a mean that
is not finite or more than DIVERGED_RATIO times the best means the unit diverged. Starting over
throws away every epoch trained (elements' and foldoc's default units started over after epoch 2 or
3: 14 or 15 epochs' tokens for 12). Rolling back keeps them: the unit returns to its *mark*, its
whole state at the end of the last epoch that passed (blocks, optimizer moments, provenance, scores,
sit-outs), which the checkpoint carries while a restart is left, so a resumed unit goes back exactly
as an uninterrupted one, and only the failed epoch is trained again. Measured once on foldoc
(2026-12-01, docs/history.md): 7% fewer tokens than starting over after epoch 2, the same statements,
but unrelated text +4.0% with the gate on (+14.0% where its memories meet it) against +2.3% to +2.6%
for units that started over: the full-rate epochs it keeps had begun the drift. So it is not the default.

A unit can also go wrong slowly. In a FOLDOC unit at 1e-2 (docs/history.md, 2026-11-27) the
distillation loss fell, then stalled near 2.0 while the preservation loss drifted from 1.67 to 2.41
(first and last 5% of its steps): no epoch was twice the best, yet the blocks learned little and
made the unrelated text routed into them 3.6x as perplexing. The same bank at half the learning
rate trained well, its preservation loss flat (1.68 to 1.66). The preservation loss is the student's
cross-entropy to the anchor on text no document wrote, so it rising is the memories harming text
they should leave alone: an epoch whose preservation mean exceeds DRIFT_RATIO times the first
epoch's has drifted, and the unit starts over (or rolls back) the same way. That FOLDOC unit's epoch
means were 1.712, 1.889, 1.927, 1.969 and 2.175 (1.27x: restarted after epoch 5, it then trained as well as at
5e-3); healthy units' stayed within 1.04x of their first epoch's (FOLDOC at 5e-3, the fictional
corpus at 1e-2), and ended below it. The ratio was 1.2 until a FOLDOC unit at 1e-2 (2026-11-29) rose to
1.119x in epoch 2 and came back (1.810, 2.025, 2.028, 1.971, 1.917, ...): the guard never fired, and
the unit left the text routed into its memories 45% more perplexing (unrelated text +11.8% with the
gate on, against +1.6% to +2.4% for the unit restarted at half the rate). At 1.1 the three FOLDOC units
at 1e-2 measured fire by epoch 3 (1.103x, 1.125x, 1.119x), while fictional's stays below (1.044x)
and so does elements' cloze unit (1.047x before a spike of 1.21x that restarts it either way). Elements'
self-study unit reached 1.100x in epoch 3 (1.704, 1.849, 1.875) and started over too, for three epochs'
time and the same probe scores; whether its drift harms text is not measured (no unrelated text passes
the gate into it)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

DIVERGED_RATIO = 2.0  # an epoch's mean loss this many times the kind's best earlier epoch: diverged
DRIFT_RATIO = 1.1  # an epoch's preservation mean this many times the first epoch's: drifted
PRESERVE = "keep"  # the preservation batches' kind (memctl.train.batches)
# preservation on the anchor's hidden states (memctl.train.keepstates): 0 while the blocks are untrained
# and rising as they learn, so only a loss that is not finite counts against it
STATES = "states"
KIND_NAMES = {"lm": "next-token", "kd": "distillation", PRESERVE: "preservation", STATES: "preservation (states)"}


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


def diverged(losses: dict[str, list[float]], counts: Sequence[dict[str, int]], epoch: int) -> str | None:
    """Why `epoch` (just finished) means the unit must start over or roll back (memctl.train.loop), or None:
    some kind's mean loss is not finite, or more than DIVERGED_RATIO times its best mean in an earlier
    epoch, or the preservation mean is more than DRIFT_RATIO times the first epoch's."""
    now = epoch_means(losses, counts, epoch)
    for kind, value in now.items():
        if not math.isfinite(value):
            return f"{KIND_NAMES.get(kind, kind)} loss is {value}"
    for kind, value in now.items():
        earlier = [m[kind] for e in range(epoch) if kind in (m := epoch_means(losses, counts, e))]
        if not earlier or kind == STATES:
            continue
        name = KIND_NAMES.get(kind, kind)
        if value > DIVERGED_RATIO * min(earlier):
            return f"{name} loss {value:.3f} > {DIVERGED_RATIO:g}x its best epoch's {min(earlier):.3f}"
        if kind == PRESERVE and value > DRIFT_RATIO * earlier[0]:
            return f"{name} loss {value:.3f} > {DRIFT_RATIO:g}x the first epoch's {earlier[0]:.3f}"
    return None
