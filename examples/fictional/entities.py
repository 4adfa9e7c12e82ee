"""The fictional corpus's entities: invented people and organisations, their names drawn from syllable pools
and their attributes at random, so that a model can only know them from the documents."""

from __future__ import annotations

import calendar
import datetime as dt
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
