"""Build a fictional corpus: invented people and organisations, with fact probes the anchor cannot know.

Usage: python examples/fictional/build.py --out DIR [--seed 0] [--entities 300]

Writes DIR/fictional.jsonl (one short document per entity, a second one in another style for about
a fifth of them), DIR/probes.jsonl (statement completions: "Nesald Thalard came into the world in the
year" -> ["1937"]) and DIR/probes-questions.jsonl (the same facts asked as questions). Every name,
city, organisation and prize is made up from syllable pools, so that a model can only know these
facts from the documents: the stand-in for private data. No probe wording occurs in any document:
the build fails if a probe prompt, its entity's name taken out, shares a 4-word sequence with a text.
Only the standard library is used; output is a function of --seed and --entities alone.
"""

from __future__ import annotations

import argparse
import calendar
import datetime as dt
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# --- pools -------------------------------------------------------------------------------------

GIVEN_START = ("Bre", "Cor", "Dav", "Fen", "Gal", "Hes", "Is", "Jor", "Kel", "Lir", "Mav", "Nes", "Or", "Per")
GIVEN_START += ("Quil", "Sel", "Tam", "Ul", "Ver", "Wyl", "Yr", "Zel", "Aur", "Thes", "Brun")
GIVEN_END_F = ("wen", "ysse", "ira", "odne", "ielle", "isca", "une", "ith", "ova", "ayne")
GIVEN_END_M = ("ric", "and", "mon", "ald", "ven", "ias", "orn", "ek", "ustin", "ard")
SURNAME_START = ("Orr", "Thal", "Brack", "Vess", "Quen", "Hald", "Skel", "Durn", "Fald", "Gorm", "Lask", "Pell")
SURNAME_START += ("Rusk", "Trev", "Yarr", "Cald", "Hov", "Nib", "Wick", "Ebb", "Mord", "Sarv")
SURNAME_END = ("ick", "wen", "holt", "ery", "ane", "iss", "ard", "ling", "mere", "by", "strom", "ek", "ton", "icott")
ORG_START = ("Quor", "Vel", "Tarn", "Oss", "Brev", "Cyr", "Dral", "Kalm", "Nerv", "Ryn", "Umb", "Vant", "Harv")
ORG_START += ("Istr", "Jask", "Grod", "Skarv", "Wulm", "Prax", "Ombr")
ORG_END = ("vane", "ith", "ex", "ora", "ant", "yx", "ion", "ell", "ost", "ique", "ent", "aris")
# Names the syllables can spell that are real words, well-known names or real places.
BLOCKED = frozenset(
    (
        "Auric Brek Brevent Brunwen Caldery Caldicott Cormon Corwen Cyrex Dralion Ebbton Galand Haldane "
        "Harvent Harvost Hesmon Hovard Isira Istrora Jorand Kalmex Kelven Maven Ombrell Orrery Orrick Orwen "
        "Ossent Ossion Pellery Pelling Perand Perira Perven Praxion Quenton Rynant Sarvane Seland Selune "
        "Selven Skelton Tamira Thesira Trevery Ulric Ulysse Velaris Velex Velvane Wickard Wickby Wickery "
        "Wickmere Wyland Yarrick Zeland"
    ).split()
)
# fmt: off
CITIES = (
    "Brantholm", "Eskerfall", "Varnmouth", "Corlinde", "Quellhaven", "Orskeld", "Tamberlow", "Vessmoor",
    "Hallowrin", "Kelthorne", "Ostervale", "Fennistow", "Gravenlith", "Skarnvik", "Brisquay", "Caddenholt",
    "Dunmarrow", "Elskeby", "Fallowrin", "Gessimar", "Holvendt", "Irrendale", "Jorvasse", "Kestrennel",
    "Lunnford", "Mirrowick", "Nethercaul", "Oddenvik", "Pranmoor", "Quistleby", "Rhosskarn", "Sallowmede",
    "Umberholt", "Vindrel", "Wexhollow", "Yssingford", "Zandermire", "Cobblemire", "Loskerrow", "Arvenhall",
)
ROLES = (
    "tide engineer", "archivist", "glassblower", "cartographer", "actuary", "bookbinder", "seismologist",
    "lighthouse keeper", "patent examiner", "orchard surveyor", "court stenographer", "bridge inspector",
    "ceramicist", "translator", "locksmith", "pharmacologist", "typesetter", "radio operator",
    "vineyard manager", "sound engineer", "museum conservator", "ferry pilot", "beekeeper", "clockmaker",
    "toxicologist", "harbour master", "acoustician", "piano tuner", "dye chemist", "statistician",
)
FIELDS = (
    "hydrology", "textile chemistry", "acoustics", "soil science", "materials testing", "paleobotany",
    "coastal geology", "pharmacology", "cartography", "archival science", "ornithology", "metallurgy",
    "glaciology", "typography", "epidemiology", "fluid dynamics", "mycology", "linguistics", "optics",
    "horology", "seismology", "limnology", "entomology", "ceramics", "cryptography",
)
# fmt: on
HOBBIES = (  # (gerund, verb phrase)
    ("restoring old barometers", "restores old barometers"),
    ("growing alpine plants", "grows alpine plants"),
    ("playing the cello", "plays the cello"),
    ("building model ships", "builds model ships"),
    ("birdwatching", "goes birdwatching"),
    ("long-distance swimming", "swims long distances"),
    ("collecting old maps", "collects old maps"),
    ("fly fishing", "goes fly fishing"),
    ("chess", "plays chess"),
    ("amateur astronomy", "watches the night sky through a small telescope"),
    ("carpentry", "builds furniture"),
    ("sailing small boats", "sails small boats"),
    ("writing crime novels", "writes crime novels"),
    ("baking bread", "bakes bread"),
    ("hill walking", "walks in the hills"),
)
PRIZE_KINDS = ("Medal", "Prize", "Award")
INDUSTRIES = (  # (industry, name suffixes that suit it)
    ("precision optics", ("Optics", "Instruments")),
    ("freight logistics", ("Logistics", "Freight")),
    ("textile manufacturing", ("Textiles", "Mills")),
    ("marine engineering", ("Maritime", "Engineering")),
    ("book publishing", ("Press", "Publishing")),
    ("industrial ceramics", ("Ceramics", "Works")),
    ("agricultural machinery", ("Machinery", "Works")),
    ("water treatment", ("Water", "Systems")),
    ("medical diagnostics", ("Diagnostics", "Laboratories")),
    ("software consulting", ("Systems", "Analytics")),
    ("glass manufacturing", ("Glassworks", "Works")),
    ("specialty chemicals", ("Chemicals", "Laboratories")),
    ("insurance", ("Mutual", "Assurance")),
    ("seed breeding", ("Seeds", "Growers")),
    ("weather forecasting", ("Meteorics", "Analytics")),
    ("acoustic engineering", ("Acoustics", "Audio")),
    ("rail signalling", ("Signalling", "Rail")),
    ("archival services", ("Archives", "Trust")),
    ("paper milling", ("Paper", "Mills")),
    ("bicycle manufacturing", ("Cycles", "Works")),
    ("wind energy", ("Wind", "Energy")),
    ("food processing", ("Foods", "Provisions")),
    ("architectural design", ("Architects", "Design")),
)
OFFICES = ("Personnel Office", "Records Desk", "Staff Services", "Registry", "Office of the Director", "Archive Unit")
MONTHS = tuple(calendar.month_name)[1:]
STYLES = ("narrative", "bullets", "table", "record", "qa", "memo")
MIN_WORDS, MAX_WORDS = 40, 120

