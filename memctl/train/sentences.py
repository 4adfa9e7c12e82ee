"""Where a text's sentences end (pure text): the units the cloze rules (memctl.train.prompts) and the leads
(memctl.train.leads) read, and the date forms both know."""

from __future__ import annotations

import re

# a sentence ends at . ! ? after a lowercase letter, a digit or a closing mark, so initials ("Jane Q. Example",
# "Sir H. Davy") do not end one
SENT = re.compile(r"(?<=[a-z0-9%)\]\"'][.!?])\s+(?=[A-Z0-9\"'(])")
# ... nor does a title or an abbreviation that a name or a word follows ("Dr. John Cupitt", "e.g. Lisp", "ca. 1979")
TITLE = r"(?:Dr|Mr|Mrs|Ms|Prof|St|Mt|Gen|Col|Capt|Rev|Sgt|Lt|Fr|Sen|Gov)"
ABBREVIATION = re.compile(rf"(?:^|\s|\()(?:{TITLE}|No|Fig|Vol|vs|cf|ca|c|approx|e\.g|i\.e)\.$")
MONTH_NAMES = "January February March April May June July August September October November December".split()
MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|"
    r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
DAY = r"\d{1,2}(?:st|nd|rd|th)?"
DATE = re.compile(
    rf"(?<![\w-])(\d{{4}}-\d{{2}}-\d{{2}}|{DAY} {MONTH},? \d{{4}}|{MONTH} {DAY},? \d{{4}}|"
    r"\d{1,2}([/.])\d{1,2}\2\d{4})(?![\w-])"  # and 08/10/1983, 08.10.1983
)
# a list item or a field line: "- Born: 14 March 1962", "Employer: Quorvane Systems", "City | Brantholm"
FIELD = re.compile(
    r"^\s*(?:[-*\u2022]|\d{1,2}[.)])?\s*([A-Za-z][\w/'-]*(?: [\w/'-]+){0,3})\s*(?::|\|)\s+(\S.{0,80}?)\s*\.?$"
)
ITEM = re.compile(r"^\s*(?:[-*\u2022]|\d{1,2}[.)])\s+\S")
QA = re.compile(r"^(?:Q|Question):\s*(.+?\?)(?:\s+(?:A|Answer):\s*(.+?))?\.?$")


def is_line_unit(line: str) -> bool:
    return bool(ITEM.match(line) or FIELD.match(line) or QA.match(line))


def sentences(text: str) -> list[str]:
    """Sentences of each paragraph; in a paragraph of list items or field lines, each line is one unit
    (a "Q: ..." line and the "A: ..." line after it make one)."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [" ".join(x.split()) for x in para.splitlines() if x.strip()]
        if len(lines) > 1 and sum(is_line_unit(x) for x in lines) >= 2:
            for line in lines:
                if out and line.startswith("A:") and out[-1].startswith("Q:") and " A: " not in out[-1]:
                    out[-1] = f"{out[-1]} {line}"
                else:
                    out.append(line)
            continue
        para = " ".join(para.split())
        parts: list[str] = []
        for s in SENT.split(para):
            if parts and ABBREVIATION.search(parts[-1]):
                parts[-1] = f"{parts[-1]} {s}"
            elif s.strip():
                parts.append(s.strip())
        out.extend(parts)
    return out
