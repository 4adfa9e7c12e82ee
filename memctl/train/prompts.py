"""Prompts about a window, generated from the window itself (pure text; no labels, no models).

* cloze: a statement of the window cut just before a salient span, with the statement's subject (the
  document's title, or in a document of sections its section's name: memctl.train.sections)
  made explicit (a leading pronoun or a bare participle gets the subject, a question's first pronoun
  is replaced by it, a statement that never names it is prefixed "<S>: "); the span is the answer,
  unless it is the subject itself or part of a short subject's name. Salient spans, meant for any style of text:
    - numbers, including either end of a range ("(1801-1882)") and the parts of a date;
    - whole dates in any common form ("14 March 1962", "March 14, 1962", "1962-03-14");
    - names: a Capitalised word, an acronym or a word with a capital or a digit after a lowercase start inside
      a sentence ("born in Brisquay", "sold by IBM", "from AT&T", "standard called V.90", "eBay", "k56flex"),
      with the Capitalised words, "of" and trailing version numbers that continue it
      ("University of Kent", "SQL Access Group", "Windows 3.1"), and one Capitalised word inside a
      parenthetical ("(also known as Example)");
    - a short quoted term ('known as "Chicago"');
    - the lowercase noun phrase after a copula ("is a theologian", "was an English composer", "serves as a
      piano tuner") and the term after a naming phrase ("known as ransomware", "named after birds");
    - the lowercase phrase that ends a sentence after a preposition, an article or a copula, where English
      puts the new information ("used in telecommunications", "job title is dye chemist");
    - the value of a list item or a field line ("- Born: 14 March 1962", "Employer | Quorvane").
  A passage that opens on a definition, as dictionaries and glossaries write them ("A vi lookalike which
  ...", "(ODBC) A standard for ..."), is read as the statement "<S> is a vi lookalike which ...". A span in a
  sentence's opening phrase ("In 1993, SAG submitted the CLI ...") is asked at the end of the main clause
  ("SAG submitted the CLI ... in" -> "1993"): a sentence's first words follow no prompt.
* paraphrase: the same fact asked in other generic English forms:
    - attribute form  "<S> ... with atomic number 2"      -> "The atomic number of <S> is"
    - agent deletion  "<S> was discovered by X Y in 1766" -> "<S> was discovered in"
    - field form      "- Born: 14 March 1962"             -> "<S>, born:"
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .leads import label_lead
from .sections import passages
from .sentences import DATE as _DATE
from .sentences import FIELD as _FIELD
from .sentences import QA as _QA
from .sentences import TITLE as _TITLE
from .sentences import sentences

# The version of these rules. Bump it when a change makes them write other prompts for some text: each window
# records the version that wrote its prompts, and `memctl reprompt` rewrites those of older versions.
#   1: 2026-11-26 (1c6a850): one-word names, acronyms, quoted terms, slashed dates (0: any rules before)
#   2: 2026-11-28: in a document of sections, a prompt names its section's subject (memctl.train.sections)
#   3: 2026-12-02: names that open a parenthesis, follow an owner ("MIT's") or a list's comma; an answer the
#      prompt already gives is whole words
#   4: 2026-12-02: a definition that opens a passage is read as "<S> is ..."; a date or a name that opens a
#      sentence ("In 1993, SAG ...") is asked at the end of it; the term after "known as", "called", "named";
#      a sentence's last lowercase phrase; names with a dotted number ("V.90") or a lowercase start ("eBay")
#   5: 2026-12-04: a window titled by an id or a date ("INC-1770 timeline") names its lead in every prompt
#      but the lead's own ("INC-1770 timeline (Harvion gateway, ...): Cause found: a"; memctl.train.leads)
RULES = 5

# a number: not inside a word or a decimal, not glued to a word by a hyphen ("COVID-19", "3-year"),
# but either end of a numeric range ("1801-1882", "1801–1882") is one
_NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z]-)(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?!\w)(?![-\u2013][A-Za-z])")
# a lowercase noun phrase after a copula and an article: "is a theologian", "was an English composer"
_COPULA_NP = re.compile(
    r"\b(?:is|was|are|were|became|becomes|remains|(?:serves|served|works|worked|acts|acted) as)\s+(?:a|an|the)\s+"
    r"((?:[A-Z][a-z]+\s+)?[a-z][a-z-]+(?:\s+(?!(?:in|at|of|for|from|with|by|who|which|that|and|or|to|on|since)\b)"
    r"[a-z][a-z-]+){0,3})"
)
# one Capitalised word (or a number) led by a lowercase phrase inside parentheses: "(also known as Example)"
_PAREN = re.compile(r"\((?:[a-z][a-z.]*\s+){1,4}([A-Z][\w'-]+)\)")
MAX_FIELD_WORDS = 8
_HEADER_KEYS = {"field", "key", "attribute", "property", "item", "name"}
# a name inside a sentence (never its first word, which any sentence capitalises): a Capitalised word or an
# acronym ("Brisquay", "IBM", "AT&T", "C++", "MS-DOS", "OS/2"), with the initials, Capitalised words, "of"
# and version numbers that continue it ("M. Cowlishaw", "John Q. Public", "University of Kent", "Windows 3.1")
_WORD = r"(?:[A-Z](?:[\w&/-]*\w)?(?:\.\d+)*(?:\+\+)?|[a-z]+(?:[A-Z]|\d)[A-Za-z\d]*(?![\w-]))"
_NAME = re.compile(
    rf"(?:(?<=[a-z0-9,;:)] )|(?<=[a-z0-9,;:] \())((?:{_TITLE}\.\s+)?(?:[A-Z]\.\s*)*{_WORD}"
    rf"(?:(?:\s+(?:[A-Z]\.\s*)*|\s+(?:of\s+(?:the\s+)?|&\s+)){_WORD})*"
    r"(?:\s+\d+(?:\.\d+)*(?![\w-]))?)"
)
# the lowercase term a naming phrase gives: "the kind of malware known as ransomware", "named after birds"
_NAMING = re.compile(
    r"\b(?:known as|referred to as|called|named after|termed|dubbed)\s+(?:(?:a|an|the)\s+)?"
    r"((?!(?:in|at|of|for|from|with|by|to|on|after|as|a|an|the)\b)[a-z][a-z-]+"
    r"(?:\s+(?!(?:in|at|of|for|from|with|by|who|which|that|and|or|to|on|since)\b)[a-z][a-z-]+){0,2})"
)
# a short quoted term: 'known as "Chicago"' (the prompt ends with the opening quote)
_QUOTED = re.compile(r"(?<=\s[\"\u201c])([^\"\u201c\u201d]{1,40}?)(?=[\"\u201d])")
# Capitalised words that are no name: sentence words any text capitalises after a colon or in a title
_NOT_NAMES = set(
    "i the a an this these those he she they we you it its his her their our my there here in on at for if when as "
    "but and or not no yes see note".split()
)
_PRONOUN = re.compile(r"^(It|Its|This element|This|They|Their|He|She|His|Her)\b")
_POSSESSIVES = {"its", "their", "his", "her"}  # a pronoun the subject replaces as "<S>'s"
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
MAX_NAME_WORDS = 4  # a subject this short is a name: no part of it is an answer


@dataclass(frozen=True)
class Prompt:
    kind: str  # cloze | paraphrase
    text: str  # ends right before the answer (no trailing space)
    answer: str


def _explicit_subject(prefix: str, subject: str) -> str:
    """Replace a leading pronoun by the subject; give a bare participle clause its subject."""
    m = _PRONOUN.match(prefix)
    if m:
        word = m.group(1)
        repl = f"{subject}'s" if word.lower() in _POSSESSIVES else subject
        return repl + prefix[m.end() :]
    first = prefix.split(" ", 1)[0]
    if first.endswith("ed") and first[:1].isupper() and subject.lower() not in prefix.lower():
        return f"{subject} was {first.lower()}{prefix[len(first) :]}"
    return prefix


_QUESTION_PRONOUN = re.compile(r"\b(it|he|she|they|him|them|its|his|their|her)\b(\s+\w)?", re.IGNORECASE)


def _with_subject(prompt: str, subject: str) -> str:
    """A prompt that names its subject: as it is when it does; a question ("Q: Who founded it? A:") with
    its first pronoun replaced ("Q: Who founded Quorvane? A:"); anything else prefixed "<S>: "."""
    if not subject or subject.lower() in prompt.lower():
        return prompt
    qa = re.match(r"(Q: )(.+?\?)( A:.*)$", prompt)
    m = _QUESTION_PRONOUN.search(qa.group(2)) if qa else None
    if qa and m:
        word = m.group(1).lower()
        # "her" before a word is possessive ("her date of birth"), at the end an object ("who employs her")
        owner = word in _POSSESSIVES and (word != "her" or m.group(2) is not None)
        q = qa.group(2)
        q = q[: m.start(1)] + (f"{subject}'s" if owner else subject) + q[m.end(1) :]
        return f"{qa.group(1)}{q}{qa.group(3)}"
    return f"{subject}: {prompt}"


def _names_subject(answer: str, subject: str) -> bool:
    """Whether an answer is the subject, or a part of a short subject's name ("68" of "ALGOL 68"); a long
    subject (a plain text's first line) is no name, and its words can be real answers."""
    a, s = answer.strip().lower(), subject.strip().lower()
    return bool(s) and (
        a == s or (len(s.split()) <= MAX_NAME_WORDS and re.search(rf"\b{re.escape(a)}\b", s) is not None)
    )


def gives(prefix: str, answer: str) -> bool:
    """Whether `prefix` already says `answer`, as whole words ("W" is not in "window", "NeXT" not in "NEXTSTEP")."""
    return re.search(rf"(?<!\w){re.escape(answer.lower())}(?!\w)", prefix.lower()) is not None


def _is_name(span: str, before: str) -> bool:
    """A name span: not one letter ("J" of "J & C"), not a word any text capitalises ("The" after a colon),
    not the tail of a longer name ("Iron" of 'the "Big Iron"', "Box" of "Set Top Box")."""
    last = before.split()[-1].lstrip("(") if before.split() else ""  # "States" of "(United States)" is a tail
    # after an owner ("MIT's Project Athena") or a list's comma ("SunOS, ULTRIX") a name starts anew
    owner = last.endswith(("'s", "\u2019s", ",", ";"))
    tail = bool(last) and (last[0].isupper() or last[0] in '"\u201c') and last.lower() not in _NOT_NAMES and not owner
    return len(span) > 1 and span.lower() not in _NOT_NAMES and not tail


_NOT_CONTENT = _STOP | set(
    "not no more less very such other others them him her us me you one ones all any each both own same so then "
    "there here now well too only just still even again use uses used my your our their whose "
    # idioms that end a sentence and name nothing: "in the future", "for example", "in person"
    "future past way time times case example instance general fact person part".split()
)
_MODIFIER = re.compile(r"(?:ed|ing|ly)$")  # a participle or an adverb: no noun phrase ends on one
# the word before a sentence's last phrase that makes it one (not "and", "or": "questions and answers")
_FUNCTION_WORDS = (_STOP - {"and", "or"}) | set("as is are was were by per via like within without across".split())


def _end_focus(sentence: str) -> tuple[int, int] | None:
    """The lowercase noun phrase that ends a sentence, after a preposition, an article or a copula: where
    English puts a sentence's new information ("widely used in telecommunications", "job title is dye
    chemist", "holds the position of beekeeper", "over analogue telephone lines"); at most three words."""
    words = list(re.finditer(r"\S+", sentence.rstrip(" .!?")))
    phrase: list[re.Match[str]] = []
    for w in reversed(words):
        if not re.fullmatch(r"[a-z][a-z-]*[a-z]", w.group()) or w.group() in _NOT_CONTENT or len(phrase) == 3:
            break
        phrase.insert(0, w)
    before = len(words) - len(phrase) - 1
    if not phrase or before < 1 or words[before].group().lower() not in _FUNCTION_WORDS:
        return None
    if _MODIFIER.search(phrase[-1].group()):  # a participle or an adverb, not a noun
        return None
    return phrase[0].start(), phrase[-1].end()


def _is_term(span: str) -> bool:
    """A quoted term worth asking for: a word in it that is not a stop word ('a "with"' is no term)."""
    return any(re.fullmatch(r"\w[\w'&+.-]*", w) and w.lower() not in _STOP for w in span.split())


def _spans(sentence: str) -> list[tuple[int, int]]:
    """Salient spans, one per start (the longest): a date is one answer, not its first number."""
    spans = [(m.start(1), m.end(1)) for m in _NUMBER.finditer(sentence)]
    for pattern in (_DATE, _PAREN):
        spans += [(m.start(1), m.end(1)) for m in pattern.finditer(sentence)]
    for pattern in (_COPULA_NP, _NAMING):  # a noun phrase, without the participle or adverb that ends it
        for m in pattern.finditer(sentence):
            words = m.group(1).split()
            while len(words) > 1 and _MODIFIER.search(words[-1]):
                words.pop()
            spans.append((m.start(1), m.start(1) + len(" ".join(words))))
    spans += [(m.start(1), m.end(1)) for m in _NAME.finditer(sentence) if _is_name(m.group(1), sentence[: m.start(1)])]
    end = _end_focus(sentence)
    if end:
        spans.append(end)
    spans += [(m.start(1), m.end(1)) for m in _QUOTED.finditer(sentence) if _is_term(m.group(1))]
    longest: dict[int, int] = {}
    for s, e in spans:
        longest[s] = max(e, longest.get(s, e))
    return sorted(longest.items())


# a passage that opens on a definition, as dictionaries and glossaries write them: an optional alias in
# parentheses, then "A" or "An" and a lowercase word ("(ODBC) A standard for ...", "A vi lookalike which ...")
# or an owner's name ("Borland's first C/C++ IDE ..."), with no verb before its first clause word ("The" opens
# too many plain sentences: "The system grew out of ...")
_DEFINITION = re.compile(
    r"^(\([^()]{1,60}\)\s+)?(?:(A|An)\s+(?=[a-z\d])|(?=[A-Z][\w&.+-]*(?:\s+[A-Z][\w&.+-]*){0,3}(?:['\u2019]s|s['\u2019])\s+[a-z]))"
)
_CLAUSE_WORDS = set("that which who whose where when for of with in on at by from to and or as".split())
_AUXILIARIES = set(
    "is are was were be been being has have had can could will would may might must shall should do does did".split()
)


def _as_definition(sentence: str, subject: str) -> str | None:
    """A passage's opening definition as the statement it stands for: "A vi lookalike which ..." of Elvis as
    "Elvis is a vi lookalike which ...", "(ODBC) A standard ..." as "<S> (ODBC) is a standard ..."; None when the
    sentence is no definition (it names its subject, or a verb comes before its first clause word)."""
    m = _DEFINITION.match(sentence)
    if not m or not subject or subject.lower() in sentence.lower():
        return None
    body = sentence[m.end() :]
    for word in body.split()[:12]:
        w = word.lower().strip(",;:()\"'")
        if w in _AUXILIARIES:
            return None
        if w in _CLAUSE_WORDS or word.endswith((",", ";", ":")):
            break
    alias = f"{m.group(1).strip()} " if m.group(1) else ""
    article = f"{m.group(2).lower()} " if m.group(2) else ""
    return f"{subject} {alias}is {article}{body}"


# a sentence that opens on a time or a place ("In 1993, SAG submitted ...", "At the end of 1997 there were ..."):
# the preposition, then at most three words before the span, then the clause (after a comma, or a word that starts one)
_FRONTED = re.compile(r"^(In|On|At|By|During|Since|From|Until|Before|After|Around|Circa)\s+((?:\S+\s+){0,3}?)$")
_OPENERS = "the|a|an|there|it|he|she|they|we|this|these"  # lowercase words that start a clause
_CLAUSE_START = re.compile(rf"^(?:,\s+|\s+(?=(?:{_OPENERS})\b|[A-Z]))(.+)$")


def _fronted(sentence: str, s: int, e: int) -> str | None:
    """The prompt that asks for a span in a sentence's opening phrase at the sentence's end: "In 1993, SAG
    submitted the CLI to ANSI." -> ("SAG submitted the CLI to ANSI in", answer "1993")."""
    m = _FRONTED.match(sentence[:s])
    after = _CLAUSE_START.match(sentence[e:])
    if not m or not after:
        return None
    # the main clause only: the opening phrase belongs to it, not to a relative clause after it
    clause = re.split(r"[;:]\s|,\s+(?:which|who|whose|where|while|whereas|although|but)\b", after.group(1))[0]
    clause = clause.rstrip(" .!?")
    if len(clause.split()) < MIN_PREFIX_WORDS or clause.split()[0].lower() in {"and", "or", "to"}:
        return None
    if re.match(rf"(?:{_OPENERS})\b", clause):  # the clause now opens the sentence
        clause = clause[0].upper() + clause[1:]
    return " ".join(f"{clause} {m.group(1).lower()} {m.group(2)}".split())


def _fields(unit: str) -> tuple[str, str] | None:
    """(key, value) of a field line or a question-and-answer pair, when the value is a short answer."""
    qa = _QA.match(unit)
    if qa:
        key, value = f"Q: {qa.group(1)} A:", qa.group(2) or ""
    else:
        m = _FIELD.match(unit)
        if not m or len(m.group(1)) < 2 or m.group(1).lower() in _HEADER_KEYS:
            return None
        key, value = m.group(1).strip(), m.group(2).strip().rstrip(".")
    return (key, value) if value and len(value.split()) <= MAX_FIELD_WORDS else None


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


def joins_without_space(prompt: str) -> bool:
    """Whether an answer follows `prompt` with no space ("(1801-" + "1882", 'known as "' + "Chicago")."""
    return prompt.endswith(("-", "\u2013", "(", "/", "\u201c")) or re.search(r"(?:^|\s)\"$", prompt) is not None


def prompts_for(
    text: str,
    title: str,
    max_per_window: int = 48,
    sections: bool | None = None,
    start: str = "",
    lead: str | None = None,
) -> list[Prompt]:
    """Cloze prompts and their paraphrases for every salient span of every sentence of `text`, each naming
    the subject of its passage: the document's title (with its lead, for a title that is an id or a date:
    memctl.train.leads), or in a document of sections the name its section opens on (memctl.train.sections;
    `sections` and `start` as in its `passages`). `lead`: the document's lead (`leads.window_leads`); None
    reads `text` as a whole document."""
    out: list[Prompt] = []
    answers: dict[str, set[str]] = {}

    def add(kind: str, prompt: str, answer: str, min_words: int = MIN_PREFIX_WORDS) -> None:
        prompt = " ".join(prompt.split()).rstrip()
        if len(prompt.split()) >= min_words:
            if prompt not in answers:
                out.append(Prompt(kind, prompt, answer))
            answers.setdefault(prompt, set()).add(answer)

    title = title.strip()
    if lead is None:
        lead = label_lead(title, text)
    for part, subject in passages(text, title, sections, start):
        # a passage about the title, in a document titled by an id or a date, is about what its lead names
        _add_sentences(part, subject.strip(), add, lead if subject == title else "")
    # a prompt the window answers in two ways (e.g. two discovery years) teaches nothing: drop it
    return [p for p in out if len(answers[p.text]) == 1][:max_per_window]


def window_prompts(text: str, title: str | None, start: str | None, lead: str) -> list[Prompt]:
    """`prompts_for` of a window, given what `memctl.train.sections.window_openings` says of it (the name
    its section opens on in a document of sections, None in any other document) and its document's lead
    (`memctl.train.leads.window_leads`)."""
    return prompts_for(text, title or "", sections=start is not None, start=start or "", lead=lead)


def _add_sentences(text: str, title: str, add: Callable[..., None], opening: str = "") -> None:
    """Every prompt of `text`'s sentences, about `title`, through `add(kind, prompt, answer[, min_words])`;
    with an `opening` (its document's lead: memctl.train.leads), about "<title> (<opening>)", but in the
    lead's own sentence, and for an answer the lead says (either would give the answer away)."""
    about = f"{title} ({opening})" if opening and title else title
    for i, sent in enumerate(sentences(text)):
        whom = title if about == title or opening in sent else about

        def subject_for(answer: str, whom: str = whom) -> str:
            return title if whom != title and gives(opening, answer) else whom

        def names(answer: str, subject: str) -> bool:  # the subject itself, or the title's name
            return _names_subject(answer, subject) or _names_subject(answer, title)

        definition = _as_definition(sent, title) if i == 0 else None
        sent = definition or sent
        field = _fields(sent)
        value_at = -1
        if field and whom:
            key, value = field
            value_at = sent.rfind(value)
            subject = subject_for(value)
            # a header line ("Quorvane: questions and answers") or an answer that only names the subject
            if key.lower() != subject.lower() and not names(value, subject):
                add("cloze", _with_subject(key, subject) if key.startswith("Q: ") else f"{subject}, {key.lower()}:",
                    value, min_words=2)  # fmt: skip
        for s, e in _spans(sent):
            if s == value_at:  # the field's value: asked above, with its key
                continue
            prefix = sent[:s].rstrip(" (")
            answer = sent[s:e]
            subject = subject_for(answer)
            moved = _fronted(sent, s, e)
            if moved and not gives(moved, answer) and not names(answer, subject):
                add("cloze", _with_subject(_explicit_subject(moved, subject) if subject else moved, subject), answer)
                continue
            # a range's second year may follow its hyphen ("(1801-" -> "1882"); other glued parts may not
            ranged = re.search(r"\d{4}\s*[-\u2013]$", prefix) and re.fullmatch(r"\d{4}", answer)
            if len(prefix.split()) < 2 or (prefix.endswith(("-", "/", "\u2013")) and not ranged):
                continue
            if gives(prefix, answer) or names(answer, subject):
                continue  # an answer the prompt already gives, or the subject itself
            cloze = _with_subject(_explicit_subject(prefix, subject) if subject else prefix, subject)
            # a definition's prompt names its subject: "Slingshot is" asks for "CSK Software"
            add("cloze", cloze, answer, min_words=2 if definition else MIN_PREFIX_WORDS)
            if not subject:
                continue
            np_ = _attribute_np(prefix)
            if np_:
                add("paraphrase", f"The {np_} of {subject} is", answer)
            agentless = re.sub(r"\s+by\s+[^,;()]+?(?=\s+(in|on|at|from|during)$)", "", cloze)
            if agentless != cloze:
                add("paraphrase", agentless, answer)
