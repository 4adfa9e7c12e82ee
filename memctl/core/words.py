"""Content words: the lowercase words and numbers of a text, stop words and single letters left out.

What coverage counts (memctl.train.coverage) and what lexical routing matches (memctl.build.lexical)."""

from __future__ import annotations

import re

WORD = re.compile(r"[a-z0-9]+(?:['\u2019][a-z]+)?")
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
    return [w for w in WORD.findall(text.lower()) if w not in STOP_WORDS and (len(w) > 1 or w.isdigit())]
