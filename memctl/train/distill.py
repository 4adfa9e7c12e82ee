"""Self-study with context distillation (Cartridges, 2025), routed the way inference routes.

Teacher: the frozen anchor with the window in its context (open book). Student: the anchor with
the memories of a route and no window. For every prompt about a window (memctl.train.prompts) the
student learns the teacher's next-token distributions over the answer tokens. Because the anchor
is frozen, the teacher's top-k distributions are computed once and cached in the registry; every
later epoch costs one student pass. The window's KV cache is computed once and shared by all of
its prompts.

Every prompt is routed from its own embedding, as a question will be at inference, so the block
that will be fetched for it is the one that learns its answer; where that route differs from the
window's, both paths are trained.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..build.routing import route_rows
from ..core.probes import PROBE_TOKENS, is_correct
from ..model.anchor import Anchor, greedy, has_chat_template
from ..model.prefix import on_model
from ..registry import Registry
from .batches import Sample, _teacher, batch_loss, collate, loss_positions
from .coverage import bank_coverage
from .echo import add_echo
from .kinds import ECHO, QUESTION, replace_kind
from .leads import window_leads
from .namings import add_namings
from .prompts import RULES, joins_without_space, window_prompts
from .questions import ANSWER_TOKENS, answer_questions, chat_prompt, write_questions
from .reprompt import settle
from .sections import window_openings
from .study import add_study

TOPK = 16
HELD_OUT_EVERY = 10  # one prompt in ten is held out for scoring
MAX_ANSWER_TOKENS = 8
TEACHER_SEPARATOR = "\n\n"
Progress = Callable[[str, int, int], None]


NO_ECHO = "no echo questions: the anchor's tokenizer has no chat template to ask them in"


@dataclass
class PrepareReport:
    prompts_added: int
    prompts_total: int
    route_differs_leaf: float  # share of prompts routed to another leaf than their window
    route_differs_l1: float
    teacher_seconds: float
    study_added: int = 0  # self-study continuations sampled now (memctl.train.study)
    study_seconds: float = 0.0
    coverage: dict[str, Any] = field(default_factory=dict)  # memctl.train.coverage.Coverage.to_dict()
    notes: tuple[str, ...] = ()  # what the run asked for and could not do


def _held_out(window_id: int, text: str) -> int:
    h = hashlib.blake2b(f"{window_id}:{text}".encode(), digest_size=4).digest()
    return int(int.from_bytes(h, "little") % HELD_OUT_EVERY == 0)


def generate_prompts(reg: Registry, progress: Progress | None = None) -> int:
    """Prompts for every window that has none yet, routed by their own embedding. Returns how many."""
    settle(reg)  # windows of older rules whose prompts these rules write the same: recorded as current
    rows = list(
        reg.db.query(
            "select w.id, w.doc_id, w.text, d.title from windows w join documents d on d.id = w.doc_id "
            "where w.prompted = 0 order by w.id"
        )
    )
    if not rows:
        return 0
    docs = {r["doc_id"] for r in rows}
    starts, leads = window_openings(reg, docs), window_leads(reg, docs)
    made: list[dict[str, Any]] = []
    for r in rows:
        for p in window_prompts(r["text"], r["title"], starts[int(r["id"])], leads[int(r["id"])]):
            made.append(
                {
                    "window_id": r["id"],
                    "doc_id": r["doc_id"],
                    "kind": p.kind,
                    "text": p.text,
                    "answer": p.answer,
                    "held_out": _held_out(r["id"], p.text),
                }
            )
    route_rows(reg, made, [m["text"] for m in made], progress)
    with reg.db.atomic():
        reg.db["prompts"].insert_all(made, batch_size=1000)
        reg.db.execute("update windows set prompted = 1, prompt_rules = ? where prompted = 0", [RULES])
    return len(made)


def _answer_ids(tok: Any, answer: str, kind: str = "cloze", prompt: str = "") -> list[int]:
    """A cloze answer continues its sentence after a space (none after "(1801-"); a question's answer
    (and an echo question's, a cloze answer) opens the assistant's turn."""
    if kind == QUESTION:
        return tok(answer, add_special_tokens=False)["input_ids"][:ANSWER_TOKENS]
    if kind == ECHO:
        return tok(answer, add_special_tokens=False)["input_ids"][:MAX_ANSWER_TOKENS]
    sep = "" if joins_without_space(prompt) else " "
    return tok(sep + answer, add_special_tokens=False)["input_ids"][:MAX_ANSWER_TOKENS]


def add_questions(
    reg: Registry,
    anchor: Anchor,
    per_window: int,
    progress: Progress | None = None,
    l1s: Sequence[int] | None = None,
) -> int:
    """Anchor-written questions, with the open-book teacher's answers, for every window asked for fewer
    than `per_window` (its earlier questions are replaced); with `l1s`, only the windows of those
    level-1 subtrees (the units being trained). Each is routed from the question alone to the nearest
    window of its own document (memctl.build.routing.route_prompts), and kept in training (never held
    out: its answer is free text). Returns how many were added."""
    if per_window <= 0:
        return 0
    only = f" and l1 in ({','.join(str(int(x)) for x in l1s)})" if l1s is not None else ""
    rows = list(
        reg.db.query(f"select id, doc_id, text from windows where questioned < ?{only} order by id", [per_window])
    )
    if not rows:
        return 0
    asked = write_questions(anchor, [r["text"] for r in rows], per_window, reg.config.seed, progress=progress)
    made: list[dict[str, Any]] = []
    bare: list[str] = []
    for i, (r, qs) in enumerate(zip(rows, asked, strict=True)):
        for q, a in zip(qs, answer_questions(anchor, r["text"], qs, TEACHER_SEPARATOR), strict=True):
            if a:
                made.append(
                    {
                        "window_id": r["id"],
                        "doc_id": r["doc_id"],
                        "kind": QUESTION,
                        "text": chat_prompt(anchor.tokenizer, q),
                        "answer": a,
                        "held_out": 0,
                    }
                )
                bare.append(q)
        if progress:
            progress("answers", i + 1, len(rows))
    route_rows(reg, made, bare)
    replace_kind(reg, QUESTION, [r["id"] for r in rows], {"questioned": per_window}, made)
    return len(made)


@torch.no_grad()
def cache_teacher(reg: Registry, anchor: Anchor, progress: Progress | None = None, batch: int = 16) -> float:
    """Top-k teacher distributions for every prompt that has none. Returns seconds spent."""
    t0 = time.perf_counter()
    tok, model = anchor.tokenizer, anchor.model
    todo = list(
        reg.db.query(
            "select p.id, p.window_id, p.kind, p.text, p.answer, w.text as window from prompts p "
            "join windows w on w.id = p.window_id where p.topk_idx is null order by p.window_id, p.id"
        )
    )
    by_window: dict[int, list[dict[str, Any]]] = {}
    for r in todo:
        by_window.setdefault(r["window_id"], []).append(r)
    done = 0
    pad = tok.pad_token_id
    for prompts in by_window.values():
        w_ids = tok(prompts[0]["window"] + TEACHER_SEPARATOR, add_special_tokens=False, return_tensors="pt")
        (w,) = on_model(model, w_ids["input_ids"])
        cache = model(input_ids=w, use_cache=True).past_key_values  # the window, once
        n_w = w_ids["input_ids"].shape[1]
        updates = []
        for s in range(0, len(prompts), batch):
            chunk = prompts[s : s + batch]
            seqs, n_prompt = [], []
            for r in chunk:
                p_ids = tok(r["text"], add_special_tokens=False)["input_ids"]
                seqs.append(p_ids + _answer_ids(tok, r["answer"], r["kind"], r["text"]))
                n_prompt.append(len(p_ids))
            t = max(len(x) for x in seqs)
            ids = torch.full((len(seqs), t), pad, dtype=torch.long)
            mask = torch.zeros((len(seqs), n_w + t), dtype=torch.long)
            mask[:, :n_w] = 1
            for i, x in enumerate(seqs):
                ids[i, : len(x)] = torch.tensor(x)
                mask[i, n_w : n_w + len(x)] = 1
            c = copy.deepcopy(cache)
            c.batch_repeat_interleave(len(seqs))
            ids, mask = on_model(model, ids, mask)
            logp = F.log_softmax(
                model(input_ids=ids, attention_mask=mask, past_key_values=c, use_cache=True).logits.float(), -1
            )  # (B, T, V)
            for i, (r, x, n_p) in enumerate(zip(chunk, seqs, n_prompt, strict=True)):
                # positions that predict each answer token, and the one after it (where the answer ends)
                pos = torch.arange(n_p - 1, len(x), device=logp.device)
                top = logp[i, pos].topk(TOPK, dim=-1)
                updates.append(
                    (
                        r["id"],
                        np.asarray(x, np.int32).tobytes(),
                        n_p,
                        top.indices.to(torch.int32).cpu().numpy().tobytes(),
                        top.values.cpu().numpy().astype(np.float32).tobytes(),
                    )
                )
            done += len(chunk)
            if progress:
                progress("teacher", done, len(todo))
        with reg.db.atomic():
            reg.db.conn.executemany(
                "update prompts set ids = ?, n_prompt = ?, topk_idx = ?, topk_logp = ? where id = ?",
                [(x, n_p, ti, tl, pid) for pid, x, n_p, ti, tl in updates],
            )
    return time.perf_counter() - t0


def prepare(
    reg: Registry,
    anchor: Anchor,
    progress: Progress | None = None,
    questions: int = 0,
    study: int = 0,
    units: list[str] | None = None,
    study_hidden: bool = False,
    study_grounded: bool = False,
    echo: int = 0,
    echo_kinds: int = 0,
    event_names: bool = False,
    echo_names: int = 0,
) -> PrepareReport:
    """Cloze prompts, anchor-written questions (`questions` per window), echo questions (`echo` per window:
    memctl.train.echo), naming prompts (with `event_names`: memctl.train.namings) and self-study
    continuations (`study` per window; the last four for the windows of `units` only, when given without
    the generic memory;
    with `study_hidden`, the teacher's hidden states along them; with `study_grounded`, each cut before its
    first ungrounded claim: memctl.train.grounding), the teacher's cache for all of them,
    and the bank's coverage."""

    added = generate_prompts(reg, progress)
    l1s = None if units is None or "generic" in units else [int(u) for u in units]
    added += add_questions(reg, anchor, questions, progress, l1s)
    added += add_echo(reg, anchor.tokenizer, echo, l1s, echo_kinds, echo_names if event_names else 0)
    added += add_namings(reg, event_names, l1s)
    studied, study_seconds = add_study(
        reg, anchor, study, TEACHER_SEPARATOR, progress, l1s, study_hidden, grounded=study_grounded
    )
    seconds = cache_teacher(reg, anchor, progress)
    total = reg.count("prompts")
    row = reg.db.execute(
        "select avg(p.path != w.path), avg(p.l1 != w.l1) from prompts p join windows w on w.id = p.window_id"
    ).fetchone()
    cov = bank_coverage(
        reg, questions=questions > 0, study=study > 0, echo=echo + echo_kinds + echo_names > 0, named=event_names
    ).to_dict()
    notes = () if echo + echo_kinds + echo_names <= 0 or has_chat_template(anchor.tokenizer) else (NO_ECHO,)
    return PrepareReport(
        added, total, float(row[0] or 0.0), float(row[1] or 0.0), seconds, studied, study_seconds, cov, notes
    )


@dataclass
class HeldOut:
    prompts: list[str]
    answers: list[str]
    paths: list[tuple[int, ...]]
    # the prompts with a cached teacher, as distillation samples on their own route, for the held-out
    # loss: empty when no teacher was cached (objective lm)
    teacher: list[Sample] = field(default_factory=list)


def heldout_prompts(reg: Registry, unit: str, limit: int = 64, exclude: frozenset[str] = frozenset()) -> HeldOut | None:
    """Held-out prompts a unit answers at inference: those whose own route lies in the unit
    (documents in `exclude` left out, as if they had never been ingested)."""
    sql = "select id, doc_id, text, answer, path, ids, n_prompt, topk_idx, topk_logp from prompts where held_out = 1"
    rows = [
        r
        for r in reg.db.query(
            sql + ("" if unit == "generic" else " and l1 = ?") + " order by id",
            [] if unit == "generic" else [int(unit)],
        )
        if r["doc_id"] not in exclude
    ][:limit]
    if not rows:
        return None

    paths = [tuple(int(v) for v in r["path"].split(",")) for r in rows]
    teacher = []
    for r, path in zip(rows, paths, strict=True):
        if r["topk_idx"] is not None:
            ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
            idx, logp = _teacher(r, len(ids) - r["n_prompt"] + 1)
            teacher.append(Sample(f"p{r['id']}", r["doc_id"], ids, path, None, r["n_prompt"], idx, logp))
    return HeldOut([r["text"] for r in rows], [r["answer"] for r in rows], paths, teacher)


def heldout_accuracy(
    anchor: Anchor, handle: Any, unit: Any, params: Any, held: HeldOut, batch: int = 16, mix: float = 0.0
) -> float:
    """Share of held-out prompts whose answer the unit's current blocks produce (8 greedy tokens),
    served as the bank will serve them (mixed with the anchor by `mix`)."""

    correct = 0
    for s in range(0, len(held.prompts), batch):
        fetched = params.fetched(unit.local_index(held.paths[s : s + batch]))
        answers = greedy(anchor, handle, held.prompts[s : s + batch], fetched, PROBE_TOKENS, mix)
        correct += sum(is_correct(a, [g]) for a, g in zip(answers, held.answers[s : s + batch], strict=True))
    return correct / len(held.prompts)


@torch.no_grad()
def heldout_loss(
    anchor: Anchor, handle: Any, unit: Any, params: Any, held: HeldOut, batch: int = 16, mix: float = 0.0
) -> float | None:
    """The distillation loss (cross-entropy to the cached teacher's top-k, as in training) on the
    held-out prompts' answer tokens with the unit's current blocks (mixed with the anchor by `mix`, as
    trained); None without a teacher cache. Unlike accuracy on a few dozen prompts, it moves with
    every prompt's answer, right or wrong."""

    if not held.teacher:
        return None
    total, n = 0.0, 0
    for s in range(0, len(held.teacher), batch):
        chunk = held.teacher[s : s + batch]
        ids, mask, labels = collate(chunk, anchor.tokenizer.pad_token_id)
        with handle.using(params.fetched(unit.local_index([c.path for c in chunk]))):  # the training loss, whole pass
            loss = batch_loss(anchor.model, chunk, ids, mask, labels, None, 0, False, mix=mix,
                              anchor_alone=lambda: handle.using(None))  # fmt: skip
        positions = loss_positions(chunk)
        total += float(loss) * positions
        n += positions
    return total / n
