"""The fictional corpus's documents: each entity rendered in one of six prose styles (narrative, bullets,
`|` table, `key: value` record, Q&A, memo), its facts in varying order, padded with filler sentences."""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Sequence

from entities import MONTHS, OFFICES, Entity, Person

MIN_WORDS, MAX_WORDS = 40, 120


# --- rendering ---------------------------------------------------------------------------------


def article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def fmt_date(d: dt.date, how: int) -> str:
    month = MONTHS[d.month - 1]
    return (
        f"{d.day} {month} {d.year}",
        f"{month} {d.day}, {d.year}",
        d.isoformat(),
        f"{d.day:02d}/{d.month:02d}/{d.year}",
    )[how]


def refs(subject: str, possessive: str | None = None, obj: str | None = None) -> dict[str, str]:
    """Ways to refer to an entity in a template: {S}/{s} subject (sentence start / inside), {o} object,
    {P}/{p} possessive."""
    possessive = possessive if possessive is not None else subject + ("'" if subject.endswith("s") else "'s")
    return {"S": cap(subject), "s": subject, "o": obj or subject, "P": cap(possessive), "p": possessive}


def short_refs(e: Entity) -> list[dict[str, str]]:
    """References after the first mention."""
    if isinstance(e, Person):
        pron = refs("she", "her", "her") if e.female else refs("he", "his", "him")
        return [pron, pron, refs(e.surname)]
    return [refs("it", "its", "it"), refs("it", "its", "it"), refs(e.stem), refs("the organisation"), refs("the firm")]


def pronoun(e: Entity) -> dict[str, str]:
    return short_refs(e)[0]


def values(e: Entity, rng: random.Random, date_formats: Sequence[int]) -> dict[str, str]:
    if isinstance(e, Person):
        v = {"name": e.name, "date": fmt_date(e.born, rng.choice(date_formats)), "city": e.city, "emp": e.employer}
        v |= {"role": e.role, "a_role": article(e.role), "field": e.field}
        if e.hobby:
            v |= {"hobby_g": e.hobby[0], "hobby_v": e.hobby[1]}
        if e.prize:
            v |= {"prize": e.prize, "Prize": e.prize.removeprefix("the "), "pyear": str(e.prize_year)}
        return v
    return {
        "name": e.name,
        "year": str(e.founded),
        "founder": e.founder,
        "city": e.city,
        "industry": e.industry,
        "n": f"{e.employees:,}",
    }


def fact_keys(e: Entity) -> list[str]:
    if isinstance(e, Person):
        return (
            ["birth", "city", "employer", "role", "field"]
            + (["hobby"] if e.hobby else [])
            + (["prize"] if e.prize else [])
        )
    return ["year", "founder", "city", "industry", "employees"]


def merged_units(e: Entity, rng: random.Random, pairs: dict[str, tuple[str, str]]) -> list[str]:
    """Fact keys in random order, some pairs told in one sentence ("born in X on D")."""
    keys = fact_keys(e)
    units = []
    for unit, (a, b) in pairs.items():
        if rng.random() < 0.35:
            keys.remove(a)
            keys.remove(b)
            units.append(unit)
    units += keys
    rng.shuffle(units)
    return units


