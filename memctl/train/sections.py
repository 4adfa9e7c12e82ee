"""Whom each paragraph of a window is about: its document's title, or a name of its own (pure text, but
for `document_windows` and `window_openings`, which read a bank's windows).

A register, a staff list, minutes or a ticket log is one document about many subjects, none of them
named by its title: "Aurias Haldton is employed by Cyraris Instruments. His date of birth is ..." in
"Vindrel chamber register, part 1". A prompt that names the title there ("Vindrel chamber register,
part 1, employer:") asks what every section answers differently, and a question about Aurias Haldton
never nears it. So a window that holds sections opening on *different* names (two at least, none of
them the title) is read as a set of sections, each paragraph about the name it opens with; every
other window, a one-subject document with paragraphs that open on some other name ("Dralaris
Systems hired him in 1990"), keeps its title as the subject of all its text.

The rules are about the shape of a text, not its style:
- a paragraph that names the document's title is about the title;
- a paragraph opens on a name: its first line begins with two or more Capitalised words ("Zelven
  Trevek was born", "Velell Energy: profile", "About Dralique Machinery", "Fenodne Orrmere's
  position"), not a sentence word ("The", "In", "No"), one of which the text never writes in
  lowercase (not "Getting Started" or "Click Save" in a manual that speaks of saving);
- in a window of sections, a paragraph that opens on no name is about the name on its first
  "Re:", "Subject:" or "Name" line, else, when it does not name the current section's subject, about
  the first name of two or more Capitalised words in it (a table that lists "Name | Orand
  Mordicott"); else it continues the paragraph before it (a pronoun, a closing line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..registry import Registry

_PARA = re.compile(r"\n\s*\n")
# what a heading or a memo line may put before a name: "# ", "- ", "About ", "Re: ", "Profile of "
_LEAD = re.compile(r"^(?:#+\s*|[-*\u2022]\s+)?(?:(?:About|Regarding|Profile of|Notes on)\s+)?")
# a label before the name ("FAQ: Yrald Wickick", "Re: ...", "name: ..."), not a memo's other fields ("To: Records Desk")
_LABEL = re.compile(r"^([A-Za-z]+)\s*:\s+(?=[A-Z])")
_NOT_LABELS = {"to", "from", "cc", "bcc", "date", "sent", "by", "author", "owner", "assignee", "reporter", "attendees"}
_CAP = re.compile(r"^[A-Z][\w&.'\u2019-]*$")
_JOIN = {"of", "de", "van", "von", "der", "du", "la", "le", "&"}  # inside a name: "University of Kent"
# Capitalised words that open sentences and headings without being names
SENTENCE_WORDS = set(
    "the a an this that these those in on at for from to by with after before during our we you i it he she "
    "they his her its their my there here when while if as all each every some no not what who which where why "
    "how q a question answer note notes dear hi hello subject re to from date summary table memo minutes "
    "agenda item items attendees present action actions despite although though however because since unlike like "
    "also then thus hence many most other such both either neither one two first later early today see please "
    "under over between among against without within".split()
)
_NAME_LINE = re.compile(r"^[ \t]*(?:Re|Subject|Regarding|Name|Full name)[ \t]*[:|][ \t]*(\S.*?)[ \t]*$", re.I | re.M)
_CAP_WORD = r"[A-Z][a-z][\w'\u2019-]*"
_INNER_NAME = re.compile(rf"(?<![\w.])({_CAP_WORD}(?:[ \t]+(?:(?:of|de|van|von)[ \t]+)?{_CAP_WORD})+)")
MAX_WORDS = 6


def _strip(name: str) -> str:
    name = re.sub(r"['\u2019]s?$", "", name.strip(" .,;:|-"))
    return " ".join(name.split())


def opening_name(paragraph: str) -> str:
    """The name a paragraph's first line begins with: two to six Capitalised words (with "of", "&" and the
    like inside), or "" when it begins otherwise."""
    first = paragraph.strip().split("\n", 1)[0]
    first = _LEAD.sub("", first, count=1)
    label = _LABEL.match(first)
    if label:
        if label.group(1).lower() in _NOT_LABELS:
            return ""
        first = first[label.end() :]
    words = first.split()
    if not words or words[0].lower().strip(":,") in SENTENCE_WORDS:
        return ""
    out: list[str] = []
    for w in words[:MAX_WORDS]:
        bare = w.rstrip(":,;|.")
        if bare.lower() in _JOIN and out:
            out.append(bare)
            continue
        if not _CAP.match(bare) or bare.lower() in SENTENCE_WORDS:
            break
        out.append(bare)
        if bare != w or re.search(r"['\u2019]s$", bare):  # "Velell Energy:", "Orrmere's": the name ends here
            break
    while out and out[-1].lower() in _JOIN:
        out.pop()
    caps = sum(1 for w in out if w.lower() not in _JOIN)
    return _strip(" ".join(out)) if caps >= 2 else ""


def own_name(paragraph: str) -> str:
    """The name a paragraph opens on, else the value of its first "Re:", "Subject:" or "Name" line."""
    name = opening_name(paragraph)
    if name:
        return name
    m = _NAME_LINE.search(paragraph)
    return _strip(m.group(1)) if m and len(m.group(1).split()) <= MAX_WORDS else ""


def _mentions(text: str, name: str) -> bool:
    return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.I) is not None


def _inner_name(paragraph: str, current: str) -> str:
    if _mentions(paragraph, current) or _mentions(paragraph, current.split()[-1] if current else ""):
        return current
    for m in _INNER_NAME.finditer(paragraph):
        name = _strip(m.group(1))
        words = [w.lower() for w in name.split()]
        if not any(w in SENTENCE_WORDS for w in words) and len(words) <= MAX_WORDS:
            return name
    return current


def _lowercase_words(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])[a-z][a-z'\u2019-]*", text))


def _proper(name: str, lower: set[str]) -> bool:
    """Whether one of a name's words never appears in lowercase in the text: "Aurias Haldton", "Velell
    Energy", not a heading or an instruction in title case ("Getting Started", "Click Save")."""
    return any(w.lower() not in lower for w in name.split() if w.lower() not in _JOIN)


