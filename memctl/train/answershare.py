"""The answer's share in an echo question's targets (`train --echo-answer W`; pure numeric code).

An echo or kind question (memctl.train.echo) is distilled from the open-book teacher: the window, then the
question in a user turn, then the cloze's answer opening the assistant's turn. A small anchor reading the
window does not answer "how many minutes?" with the figure first: it opens with "The" or "Our", and the
figure is rarely among its top-k at the first answer position (incidents: 43 of 152 echo and kind
questions, and the most likely token in 5; cloze prompts: 785 and 745 of 804, docs/corpora.md). Matched as
it is, such a target teaches the student to open its answer as the teacher would, not to give the fact.

With a share W, each answer position's target is (1 - W) times the teacher's renormalised top-k plus W on
the answer's own token: at W >= 0.5 the answer is the most likely token at every position, and the rest
of the teacher's distribution still shapes the student's. Where the answer's token is not in the top-k it
takes the least likely slot. The position after the answer (where it ends) keeps the teacher's target.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

FLOOR = 1e-12  # a target probability of 0 is stored as log(FLOOR): softmax then gives it ~0


def with_answer(
    idx: torch.Tensor, logp: torch.Tensor, answer: Sequence[int], share: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets (n_pos, k) whose first len(answer) positions give `share` of their mass to the answer's
    token there: new (idx, logp) tensors, the teacher's untouched when `share` is 0. `logp` rows are the
    teacher's top-k log-probabilities (renormalised here, as the distillation loss does)."""
    if share <= 0:
        return idx, logp
    idx, logp = idx.clone(), logp.clone()
    for i, token in enumerate(list(answer)[: idx.shape[0]]):
        p = F.softmax(logp[i].double(), -1)
        hit = (idx[i] == token).nonzero()
        j = int(hit[0, 0]) if len(hit) else idx.shape[1] - 1
        if not len(hit):
            idx[i, j] = token
            p[j] = 0.0
            p = p / p.sum()
        q = (1.0 - share) * p
        q[j] += share
        logp[i] = q.clamp_min(FLOOR).log().to(logp.dtype)
    return idx, logp