PERSON_SENTENCES: dict[str, tuple[str, ...]] = {
    "birth": ("{S} was born on {date}.", "{P} date of birth is {date}.", "{S} was born on {date}, the register says."),
    "city": ("{S} was born in {city}.", "{P} birthplace is {city}.", "{S} is a native of {city}."),
    "birth+city": ("{S} was born in {city} on {date}.", "Born on {date} in {city}, {s} grew up there."),
    "employer": (
        "{S} works for {emp}.",
        "{S} is employed by {emp}.",
        "{P} employer is {emp}.",
        "{S} is on the staff of {emp}.",
    ),
    "role": (
        "{S} works as {a_role}.",
        "{S} is {a_role} by profession.",
        "{S} holds a post as {a_role}.",
        "{P} job title is {role}.",
    ),
    "role+employer": (
        "{S} works as {a_role} at {emp}.",
        "{S} is {a_role} with {emp}.",
        "At {emp}, {s} holds the position of {role}.",
    ),
    "field": ("{P} work centres on {field}.", "{S} specialises in {field}.", "{S} trained in {field}."),
    "hobby": ("Outside work, {s} {hobby_v}.", "{S} {hobby_v} when not at work.", "{P} favourite pastime is {hobby_g}."),
    "prize": (
        "In {pyear}, {s} received {prize}.",
        "{S} won {prize} in {pyear}.",
        "{S} was awarded {prize} in {pyear}.",
    ),
}
PERSON_MEMO: dict[str, tuple[str, ...]] = {
    "birth": ("Our records give {p} date of birth as {date}.", "{S} was born on {date}."),
    "city": ("{P} place of birth is recorded as {city}.", "{S} was born in {city}."),
    "birth+city": ("Our records show that {s} was born in {city} on {date}.",),
    "employer": ("{S} is currently employed by {emp}.", "{S} remains on the payroll of {emp}."),
    "role": ("{S} serves as {a_role}.", "{P} current position is {role}."),
    "role+employer": ("{S} joined {emp} as {a_role}.", "{S} is employed by {emp} as {a_role}."),
    "field": ("{P} area of expertise is {field}.", "{S} is qualified in {field}."),
    "hobby": ("For the social committee: {s} {hobby_v}.",),
    "prize": ("Please note that {s} received {prize} in {pyear}.",),
}
ORG_SENTENCES: dict[str, tuple[str, ...]] = {
    "year": (
        "{S} was founded in {year}.",
        "{S} was established in {year}.",
        "{S} dates back to {year}.",
        "{S} has been in business since {year}.",
    ),
    "founder": (
        "{S} was founded by {founder}.",
        "{founder} founded {o}.",
        "{P} founder was {founder}.",
        "{S} owes its origins to {founder}.",
    ),
    "year+founder": ("{S} was founded in {year} by {founder}.", "{founder} established {o} in {year}."),
    "city": (
        "{S} is headquartered in {city}.",
        "{S} has its headquarters in {city}.",
        "{S} is based in {city}.",
        "{P} main offices are in {city}.",
    ),
    "industry": (
        "{S} works in {industry}.",
        "{S} is active in {industry}.",
        "{P} business is {industry}.",
        "{S} specialises in {industry}.",
    ),
    "employees": (
        "{S} employs {n} people.",
        "{S} has a staff of {n}.",
        "Some {n} people work for {o}.",
        "{P} workforce numbers {n}.",
    ),
}
ORG_MEMO: dict[str, tuple[str, ...]] = {
    "year": ("For the supplier file: {s} was founded in {year}.", "{S} was established in {year}."),
    "founder": ("{S} was founded by {founder}.", "{P} founder is listed as {founder}."),
    "year+founder": ("{S} was founded in {year} by {founder}.",),
    "city": ("{S} is headquartered in {city}.", "Correspondence for {o} goes to {city}, where it is based."),
    "industry": ("{S} operates in {industry}.", "{P} line of business is {industry}."),
    "employees": ("{S} reports a headcount of {n}.", "{S} employs {n} people."),
}
PERSON_PAIRS = {"birth+city": ("birth", "city"), "role+employer": ("role", "employer")}
ORG_PAIRS = {"year+founder": ("year", "founder")}
# Label: value styles: (labels for bullets and tables, keys for records, value template).
PERSON_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "birth": (("Born", "Date of birth", "Birth date"), ("born", "dob", "date of birth"), "{date}"),
    "city": (("Birthplace", "Place of birth"), ("birthplace", "place of birth"), "{city}"),
    "employer": (("Employer", "Works for", "Organisation"), ("employer", "organisation", "company"), "{emp}"),
    "role": (("Role", "Position", "Job title", "Occupation"), ("role", "position", "title"), "{role}"),
    "field": (("Speciality", "Discipline", "Area"), ("field", "discipline"), "{field}"),
    "hobby": (("Hobby", "Pastime", "Interests"), ("hobby", "interests"), "{hobby_g}"),
    "prize": (("Award", "Honours", "Distinction"), ("award", "honours"), "{Prize} ({pyear})"),
}
ORG_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "year": (("Founded", "Established", "Year founded"), ("founded", "established"), "{year}"),
    "founder": (("Founder", "Founded by"), ("founder", "founded by"), "{founder}"),
    "city": (("Headquarters", "Head office", "Based in"), ("headquarters", "hq", "head office"), "{city}"),
    "industry": (("Industry", "Sector", "Business"), ("industry", "sector"), "{industry}"),
    "employees": (("Employees", "Staff", "Headcount"), ("employees", "headcount", "staff"), "{n}"),
}
# Q&A: the question mentions the entity as {s}/{o}/{p} (the name first, then a pronoun), the answer uses {A}/{AP}.
PERSON_QA: dict[str, tuple[tuple[str, str], ...]] = {
    "birth": (("When was {s} born?", "On {date}."), ("What is {p} date of birth?", "{date}.")),
    "city": (("Where was {s} born?", "In {city}."), ("What is {p} birthplace?", "{A} was born in {city}.")),
    "employer": (("Who employs {o}?", "{emp}."), ("Where does {s} work?", "{A} works for {emp}.")),
    "role": (
        ("What does {s} do for a living?", "{A} is {a_role}."),
        ("What position does {s} hold?", "{A} works as {a_role}."),
    ),
    "field": (
        ("What does {s} specialise in?", "{A} specialises in {field}."),
        ("What is {p} area of expertise?", "{A} works in {field}."),
    ),
    "hobby": (("What does {s} do outside work?", "{A} {hobby_v}."),),
    "prize": (("Has {s} won any awards?", "Yes: {prize}, in {pyear}."),),
}
ORG_QA: dict[str, tuple[tuple[str, str], ...]] = {
    "year": (("When was {s} founded?", "In {year}."), ("How old is {s}?", "{A} was established in {year}.")),
    "founder": (("Whose idea was {s}?", "{AP} founder was {founder}."), ("Who started {o}?", "{founder}.")),
    "city": (
        ("Where is {s} based?", "In {city}."),
        ("Where does {s} keep its offices?", "{AP} headquarters are in {city}."),
    ),
    "industry": (("What does {s} do?", "{A} works in {industry}."), ("What sector is {s} in?", "{cap_industry}.")),
    "employees": (("How many people work at {o}?", "About {n}."), ("How large is {s}?", "{A} employs {n} people.")),
}
PERSON_FILLERS = (
    "Colleagues describe {o} as patient and exacting.",
    "{S} keeps a notebook of unfinished ideas on {p} desk.",
    "{S} prefers to start work early in the morning.",
    "{S} has mentored several junior colleagues.",
    "{S} rarely attends conferences but answers every letter.",
    "{S} speaks three languages with varying confidence.",
    "{S} has written a handful of short technical notes.",
    "{S} is known for meticulous record-keeping.",
    "{S} chairs a small reading group that meets monthly.",
    "{S} cycles to work in all weathers.",
    "Friends say {s} has never missed a deadline.",
    "{S} once spent a winter cataloguing old field notes.",
)
ORG_FILLERS = (
    "{S} publishes a short annual report every spring.",
    "{P} offices close for two weeks each summer.",
    "{S} runs an apprenticeship scheme for school leavers.",
    "{S} has never been listed on a stock exchange.",
    "{S} sponsors a local choir and a rowing club.",
    "{S} keeps a small archive of early correspondence.",
    "{S} is known for long supplier relationships.",
    "{P} board meets four times a year.",
    "{S} avoids advertising and relies on referrals.",
    "{S} is said to have low staff turnover.",
    "{S} has weathered several changes of ownership.",
    "{S} still uses its original company seal.",
)


