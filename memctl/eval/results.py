"""Aggregating an evaluation run: accuracy with Wilson intervals per setup and probe kind, routing
agreement per level and accuracy split by routed right or wrong, what a beam buys and costs, accuracy
against the blocked fraction, and perplexity per setup. Plain dictionaries, ready for JSON."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..core.probes import wilson
from ..core.tree import nodes_to_block
from ..serve.session import BankSession
from .options import SETUPS, EvalOptions, Job, Plan
from .runs import ItemResult

DAMAGE_LIMIT = 0.02  # memories must not make unrelated text worse than this (relative perplexity)


def accuracy(correct: Iterable[int]) -> dict[str, Any]:
    c = [int(x) for x in correct]
    k, n = sum(c), len(c)
    lo, hi = wilson(k, n)
    return {"accuracy": k / n if n else 0.0, "ci95": [lo, hi], "correct": k, "n": n}


def _blocks(session: BankSession, job: Job) -> list[tuple[int, int]]:
    """Distinct servable blocks a fetched job uses."""
    if job.mode == "generic":
        return [(0, 0)] if session.store.has(0, 0) else []
    if job.mode != "fetched" or job.paths is None:
        return []
    keys = {(lvl + 1, int(n)) for path in job.paths for lvl, n in enumerate(path) if n >= 0}
    return sorted(k for k in keys if session.store.has(*k))


def _params(session: BankSession, keys: Sequence[tuple[int, int]]) -> int:
    mem = session.cfg.memory
    return sum(mem.fetched_params if lvl == 0 else mem.block_params(lvl) for lvl, _ in keys)


def aggregate(session: BankSession, plan: Plan, opts: EvalOptions, results: dict[str, ItemResult]) -> dict[str, Any]:
    groups: dict[str, list[tuple[Job, ItemResult]]] = {}
    for j in plan.jobs:
        groups.setdefault(j.group, []).append((j, results[j.item]))
    probes = plan.probes
    right = plan.known & plan.agree[:, -1]
    wrong = plan.known & ~plan.agree[:, -1]

    def row(name: str) -> dict[str, Any]:
        pairs = groups.get(name, [])
        out = {"setup": name, **accuracy(r.correct for _, r in pairs)}
        out["seconds"] = sum(r.seconds for _, r in pairs)
        kinds = sorted({probes[j.index].kind for j, _ in pairs})
        out["per_kind"] = {k: accuracy(r.correct for j, r in pairs if probes[j.index].kind == k) for k in kinds}
        out["routed_right"] = accuracy(r.correct for j, r in pairs if right[j.index])
        out["routed_wrong"] = accuracy(r.correct for j, r in pairs if wrong[j.index])
        return out

    setups = [row(s) for s in SETUPS if s in groups]
    for r in setups:
        if r["setup"] == "fetched-corrupted":
            r["unit"] = "probe x sibling leaf"
    out: dict[str, Any] = {
        "bank": session.reg.name,
        "n": len(probes),
        "setups": setups,
        "routing": routing(plan),
        "retrieved": sum(1 for r in plan.retrieved if r),
    }
    if opts.beam > 1:
        out["beam"] = [
            _beam_row(session, groups, "fetched", 1),
            _beam_row(session, groups, f"fetched beam={opts.beam}", opts.beam),
        ]
    if opts.fractions:
        out["blocking"] = blocking(session, plan, opts, groups)
    if plan.ppl_docs:
        out["perplexity"] = perplexity(groups, plan.ppl_docs)
    return out


def routing(plan: Plan) -> dict[str, Any]:
    """Share of probes (with their document in the bank) routed into a node of their document."""
    known = plan.known
    n = int(known.sum())
    levels = []
    for lvl in range(plan.routes.shape[1]):
        agree = int((plan.agree[:, lvl] & known).sum())
        levels.append({"level": lvl + 1, "agree": agree, "n": n, "share": agree / n if n else 0.0})
    return {"n": n, "unknown_doc": int((~known).sum()), "levels": levels}


def _beam_row(
    session: BankSession, groups: dict[str, list[tuple[Job, ItemResult]]], name: str, beam: int
) -> dict[str, Any]:
    pairs = groups.get(name, [])
    blocks = [_blocks(session, j) for j, _ in pairs]
    n = max(1, len(pairs))
    return {
        "beam": beam,
        **accuracy(r.correct for _, r in pairs),
        "blocks_per_probe": sum(len(b) for b in blocks) / n,
        "params_per_probe": sum(_params(session, b) for b in blocks) / n,
        "seconds_per_probe": sum(r.seconds for _, r in pairs) / n,
    }


def blocking(
    session: BankSession, plan: Plan, opts: EvalOptions, groups: dict[str, list[tuple[Job, ItemResult]]]
) -> dict[str, Any]:
    """Accuracy of fetched memories with the best-matching fraction of the bank blocked per probe."""
    tree, mem = session.tree, session.cfg.memory
    bank = mem.bank_params(tree.k)
    full = accuracy(r.correct for _, r in groups.get("fetched", []))
    rows = []
    for f in sorted(set(opts.fractions)):
        counts = nodes_to_block(tree, f) if f > 0 else [0] * tree.p
        acc = full if f == 0 else accuracy(r.correct for _, r in groups.get(f"fetched blocked={f:g}", []))
        per_probe = [len(nodes) for nodes in plan.blocked.get(f, [])]
        rows.append(
            {
                "fraction": f,
                "nodes_per_level": counts,
                "blocks": sum(counts),
                "blocked_per_probe": (sum(per_probe) / len(per_probe)) if per_probe else 0.0,
                "bank_share": sum(c * mem.block_params(lvl + 1) for lvl, c in enumerate(counts)) / bank,
                **acc,
                "change": acc["accuracy"] - full["accuracy"],
            }
        )
    return {"mode": opts.blocking, "rows": rows}


def perplexity(groups: dict[str, list[tuple[Job, ItemResult]]], docs: int) -> dict[str, Any]:
    """Perplexity per setup over all documents; and, because a document the relevance gate leaves to
    the anchor scores exactly as the anchor does, the same ratio over the documents that did fetch
    memories (`fetched_docs`, `ratio_on_fetched`). `documents` lists each document's route (the path
    its fetched memories came from: -1 where the gate fetched nothing; None without a fetched setup),
    gate verdict, tokens and summed loss per setup (which documents the memories hurt)."""
    rows = []
    base = None
    documents: dict[int, dict[str, Any]] = {}
    for s in ("anchor", "generic", "fetched"):
        pairs = groups.get(f"ppl {s}", [])
        if not pairs:
            continue
        nll = sum(r.nll for _, r in pairs)
        tokens = sum(r.tokens for _, r in pairs)
        first = not documents  # every setup scores the same chunks: count each document's tokens once
        for j, r in pairs:
            doc = documents.setdefault(
                j.index,
                {"index": j.index, "route": None, "gated": j.off, "relevance": j.relevance, "tokens": 0, "nll": {}},
            )
            doc["nll"][s] = doc["nll"].get(s, 0.0) + r.nll
            doc["tokens"] += r.tokens if first else 0
            if s == "fetched":
                doc["route"] = [int(v) for v in j.paths[0]]  # type: ignore[index]
        ppl = math.exp(nll / tokens) if tokens else math.nan
        if s == "anchor":
            base = ppl
        rows.append({"setup": s, "perplexity": ppl, "nll_per_token": nll / tokens if tokens else math.nan,
                     "tokens": tokens, "seconds": sum(r.seconds for _, r in pairs)})  # fmt: skip
    listed = [documents[d] for d in sorted(documents)]
    passed = [d for d in listed if not d["gated"]]
    for r in rows:
        r["ratio_to_anchor"] = r["perplexity"] / base if base else None
        r["worse_than_limit"] = bool(base and r["perplexity"] > base * (1 + DAMAGE_LIMIT))
        if r["setup"] != "anchor":
            r["fetched_docs"] = len(passed)
            r["ratio_on_fetched"] = ratio_over(passed, r["setup"])
    return {"docs": docs, "routing": "whole document", "limit": DAMAGE_LIMIT, "gated": len(listed) - len(passed),
            "rows": rows, "documents": listed}  # fmt: skip


def ratio_over(documents: Sequence[dict[str, Any]], setup: str) -> float | None:
    """Perplexity of `setup` over some of a perplexity run's `documents` divided by the anchor's over
    the same documents (None when none has both)."""
    have = [d for d in documents if d["tokens"] and setup in d["nll"] and "anchor" in d["nll"]]
    n = sum(d["tokens"] for d in have)
    if not n:
        return None
    return math.exp(sum(d["nll"][setup] - d["nll"]["anchor"] for d in have) / n)


def answers(plan: Plan, results: dict[str, ItemResult]) -> list[dict[str, Any]]:
    """Per probe: its route, whether it routed right, and every variant's answer (for --json)."""
    out: list[dict[str, Any]] = []
    for i, p in enumerate(plan.probes):
        out.append({"doc": p.doc, "kind": p.kind, "prompt": p.prompt, "expected": list(p.answers),
                    "route": [int(v) for v in plan.routes[i]],
                    "routed_right": bool(plan.known[i] and plan.agree[i, -1]) if plan.known[i] else None,
                    "retrieved": plan.retrieved[i]["doc_id"] if plan.retrieved[i] else None,
                    "relevance": plan.relevance[i] if plan.relevance else None,
                    "unrelated": plan.unrelated[i] if plan.unrelated else False,
                    "answers": {}})  # fmt: skip
    for j in plan.jobs:
        if j.seqs:
            continue
        r = results[j.item]
        key = j.group + (f" leaf={j.item.rsplit('|', 1)[1]}" if j.group == "fetched-corrupted" else "")
        out[j.index]["answers"][key] = {"text": r.answer, "correct": bool(r.correct)}
    return out
