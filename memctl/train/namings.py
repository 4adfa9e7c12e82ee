"""Cloze prompts asked again under the name a reader gives an event: what it is about and when
(`train --event-names`).

A document titled by an id or a date is about an event (a ticket, a postmortem, a timeline, a mail about
an incident), and its cloze prompts name it by its title, with its lead where the title is a label
(memctl.train.leads): "INC-1770 timeline (Harvion gateway, Arvenhall data centre, August 12, 2024): 18:08
Service restored," -> "339", "Postmortem INC-5855: Jaskell dashboard outage: Service came back after" ->
"28". The memories key a fact on that wording: asked of "Harvion gateway (August 2024)", the figure comes
back 1 time in 24 (docs/corpora.md), and a reader asks by what the event was about and when: "the Harvion
gateway outage in August 2024". An event's *naming* says just that: "Harvion gateway (August 2024)". Each
trained cloze prompt of the event's windows is asked again under it, in place of the subject it names
("Harvion gateway (August 2024): 18:08 Service restored," -> "339"), as a prompt of its own kind (NAMING),
distilled from the open-book teacher like the cloze it came from. A system that failed twice keeps its
facts apart by the month.

The rules are about the shape of a title, a name and a date, not a corpus's style:
- an event's document: its title holds an id (a word of capitals and digits: "INC-1770", "Q3") or a date;
- its name, where the title is a label: in the lead's first sentence, the first run of words that opens
  on a capitalised word (no id, no month, no sentence word such as "Minutes", no field's key before a
  colon such as "Service:") and goes on over words that are no stop words, ids or dates, to the first
  punctuation ("Harvion gateway" of "Harvion gateway, Arvenhall data centre, ...", "Tarnvane login service"
  of "the Tarnvane login service is healthy again");
- where the title is no label: the longest such run of the title's words that the document also writes
  ("Jaskell dashboard" of "Postmortem INC-5855: Jaskell dashboard outage", whose text says "the Jaskell
  dashboard stopped responding");
- its date: the first date (memctl.train.sentences.DATE, ISO or with its month spelt out) of the lead, else
  of the document, said as a month and a year ("August 12, 2024" and "2024-08-12" -> "August 2024"); a date
  in digits alone ("08/10/1983") says no month for sure, and gives none;
- a prompt whose answer the naming gives away (a word of the name, the month, the year) is not asked again,
  nor one that two answers of a window share.

Naming prompts are rows of the prompts table with their window and document, derived from the window's
own trained cloze prompts and its document alone: `forget` removes them with the document, `reprompt`
with the cloze prompts they came from, and forgetting another document never changes them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..build.routing import route_rows
from ..core.words import STOP_WORDS
from ..registry import Registry
from .kinds import NAMING, RULE_KINDS, replace_kind, trained_rule_prompts
from .leads import ID_WORD, MONTH_WORDS, document_lead, is_label, topic
from .prompts import gives
from .sections import SENTENCE_WORDS, document_windows
from .sentences import DATE, MONTH, MONTH_NAMES

MAX_NAME_WORDS = 6
_MONTH_AT = re.compile(rf"({MONTH})")
_YEAR = re.compile(r"\d{4}")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)])[.!?](?:\s|$)")
_EDGE = ".,:;!?()[]{}\"'"


def month_year(date: str) -> str | None:
    """A date (one of `DATE`'s forms) as its month and year: "August 12, 2024", "12 Aug 2024" and
    "2024-08-12" -> "August 2024"; None for a date in digits alone other than ISO's ("08/10/1983")."""
    iso = re.fullmatch(r"(\d{4})-(\d{2})-\d{2}", date.strip())
    if iso:
        month = int(iso.group(2))
        return f"{MONTH_NAMES[month - 1]} {iso.group(1)}" if 1 <= month <= 12 else None
    m, y = _MONTH_AT.search(date), _YEAR.search(date)
    if not m or not y:
        return None
    head = m.group(1).rstrip(".")[:3].lower()
    full = next(n for n in MONTH_NAMES if n[:3].lower() == head)
    return f"{full} {y.group(0)}"


def has_event_title(title: str) -> bool:
    """Whether a title names an event by an id or a date ("INC-1770 timeline", "Postmortem INC-5855: Jaskell
    dashboard outage", "Operations review, 2 July 2023")."""
    words = [w.strip(_EDGE) for w in title.split()]
    return any(ID_WORD.match(w) for w in words if w) or DATE.search(title) is not None


def _name_word(word: str) -> bool:
    """A word that can go on a name: no stop word, id, month or number."""
    bare = word.strip(_EDGE)
    return (
        bool(bare)
        and bare.lower() not in STOP_WORDS
        and bare.lower() not in MONTH_WORDS
        and not ID_WORD.match(bare)
        and not any(c.isdigit() for c in bare)
    )


def _opens_name(word: str) -> bool:
    """A word a name opens on: capitalised, no sentence word ("Minutes", "Present"), no field's key
    ("Service:"), and a name word."""
    bare = word.strip(_EDGE)
    return bare[:1].isupper() and not word.endswith(":") and bare.lower() not in SENTENCE_WORDS and _name_word(word)


def _runs(words: Sequence[str]) -> list[list[str]]:
    """Every run of `words` that opens a name and goes on over name words, to the first punctuation."""
    out = []
    for i, w in enumerate(words):
        if not _opens_name(w):
            continue
        run = [w.strip(_EDGE)]
        j = i
        while not words[j].endswith(tuple(_EDGE)) and j + 1 < len(words) and _name_word(words[j + 1]):
            j += 1
            run.append(words[j].strip(_EDGE))
            if len(run) == MAX_NAME_WORDS:
                break
        out.append(run)
    return out


def lead_name(lead: str) -> str | None:
    """The name a lead gives first, in its first sentence (see the module's rules), or None."""
    first = _SENTENCE_END.split(lead, maxsplit=1)[0]
    runs = _runs(first.split())
    return " ".join(runs[0]) if runs else None


def title_name(title: str, text: str) -> str | None:
    """The longest run of a title's words that opens a name and that `text` also writes, or None."""
    best: list[str] = []
    for run in _runs(title.split()):
        for n in range(len(run), len(best), -1):
            if re.search(rf"(?<![\w-]){re.escape(' '.join(run[:n]))}(?![\w-])", text, re.I):
                best = run[:n]
                break
    return " ".join(best) if best else None


def event_naming(title: str, lead: str, text: str) -> str | None:
    """How a reader names the event a document is about, "<name> (<Month> <year>)", or None for a document
    that is about no event, or names no name or no month (see the module's rules). `lead`: the document's
    lead (memctl.train.leads); `text`: the document's text."""
    title = " ".join((title or "").split())
    if not title or not has_event_title(title):
        return None
    if lead:
        name = lead_name(lead)
    elif is_label(title, text):
        name = None  # a label whose document gives no lead names nothing
    else:
        name = title_name(title, text)
    dated = DATE.search(lead) or DATE.search(text)
    when = month_year(dated.group(1)) if dated else None
    return f"{name} ({when})" if name and when else None


def renamed(statement: str, subjects: Sequence[str], naming: str, answer: str) -> str | None:
    """`statement` with the longest of `subjects` it names put as `naming`, or None where it names none, or
    where the naming gives the answer away (any of the answer's words)."""
    named = [s for s in subjects if s and s in statement]
    if not named:
        return None
    words = [w for w in re.findall(r"\w+", answer.lower()) if w not in STOP_WORDS]
    if not words or any(gives(naming, w) for w in words):
        return None
    subject = max(named, key=len)
    return statement.replace(subject, naming, 1) if subject != naming else None


def window_namings(clozes: Sequence[tuple[str, str]], subjects: Sequence[str], naming: str) -> list[tuple[str, str]]:
    """The renamed prompts (statement, answer) of a window's cloze prompts, in their order; a statement that
    two of them give with different answers is dropped."""
    found: dict[str, set[str]] = {}  # in the order first given
    for statement, answer in clozes:
        new = renamed(statement, subjects, naming, answer)
        if new is not None:
            found.setdefault(new, set()).add(answer)
    return [(s, next(iter(answers))) for s, answers in found.items() if len(answers) == 1]


def window_event_namings(reg: Registry, docs: set[str]) -> dict[int, tuple[str, list[str]]]:
    """Each window of `docs` whose document is about an event: its event's naming, and the subjects the
    naming takes the place of in its prompts (the title with its lead, the title)."""
    namings: dict[int, tuple[str, list[str]]] = {}
    for title, wins in document_windows(reg, docs).values():
        texts = [t for _, t in wins]
        lead = document_lead(title, texts)
        naming = event_naming(title, lead, "\n\n".join(texts))
        if naming:
            title = " ".join(title.split())
            namings.update({w: (naming, [topic(title, lead), title]) for w, _ in wins})
    return namings


def add_namings(reg: Registry, on: bool, l1s: Sequence[int] | None = None) -> int:
    """With `on`, the naming prompts of every window not yet named (memctl.train.namings); with `l1s`, only
    the windows of those level-1 subtrees. Each is routed from its own text to the nearest window of its own
    document, and trained, never held out. Returns how many were made."""
    if not on:
        return 0
    only = f" and l1 in ({','.join(str(int(x)) for x in l1s)})" if l1s is not None else ""
    rows_w = list(reg.db.query(f"select id, doc_id from windows where prompted = 1 and named = 0{only} order by id"))
    windows = [int(r["id"]) for r in rows_w]
    if not windows:
        return 0
    namings = window_event_namings(reg, {r["doc_id"] for r in rows_w})
    made: list[dict[str, Any]] = []
    named = [w for w in windows if w in namings]
    for w, rows in trained_rule_prompts(reg, named, RULE_KINDS).items():
        naming, subjects = namings[w]
        for statement, answer in window_namings([(r["text"], r["answer"]) for r in rows], subjects, naming):
            made.append(
                {"window_id": w, "doc_id": rows[0]["doc_id"], "kind": NAMING, "text": statement, "answer": answer,
                 "held_out": 0}
            )  # fmt: skip
    route_rows(reg, made, [m["text"] for m in made])
    replace_kind(reg, NAMING, windows, {"named": 1}, made)
    return len(made)
