"""Where a self-study continuation stops saying what its window says.

The open-book teacher is a small model: asked about a window, it soon adds names and numbers the
window never gave ("REXX is a scripting language, specifically designed for Windows", "released on
January 22, 2023"), and the memories would learn those as facts of the document. In the first
subtrees of `benchmarks/corpora.py`'s corpora, 39 of FOLDOC's 88 self-study continuations, 51 of the
fictional corpus's 76 and 11 of elements' 52 make such a claim (docs/history.md).

A claim here is a number, or a Capitalised word that does not open a sentence or a list item; it is
grounded when the window or the seed's question has it as a whole word (case aside). With
`train --ground-study`, each continuation is cut before its first ungrounded claim
(memctl.train.study), and one with fewer than MIN_TOKENS tokens left is dropped. Pure text; no models.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

MIN_TOKENS = 2  # a continuation cut shorter than this teaches nothing worth a sample
_CLAIM = re.compile(r"(?<![\w.])(\d[\d,.:/-]*\d|\d)(?![\w])|(?<![\w'-])([A-Z][\w&+'-]*)")
# what may open a sentence or a list item: the text's start, a sentence end, a line start with a marker
_OPENING = re.compile(r"(?:^|[.!?:;]\s+|\n\s*(?:(?:\d{1,2}[.)]|[-*\u2022]|#+)\s*)?)[*_\"'\u201c]*$")
_LIST_MARK = re.compile(r"(?:^|\n)\s*$")


def _known(word: str, sources: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(word.lower())}(?![\w])", sources) is not None


def first_ungrounded(text: str, window: str, seed: str = "") -> int | None:
    """Character offset in `text` of its first claim that neither `window` nor `seed` makes; None when
    every claim is grounded."""
    sources = f"{window}\n{seed}".lower()
    for m in _CLAIM.finditer(text):
        before = text[: m.start()]
        if m.group(1):  # a number: grounded only as written ("1,989" is no "1989")
            num = m.group(1).rstrip(".,:/-")
            follows = text[m.end() : m.end() + 1]
            if _LIST_MARK.search(before) and follows in (".", ")"):
                continue  # "2." opening a list item
            if not _known(num, sources):
                return m.start()
        else:
            word = m.group(2).rstrip("'-")
            if word == "I" or _OPENING.search(before):
                continue  # any word may open a sentence
            if not _known(word, sources):
                return m.start()
    return None


def grounded_tokens(decode: Callable[[Sequence[int]], str], ids: Sequence[int], window: str, seed: str = "") -> int:
    """How many of the continuation tokens `ids` come before its first ungrounded claim (all of them
    when there is none); `decode` turns token ids into text."""
    at = first_ungrounded(decode(ids), window, seed)
    if at is None:
        return len(ids)
    for k in range(1, len(ids) + 1):
        if len(decode(ids[:k]).rstrip()) > at:  # token k-1 reaches into the claim
            return k - 1
    return len(ids)
