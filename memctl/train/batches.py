"""Training data: windows (next-token loss) and prompts (distillation) as samples, the seeded order of
an epoch, collation and the losses."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..core.config import TrainConfig
from ..model.anchor import Anchor
from ..model.mix import mixed_logprobs
from ..model.prefix import CACHE_BYTES, layer_outputs, logits_at, prefix_states, suffix_matches
from ..registry import Registry
from .answershare import with_answer
from .kinds import ECHO, NAMING, RULE_KINDS, STUDY, untrained_kinds
from .units import GENERIC


@dataclass
class Sample:
    key: str  # "w<id>" for a window, "p<id>" for a prompt: the prefix-cache key
    doc_id: str
    ids: list[int]
    path: tuple[int, ...]
    states: torch.Tensor | None = None  # cached input of the first memory layer, (T, d)
    # distillation targets (None for a next-token sample)
    n_prompt: int = 0  # positions n_prompt-1 .. len(ids)-2 predict the answer tokens
    topk_idx: torch.Tensor | None = None  # (A, k) int64
    topk_logp: torch.Tensor | None = None  # (A, k) float32
    keep: bool = False  # a preservation sample: match the anchor alone at every position
    hidden: torch.Tensor | None = None  # (A, layers, d) float16: the teacher's hidden states (train --match-hidden)
    # the position of each of the A targets, where prompts ride in a longer one (`merge_prefixes`); None: the
    # positions n_prompt-1 .. n_prompt-2+A
    kd_pos: list[int] | None = None
    prompts: int = 1  # how many prompts the sample carries: a batch holds as many prompts as before merging
    # a self-study continuation: its place among its window's (in sampling order) and how many the window has
    # (`in_epoch`); -1 and 0 for every other sample
    turn: int = -1
    turns: int = 0

    @property
    def kind(self) -> str:
        return "lm" if self.topk_idx is None else "keep" if self.keep else "kd"


def parse_path(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def window_samples(reg: Registry, anchor: Anchor, unit: str) -> list[Sample]:
    rows = reg.windows() if unit == GENERIC else reg.windows("l1 = ?", [int(unit)])
    tok = anchor.tokenizer
    out = []
    for r in rows:
        ids = tok(r["text"], add_special_tokens=False)["input_ids"]
        if len(ids) >= 2:
            out.append(Sample(f"w{r['id']}", r["doc_id"], ids, parse_path(r["path"])))
    return out


def _teacher(row: dict[str, Any], n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A stored teacher's top-k at n_pos positions: (n_pos, k) int64 indices, float32 log-probabilities."""
    idx = np.frombuffer(row["topk_idx"], dtype=np.int32).reshape(n_pos, -1).astype(np.int64)
    logp = np.frombuffer(row["topk_logp"], dtype=np.float32).reshape(n_pos, -1).copy()
    return torch.from_numpy(idx), torch.from_numpy(logp)


def kd_loss(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_logp: torch.Tensor,
    states: torch.Tensor | None = None,
    start: int = 0,
    split_head: bool = True,
    tail: bool = False,
    anchor_logits: torch.Tensor | None = None,
    mix: float = 0.0,
    agree: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Cross-entropy of the student against the teacher's top-k (= KL up to the teacher's entropy).
    positions (N, 2) = (row, t); topk_* (N, k), the teacher's true log-probabilities.

    tail=False: against the renormalised top-k, which sharpens the student onto the teacher's
    candidates (answers). tail=True: the top-k plus one bucket for all other tokens, with their mass
    on both sides: the student matches the teacher's whole distribution, its spread included
    (preservation: renormalising there would make every token outside the top-k less likely).
    With `mix` > 0 the student is (1 - mix) p(memories) + mix p(anchor), `anchor_logits` (N, V) at the
    same positions without memories (memctl.model.mix). With `agree`, appends a (B,) bool: whether the
    student's most likely token is the teacher's at every target position of the row (memctl.train.retire)."""
    logits = logits_at(model, ids, mask, positions[:, 0], positions[:, 1], states, start, split_head)  # (N, V)
    topk_idx, topk_logp = topk_idx.to(logits.device), topk_logp.to(logits.device)
    logp_all = student_logp(logits, anchor_logits, mix)  # (N, V)
    logp_s = logp_all.gather(1, topk_idx)  # (N, k)
    if agree is not None:
        with torch.no_grad():
            top_t = topk_idx.gather(1, topk_logp.argmax(-1, keepdim=True)).squeeze(1)
            miss = (logp_all.argmax(-1) != top_t).float()
            rows = positions[:, 0].to(miss.device)
            agree.append(torch.zeros(ids.shape[0], device=miss.device).index_add_(0, rows, miss).cpu() == 0)
    if not tail:
        p_t = F.softmax(topk_logp, -1)
        return -(p_t * logp_s).sum(-1).mean()
    p_t = topk_logp.exp()
    rest_t = (1.0 - p_t.sum(-1)).clamp_min(0.0)
    rest_s = torch.log1p(-logp_s.exp().sum(-1).clamp(max=1.0 - 1e-6))
    return (-(p_t * logp_s).sum(-1) - rest_t * rest_s).mean()


def student_logp(logits: torch.Tensor, anchor_logits: torch.Tensor | None, mix: float) -> torch.Tensor:
    """The student's log-probabilities (N, V): the memories' own, or mixed with the anchor's."""
    if mix > 0 and anchor_logits is not None:
        return mixed_logprobs(logits, anchor_logits.to(logits.device), mix)
    return F.log_softmax(logits.float(), -1)


