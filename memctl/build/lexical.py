"""Lexical evidence for routing: how well a context's words pick out each window (Okapi BM25).

A sentence embedder (MiniLM) reads what a text is about, and reads it well when the words are its
own; private documents name things it has never seen: invented systems, people, codes. Asked "How
many minutes was the Harvion gateway down in August 2024?", it finds every outage report about
equally near, and the one about the Harvion gateway only half the time. The rare words the question
shares with a window say which it is. `nearest` routing (memctl.build.routing) adds to each window's
cosine `weight` times its BM25 score over the best score any searched window gets for that context:
so a context that shares no word with the bank routes exactly as by cosine alone, and one whose
rare words appear in one window moves toward it by up to `weight`. A date gives its month a word of its
own in any form ("12 May 2023", "May 12, 2023", "2023-05-12": `words`), as a question names the month.

Measured without a model (python benchmarks/routing.py --corpora ..., docs/corpora.md "Routing by words as
well"): the route reaches a leaf holding the question's document for 56% of incidents' questions by the
cosine and 82% with weight 0.3, and on no probe set of the benchmark's corpora for fewer.

Pure numeric code on texts; the registry read lives with the caller (memctl.build.routing).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError
from ..core.words import content_words

_MONTHS = "jan feb mar apr may jun jul aug sep oct nov dec".split()
_MONTH_NAME = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
    r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
# a month's name next to a number ("12 May 2023", "May 12, 2023", "Aug 2024"), or an ISO date ("2023-05-12", "2023-05")
_NAMED = re.compile(rf"(?<=\d )({_MONTH_NAME})(?![\w-])|(?<![\w-])({_MONTH_NAME})(?= \d)")
# a lowercase name ("in may 2023", as typed in a chat) counts only before a year: "you may 3 times" is no date
_LOWER = re.compile(rf"(?<![\w-])(?=[a-z])((?i:{_MONTH_NAME}))(?= (?:\d{{1,2}},? )?(?:19|20)\d\d(?!\d))")
_ISO = re.compile(r"(?<![\w-])(?:19|20)\d\d-(0?[1-9]|1[0-2])(?:-\d\d?)?(?![\w-])")
K1 = 1.2  # term-frequency saturation
B = 0.75  # length normalisation
DEFAULT_WEIGHT = 0.3  # new `nearest` banks; a bank made before lexical routing has 0 (cosine alone)
MAX_WEIGHT = 10.0


def words(text: str) -> list[str]:
    """What BM25 matches: the content words (memctl.core.words), and a month token ("month5") for each date,
    whatever its form: a question says "in May 2023" of a ticket "opened 2023-05-12" ("may" is a stop word)."""
    out = content_words(text)
    for m in _NAMED.finditer(text):
        out.append(f"month{_MONTHS.index((m.group(1) or m.group(2))[:3].lower()) + 1}")
    out.extend(f"month{_MONTHS.index(m.group(1)[:3].lower()) + 1}" for m in _LOWER.finditer(text))
    out.extend(f"month{int(m.group(1))}" for m in _ISO.finditer(text))
    return out


@dataclass(frozen=True)
class LexicalIndex:
    """An inverted index of windows' content words: for word id t, postings indptr[t]:indptr[t + 1] hold
    the windows that use it (`rows`) and its BM25 term score in each (`weights`)."""

    n: int  # windows
    vocab: dict[str, int]  # word -> id
    indptr: np.ndarray  # (V + 1,) int64
    rows: np.ndarray  # (postings,) int32, ascending within a word
    weights: np.ndarray  # (postings,) float32

    @staticmethod
    def build(texts: Sequence[str]) -> LexicalIndex:
        words_of = [words(t) for t in texts]
        n = len(words_of)
        lengths = np.array([len(w) for w in words_of], dtype=np.int64)
        vocab: dict[str, int] = {}
        ids = np.fromiter(
            (vocab.setdefault(w, len(vocab)) for ws in words_of for w in ws), np.int64, int(lengths.sum())
        )
        if not vocab:
            return LexicalIndex(n, {}, np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32))
        doc = np.repeat(np.arange(n, dtype=np.int64), lengths)
        # one posting per (word, window), sorted by word then window, with its count
        pair, tf = np.unique(ids * n + doc, return_counts=True)
        term, row = pair // n, pair % n
        df = np.bincount(term, minlength=len(vocab))
        idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
        norm = K1 * (1 - B + B * lengths / max(float(lengths.mean()), 1e-9))
        weights = idf[term] * tf * (K1 + 1) / (tf + norm[row])
        indptr = np.concatenate([[0], np.cumsum(df)]).astype(np.int64)
        return LexicalIndex(n, vocab, indptr, row.astype(np.int32), weights.astype(np.float32))

    def __len__(self) -> int:
        return self.n

    def scores(self, text: str) -> np.ndarray:
        """(n,) float32: each window's BM25 score for the context `text` (each of its words once)."""
        out = np.zeros(self.n, dtype=np.float32)
        for w in set(words(text)):
            t = self.vocab.get(w)
            if t is not None:
                lo, hi = self.indptr[t], self.indptr[t + 1]
                out[self.rows[lo:hi]] += self.weights[lo:hi]  # a word's postings name each window once
        return out


def top(scores: np.ndarray, n: int) -> np.ndarray:
    """Rows of the (up to) n windows with the highest positive score, best first."""
    hit = np.flatnonzero(scores > 0)
    return hit[np.argsort(-scores[hit], kind="stable")[:n]]


def relative(scores: np.ndarray) -> np.ndarray:
    """Scores over the best among them: 1 for the best window searched, 0 everywhere when none scored."""
    best = float(scores.max()) if len(scores) else 0.0
    return scores / best if best > 0 else np.zeros_like(scores)


def check_weight(weight: float) -> float:
    if not 0 <= weight <= MAX_WEIGHT:  # NaN fails too
        raise InputError(f"--lexical must be between 0 and {MAX_WEIGHT:g}, got {weight}")
    return float(weight)
