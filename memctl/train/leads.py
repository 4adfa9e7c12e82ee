"""What a document titled by an id or a date is about: the opening line that names it (pure text).

A ticket, a timeline, a mail thread or the minutes of a meeting is titled by its id or its date
("INC-1770 timeline", "Re: INC-1436 resolved", "Operations review, 2023-06-02"), and a reader asks
about it by what it is about: "the Harvion gateway outage in August 2024". A prompt that names only the
title ("INC-1770 timeline: Cause found: a") teaches the fact under the id, where no question goes. So
such a document's prompts name its *topic* instead: the title followed by its lead, the first line or
sentence of its text that names something ("INC-1770 timeline (Harvion gateway, Arvenhall data centre,
August 12, 2024)").

The rules are about the shape of a title, not a corpus's style:
- a title is a label when it holds an id or a date (a word with a digit and a letter or a separator:
  "INC-1770", "2023-06-02", "Q3") and no name: no Capitalised word but its first, and a first one the text
  writes in lowercase too ("Operations review" beside "the operations review"); a mail's "Re:" or "Fwd:"
  is no word of it. "Postmortem INC-5855: Jaskell dashboard outage" names its subject; "ALGOL 68" has
  no id ("68" is a number), so neither is a label;
- its lead is the first sentence, past mail headers ("From:", "To:", "Subject:"), with a Capitalised word
  after its first word that is no word of the title, no month and no sentence word, and a lowercase word
  ("Service: Grodion report builder", "Hi all, the Tarnvane login service is healthy again.", not a list
  of names: "Present: Lirith Vessery, Davias Hovby"), less the title's id where it opens it, cut to
  MAX_LEAD_WORDS words.
"""

from __future__ import annotations

import re

from .sections import SENTENCE_WORDS

MAX_LEAD_WORDS = 12
_MAIL_PREFIX = re.compile(r"^\s*(?:(?:re|fwd?|aw)\s*:\s*)+", re.I)
_HEADER = re.compile(r"^\s*(?:from|to|cc|bcc|date|sent|subject|re)\s*:", re.I)
_ID = re.compile(r"^(?=.*\d)(?=.*[A-Z\-/:.])[^a-z]+$")  # a digit, a capital or a separator, no lowercase letter
_MONTHS = set(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday".split()
)
_SENT = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")
_WORD = re.compile(r"[A-Za-z][\w'\u2019-]*")
_PUNCT = ".,:;()[]{}#\"'"


def _words(title: str) -> list[str]:
    return [w.strip(_PUNCT) for w in _MAIL_PREFIX.sub("", title).split() if w.strip(_PUNCT)]


def is_label(title: str, text: str) -> bool:
    """Whether `title` names its document by an id or a date alone (see the module's rules)."""
    words = _words(title)
    if not any(_ID.match(w) for w in words):
        return False
    for i, w in enumerate(words):
        if any(c.isdigit() for c in w) or not w[:1].isupper() or w.lower() in _MONTHS:
            continue
        if i > 0 or not re.search(rf"(?<![\w-]){re.escape(w.lower())}(?![\w-])", text):
            return False  # a name: "Jaskell", or a first word the text never writes in lowercase
    return True


def _names_something(sentence: str, title_words: set[str]) -> bool:
    """Whether a sentence names something past its first word that the title does not, and says something
    of it: a lowercase word too (a list of names, "Present: Lirith Vessery, Davias Hovby", describes nothing)."""
    words = [m.group(0) for m in _WORD.finditer(sentence)]
    if not any(w[:1].islower() for w in words):
        return False
    for w in words[1:]:
        lw = w.lower()
        if w[:1].isupper() and w[1:2].islower() and lw not in title_words | _MONTHS | SENTENCE_WORDS:
            return True
    return False


def lead(title: str, text: str) -> str:
    """The first sentence of `text` past mail headers that names something the title does not, without
    the title's words that open it ("INC-1770: "), at most MAX_LEAD_WORDS words; "" when none does."""
    title_words = {w.lower() for w in _words(title)}
    for line in text.splitlines():
        if not line.strip() or _HEADER.match(line):
            continue
        for sent in _SENT.split(line.strip()):
            if not _names_something(sent, title_words):
                continue
            words = sent.split()
            while words and words[0].strip(_PUNCT).lower() in title_words:
                words.pop(0)
            return " ".join(words[:MAX_LEAD_WORDS]).rstrip(" .,;:")
    return ""


def label_lead(title: str, text: str) -> str:
    """The lead of a window whose title is a label (`is_label`), "" for any other."""
    title = " ".join((title or "").split())
    return lead(title, text) if title and is_label(title, text) else ""


def topic(title: str, text: str) -> str:
    """Whom a one-subject window is about: its title, or for a label the title and its lead."""
    title = " ".join((title or "").split())
    opening = label_lead(title, text)
    return f"{title} ({opening})" if opening else title