def _left_out(questions: bool, study: bool, echo: bool = False, named: bool = False) -> str:
    """SQL condition on `p.kind` leaving out the kinds a run does not train on."""
    return "".join(f" and p.kind != '{k}'" for k in untrained_kinds(questions, study, echo, named))


def prompt_samples(
    reg: Registry,
    unit: str,
    questions: bool = False,
    study: bool = False,
    hidden: bool = False,
    echo: bool = False,
    echo_answer: float = 0.0,
    named: bool = False,
) -> list[Sample]:
    """Trained (not held-out) prompts of a unit: on the prompt's own route when it lies in the unit,
    and on its window's route when that lies in the unit and differs (both paths are trained).
    Anchor-written questions (memctl.train.questions) only with `questions`, self-study continuations
    (memctl.train.study) only with `study`, echo questions (memctl.train.echo) only with `echo`; with
    `hidden`, the teacher's hidden states where stored; `echo_answer`, the answer's share in echo questions'
    targets (memctl.train.answershare); naming prompts (memctl.train.namings) only with `named`."""
    sql = (
        "select p.id, p.doc_id, p.window_id, p.kind, p.ids, p.n_prompt, p.topk_idx, p.topk_logp, p.path, "
        "w.path as wpath"
        + (", p.hidden " if hidden else " ")
        + "from prompts p join windows w on w.id = p.window_id where p.held_out = 0 and p.topk_idx is not null"
        + _left_out(questions, study, echo, named)
    )
    out, cloze = [], []  # every prompt in id order; the cloze ones, which may ride in a longer one
    rows = list(reg.db.query(sql + " order by p.id"))
    turns = Counter(r["window_id"] for r in rows if r["kind"] == STUDY)  # window -> its self-study continuations
    seen: dict[int, int] = {}
    for r in rows:
        turn = -1
        if r["kind"] == STUDY:
            turn = seen.get(r["window_id"], 0)
            seen[r["window_id"]] = turn + 1
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        n_pos = len(ids) - r["n_prompt"] + 1  # each answer token, and the one after
        idx, logp = _teacher(r, n_pos)
        if r["kind"] == ECHO:
            idx, logp = with_answer(idx, logp, ids[r["n_prompt"] :], echo_answer)
        hid = None
        if hidden and r["hidden"] is not None:
            flat = np.frombuffer(r["hidden"], dtype=np.float16)
            hid = torch.from_numpy(flat.reshape(n_pos, -1, reg.config.memory.hidden).copy())
        paths = (
            [parse_path(r["path"])]
            if unit == GENERIC
            else [p for p in dict.fromkeys([parse_path(r["path"]), parse_path(r["wpath"])]) if p[0] == int(unit)]
        )
        for path in paths:
            smp = Sample(f"p{r['id']}", r["doc_id"], ids, path, None, r["n_prompt"], idx, logp, hidden=hid)
            if turn >= 0:
                smp.turn, smp.turns = turn, turns[r["window_id"]]
            out.append(smp)
            if r["kind"] in CLOZE_KINDS:
                cloze.append(smp)
    hosts = {(s.key, s.path): s for s in merge_prefixes(cloze)}
    kept = {(s.key, s.path) for s in cloze}
    return [hosts.get((s.key, s.path), s) for s in out if (s.key, s.path) in hosts or (s.key, s.path) not in kept]


CLOZE_KINDS = (*RULE_KINDS, NAMING)  # statements cut before an answer: one may ride in a longer one