def _names(paras: list[str], title: str, lower: set[str]) -> list[str]:
    """Each paragraph's own name ("" for none, for a name made of the text's common words, and for a
    paragraph that names the title)."""
    out = []
    for p in paras:
        name = "" if _mentions(p, title) else own_name(p)
        out.append(name if name and _proper(name, lower) else "")
    return out


def sectioned(texts: Iterable[str], title: str) -> bool:
    """Whether a document, given as its windows' texts, is a set of sections: two or more different names,
    none of them its title, open its paragraphs."""
    title = " ".join((title or "").split())
    texts = list(texts)
    lower = set().union(*(_lowercase_words(t) for t in texts))
    names = {n.lower() for t in texts for n in _names([p for p in _PARA.split(t) if p.strip()], title, lower) if n}
    names.discard(title.lower())
    return len(names) >= 2


def openings(texts: Sequence[str], title: str) -> list[str] | None:
    """For a document given as its windows' texts in order: the subject each window opens with (the title
    for the first, then the last subject of the window before: a section that runs on into the next
    window keeps its name there), or None when the document is not a set of sections."""
    if not sectioned(texts, title):
        return None
    out, start = [], " ".join((title or "").split())
    for t in texts:
        out.append(start)
        start = passages(t, title, True, start)[-1][1]
    return out


def passages(text: str, title: str, sections: bool | None = None, start: str = "") -> list[tuple[str, str]]:
    """The window's text as (passage, subject) pairs, in order, consecutive paragraphs with one subject
    joined: one pair (text, title) unless its document is a set of sections (`sectioned`, of the whole
    document where the caller knows it; None: of this window alone). `start`: the subject the window
    opens with (`openings`; default the title)."""
    if sections is None:
        sections = sectioned([text], title)
    if not sections:
        return [(text, title)]
    title = " ".join((title or "").split())
    paras = [p for p in _PARA.split(text) if p.strip()]
    out: list[tuple[str, str]] = []
    current = start or title
    for p, name in zip(paras, _names(paras, title, _lowercase_words(text)), strict=True):
        if _mentions(p, title):
            subject = title
        elif name:
            subject = name
        elif current != title:
            subject = _inner_name(p, current)
        else:
            subject = current
        if out and out[-1][1] == subject:
            out[-1] = (f"{out[-1][0]}\n\n{p}", subject)
        else:
            out.append((p, subject))
        current = subject
    return out or [(text, title)]


def subjects(text: str, title: str, sections: bool | None = None, start: str = "") -> list[str]:
    """Whom the window is about, in order of first appearance: its title alone, or its sections' names."""
    seen: dict[str, str] = {}
    for _, s in passages(text, title, sections, start):
        if s:
            seen.setdefault(s.lower(), s)
    return list(seen.values())


def document_windows(reg: Registry, doc_ids: set[str]) -> dict[str, tuple[str, list[tuple[int, str]]]]:
    """Each of these documents' title and windows (id, text), in order."""
    out: dict[str, tuple[str, list[tuple[int, str]]]] = {}
    ids = sorted(doc_ids)
    for i in range(0, len(ids), 500):
        part = ids[i : i + 500]
        sql = (
            "select w.id, w.doc_id, w.text, d.title from windows w join documents d on d.id = w.doc_id "
            f"where w.doc_id in ({','.join('?' * len(part))}) order by w.id"
        )
        for r in reg.db.query(sql, part):
            out.setdefault(r["doc_id"], (r["title"] or "", []))[1].append((int(r["id"]), r["text"]))
    return out


def window_openings(reg: Registry, doc_ids: set[str]) -> dict[int, str | None]:
    """For every window of these documents, the subject it opens with when its document is a set of
    sections, else None (`openings`, read from all of each document's windows)."""
    out: dict[int, str | None] = {}
    for title, wins in document_windows(reg, doc_ids).values():
        starts = openings([t for _, t in wins], title)
        out.update({w: (starts[i] if starts is not None else None) for i, (w, _) in enumerate(wins)})
    return out
