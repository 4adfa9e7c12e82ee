"""`memctl eval`: what memories buy, on any bank and any probe set.

Setups (each changes what the model sees):
  anchor             no memory, the probe alone
  generic            the generic memory (same fetched size, no routing)
  fetched            the blocks the probe routes to
  rag                the nearest stored window of the routed leaf in the prompt, no memory
  rag+fetched        both
  oracle-rag         the probe's own document in the prompt, no memory: the open-book ceiling
  fetched-corrupted  the routed leaf replaced by each of its siblings (the paper's failure analysis)
Variants: `beam` > 1 adds 'fetched' with the blocks of the N best leaves and their ancestors;
block fractions add 'fetched' with the best-matching fraction of the bank blocked for each probe.
Perplexity: mean token perplexity of documents under anchor, generic and fetched, memories routed on
the whole document.

Work is a list of jobs (one greedy answer, or one chunk's loss); jobs of one variant run in batches
that mix paths (every row fetches its own blocks). With a run store, each batch's answers are
committed as they come, so a stopped run resumes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..build.corpus import read_documents
from ..core.errors import InputError
from ..core.probes import PROBE_TOKENS, Probe, file_sha256, is_correct
from ..core.relevance import below_floor, gate
from ..core.tree import best_matching
from ..model.anchor import greedy
from ..model.memory import Fetched
from ..serve.rag import with_context
from ..serve.session import BankSession
from .options import PPL_CHUNK, PPL_SETUPS, EvalInterrupted, EvalOptions, Job, Plan
from .perplexity import token_losses
from .results import aggregate, answers
from .runs import EvalRuns, ItemResult

CHAT_RESERVE = 64  # tokens of context kept for the chat template around a probe (`eval --chat`)

Progress = Callable[[str, int, int], None]


# ---- planning ------------------------------------------------------------------------------------
def doc_routes(session: BankSession) -> dict[str, list[tuple[int, ...]]]:
    out: dict[str, list[tuple[int, ...]]] = {}
    for r in session.reg.db.query("select doc_id, path from windows order by id"):
        out.setdefault(r["doc_id"], []).append(tuple(int(v) for v in r["path"].split(",")))
    return out


def agreement(routes: np.ndarray, docs: Sequence[str], by_doc: dict[str, list[tuple[int, ...]]]) -> np.ndarray:
    """(N, p) bool: the probe's route shares its first l levels with a window of its document."""
    out = np.zeros(routes.shape, dtype=bool)
    for i, d in enumerate(docs):
        for path in by_doc.get(d, []):
            same = np.cumprod(np.asarray(path) == routes[i]).astype(bool)
            out[i] |= same
    return out


def open_book(session: BankSession, probe: Probe, answer_tokens: int = PROBE_TOKENS) -> str:
    """The probe's own document (its windows, in order, cut to the context) then the probe."""
    rows = session.reg.windows("doc_id = ?", [probe.doc])
    text = "\n\n".join(r["text"] for r in rows)
    room = session.context_room(probe.prompt, answer_tokens + 8)
    return with_context(text, probe.prompt, session.anchor.tokenizer, room)


