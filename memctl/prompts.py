"""Prompts about a window, generated from the window itself (pure text; no labels, no models).

* cloze: a statement of the window cut just before a salient span (a number, a year, a name),
  with the statement's subject made explicit (a leading pronoun or a bare participle gets the
  subject; a statement that never names it is prefixed "<S>: "); the span is the answer.
* paraphrase: the same fact asked in other generic English forms:
    - attribute form  "<S> ... with atomic number 2"      -> "The atomic number of <S> is"
    - agent deletion  "<S> was discovered by X Y in 1766" -> "<S> was discovered in"
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
_NUMBER = re.compile(r"(?<![\w.-])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\w-])")
_NAME = re.compile(r"(?<=[a-z,;:] )([A-Z][a-z]+(?:\s+(?:[A-Z]\.\s*)*[A-Z][a-z]+)+)")
_PRONOUN = re.compile(r"^(It|Its|This element|This|They|Their)\b")
_STOP = {
    "the",
    "a",
    "an",
    "of",
    "in",
    "on",
    "at",
    "by",
    "for",
    "with",
    "from",
    "to",
    "and",
    "or",
    "is",
    "was",
    "are",
    "were",
    "be",
    "been",
    "has",
    "have",
    "had",
    "it",
    "its",
    "as",
    "that",
    "this",
    "which",
    "than",
    "about",
    "into",
    "over",
    "under",
    "after",
    "before",
    "between",
    "since",
    "until",
    "during",
    "also",
    "most",
    "some",
}
MIN_PREFIX_WORDS = 3


@dataclass(frozen=True)
class Prompt:
    kind: str  # cloze | paraphrase
    text: str  # ends right before the answer (no trailing space)
    answer: str


def sentences(text: str) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        out.extend(s.strip() for s in _SENT.split(para) if s.strip())
    return out


def _explicit_subject(prefix: str, subject: str) -> str:
    """Replace a leading pronoun by the subject; give a bare participle clause its subject."""
    m = _PRONOUN.match(prefix)
    if m:
        word = m.group(1)
        repl = f"{subject}'s" if word in ("Its", "Their") else subject
        return repl + prefix[m.end() :]
    first = prefix.split(" ", 1)[0]
    if first.endswith("ed") and first[:1].isupper() and subject.lower() not in prefix.lower():
        return f"{subject} was {first.lower()}{prefix[len(first) :]}"
    return prefix


def _spans(sentence: str) -> list[tuple[int, int]]:
    spans = [(m.start(1), m.end(1)) for m in _NUMBER.finditer(sentence)]
    spans += [(m.start(1), m.end(1)) for m in _NAME.finditer(sentence)]
    return sorted(set(spans))


def _attribute_np(prefix: str) -> str | None:
    """The noun phrase right before the answer ('with atomic number' -> 'atomic number')."""
    words = prefix.split()
    np_words: list[str] = []
    for w in reversed(words[-3:]):
        if w.lower() in _STOP or not re.fullmatch(r"[a-z][a-z-]*", w):
            break
        np_words.insert(0, w)
    if not np_words or len(np_words) == len(words):
        return None
    before = words[len(words) - len(np_words) - 1].lower()
    return " ".join(np_words) if before in {"with", "of", "has", "have", "had", "is", "was"} else None


def prompts_for(text: str, subject: str, max_per_window: int = 48) -> list[Prompt]:
    """Cloze prompts and their paraphrases for every salient span of every sentence of `text`."""
    subject = subject.strip()
    out: list[Prompt] = []
    answers: dict[str, set[str]] = {}

    def add(kind: str, prompt: str, answer: str) -> None:
        prompt = " ".join(prompt.split()).rstrip()
        if len(prompt.split()) >= MIN_PREFIX_WORDS:
            if prompt not in answers:
                out.append(Prompt(kind, prompt, answer))
            answers.setdefault(prompt, set()).add(answer)

    for sent in sentences(text):
        for s, e in _spans(sent):
            prefix = sent[:s].rstrip(" (")
            if len(prefix.split()) < 2 or prefix.endswith(("-", "/")):
                continue
            answer = sent[s:e]
            if answer.lower() in prefix.lower():
                continue
            cloze = _explicit_subject(prefix, subject) if subject else prefix
            if subject and subject.lower() not in cloze.lower():
                cloze = f"{subject}: {cloze}"
            add("cloze", cloze, answer)
            if not subject:
                continue
            np_ = _attribute_np(prefix)
            if np_:
                add("paraphrase", f"The {np_} of {subject} is", answer)
            agentless = re.sub(r"\s+by\s+[^,;()]+?(?=\s+(in|on|at|from|during)$)", "", cloze)
            if agentless != cloze:
                add("paraphrase", agentless, answer)
    # a prompt the window answers in two ways (e.g. two discovery years) teaches nothing: drop it
    return [p for p in out if len(answers[p.text]) == 1][:max_per_window]
