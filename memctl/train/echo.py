"""Cloze statements asked back as questions, in the anchor's chat template (`train --echo N`).

A cloze prompt is a statement of the window cut before a fact ("The Group 4 protocol was published by"
-> "CCITT"). The memories learn it as a continuation of that wording, and a question asked in other
words often misses it: language models trained on one form of a fact recall it from that form
(Allen-Zhu and Li, *Physics of Language Models 3.1*, 2023), and questions about some facts in training
help them answer questions about others. An echo question turns the statement into a question without
any rule about the corpus's style: the statement, then a wh-word the answer's shape picks ("The Group 4
protocol was published by whom?", "zoo was released when?", "ALGOL 68 is a what?"), asked in a user
turn. The student reads the question alone, with the memories of its own
route; the open-book teacher reads the window before it, and the student learns the teacher's
distributions over the cloze's answer, which opens the assistant's turn. On foldoc, asking "what?" of
every answer, it took the question-form probes from 6 to 14 of 64, almost all on the facts it asked
back (docs/history.md).

Each window gets up to N, never from a held-out cloze prompt, so held-out scoring still reads facts the
student never saw. They ask first what questions most often ask for, by the answer's shape and not by any
rule of a corpus's style: times and people, then other names and numbers, then the rest, one per sentence
before any sentence gets a second. Picked so, 4 per window ask back 35 of foldoc's 64 question probes'
facts in one subtree, 72 of fictional's 93 and 29 of elements' 36 (the first fact of each sentence: 19, 66
and 7). Echo prompts are rows of the prompts table with their window and document, so
`forget` removes them with the document, and they derive from the window's own cloze prompts alone, so
forgetting another document never changes them. `reprompt` drops them with the cloze prompts they
came from.

A *kind question* (`train --echo-kinds N`) asks a cloze's answer by the words after it that say what it is
("... restored, 339 minutes after" -> "how many minutes?", "served from the Jorvasse data centre." -> "which
data centre?"), put to the window's subject alone: "INC-1770 timeline (Harvion gateway, August 12, 2024):
how many minutes?". The memories tie a fact to the words just before it in its training prompts, and the
subject beside them: a probe that names the subject in other words ("How many minutes was the Harvion gateway
down?") misses a figure learned after "Service restored," (docs/corpora.md). A kind question gives the
answer a second key, the subject and the answer's own kind, with none of the statement's other words. The
rule is one of English, not of a corpus's style: a number followed by a plural noun or a unit, or a name by a
short noun phrase that ends its clause, is a count or an instance of that noun.

With event names (`train --event-names`, memctl.train.namings) and `train --echo-names N`, an event's window
also asks N of its naming prompts back, picked the same way: "Harvion gateway (August 2024): 18:08 Service
restored what?" -> "339", beside "INC-1770 timeline (Harvion gateway, Arvenhall data centre, August 12,
2024): 18:08 Service restored what?". A reader asks about an event by what failed and when, in a question; the
naming prompts give the memories that key as statements only. Off by default: on incidents it moved 3
statements and 2 questions of 120, against a baseline trained on another CPU (docs/corpora.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..build.routing import route_rows
from ..core.words import STOP_WORDS
from ..model.anchor import has_chat_template
from ..registry import Registry
from .kinds import ECHO, replace_kind, trained_rule_prompts
from .leads import topic, window_leads
from .namings import has_event_title, window_event_namings, window_namings
from .prompts import gives, joins_without_space
from .sections import document_windows, subjects, window_openings
from .sentences import DAY as _DAY
from .sentences import MONTH_NAMES
from .study import chat_turn

ASK = " what?"
_TRAILING = " ,;:("  # a statement cut after these reads as a question once they go ("...pictures, what?")

# The wh-word follows the answer's shape and the word before it, rules of English and not of any
# corpus's style: a date, or a year after a preposition, an article, a month, a comma or an opening
# parenthesis, is asked "when?" ("released in" -> "released when?", "since" -> "since when?"; "RFC" +
# "1985" names a document, not a time), a name after "by" "by whom?" ("format by" -> "format by whom?":
# a person's question, "Who wrote zoo?", asks for it so), the rest "what?". A date here has its month
# spelt out, with or without a day ("3 May 1993", "March 1998"), or is ISO; the cloze rules' other date
# spans (memctl.train.prompts: "Aug 1995", "08/10/1983") are asked "what?".
_MONTH = f"(?:{'|'.join(MONTH_NAMES)})"
_DATE = re.compile(
    rf"^(?:\d{{1,2}} )?{_MONTH}(?: \d{{1,2}},?)? \d{{4}}$"  # 3 May 1993, May 3, 1993, May 1993
    rf"|^\d{{4}}-\d{{2}}(?:-\d{{2}})?$"  # 1993-05(-03)
)
_YEAR = re.compile(r"^(?:1[0-9]{3}|20[0-9]{2})s?$")  # 1993, the 1990s
_BEFORE_YEAR = frozenset(
    "in on at by of since until till from to and or between around circa c. during before after".split()
    + ["the", "late", "early", "mid"]
    + [m.lower() for m in MONTH_NAMES]  # "born on 20 March" + "1954"
)
# what "when?" stands for: "in (late)", "on 6" + "August 1996", "on January 5," + "1947"
_WHEN_DROPS = frozenset({"in", "on", "during", "at", "the", "late", "early", "mid", "around", "circa", "c."})
_DAY_OR_MONTH = re.compile(rf"{_DAY}|{_MONTH}")


def _asks_time(statement: str, answer: str) -> bool:
    """Whether the answer is a time: a date, or a year the statement leads up to as one."""
    if _DATE.match(answer):
        return True
    words = statement.split()
    return bool(_YEAR.match(answer)) and (
        statement.rstrip().endswith(("(", ",")) or bool(words) and words[-1].lower() in _BEFORE_YEAR
    )


# a cloze prompt that is a question already: the pair of a Q&A document ("Q: Who started Brevion? A:"), its
# answer perhaps begun ("Q: What does Brevion do? A: It makes" -> "loudspeakers")
_ASKED = re.compile(r"^(.*)(?:Q|Question):\s*([^?]+\?)\s*(?:A|Answer):\s*(.*)$")


def echo_pair(statement: str, answer: str) -> tuple[str, str]:
    """The question a cloze statement asks of its answer, and the answer the student learns after it: the
    statement, then a wh-word chosen by the answer's shape (a time: "when?"; a name after "by": "by whom?";
    else "what?"); a Q&A pair's own question, its answer begun or not ("What does Brevion do?" ->
    "It makes loudspeakers")."""
    asked = _ASKED.match(statement.strip())
    if asked:
        begun = asked.group(3)
        if not begun:
            return asked.group(1) + asked.group(2), answer
        return asked.group(1) + asked.group(2), begun + ("" if joins_without_space(begun) else " ") + answer.strip()
    stem = statement.rstrip(_TRAILING)
    words = stem.split(" ")
    if _asks_time(statement, answer.strip()):
        while len(words) > 1 and (words[-1].lower() in _WHEN_DROPS or _DAY_OR_MONTH.fullmatch(words[-1].rstrip(","))):
            words.pop()
        return " ".join(words).rstrip(_TRAILING) + " when?", answer
    if words[-1].lower() == "by" and answer[:1].isupper():  # a name: "by Rahul Dhesi", not "by profession"
        return stem + " whom?", answer
    return stem + ASK, answer


def echo_question(statement: str, answer: str) -> str:
    """The question of `echo_pair`."""
    return echo_pair(statement, answer)[0]


def _tier(statement: str, answer: str) -> int:
    """How much a question is likely to ask for this answer: 0 a time or a person ("when?", "by whom?"),
    1 another name or a number (Capitalised or starting with a digit), 2 the rest ("a what?")."""
    if echo_question(statement, answer).endswith((" when?", " whom?")):
        return 0
    return 1 if answer[:1].isupper() or answer[:1].isdigit() else 2


def pick_statements(clozes: Sequence[tuple[str, str]], n: int) -> list[int]:
    """Indices of up to `n` cloze prompts (statement, answer): times and people first, then other names and
    numbers, then the rest (in the order they were written within each tier), each from a sentence not
    picked yet; then, while fewer than `n`, the best of the rest from sentences already picked. A prompt is of a
    sentence already picked when one's statement and answer starts the other's statement, or the other way
    round ("published by" -> "CCITT" and "published by CCITT in" -> "1993" are one sentence)."""
    if n <= 0:
        return []
    order = sorted(range(len(clozes)), key=lambda i: _tier(*clozes[i]))  # stable: written order within a tier
    picked: list[int] = []
    fulls: list[str] = []
    for i in order:
        if len(picked) >= n:
            break
        text, answer = clozes[i]
        full = f"{text} {answer}"
        if any(full.startswith(f) or f.startswith(text) for f in fulls):
            continue
        picked.append(i)
        fulls.append(full)
    chosen = set(picked)
    picked += [i for i in order if i not in chosen][: n - len(picked)]
    return picked


# what follows an answer and names its kind: one or two lowercase words that end the clause ("data centre.",
# "min" at a line's end), or, after a number, one plural word ("minutes after the alert")
_KIND_ENDS = re.compile(r"[ \t]+([a-z][a-z-]*[a-z])(?:[ \t]+([a-z][a-z-]*[a-z]))?(?=[ \t]*(?:[,.;:!?)]|\n|$))")
_KIND_PLURAL = re.compile(r"[ \t]+([a-z][a-z-]*[a-z]s)(?![\w-])")
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?")
_COUNTED = re.compile(rf"({_NUMBER.pattern})\s+([a-z][a-z-]*[a-z])")  # a field's value: "97 min"
TAIL_WORDS = 3  # the statement's last words that find its answer in the window


# words after an answer that name no kind of it: conjunctions and adverbs no stop list holds, a citation's
# "et al", the words of a number ("20 million")
_NO_KIND = frozenset(
    "whereas whilst though although ever even et al etc thus hence million billion thousand hundred dozen".split()
)


def _kind_words(words: Sequence[str | None]) -> str | None:
    """The kind a few words name, or None where one is a stop word or reads as a verb or an adverb."""
    kept = [w for w in words if w]
    if not kept or any(w in STOP_WORDS or w in _NO_KIND or w.endswith(("ed", "ly", "ing")) for w in kept):
        return None
    return " ".join(kept)


def kind_ask(answer: str, after: str) -> str | None:
    """How a question asks for `answer` by its kind, read from the text right `after` it in its window:
    "how many minutes?" for a number before "minutes after ...", "which data centre?" for a name before
    "data centre."; None where the words after say no kind (a verb, a year, a clause that goes on)."""
    answer = answer.strip()
    counted = _COUNTED.fullmatch(answer)
    if counted:  # the value of a field, "97 min": its own unit
        kind = _kind_words([counted.group(2)])
        return f"how many {kind}?" if kind else None
    ends = _KIND_ENDS.match(after)
    kind = _kind_words(ends.groups()) if ends else None
    if _NUMBER.fullmatch(answer):
        if _YEAR.match(answer):
            return None  # a year is a time, asked "when?"
        if kind is None:
            plural = _KIND_PLURAL.match(after)
            kind = _kind_words([plural.group(1)]) if plural else None
        return f"how many {kind}?" if kind else None
    if answer[:1].isupper():
        return f"which {kind}?" if kind else None
    return None


def _after(window: str, statement: str, answer: str) -> str | None:
    """The window's text right after the answer where the statement's last words lead to it (the last
    TAIL_WORDS, or fewer where the statement's subject or a pronoun put in its place stands among them), or
    None."""
    words = statement.split()
    for n in range(min(TAIL_WORDS, len(words)), 0, -1):
        lead_in = r"\s+".join(re.escape(w) for w in words[-n:])
        m = re.search(lead_in + r"\s*\(?\s*" + re.escape(answer.strip()) + r"(?![\w])", window, re.IGNORECASE)
        if m:
            return window[m.end() :]
    return None


def kind_subject(statement: str, answer: str, candidates: Sequence[str], lead: str) -> str | None:
    """Whom a kind question names: the longest of the window's subjects (`candidates`: its title, its
    sections' names) that the statement names; a title given with its document's `lead` ("INC-1770 timeline
    (Harvion gateway, ...)") keeps the lead's comma-separated parts that do not give the answer away."""
    named = [c for c in candidates if c and c.lower() in statement.lower()]
    if not named:
        return None
    subject = max(named, key=len)
    if lead and subject == candidates[0]:
        kept = ", ".join(p for p in lead.split(", ") if not gives(p, answer.strip()))
        subject = topic(subject, kept)
    return None if gives(subject, answer.strip()) else subject


def kind_questions(
    window: str, clozes: Sequence[tuple[str, str]], candidates: Sequence[str], lead: str, n: int
) -> list[tuple[str, str]]:
    """Up to `n` kind questions (question, answer) of a window's cloze prompts (statement, answer), in
    `pick_statements` order; a question asked of two answers in one window is dropped (it has none)."""
    found: dict[str, set[str]] = {}
    order: list[str] = []
    for i in pick_statements(clozes, len(clozes)):
        statement, answer = clozes[i]
        after = _after(window, statement, answer)
        ask = kind_ask(answer, after) if after is not None else None
        subject = kind_subject(statement, answer, candidates, lead) if ask else None
        if ask and subject:
            q = f"{subject}: {ask}"
            if q not in found:
                order.append(q)
            found.setdefault(q, set()).add(answer.strip())
    return [(q, next(iter(found[q]))) for q in order if len(found[q]) == 1][:n]


def add_echo(
    reg: Registry,
    tokenizer: Any,
    per_window: int,
    l1s: Sequence[int] | None = None,
    kinds: int = 0,
    names: int = 0,
) -> int:
    """Echo questions (`per_window`) and kind questions (`kinds` per window) for every window last echoed
    with other counts (its earlier ones are replaced); `names` per window of an event (`train --echo-names`) ask
    its naming prompts back (memctl.train.namings: "Harvion gateway (August 2024): 18:08 Service restored
    what?"); with `l1s`, only the windows of those level-1 subtrees. Each is
    routed from the question alone to the nearest window of its own document, and trained, never held out.
    None for an anchor without a chat template (the prepare report says so). Returns how many."""
    if (per_window <= 0 and kinds <= 0 and names <= 0) or not has_chat_template(tokenizer):
        return 0
    only = f" and w.l1 in ({','.join(str(int(x)) for x in l1s)})" if l1s is not None else ""
    rows_all = list(
        reg.db.query(
            "select w.id, w.doc_id, w.echoed, w.echo_kinds, w.echo_named, d.title from windows w "
            f"join documents d on d.id = w.doc_id where w.prompted = 1{only} order by w.id"
        )
    )
    events = {r["doc_id"] for r in rows_all if names > 0 and has_event_title(r["title"] or "")}
    namings = window_event_namings(reg, events) if events else {}
    asked = {int(r["id"]): names if int(r["id"]) in namings else 0 for r in rows_all}  # under an event's name
    rows_w = [
        r
        for r in rows_all
        if (r["echoed"], r["echo_kinds"], r["echo_named"]) != (per_window, kinds, asked[int(r["id"])])
    ]
    windows = [int(r["id"]) for r in rows_w]
    if not windows:
        return 0
    about: dict[int, tuple[str, list[str], str]] = {}  # window: its text, its subjects, its document's lead
    if kinds > 0:
        docs = {r["doc_id"] for r in rows_w}
        starts, leads = window_openings(reg, docs), window_leads(reg, docs)
        texts = {w: t for _, wins in document_windows(reg, docs).values() for w, t in wins}
        for r in rows_w:
            w, title, start = int(r["id"]), r["title"] or "", starts[int(r["id"])]
            called = [title] + [x for x in subjects(texts[w], title, start is not None, start or "") if x != title]
            about[w] = (texts[w], called, leads[w])
    made: list[dict[str, Any]] = []
    bare: list[str] = []

    def add(r: dict[str, Any], q: str, said: str) -> None:
        made.append(
            {
                "window_id": r["window_id"],
                "doc_id": r["doc_id"],
                "kind": ECHO,
                "text": chat_turn(tokenizer, q),
                "answer": said,
                "held_out": 0,
            }
        )
        bare.append(q)

    for w, rows in trained_rule_prompts(reg, windows).items():
        clozes = [(r["text"], r["answer"]) for r in rows]
        for i in pick_statements(clozes, per_window):
            add(rows[i], *echo_pair(*clozes[i]))
        if kinds > 0:
            text, called, lead = about[w]
            for q, said in kind_questions(text, clozes, called, lead, kinds):
                add(rows[0], q, said)
        if w in namings:
            renamed_clozes = window_namings(clozes, namings[w][1], namings[w][0])
            for i in pick_statements(renamed_clozes, names):
                add(rows[0], *echo_pair(*renamed_clozes[i]))
    route_rows(reg, made, bare)
    with reg.db.atomic():  # the windows asked under an event's name record how many, the others 0
        for value in sorted({asked[w] for w in windows}):
            group = {w for w in windows if asked[w] == value}
            counts = {"echoed": per_window, "echo_kinds": kinds, "echo_named": value}
            replace_kind(reg, ECHO, sorted(group), counts, [m for m in made if m["window_id"] in group])
    return len(made)
