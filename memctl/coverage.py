"""Coverage: how much of each window the student is asked to produce.

A fact that no training prompt's answer (or self-study continuation) contains cannot be learned by
distillation. For each window, coverage is the share of its content tokens (words that are not stop
words) whose word appears in at least one answer or continuation trained for that window. The pure
function knows no registry; `bank_coverage` reads the bank's windows and trained prompts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .registry import Registry

_WORD = re.compile(r"[a-z0-9]+(?:['\u2019][a-z]+)?")
STOP_WORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having
    he her here hers herself him himself his how i if in into is it its itself just me more most my myself no
    nor not now of off on once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too under until up very
    was we were what when where which while who whom why will with would you your yours yourself yourselves
    s t also may might must shall upon via per""".split()
)


def content_words(text: str) -> list[str]:
    """The content tokens of a text: lowercase words and numbers, stop words and single letters left out."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS and (len(w) > 1 or w.isdigit())]


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

    def to_dict(self) -> dict[str, object]:
        return {
            "mean": self.mean,
            "windows": self.windows,
            "uncovered": len(self.uncovered),
            "uncovered_windows": [{"window": w, "doc": d} for w, d in self.uncovered[:50]],
            "by_kind": self.by_kind,
        }


def bank_coverage(reg: Registry, questions: bool = False, study: bool = False) -> Coverage:
    """Coverage of every window by the prompts the student trains on (never the held-out ones): cloze
    and paraphrase answers, anchor-written questions' answers with `questions`, self-study
    continuations with `study`."""
    left_out = ([] if questions else ["question"]) + ([] if study else ["study"])
    answers: dict[int, list[tuple[str, str]]] = {}
    sql = "select window_id, kind, answer from prompts where held_out = 0" + " and kind != ?" * len(left_out)
    for r in reg.db.query(sql, left_out):
        answers.setdefault(r["window_id"], []).append((r["kind"], r["answer"] or ""))
    present = sorted({k for rows in answers.values() for k, _ in rows})
    total = 0
    covered = 0.0
    per_kind = dict.fromkeys(present, 0.0)
    uncovered: list[tuple[int, str]] = []
    n = 0
    for w in reg.db.query("select id, doc_id, text from windows order by id"):
        words = content_words(w["text"])
        if not words:
            continue
        mine = answers.get(w["id"], [])
        c = window_coverage(w["text"], (a for _, a in mine)) or 0.0
        n += 1
        total += len(words)
        covered += c * len(words)
        for k in present:
            per_kind[k] += (window_coverage(w["text"], (a for kk, a in mine if kk == k)) or 0.0) * len(words)
        if c == 0.0:
            uncovered.append((int(w["id"]), str(w["doc_id"])))
    mean = covered / total if total else 0.0
    return Coverage(mean, n, uncovered, {k: v / total for k, v in per_kind.items()} if total else {})