def merge_prefixes(samples: list[Sample]) -> list[Sample]:
    """Prompts that ride in a longer one: a prompt whose tokens (prompt and answer) begin a longer prompt of
    the same document on the same path ("X ran on" -> "MS-DOS" inside "X ran on MS-DOS and" -> "Windows")
    adds its targets at their own positions in the longer one, where the context is the same token for
    token: the same loss for fewer tokens through the anchor. Order: the hosts', in `samples` order."""
    hosts: dict[tuple[str, tuple[int, ...]], list[Sample]] = {}
    riders: dict[int, list[Sample]] = {}  # by id() of the host
    for smp in sorted(samples, key=lambda x: -len(x.ids)):
        group = hosts.setdefault((smp.doc_id, smp.path), [])
        host = next((h for h in group if len(h.ids) > len(smp.ids) and h.ids[: len(smp.ids)] == smp.ids), None)
        if host is None or smp.hidden is not None or host.hidden is not None:
            group.append(smp)
            riders[id(smp)] = []
        else:
            riders[id(host)].append(smp)
    out = []
    for smp in samples:
        if id(smp) not in riders:
            continue  # rides in a host
        if not riders[id(smp)]:
            out.append(smp)
            continue
        pos = _target_positions(smp)
        idx, logp = [smp.topk_idx], [smp.topk_logp]
        for r in riders[id(smp)]:
            theirs = _target_positions(r)
            keep = [j for j, t in enumerate(theirs) if t not in pos]  # a position both predict counts once
            pos += [theirs[j] for j in keep]
            assert r.topk_idx is not None and r.topk_logp is not None
            idx.append(r.topk_idx[keep])
            logp.append(r.topk_logp[keep])
        n = 1 + len(riders[id(smp)])
        out.append(dataclasses.replace(smp, topk_idx=torch.cat(idx), topk_logp=torch.cat(logp), kd_pos=pos, prompts=n))
    return out


def _target_positions(s: Sample) -> list[int]:
    """The position that predicts each of a prompt sample's targets."""
    assert s.topk_idx is not None
    return list(s.kd_pos) if s.kd_pos is not None else list(range(s.n_prompt - 1, s.n_prompt - 1 + len(s.topk_idx)))


def preserve_samples(
    reg: Registry, unit: str, share: float, samples: list[Sample], seed: int, pool_size: int, per_epoch: int = 0
) -> list[Sample]:
    """Pool sequences (memctl.train.preserve) worth `share` of the unit's training tokens in an epoch, each on
    a path drawn from the unit's own paths: every block of the unit learns to leave unrelated text alone.
    Only the pool's first `pool_size` sequences are used (`train --preserve-pool`); `per_epoch` as in
    `epoch_tokens`."""
    if share <= 0 or not samples:
        return []
    sql = "select id, ids, topk_idx, topk_logp from preserve where id < ? order by id"
    pool = list(reg.db.query(sql, [pool_size]))
    if not pool:
        return []
    tokens = epoch_tokens(samples, per_epoch)
    length = len(pool[0]["ids"]) // 4
    n = max(1, math.ceil(share * tokens / length))
    rng = np.random.default_rng(unit_seed(seed, unit) + [7])
    picks = rng.choice(len(pool), size=n, replace=n > len(pool))
    paths = sorted({s.path for s in samples})
    out = []
    for i in picks.tolist():
        r = pool[i]
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        idx, logp = _teacher(r, len(ids))  # every position
        path = paths[int(rng.integers(len(paths)))]
        out.append(Sample(f"k{r['id']}", "", ids, path, None, 1, idx, logp, keep=True))
    return out


def load_samples(
    reg: Registry,
    anchor: Anchor,
    unit: str,
    objective: str = "lm",
    questions: bool = False,
    study: bool = False,
    hidden: bool = False,
    echo: bool = False,
    echo_answer: float = 0.0,
    named: bool = False,
) -> list[Sample]:
    """The unit's samples for an objective: lm = windows, distill = prompts, mix = both. Under
    distill, a window that yields no prompt (nothing salient to ask about) is learned next-token.
    With `hidden`, self-study samples carry the teacher's hidden states. Preservation samples
    (preserve_samples) come on top."""
    if objective == "lm":
        return window_samples(reg, anchor, unit)
    windows = window_samples(reg, anchor, unit)
    if objective == "distill":
        sql = "select distinct window_id from prompts p where 1 = 1" + _left_out(questions, study, echo, named)
        prompted = {f"w{r['window_id']}" for r in reg.db.query(sql)}
        windows = [w for w in windows if w.key not in prompted]
    return windows + prompt_samples(reg, unit, questions, study, hidden, echo, echo_answer, named)


