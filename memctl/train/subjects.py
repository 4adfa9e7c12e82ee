"""The other names a document gives its subject in its opening: "Open DataBase Connectivity (ODBC)",
"Jane Q. Example (also known as Example)", FOLDOC's "(KAOS) A functional operating system ...".

People ask about a subject by whichever name they know, and a memory answers the name it was trained
on: the facts of "Kent Applicative Operating System" were prompted under that title, and the question
"Who described KAOS in his PhD thesis?" never named it (on FOLDOC, 96 of 220 question-form probes name
the subject by another name than the title). memctl.train.prompts and memctl.train.study take turns
over the subject's names, so each name carries part of the document's facts.

An alias is read from one place only: a parenthetical that opens the document, or that follows its
subject's name there. Its first item counts when it is introduced as another name ("also known as",
"a.k.a.", "or") or is an abbreviation of the subject (its letters appear in the subject's, in order,
from the subject's first letter: the test of Schwartz and Hearst, 2003). So "(symbol H)", "(1801-1882)"
and "Acme Ltd (UK)" give no alias. Pure text; no models.
"""

from __future__ import annotations

import re

MAX_ALIAS_WORDS = 6
# a column for a query over windows `w`: the text of the first window of w's document, where aliases are read
OPENING = "(select o.text from windows o where o.doc_id = w.doc_id order by o.idx, o.id limit 1) as opening"
_LEAD = re.compile(
    r"^(?:(?:also|better|formerly|originally|commonly|otherwise|previously)\s+)?(?:known|called|named)\s+as\s+"
    r"|^(?:a\.?k\.?a\.?|or|formerly|previously|originally|short for)\s+",
    re.IGNORECASE,
)
_JOINERS = {"of", "and", "the", "for", "in", "a", "an", "on", "to", "de", "&"}
_QUOTES = "\"'\u201c\u201d\u2018\u2019"


def _is_name(alias: str) -> bool:
    """A name: up to MAX_ALIAS_WORDS words, the first Capitalised (or an acronym), the others too or joiners."""
    words = alias.split()
    if not 1 <= len(words) <= MAX_ALIAS_WORDS or not words[0][:1].isupper():
        return False
    return all(w[:1].isupper() or w[:1].isdigit() or w.lower() in _JOINERS for w in words)


def abbreviates(short: str, long: str) -> bool:
    """Whether `short` abbreviates `long`: its letters and digits appear in `long`'s, in order, and its first
    is `long`'s first ("ODBC" of "Open DataBase Connectivity", "G4" of "Group 4", "KTH" of "Kungliga
    Tekniska Högskolan"). A short form as long as the long one is no abbreviation."""
    s = [c for c in short.lower() if c.isalnum()]
    full = [c for c in long.lower() if c.isalnum()]
    if not s or len(s) >= len(full) or s[0] != full[0]:
        return False
    it = iter(full)
    return all(c in it for c in s)


def aliases(subject: str, opening: str) -> tuple[str, ...]:
    """Other names of `subject` given by the parenthetical that opens `opening` (the document's first
    window) or follows the subject's name at its start; () when there is none."""
    subject, text = subject.strip(), opening.lstrip()
    if not subject:
        return ()
    if text.lower().startswith(subject.lower()):
        text = text[len(subject) :].lstrip()
    m = re.match(r"\(([^()]{1,120})\)", text)
    if not m:
        return ()
    first = re.split(r"[,;]|\s[-\u2013]\s", m.group(1))[0].strip()
    bare = _LEAD.sub("", first).strip().strip(_QUOTES).strip()
    introduced = bare != first
    if not _is_name(bare) or bare.lower() == subject.lower():
        return ()
    return (bare,) if introduced or abbreviates(bare, subject) else ()


def names(subject: str, opening: str) -> tuple[str, ...]:
    """The subject's name, then its aliases (memctl's prompts and seeds take turns over them)."""
    subject = subject.strip()
    return (subject, *aliases(subject, opening)) if subject else ()
