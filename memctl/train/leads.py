"""What a document titled by an id or a date is about: the opening sentence that names it (pure text, but
for `window_leads`, which reads a bank's windows).

A ticket, a timeline, a mail thread or the minutes of a meeting is titled by its id or its date
("INC-1770 timeline", "Re: INC-1436 resolved", "Operations review, 2 July 2023"), and a reader asks
about it by what it is about: "the Harvion gateway outage in August 2024". A prompt that names only the
title ("INC-1770 timeline: Cause found: a") teaches the fact under the id, where no question goes. So
such a document's prompts and self-study seeds name its title followed by its *lead*, the first sentence
of the document that names something ("INC-1770 timeline (Harvion gateway, Arvenhall data centre,
August 12, 2024)"), in every window of the document.

The rules are about the shape of a title, not a corpus's style:
- a title is a *label* when it holds an id or a date and no name:
  - an id is a word of capitals and digits ("INC-1770", "Q3", "AS/400"); a bare number or decimal ("68",
    "3.1") is none, nor a word with a lowercase letter ("libc6", "Oberon-2", "python3.11"); a date is one
    of `memctl.train.sentences.DATE`'s forms, or a month and a year;
  - a name is a word with a capital letter, no month, that the text never writes in lowercase
    ("Jaskell" in "Postmortem INC-5855: Jaskell dashboard outage", "Vindrel", "iPhone"; not "Operations"
    beside "the operations review"); a mail's "Re:" or "Fwd:" is no word of the title;
  - an id the text uses as a name is one: after an article, or before "is", "are", "was", "were" ("the
    PDP-7", "MP3 is a coding format"), so a product called by a number keeps its prompts;
- the lead is the first sentence (`memctl.train.sentences.sentences`) that is not a mail header ("From:",
  "Subject:") or a quoted line, does not open on a pronoun ("It was used ..."), names something past its
  first word that is no word of the title (a Capitalised word or an acronym, no month, no sentence word),
  and says something of it (a lowercase word: a list of names, "Present: Lirith Vessery, Davias Hovby", is
  none). A greeting that opens it ("Hi all,") is dropped, and so are the title's words that open it as a
  label ("INC-1770: "); it is cut to MAX_LEAD_WORDS words, before a parenthesis the cut leaves open.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .sections import SENTENCE_WORDS, document_windows
from .sentences import DATE, MONTH, sentences

if TYPE_CHECKING:
    from ..registry import Registry

MAX_LEAD_WORDS = 12
_MAIL_PREFIX = re.compile(r"^\s*(?:(?:re|fwd?|aw)\s*:\s*)+", re.I)
_HEADER = re.compile(r"^(?:from|to|cc|bcc|date|sent|subject|reply-to|message-id)\s*:", re.I)
ID_WORD = re.compile(r"^(?=.*\d)(?=.*[A-Z])[A-Z\d][A-Z\d/#.:_-]*$")  # no lowercase: "INC-1770", not "libc6"
_MONTH_YEAR = re.compile(rf"\b{MONTH}\s+\d{{4}}\b")
MONTH_WORDS = set(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday".split()
)
_PRONOUNS = {"it", "its", "he", "she", "they", "their", "his", "her", "this", "these", "those", "we", "i"}
_GREETING = re.compile(r"^(?:hi|hello|hey|dear)\b[^,]{0,40},\s*", re.I)
_WORD = re.compile(r"[A-Za-z][\w'\u2019-]*")
_PUNCT = ".,:;()[]{}#\"'"


def _words(title: str) -> list[str]:
    return [w.strip(_PUNCT) for w in _MAIL_PREFIX.sub("", title).split() if w.strip(_PUNCT)]


def _lowercase(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word.lower())}(?![\w-])", text) is not None


def _used_as_name(word: str, text: str) -> bool:
    w = re.escape(word)
    return re.search(rf"\b(?:the|a|an)\s+{w}(?![\w-])|(?<![\w-]){w}\s+(?:is|are|was|were)\b", text, re.I) is not None


def is_label(title: str, text: str) -> bool:
    """Whether `title` names its document by an id or a date alone (see the module's rules); `text`: the
    document's text (all of its windows, where the caller has them)."""
    words = _words(title)
    ids = [w for w in words if ID_WORD.match(w)]
    if not ids and not DATE.search(title) and not _MONTH_YEAR.search(title):
        return False
    for w in words:
        if any(c.isdigit() for c in w) or w.lower() in MONTH_WORDS or not any(c.isupper() for c in w):
            continue
        if not _lowercase(text, w):
            return False  # a name: "Jaskell", or a word the text only ever capitalises
    return not any(_used_as_name(w, text) for w in ids)


def _names_something(sentence: str, title_words: set[str]) -> bool:
    """Whether a sentence names something past its first word that the title does not, and says something
    of it: a lowercase word too (a list of names describes nothing)."""
    words = [m.group(0) for m in _WORD.finditer(sentence)]
    if not words or words[0].lower() in _PRONOUNS or not any(w[:1].islower() for w in words):
        return False
    for w in words[1:]:
        lw = w.lower()
        if any(c.isdigit() for c in w) or lw in title_words or lw in SENTENCE_WORDS:
            continue
        if lw in MONTH_WORDS and not w.isupper():  # "May", not "DEC"
            continue
        if (w[:1].isupper() and w[1:2].islower()) or (len(w) > 1 and w.isupper()):
            return True
    return False


def _cut(words: list[str]) -> str:
    words = words[:MAX_LEAD_WORDS]
    text = " ".join(words)
    if text.count("(") > text.count(")"):
        text = text[: text.rindex("(")]
    return text.rstrip(" .,;:(-")


def lead(title: str, text: str) -> str:
    """The lead of `text` under `title` (see the module's rules), "" when no sentence is one."""
    title_words = {w.lower() for w in _words(title)}
    for sent in sentences(text):
        if _HEADER.match(sent) or sent.startswith(">"):
            continue
        sent = _GREETING.sub("", sent)
        if not _names_something(sent, title_words):
            continue
        words = sent.split()
        k = 0
        while k < len(words) and words[k].strip(_PUNCT).lower() in title_words:
            k += 1
        if k and words[k - 1].endswith(":"):  # "INC-1770: Harvion gateway, ...": the title's id as a label
            words = words[k:]
        return _cut(words)
    return ""


def label_lead(title: str, text: str) -> str:
    """The lead of a document whose title is a label (`is_label`), "" for any other."""
    title = " ".join((title or "").split())
    return lead(title, text) if title and is_label(title, text) else ""


def document_lead(title: str, texts: Sequence[str]) -> str:
    """`label_lead` of a document given as its windows' texts in order."""
    return label_lead(title, "\n\n".join(texts))


def topic(title: str, lead_: str) -> str:
    """Whom a one-subject window is about: its title, with its document's lead where it has one."""
    title = " ".join((title or "").split())
    return f"{title} ({lead_})" if title and lead_ else title


def window_leads(reg: Registry, doc_ids: set[str]) -> dict[int, str]:
    """For every window of these documents, its document's lead ("" for a document whose title is no label)."""
    out: dict[int, str] = {}
    for title, wins in document_windows(reg, doc_ids).values():
        found = document_lead(title, [t for _, t in wins])
        out.update({w: found for w, _ in wins})
    return out