def unit_seed(seed: int, unit: str) -> list[int]:
    return [seed, 1_000_000 if unit == GENERIC else int(unit)]


def epoch_batches(samples: list[Sample], unit: str, k: int, tcfg: TrainConfig, epoch: int) -> list[list[int]]:
    """Seeded order of one epoch. The generic memory sees each window with probability 1/(k+1)."""
    rng = np.random.default_rng(unit_seed(tcfg.seed, unit) + [epoch])
    order = rng.permutation(len(samples))
    if tcfg.study_per_epoch > 0:
        order = order[[in_epoch(samples[i], tcfg.study_per_epoch, epoch) for i in order.tolist()]]
    if unit == GENERIC:
        keep = rng.random(len(samples)) < 1.0 / (k + 1)
        order = order[keep[order]]
    # one kind per batch (preservation sequences are short: twice as many per step); length buckets:
    # sort runs of 8 batches by length so little compute goes to padding; then shuffle the batches
    # (a sample carrying merged prompts counts as that many: see merge_prefixes). Within a batch, samples
    # go in path order: each block's rows are then one run (memctl.model.memory.memory_delta)
    batches: list[list[int]] = []
    for kind in ("lm", "kd", "keep"):
        bs = tcfg.batch_size * {"lm": 1, "kd": tcfg.prompt_batch_factor, "keep": 2}[kind]
        mine = [i for i in order.tolist() if samples[i].kind == kind]
        for run in _chunks(mine, samples, 8 * bs):
            chunks = _chunks(sorted(run, key=lambda i: len(samples[i].ids)), samples, bs)
            batches.extend(sorted(c, key=lambda i: samples[i].path) for c in chunks)
    return [batches[i] for i in rng.permutation(len(batches))]


def in_epoch(s: Sample, per_epoch: int, epoch: int) -> bool:
    """Whether `s` trains in `epoch` when each window's self-study continuations take turns, `per_epoch` at a
    time (`train --study-per-epoch`): its continuations 0..per-1 in epoch 0, the next ones in epoch 1, ...,
    starting over once all have had a turn. Every other sample trains in every epoch."""
    rounds = _rounds(s, per_epoch)
    return rounds == 1 or s.turn // per_epoch == epoch % rounds


def epoch_tokens(samples: Sequence[Sample], per_epoch: int) -> float:
    """Tokens an epoch trains on average, self-study continuations counted by the share of epochs they train in."""
    return sum(len(s.ids) / _rounds(s, per_epoch) for s in samples)