def prose(
    e: Entity,
    rng: random.Random,
    table: dict[str, tuple[str, ...]],
    fillers: list[str],
    v: dict[str, str],
    first: dict[str, str],
) -> list[str]:
    """Sentences: the facts (the first mentions the entity as `first`, the rest by pronoun or short name),
    then the fillers."""
    units = merged_units(e, rng, PERSON_PAIRS if isinstance(e, Person) else ORG_PAIRS)
    out = []
    for i, unit in enumerate(units):
        ref = first if i == 0 else rng.choice(short_refs(e))
        out.append(rng.choice(table[unit]).format(**v, **ref))
    out += [f.format(**(pronoun(e) if isinstance(e, Person) else rng.choice(short_refs(e)))) for f in fillers]
    return out


def render(e: Entity, style: str, rng: random.Random, n_fillers: int) -> str:
    person = isinstance(e, Person)
    pool = list(PERSON_FILLERS if person else ORG_FILLERS)
    rng.shuffle(pool)
    fillers = pool[:n_fillers]
    name = e.name
    if style == "narrative":
        v = values(e, rng, (0, 1))
        sentences = prose(e, rng, PERSON_SENTENCES if person else ORG_SENTENCES, fillers, v, refs(name))
        cut = rng.randint(2, len(sentences) - 1) if len(sentences) > 5 and rng.random() < 0.5 else len(sentences)
        return " ".join(sentences[:cut]) + ("\n\n" + " ".join(sentences[cut:]) if cut < len(sentences) else "")
    if style == "memo":
        v = values(e, rng, (0, 1, 3))
        offices = rng.sample(OFFICES, 2)
        head = f"MEMO\nTo: {offices[0]}\nFrom: {offices[1]}\nRe: {name}"
        closing = rng.choice(("Please update the file accordingly.", "No further action is needed.", "File as usual."))
        body = prose(e, rng, PERSON_MEMO if person else ORG_MEMO, fillers, v, refs(name))
        return head + "\n\n" + " ".join(body) + "\n\n" + closing
    if style == "qa":
        v = values(e, rng, (0, 1))
        v["cap_industry"] = cap(v.get("industry", ""))
        keys = fact_keys(e)
        rng.shuffle(keys)
        pron = pronoun(e)
        answer = {"A": pron["S"], "AP": pron["P"]}
        lines = [rng.choice((f"{name}: questions and answers", f"FAQ: {name}", f"About {name}"))]
        for i, key in enumerate(keys):
            mention = refs(name) if i == 0 or rng.random() < 0.4 else pron
            q, a = rng.choice((PERSON_QA if person else ORG_QA)[key])
            lines += [f"Q: {q.format(**v, **mention)}", f"A: {a.format(**v, **answer)}"]
        if fillers:
            lines += ["Q: Anything else worth knowing?", "A: " + " ".join(f.format(**pron) for f in fillers)]
        return "\n".join(lines)
    # label: value styles
    v = values(e, rng, (0, 1, 2, 3))
    fields = PERSON_FIELDS if person else ORG_FIELDS
    keys = fact_keys(e)
    rng.shuffle(keys)
    pron = pronoun(e)
    notes = " ".join(f.format(**pron) for f in fillers)
    if style == "bullets":
        head = rng.choice((name, f"{name}: profile", f"Profile of {name}", f"{name}, at a glance"))
        lines = [head] + [f"- {rng.choice(fields[k][0])}: {fields[k][2].format(**v)}" for k in keys]
        return "\n".join(lines + ([f"Notes: {notes}"] if notes else []))
    if style == "table":
        caption = rng.choice(("Directory entry", "Register extract", "Summary table", "Reference card"))
        header = rng.choice(("Item | Value", "Attribute | Detail", "Entry | Content"))
        lines = [caption, header, f"Name | {name}"] + [
            f"{rng.choice(fields[k][0])} | {fields[k][2].format(**v)}" for k in keys
        ]
        return "\n".join(lines + ([f"Remarks | {notes}"] if notes else []))
    assert style == "record"
    kind = "staff record" if person else "organisation record"
    lines = [f"name: {name}", f"type: {kind}"] + [
        f"{rng.choice(fields[k][1])}: {fields[k][2].format(**v)}" for k in keys
    ]
    return "\n".join(lines + ([f"remarks: {notes}"] if notes else []))


WORD = re.compile(r"\w+(?:[-'’,./]\w+)*")


def word_count(text: str) -> int:
    return len(WORD.findall(text))


def document(e: Entity, style: str, rng: random.Random) -> str:
    """The entity in `style`, padded with filler sentences to at least MIN_WORDS words."""
    n = rng.choice((0, 1, 1, 2))
    while True:
        state = rng.getstate()
        text = render(e, style, rng, n)
        if word_count(text) >= MIN_WORDS or n >= len(PERSON_FILLERS):
            break
        rng.setstate(state)
        n += 1
    if not MIN_WORDS <= word_count(text) <= MAX_WORDS:
        raise SystemExit(f"error: {style} document for {e.name} has {word_count(text)} words:\n{text}")
    return text
