"""Coverage: how much of each window the student is asked to produce.

A fact that no training prompt's answer (or self-study continuation) contains cannot be learned by
distillation. For each window, coverage is the share of its content tokens (words that are not stop
words) whose word appears in at least one answer or continuation trained for that window. The pure
function knows no registry; `bank_coverage` reads the bank's windows and trained prompts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..core.config import train_config_from_json
from ..core.words import content_words
from ..registry import Registry
from .kinds import untrained_kinds


def window_coverage(window: str, trained: Iterable[str]) -> float | None:
    """Share of the window's content tokens that some trained answer contains (None: no content tokens)."""
    words = content_words(window)
    if not words:
        return None
    seen: set[str] = set()
    for t in trained:
        seen.update(content_words(t))
    return sum(w in seen for w in words) / len(words)


@dataclass
class Coverage:
    mean: float  # over windows with content tokens, weighted by their content tokens
    windows: int  # windows with content tokens
    uncovered: list[tuple[int, str]] = field(default_factory=list)  # (window id, doc id) with coverage 0
    by_kind: dict[str, float] = field(default_factory=dict)  # the same mean from one kind of prompt alone
    sampled: bool = False  # measured on an even sample of the windows

    def to_dict(self) -> dict[str, object]:
        return {
            "mean": self.mean,
            "windows": self.windows,
            "uncovered": len(self.uncovered),
            "uncovered_windows": [{"window": w, "doc": d} for w, d in self.uncovered[:50]],
            "by_kind": self.by_kind,
            "sampled": self.sampled,
        }


def bank_coverage(
    reg: Registry,
    questions: bool = False,
    study: bool = False,
    l1: int | None = None,
    sample: int | None = None,
    echo: bool = False,
    named: bool = False,
) -> Coverage:
    """Coverage of every window (of level-1 subtree `l1`, when given) by the prompts the student trains
    on (never the held-out ones): cloze and paraphrase answers, anchor-written questions' answers with
    `questions`, self-study continuations with `study`, echo questions' answers with `echo`, naming prompts'
    answers with `named`. With
    `sample`, at most that many windows, spread evenly over the table (`Coverage.sampled`): what `info`
    and `eval` read on a large bank."""
    left_out = untrained_kinds(questions, study, echo, named)
    only = "" if l1 is None else f" where l1 = {int(l1)}"
    ids = [r[0] for r in reg.db.execute("select id from windows" + only + " order by id")]
    picked = ids if sample is None or len(ids) <= sample else [ids[i * len(ids) // sample] for i in range(sample)]
    total, covered, n = 0, 0.0, 0
    per_kind: dict[str, float] = {}
    uncovered: list[tuple[int, str]] = []
    kinds_sql = " and kind != ?" * len(left_out)
    for s in range(0, len(picked), 500):
        chunk = picked[s : s + 500]
        marks = ",".join("?" * len(chunk))
        seen: dict[int, dict[str, set[str]]] = {}  # window -> kind -> words of its answers
        sql = f"select window_id, kind, answer from prompts where held_out = 0 and window_id in ({marks})" + kinds_sql
        for wid, kind, answer in reg.db.execute(sql, [*chunk, *left_out]):
            seen.setdefault(wid, {}).setdefault(kind, set()).update(content_words(answer or ""))
        for wid, doc, text in reg.db.execute(f"select id, doc_id, text from windows where id in ({marks})", chunk):
            words = content_words(text)
            if not words:
                continue
            mine = seen.get(wid, {})
            union = set().union(*mine.values()) if mine else set()
            c = sum(w in union for w in words)
            n += 1
            total += len(words)
            covered += c
            for k, ws in mine.items():
                per_kind[k] = per_kind.get(k, 0.0) + sum(w in ws for w in words)
            if c == 0:
                uncovered.append((int(wid), str(doc)))
    uncovered.sort()
    by_kind = {k: v / total for k, v in sorted(per_kind.items())} if total else {}
    return Coverage(covered / total if total else 0.0, n, uncovered, by_kind, sampled=len(picked) < len(ids))


COVERAGE_SAMPLE = 4096  # windows `info` and `eval` read for coverage (train reads every window)


def coverage_report(reg: Registry, runs: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """Coverage (memctl.train.coverage) by the prompts the last finished run trained on; None before prompts."""
    if runs is None:
        runs = [dict(r) for r in reg.db.query("select status, config from runs order by id")]
    if not reg.db.execute("select 1 from prompts limit 1").fetchone():
        return None
    done = [r for r in runs if r.get("status") == "done" and r.get("config")]
    tcfg = train_config_from_json(done[-1]["config"]) if done else None
    if tcfg is not None and tcfg.objective == "lm":
        return {"objective": "lm"}  # next-token training learns every window itself: nothing to cover
    cov = bank_coverage(
        reg,
        questions=bool(tcfg and tcfg.questions),
        study=bool(tcfg and tcfg.study),
        sample=COVERAGE_SAMPLE,
        echo=bool(tcfg and tcfg.echoes),
        named=bool(tcfg and tcfg.event_names),
    )
    return cov.to_dict()