def _rounds(s: Sample, per_epoch: int) -> int:
    """Epochs a sample's turn takes to come round again: 1 for a sample that trains in every epoch."""
    return 1 if s.turn < 0 or per_epoch <= 0 else -(-s.turns // per_epoch)


def _chunks(idx: list[int], samples: list[Sample], size: int) -> list[list[int]]:
    """Consecutive runs of `idx` carrying `size` prompts each (the last may carry fewer)."""
    out: list[list[int]] = []
    cur: list[int] = []
    carried = 0
    for i in idx:
        cur.append(i)
        carried += samples[i].prompts
        if carried >= size:
            out.append(cur)
            cur, carried = [], 0
    return out + [cur] if cur else out


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


def kd_targets(batch: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, 2) (row, position) pairs that predict the answer tokens and the token after the answer,
    and the teacher's (N, k) top-k there."""
    pos, idx, logp = [], [], []
    for row, s in enumerate(batch):
        assert s.topk_idx is not None and s.topk_logp is not None
        pos += [(row, t) for t in _target_positions(s)]
        idx.append(s.topk_idx)
        logp.append(s.topk_logp)
    return torch.tensor(pos, dtype=torch.long), torch.cat(idx), torch.cat(logp)


def loss_positions(batch: list[Sample]) -> int:
    """How many positions `batch_loss` averages over: every next-token position of an `lm` window, the
    answer positions of a prompt (`kd`, `keep`)."""
    if batch[0].kind == "lm":
        return sum(len(s.ids) - 1 for s in batch)
    return sum(int(s.topk_idx.shape[0]) for s in batch if s.topk_idx is not None)


def batch_loss(
    model: Any,
    batch: list[Sample],
    ids: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor,
    states: torch.Tensor | None,
    start: int,
    split_head: bool,
    hidden_layers: Sequence[int] = (),
    hidden_weight: float = 0.0,
    mix: float = 0.0,
    anchor_alone: Callable[[], AbstractContextManager[Any]] | None = None,
    agree: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """The batch's loss: next-token for windows, distillation for prompts; plus, with `hidden_weight`,
    that weight times `hidden_loss` on the samples that carry the teacher's hidden states. With `mix`,
    the student is the mixture with the anchor, whose logits come from a pass under `anchor_alone()`
    (a context in which the model fetches no memory). `agree` as in `kd_loss` (prompt batches only)."""

    def anchor_at(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor | None:
        if mix <= 0 or anchor_alone is None:
            return None
        with torch.no_grad(), anchor_alone():
            return logits_at(model, ids, mask, rows, cols, states, start, split_head)

    if batch[0].kind == "lm":  # "kd" and "keep" share the distillation loss
        rows, cols = (labels[:, 1:] != -100).nonzero(as_tuple=True)
        return lm_loss(model, ids, mask, labels, states, start, split_head, anchor_at(rows, cols), mix)
    pos, idx, logp = kd_targets(batch)
    anchor_logits = anchor_at(pos[:, 0], pos[:, 1])
    deep = hidden_weight > 0 and bool(hidden_layers) and any(s.hidden is not None for s in batch)
    with layer_outputs(model, hidden_layers if deep else ()) as outs:
        loss = kd_loss(
            model, ids, mask, pos, idx, logp, states, start, split_head, batch[0].keep, anchor_logits, mix, agree
        )
    if deep:
        loss = loss + hidden_weight * hidden_loss(batch, [outs[i] for i in hidden_layers])
    return loss


def hidden_loss(batch: list[Sample], outs: list[torch.Tensor]) -> torch.Tensor:
    """Deep context distillation's hidden-state term (Caccia et al. 2025): at every position that
    predicts a continuation token, the L1 distance between the student's and the teacher's output of
    each matched layer, over the teacher's L1 norm; the mean over positions and layers of the samples
    that carry the teacher's states. `outs` (B, T, d) per layer, in the samples' layer order."""
    student, teacher = [], []
    for row, s in enumerate(batch):
        if s.hidden is None:
            continue
        cols = torch.arange(s.n_prompt - 1, s.n_prompt - 1 + s.hidden.shape[0], device=outs[0].device)
        student.append(torch.stack([o[row, cols] for o in outs], 1))  # (A, layers, d)
        teacher.append(s.hidden)
    h_s = torch.cat(student).float()
    h_t = torch.cat(teacher).to(h_s.device).float()
    return ((h_s - h_t).abs().sum(-1) / h_t.abs().sum(-1).clamp_min(1e-6)).mean()


def lm_loss(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor,
    states: torch.Tensor | None = None,
    start: int = 0,
    split_head: bool = False,
    anchor_logits: torch.Tensor | None = None,
    mix: float = 0.0,
) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled positions (see prefix.logits_at), of the memories
    or of their mixture with the anchor (`kd_loss`)."""
    rows, cols = (labels[:, 1:] != -100).nonzero(as_tuple=True)  # position t predicts token t+1
    logits = logits_at(model, ids, mask, rows, cols, states, start, split_head)  # (N, V)
    return F.nll_loss(student_logp(logits, anchor_logits, mix), labels[rows, cols + 1].to(logits.device))


def build_prefix_cache(
    anchor: Anchor, start: int, samples: list[Sample], progress: Callable[[int, int, int, float], None] | None = None
) -> dict[str, torch.Tensor] | None:
    """Inputs of the first memory layer (layer `start`) for every sample, computed once, by sample key.

    None when memories start at layer 0, when the cache would pass CACHE_BYTES, or when this
    architecture's suffix forward does not reproduce its full forward."""
    unique = list({s.key: s for s in samples}.values())
    if (
        start == 0
        or not unique
        or sum(len(s.ids) for s in unique) * anchor.hidden * anchor.dtype.itemsize > CACHE_BYTES
    ):
        return None
    unique.sort(key=lambda s: len(s.ids))  # little padding
    pad = anchor.tokenizer.pad_token_id
    ids, mask, _ = collate(unique[-2:], pad)
    if not suffix_matches(anchor.model, ids, mask, start):
        return None
    cache: dict[str, torch.Tensor] = {}
    t0, done_tokens, bs = time.perf_counter(), 0, 16
    for i in range(0, len(unique), bs):
        batch = unique[i : i + bs]
        ids, mask, _ = collate(batch, pad)
        h = prefix_states(anchor.model, ids, mask, start)  # (B, T, d)
        for j, smp in enumerate(batch):
            cache[smp.key] = h[j, : len(smp.ids)].clone()
        done_tokens += int(mask.sum())
        if progress:
            el = time.perf_counter() - t0
            progress(min(i + bs, len(unique)), len(unique), done_tokens, done_tokens / max(el, 1e-9))
    return cache
