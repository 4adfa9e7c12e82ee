"""Token losses of texts under a bank: the anchor alone, or with the memories each text routes to.

A text is routed on its own embedding (the paper routes whole documents for perplexity); the loss
is the mean next-token negative log-likelihood over the text's tokens. Used by forgetting proofs
(a forgotten document's loss must look like that of a document the bank never saw).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..model.memory import Fetched
from ..model.mix import Weights, mixes, split_mix, with_anchor_rows
from ..model.prefix import on_model
from ..serve.session import BankSession

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class TextLoss:
    nll: float  # summed over the predicted tokens
    tokens: int  # predicted tokens (all but the first)

    @property
    def mean(self) -> float:
        return self.nll / self.tokens if self.tokens else float("nan")


def _pad(seqs: Sequence[Sequence[int]], pad_id: int, min_width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) ids and attention mask."""
    width = max(min_width, max(len(x) for x in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, x in enumerate(seqs):
        ids[i, : len(x)] = torch.tensor(list(x), dtype=torch.long)
        mask[i, : len(x)] = 1
    return ids, mask


def combine(losses: Sequence[TextLoss]) -> TextLoss:
    """Token-weighted total of several windows of one document."""
    return TextLoss(sum(x.nll for x in losses), sum(x.tokens for x in losses))


def log_probs(
    session: BankSession, ids: torch.Tensor, mask: torch.Tensor, fetched: Fetched | None, mix: Weights | None = None
) -> torch.Tensor:
    """(B, T, V) float32 next-token log-probabilities of a padded batch with the given blocks (None: the
    anchor alone), mixed with the anchor's own where memories are fetched: by `mix` (one share, or one per
    row: the relevance gate's ramp, BankSession.shares), else by the session's `anchor_mix`."""
    if fetched is None:
        mix = 0.0
    elif mix is None:
        mix = session.anchor_mix
    doubled = mixes(mix)
    if doubled:  # one pass over the batch twice: the second copy fetches nothing (memctl.model.mix)
        ids, mask, fetched = torch.cat([ids, ids]), torch.cat([mask, mask]), with_anchor_rows(fetched)  # type: ignore[arg-type]
    with session.handle.using(fetched):
        logits = session.anchor.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return split_mix(logits, mix) if doubled else torch.log_softmax(logits.float(), -1)


@torch.no_grad()
def token_losses(
    session: BankSession, seqs: Sequence[Sequence[int]], fetched: Fetched | None, mix: Weights | None = None
) -> list[TextLoss]:
    """NLL of each token sequence (right-padded batch) with the given blocks (None: anchor alone), mixed
    with the anchor by `mix` (see `log_probs`)."""
    ids, mask = on_model(session.anchor.model, *_pad(seqs, session.anchor.tokenizer.pad_token_id, 2))
    logp = log_probs(session, ids, mask, fetched, mix)  # (B, T, V)
    nll = F.nll_loss(logp[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # (B, T-1)
    valid = mask[:, 1:].bool()
    return [TextLoss(float(nll[i][valid[i]].sum()), int(valid[i].sum())) for i in range(len(seqs))]


def text_losses(
    session: BankSession,
    texts: Sequence[str],
    mode: str = "fetched",
    batch_size: int = 8,
    stage: str = "loss",
    progress: Progress | None = None,
) -> list[TextLoss]:
    """NLL of each text; mode 'fetched' (routed on the text), 'generic' or 'none' (anchor alone)."""
    tok = session.anchor.tokenizer
    out: list[TextLoss] = []
    for s in range(0, len(texts), batch_size):
        chunk = list(texts[s : s + batch_size])
        paths = session.route(chunk) if mode == "fetched" else None
        seqs = [tok(t, add_special_tokens=False)["input_ids"] for t in chunk]
        out.extend(token_losses(session, seqs, session.fetch(mode, paths, len(chunk))))
        if progress:
            progress(stage, min(s + batch_size, len(texts)), len(texts))
    return out


def summary(values: Sequence[float]) -> dict[str, float]:
    """mean, sd, min, max of a list of numbers (NaNs when empty)."""
    if not values:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "min": math.nan, "max": math.nan}
    a = np.asarray(values, dtype=np.float64)
    return {
        "n": int(a.size),
        "mean": float(a.mean()),
        "sd": float(a.std(ddof=1)) if a.size > 1 else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
    }


@torch.no_grad()
def answer_losses(
    session: BankSession,
    pairs: Sequence[tuple[str, str]],
    mode: str = "fetched",
    batch_size: int = 16,
    stage: str = "facts",
    progress: Progress | None = None,
) -> list[TextLoss]:
    """NLL of each answer's tokens (' ' + answer) after its prompt; memories routed on the prompt,
    as a question is routed at inference. Measures what the bank knows, not what it can recite."""
    tok = session.anchor.tokenizer
    out: list[TextLoss] = []
    for s in range(0, len(pairs), batch_size):
        chunk = list(pairs[s : s + batch_size])
        seqs, starts = [], []
        for prompt, answer in chunk:
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            a = tok(" " + answer, add_special_tokens=False)["input_ids"]
            seqs.append(p + a)
            starts.append(len(p))
        ids, mask = on_model(session.anchor.model, *_pad(seqs, tok.pad_token_id))
        paths = session.route([p for p, _a in chunk]) if mode == "fetched" else None
        logp = log_probs(session, ids, mask, session.fetch(mode, paths, len(chunk)))
        for i, (x, st) in enumerate(zip(seqs, starts, strict=True)):
            pos = torch.arange(st - 1, len(x) - 1, device=logp.device)
            nll = -logp[i, pos, torch.tensor(x[st:], dtype=torch.long, device=logp.device)].sum()
            out.append(TextLoss(float(nll), len(x) - st))
        if progress:
            progress(stage, min(s + batch_size, len(pairs)), len(pairs))
    return out