# --- entities ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Person:
    name: str
    surname: str
    female: bool
    born: dt.date
    city: str
    employer: str
    role: str
    field: str
    hobby: tuple[str, str] | None  # (gerund, verb phrase)
    prize: str | None  # "the Vesswen Medal"
    prize_year: int | None

    @property
    def slug(self) -> str:
        return slugify(self.name)


@dataclass(frozen=True)
class Org:
    name: str
    stem: str
    founded: int
    city: str
    industry: str
    founder: str
    employees: int

    @property
    def slug(self) -> str:
        return slugify(self.name)


Entity = Person | Org


def slugify(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def combos(starts: Sequence[str], ends: Sequence[str]) -> list[str]:
    """Every start+end, joined without doubling a letter at the seam, real words left out."""
    out = []
    for s in starts:
        for e in ends:
            word = s + (e[1:] if s[-1] == e[0] else e)
            if word not in BLOCKED and word not in out:
                out.append(word)
    return out


@dataclass
class Pools:
    given_f: list[str]
    given_m: list[str]
    surnames: list[str]
    stems: list[str]
    prize_names: list[str]


def make_pools(rng: random.Random) -> Pools:
    """Name pools whose words never coincide: a surname is never a city, an organisation or a given name."""
    given_f = combos(GIVEN_START, GIVEN_END_F)
    given_m = [w for w in combos(GIVEN_START, GIVEN_END_M) if w not in given_f]
    taken = set(CITIES) | set(given_f) | set(given_m)
    surnames = [w for w in combos(SURNAME_START, SURNAME_END) if w not in taken]
    taken |= set(surnames)
    stems = [w for w in combos(ORG_START, ORG_END) if w not in taken]
    rng.shuffle(surnames)
    rng.shuffle(stems)
    prize_names = [f"the {surnames.pop()} {rng.choice(PRIZE_KINDS)}" for _ in range(12)]  # never a person's
    return Pools(given_f, given_m, surnames, stems, prize_names)


def unique(draw: Iterable[str], used: set[str], what: str, tries: int = 10_000) -> str:
    for _, name in zip(range(tries), draw, strict=False):
        if name not in used:
            used.add(name)
            return name
    raise SystemExit(f"error: ran out of unique {what}; use fewer --entities")


def person_names(rng: random.Random, pools: Pools, female: bool) -> Iterable[str]:
    while True:
        yield f"{rng.choice(pools.given_f if female else pools.given_m)} {rng.choice(pools.surnames)}"


def org_names(rng: random.Random, pools: Pools, suffixes: Sequence[str], stems_used: list[str]) -> Iterable[str]:
    """Mostly a fresh stem; now and then one already used with another suffix (then the stem alone is no answer)."""
    while True:
        fresh = [s for s in pools.stems if s not in stems_used]
        reuse = stems_used and (not fresh or rng.random() < 0.06)
        stem = rng.choice(stems_used) if reuse else fresh[0]
        yield f"{stem} {rng.choice(suffixes)}"


def make_orgs(rng: random.Random, pools: Pools, count: int, names: set[str], stems_used: list[str]) -> list[Org]:
    orgs = []
    for _ in range(count):
        industry, suffixes = rng.choice(INDUSTRIES)
        name = unique(org_names(rng, pools, suffixes, stems_used), names, "organisation names")
        stem = name.split()[0]
        if stem not in stems_used:
            stems_used.append(stem)
        founder = unique(person_names(rng, pools, rng.random() < 0.5), names, "person names")
        employees = int(round(10 ** rng.uniform(1.0, 4.7)))
        orgs.append(Org(name, stem, rng.randint(1850, 2015), rng.choice(CITIES), industry, founder, employees))
    return orgs


def make_people(
    rng: random.Random, pools: Pools, count: int, names: set[str], employers: Sequence[Org], outsiders: Sequence[Org]
) -> list[Person]:
    people = []
    for _ in range(count):
        female = rng.random() < 0.5
        name = unique(person_names(rng, pools, female), names, "person names")
        year, month = rng.randint(1930, 1999), rng.randint(1, 12)
        born = dt.date(year, month, rng.randint(1, calendar.monthrange(year, month)[1]))
        employer = rng.choice(employers if rng.random() < 0.5 else outsiders).name
        hobby, prize, prize_year = None, None, None
        extra = rng.random()
        if extra < 0.45:
            hobby = rng.choice(HOBBIES)
        elif extra < 0.8:
            prize, prize_year = rng.choice(pools.prize_names), rng.randint(year + 22, min(year + 60, 2023))
        role, field, city = rng.choice(ROLES), rng.choice(FIELDS), rng.choice(CITIES)
        surname = name.split()[-1]
        people.append(Person(name, surname, female, born, city, employer, role, field, hobby, prize, prize_year))
    return people


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


# --- probes ------------------------------------------------------------------------------------

STATEMENTS = {
    "birth_year": "{name} came into the world in the year",
    "birth_city": "Asked where {pron} was born, {name} would name the city of",
    "employer": "{name} draws a monthly salary from",
    "role": "By trade, {name} earns a living as",
    "founding_year": "{name} first opened its doors in the year",
    "headquarters": "Anyone visiting the head office of {name} has to travel to",
    "founder": "{name} was started by a person named",
}
QUESTIONS = {
    "birth_year": "Question: In what year was {name} born?\nAnswer:",
    "birth_city": "Question: In which city was {name} born?\nAnswer:",
    "employer": "Question: Which organisation does {name} work for?\nAnswer:",
    "role": "Question: What is {name}'s job?\nAnswer:",
    "founding_year": "Question: In what year was {name} founded?\nAnswer:",
    "headquarters": "Question: In which city is {name} headquartered?\nAnswer:",
    "founder": "Question: Who founded {name}?\nAnswer:",
}
PERSON_KINDS = ("birth_year", "birth_city", "employer", "role")
ORG_KINDS = ("founding_year", "headquarters", "founder")


def facts(e: Entity, sole_stems: set[str]) -> list[tuple[str, list[str]]]:
    """(kind, answers) for each probed fact of `e`."""
    if isinstance(e, Person):
        stem = e.employer.split()[0]
        employer = [e.employer] + ([stem] if stem in sole_stems else [])
        return [
            ("birth_year", [str(e.born.year)]),
            ("birth_city", [e.city]),
            ("employer", employer),
            ("role", [e.role]),
        ]
    return [("founding_year", [str(e.founded)]), ("headquarters", [e.city]), ("founder", [e.founder])]


def whole_word(answer: str, text: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text) is not None


def ngrams(text: str, n: int = 4) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def prompt_ngrams(prompt: str, name: str, n: int = 4) -> set[tuple[str, ...]]:
    """4-grams of the prompt's wording: the entity's name taken out, none spans where it stood."""
    return set().union(*(ngrams(part, n) for part in prompt.split(name)))


# --- build -------------------------------------------------------------------------------------


def build(out: Path, seed: int = 0, entities: int = 300) -> dict[str, Counter[str]]:
    rng = random.Random(seed)
    pools = make_pools(rng)
    names: set[str] = set()
    stems_used: list[str] = []
    n_orgs = entities // 3
    orgs = make_orgs(rng, pools, n_orgs, names, stems_used)
    outsiders = make_orgs(rng, pools, max(20, n_orgs // 2), names, stems_used)  # employers with no document
    people = make_people(rng, pools, entities - n_orgs, names, orgs or outsiders, outsiders)
    stem_count = Counter(o.stem for o in orgs + outsiders)
    sole_stems = {s for s, c in stem_count.items() if c == 1}
    everyone: list[Entity] = [*people, *orgs]
    rng.shuffle(everyone)

    docs: list[dict[str, str]] = []
    statements: list[dict[str, object]] = []
    questions: list[dict[str, object]] = []
    counts: dict[str, Counter[str]] = {"styles": Counter(), "statements": Counter(), "questions": Counter()}
    problems: list[str] = []
    for e in everyone:
        styles = rng.sample(STYLES, 2)
        texts = [document(e, styles[0], rng)]
        if rng.random() < 0.2:
            texts.append(document(e, styles[1], rng))
        ids = [e.slug, f"{e.slug}-2"][: len(texts)]
        for doc_id, style, text in zip(ids, styles, texts, strict=False):
            docs.append({"id": doc_id, "title": e.name, "text": text})
            counts["styles"][style] += 1
        pron = pronoun(e)["s"]
        for kind, answers in facts(e, sole_stems):
            for doc_id, text in zip(ids, texts, strict=True):
                problems += [
                    f"{doc_id}: {kind} answer {a!r} not in the text" for a in answers if not whole_word(a, text)
                ]
            for file, templates in (("statements", STATEMENTS), ("questions", QUESTIONS)):
                prompt = templates[kind].format(name=e.name, pron=pron)
                (statements if file == "statements" else questions).append(
                    {"doc": e.slug, "kind": kind, "prompt": prompt, "answers": answers}
                )
                counts[file][kind] += 1

    titles = {d["id"]: d["title"] for d in docs}
    doc_grams: set[tuple[str, ...]] = set().union(*(ngrams(d["text"]) for d in docs))
    for p in statements + questions:
        shared = sorted(prompt_ngrams(str(p["prompt"]), titles[str(p["doc"])]) & doc_grams)
        if shared:
            problems.append(f"probe {p['prompt']!r} shares {' '.join(shared[0])!r} with a document")
    if problems:
        raise SystemExit("error: bad corpus\n  " + "\n  ".join(sorted(set(problems))[:50]))

    out.mkdir(parents=True, exist_ok=True)
    files = (("fictional.jsonl", docs), ("probes.jsonl", statements), ("probes-questions.jsonl", questions))
    for filename, records in files:
        lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        (out / filename).write_text("".join(lines), encoding="utf-8")

    words = [word_count(d["text"]) for d in docs]
    second = sum(d["id"].endswith("-2") for d in docs)
    print(f"entities: {len(everyone)} ({len(people)} people, {len(orgs)} organisations)")
    print(f"documents: {len(docs)} ({second} second renderings) -> {out / 'fictional.jsonl'}")
    print(f"words: {sum(words)} (per document {min(words)}-{max(words)}, mean {sum(words) / len(words):.0f})")
    print("styles: " + ", ".join(f"{s} {counts['styles'][s]}" for s in STYLES))
    for file, filename in (("statements", "probes.jsonl"), ("questions", "probes-questions.jsonl")):
        print(f"probes: {sum(counts[file].values())} -> {out / filename}")
        for kind in PERSON_KINDS + ORG_KINDS:
            print(f"  {kind}: {counts[file][kind]}")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--entities", type=int, default=300, help="people and organisations, 2:1 (default 300)")
    args = parser.parse_args(argv)
    if args.entities < 3:
        parser.error("--entities must be at least 3")
    build(args.out, args.seed, args.entities)
    return 0


if __name__ == "__main__":
    sys.exit(main())