def siblings(session: BankSession, leaf: int) -> list[int]:
    """The other leaves under the same parent that hold a servable block."""
    k, p = session.tree.k, session.tree.p
    first = (leaf // k) * k
    return [s for s in range(first, first + k) if s != leaf and session.store.has(p, s)]


def plan_eval(session: BankSession, probes: list[Probe], opts: EvalOptions, ppl_texts: Sequence[str] = ()) -> Plan:
    opts.check()
    tree, notes = session.tree, []
    if opts.chat and probes:
        notes.append("every probe asked in the anchor's chat template (--chat)")
    r = session.route_gated([p.prompt for p in probes])  # r.off: the gate leaves these to the anchor alone
    x, routes, off, gated, share = r.x, r.paths, r.off, r.gated, r.share
    rel = readings(r.relevance)
    by_doc = doc_routes(session)
    known = np.array([p.doc in by_doc for p in probes], dtype=bool)
    setups = list(opts.setups)
    if "oracle-rag" in setups and not known.all():
        missing = next(p for p in probes if p.doc not in by_doc)
        msg = f"{int((~known).sum())} probe(s) have no document in the bank (first: {missing.doc!r})"
        if opts.explicit:
            raise InputError(f"oracle-rag needs each probe's own document: {msg}")
        setups.remove("oracle-rag")
        notes.append(f"oracle-rag skipped: {msg}")
    retrieved: list[Any] = [None] * len(probes)
    if probes and {"rag", "rag+fetched"} & set(setups):
        retrieved = session.retriever.retrieve(x, gated, [p.prompt for p in probes])  # gated: retrieves nothing
        if not any(retrieved):
            notes.append("rag retrieved nothing (no window may be served)")
    tok = session.anchor.tokenizer
    reserve = opts.answer_tokens + (CHAT_RESERVE if opts.chat else 0)
    rag_prompts = [
        with_context(r.text, p.prompt, tok, session.rag_budget(p.prompt, reserve)) if r else p.prompt
        for p, r in zip(probes, retrieved, strict=True)
    ]
    jobs: list[Job] = []

    def add(
        group: str, i: int, prompt: str, mode: str, paths: np.ndarray | None = None, sub: str = "",
        mix: float | None = None,
    ) -> None:  # fmt: skip
        if opts.chat:  # the whole prompt (context and question) in the user's turn, as `ask --chat` sends it
            prompt = session.encode_prompts([prompt], chat=True)[0]
        # the anchor's share where memories are fetched: the gate's ramp on the probe (or on its rerouted path)
        w = 0.0 if mode == "none" else float(share[i]) if mix is None else mix
        jobs.append(Job(f"{group}|{i}|{sub}", group, i, probes[i].doc, prompt, mode, paths, off=bool(off[i]), mix=w))

    for s in setups:
        for i, p in enumerate(probes):
            route1 = gated[i][None]
            rag_prompt = rag_prompts[i]
            if s in ("anchor", "generic"):
                add(s, i, p.prompt, "none" if s == "anchor" else "generic")
            elif s == "fetched":
                add(s, i, p.prompt, "fetched", route1)
            elif s == "rag":
                add(s, i, rag_prompt, "none")
            elif s == "rag+fetched":
                add(s, i, rag_prompt, "fetched", route1)
            elif s == "oracle-rag":
                add(s, i, open_book(session, p, reserve), "none")
            elif s == "fetched-corrupted":  # a diagnostic of the wrong leaf's blocks: never gated
                for sib in siblings(session, int(routes[i, -1])):
                    wrong = routes[i][None].copy()
                    wrong[0, -1] = sib
                    add(s, i, p.prompt, "fetched", wrong, str(sib), session.anchor_mix)
    if opts.beam > 1:  # the gate judges a probe on its top leaf, as for fetched
        beams = gate(session.router.beam(x, opts.beam, [p.prompt for p in probes]), off)
        for i, p in enumerate(probes):
            add(f"fetched beam={opts.beam}", i, p.prompt, "fetched", beams[i])
    blocked: dict[float, list[list[tuple[int, int]]]] = {}
    for f in opts.fractions:
        if f == 0:
            continue
        blocked[f] = []
        for i, p in enumerate(probes):
            nodes = best_matching(tree, x[i], f)
            blocked[f].append(nodes)
            mix = None
            if opts.blocking == "reroute":  # as in a bank without those nodes: the gate judges the new leaf
                path = session.router.route_avoiding(x[i], set(nodes), p.prompt)
                sims_i = session.router.similarity(x[i : i + 1], path[None])
                off_i = below_floor(sims_i, session.relevance_floor)
                mix = float(session.shares(sims_i)[0])
            else:
                path = np.array([-1 if (lvl + 1, int(n)) in nodes else int(n) for lvl, n in enumerate(routes[i])])
                off_i = off[i : i + 1]
            add(f"fetched blocked={f:g}", i, p.prompt, "fetched", gate(path[None], off_i), mix=mix)
    ppl_jobs = perplexity_jobs(session, ppl_texts, [s for s in setups if s in PPL_SETUPS])
    gated_setups = set(setups) & {"generic", "fetched", "rag", "rag+fetched"}
    if session.relevance_floor > 0 and (gated_setups or opts.beam > 1 or any(opts.fractions)):
        ppl_off = {j.index for j in ppl_jobs if j.off}
        notes.append(
            f"relevance gate (floor {session.relevance_floor:.3f}, {session.router.routing} routing): "
            f"{int(off.sum())} of {len(probes)} probes"
            + (f" and {len(ppl_off)} of {len(ppl_texts)} perplexity documents" if ppl_jobs else "")
            + " judged unrelated to the bank, answered by the anchor alone (no memory, nothing retrieved) "
            "in every setup but fetched-corrupted, anchor and oracle-rag (--min-relevance 0 turns the gate off)"
        )
    agree = agreement(routes, [p.doc for p in probes], by_doc)
    info = [r.to_dict() if r else None for r in retrieved]
    return Plan(probes, jobs + ppl_jobs, routes, agree, known, blocked, info, notes, len(ppl_texts), opts.answer_tokens,
                rel, [bool(v) for v in off])  # fmt: skip


def readings(sims: np.ndarray) -> list[float | None]:
    """The gate's reading of each context, for --json: None where it has none (NaN: no leaf to read)."""
    return [round(float(v), 4) if math.isfinite(v) else None for v in np.asarray(sims, dtype=np.float64).tolist()]


def perplexity_jobs(session: BankSession, texts: Sequence[str], setups: Sequence[str]) -> list[Job]:
    """Each document cut into chunks of at most the bank's window; memories routed on the whole
    document (one route for all its chunks)."""
    if not texts or not setups:
        return []
    tok = session.anchor.tokenizer
    size = max(2, min(PPL_CHUNK, session.cfg.window))
    r = session.route_gated(texts)  # the relevance gate, as for probes
    off, routes, rel, share = r.off, r.gated, readings(r.relevance), r.share
    jobs = []
    for d, text in enumerate(texts):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        chunks = [ids[s : s + size] for s in range(0, len(ids), size)]
        chunks = [c for c in chunks if len(c) >= 2]
        for s in setups:
            for c, seq in enumerate(chunks):
                paths = routes[d][None] if s == "fetched" else None
                job = Job(f"ppl {s}|{d}|{c}", f"ppl {s}", d, "", "", PPL_SETUPS[s], paths, list(seq), bool(off[d]),
                          rel[d], float(share[d]))  # fmt: skip
                jobs.append(job)
    return jobs


def read_texts(path: str | Path) -> list[str]:
    """Documents for --perplexity: a .txt/.md file or a directory or a table, as `ingest` reads them."""
    return [d.text for d in read_documents([path])]


# ---- running ---------------------------------------------------------------------------------------
def _fetched(session: BankSession, batch: list[Job]) -> Fetched | None:
    """The blocks of a batch of one group: every row its own paths (a beam's several), or one mode."""
    if batch[0].mode == "fetched":
        return session.fetch_union(np.stack([j.paths for j in batch]))  # type: ignore[misc]
    return session.fetch(batch[0].mode, None, len(batch), np.array([j.off for j in batch]))


def run_jobs(
    session: BankSession,
    plan: Plan,
    batch_size: int,
    done: dict[str, ItemResult],
    save: Callable[[list[ItemResult]], None] | None = None,
    progress: Progress | None = None,
) -> dict[str, ItemResult]:
    """Answer (or score) every job not in `done`, group by group, in batches; `save` each batch."""
    results = dict(done)
    groups: dict[str, list[Job]] = {}
    for j in plan.jobs:
        groups.setdefault(j.group, []).append(j)
    for group, jobs in groups.items():
        todo = [j for j in jobs if j.item not in results]
        finished = len(jobs) - len(todo)
        if progress:
            progress(group, finished, len(jobs))
        for s in range(0, len(todo), batch_size):
            batch = todo[s : s + batch_size]
            t0 = time.perf_counter()
            fetched = _fetched(session, batch)
            mix = [j.mix for j in batch]  # per row: the relevance gate's ramp (mixed only where memories are fetched)
            out: list[ItemResult] = []
            if batch[0].seqs:
                losses = token_losses(session, [j.seqs for j in batch], fetched, mix)
                dt = (time.perf_counter() - t0) / len(batch)
                out = [
                    ItemResult(j.item, j.doc, "", 0, x.nll, x.tokens, dt) for j, x in zip(batch, losses, strict=True)
                ]
            else:
                prompts = [j.prompt for j in batch]
                texts = greedy(session.anchor, session.handle, prompts, fetched, plan.answer_tokens, mix)
                dt = (time.perf_counter() - t0) / len(batch)
                out = [
                    ItemResult(j.item, j.doc, t, int(is_correct(t, plan.probes[j.index].answers)), seconds=dt)
                    for j, t in zip(batch, texts, strict=True)
                ]
            if save:
                save(out)
            results.update((r.item, r) for r in out)
            finished += len(batch)
            if progress:
                progress(group, finished, len(jobs))
    return results


def run_eval(
    session: BankSession,
    probes: list[Probe],
    opts: EvalOptions,
    *,
    probes_path: str | Path | None = None,
    perplexity: str | Path | None = None,
    params: dict[str, Any] | None = None,
    store: bool = True,
    fresh: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Plan, run (resuming a stopped run with the same parameters on the same bank), aggregate, and
    record the run in the registry. Returns the results (see `aggregate`)."""
    t0 = time.perf_counter()
    texts = read_texts(perplexity) if perplexity else []
    plan = plan_eval(session, probes, opts, texts)
    params = dict(params or {})
    params.update(
        setups=list(opts.setups),
        beam=opts.beam,
        fractions=list(opts.fractions),
        blocking=opts.blocking,
        batch_size=opts.batch_size,
        probes_sha256=file_sha256(probes_path) if probes_path else None,
        n_probes=len(probes),
        perplexity=str(perplexity) if perplexity else None,
        perplexity_sha256=file_sha256(perplexity) if perplexity and Path(perplexity).is_file() else None,
        probe_tokens=opts.answer_tokens,
    )
    if opts.chat:  # answers in the chat template are other answers: a new run (without it: as before)
        params["chat"] = True
    if session.relevance_floor > 0:  # another gate answers differently: a new run (gate off: as before it)
        params["relevance_floor"] = session.relevance_floor
    if session.relevance_floor > 0 and session.relevance_ramp > 1:  # the ramp mixes near the floor: a new run
        params["relevance_ramp"] = session.relevance_ramp
    if session.lexical > 0 and session.cfg.routing == "nearest":  # routed by words too: a new run (0: as before)
        params["lexical"] = session.lexical
    if session.anchor_mix > 0:  # mixed answers are other answers: a new run (0: as before the mix existed)
        params["anchor_mix"] = session.anchor_mix
    runs = EvalRuns(session.reg) if store else None
    opened = runs.open(str(probes_path or ""), params, fresh) if runs else None
    done = opened.done if opened else {}
    try:
        results = run_jobs(
            session,
            plan,
            opts.batch_size,
            done,
            (lambda items: runs.save(opened.id, items)) if runs and opened else None,
            progress,
        )
    except KeyboardInterrupt:
        if runs and opened:
            stored = session.reg.db.execute("select count(*) from eval_items where run_id = ?", [opened.id]).fetchone()
            raise EvalInterrupted(
                f"interrupted: run {opened.id} has {stored[0]}/{len(plan.jobs)} answers stored; "
                "run the same command again to resume"
            ) from None
        raise
    out = aggregate(session, plan, opts, results)
    out.update(params=params, notes=plan.notes, seconds=time.perf_counter() - t0)
    from ..train.coverage import coverage_report

    cov = coverage_report(session.reg)
    if cov is not None:
        out["coverage"] = cov
    if runs and opened:
        out.update(run=opened.id, resumed=opened.resumed, resumed_answers=len(done))
        runs.finish(opened.id, out, out["seconds"])
    out["answers"] = answers(plan, results)  # not stored: the registry keeps aggregates only
    return out


def evaluate(
    session: BankSession,
    probes: list[Probe],
    setups: Sequence[str] = ("anchor", "generic", "fetched"),
    batch_size: int = 16,
    progress: Progress | None = None,
) -> list[SetupAnswers]:
    """Answers and accuracy of plain setups, nothing stored (forgetting reports use this)."""
    opts = replace(EvalOptions(), setups=tuple(setups), batch_size=batch_size, explicit=True).check()
    plan = plan_eval(session, probes, opts)
    results = run_jobs(session, plan, batch_size, {}, None, progress)
    out = []
    for s in setups:
        rows = [results[j.item] for j in plan.jobs if j.group == s]
        out.append(SetupAnswers(s, sum(r.correct for r in rows), len(rows), [r.answer for r in rows]))
    return out


@dataclass
class SetupAnswers:
    setup: str
    correct: int
    n: int
    answers: list[str]

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0
