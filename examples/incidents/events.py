"""The incidents corpus's events: outages of a made-up company's systems, each with its cause, site,
length, the engineer who fixed it and the colleague left with the follow-up work, and the documents
an operations team writes about them: a postmortem, a ticket, a timeline, the minutes of a review
meeting, an e-mail to the team. Names come from the fictional corpus's syllable pools."""

from __future__ import annotations

import datetime as dt
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fictional"))
from entities import CITIES, MONTHS, Pools, person_names, unique  # noqa: E402

# what failed: (cause as the documents tell it, the word a right answer names, the follow-up it calls for)
CAUSES = (
    ("an expired TLS certificate", "certificate", "automate the certificate renewals"),
    ("a full disk on the primary database", "disk", "add alerts on disk usage"),
    ("a bad configuration push", "configuration", "add a second reviewer for config changes"),
    ("a DNS record deleted by mistake", "DNS", "lock the DNS zone against manual edits"),
    ("a memory leak in the worker pool", "memory leak", "cap the memory of each worker"),
    ("a schema migration that locked a table", "migration", "run migrations in smaller batches"),
    ("a failed network switch", "switch", "replace the remaining old switches"),
    ("a cron job that ran twice", "cron", "make the nightly job safe to repeat"),
    ("an exhausted connection pool", "connection pool", "raise the pool size and watch it"),
    ("a clock drift between hosts", "clock", "enforce time sync on every host"),
    ("a cache stampede after a deploy", "cache", "warm the cache before each deploy"),
    ("a power cut in one rack", "power", "move the rack to two power feeds"),
    ("a rate limit set too low", "rate limit", "review the rate limits every quarter"),
    ("a corrupted search index", "index", "keep a verified snapshot of the index"),
    ("a leaked API key that had to be revoked", "API key", "move every key into the secrets vault"),
    ("a retry storm from the mobile app", "retry", "add backoff to the app's requests"),
    ("a firewall rule change", "firewall", "try firewall changes in staging first"),
    ("a message queue that filled up", "queue", "alert on the depth of every queue"),
    ("a time zone bug in the release", "time zone", "add tests that run in other time zones"),
    ("a misconfigured load balancer health check", "health check", "write down the health check settings"),
)
SYSTEMS = (
    "ledger", "scheduler", "gateway", "search service", "billing service", "mail relay", "login service",
    "report builder", "file store", "booking engine", "payroll service", "inventory API", "notification hub",
    "dashboard", "export pipeline", "pricing engine", "audit log", "chat backend",
)  # fmt: skip
OTHER_ITEMS = (  # a review meeting's other business
    "{p} will rewrite the on-call handbook before the end of the quarter.",
    "The budget for new monitoring licences was approved.",
    "{p} joins the platform team next month.",
    "The game day planned for next month is postponed.",
    "{p} asked everyone to finish the security training by Friday.",
    "The status page will move to a new provider.",
)
FILLERS = (
    "No customer data was lost.",
    "The on-call rotation stays as it is.",
    "Support answered the tickets that came in during the outage.",
    "A status page notice went out while the work was under way.",
    "Monitoring showed nothing unusual in the hour before.",
    "Other systems kept running normally.",
    "The team will look at this again in the next quarterly review.",
    "Credits for affected customers are being discussed with finance.",
)
STYLES = ("postmortem", "ticket", "timeline", "minutes", "email")
MIN_WORDS, MAX_WORDS = 45, 150


@dataclass(frozen=True)
class Incident:
    id: str  # "INC-4821"
    system: str  # "Quorvane ledger"
    start: dt.datetime
    site: str  # the data centre's city
    cause: int  # index into CAUSES
    minutes: int
    detector: str  # who saw it first: named in the documents, never asked about
    resolver: str
    owner: str  # who was given the follow-up work
    attendees: tuple[str, ...]  # others at the review meeting

    @property
    def month_year(self) -> str:
        return f"{MONTHS[self.start.month - 1]} {self.start.year}"


def make_incidents(rng: random.Random, pools: Pools, count: int) -> list[Incident]:
    """`count` incidents on about two thirds as many systems; a system's incidents fall in different months."""
    names: set[str] = set()
    systems: list[str] = []
    stems = list(pools.stems)
    while len(systems) < max(1, (2 * count) // 3):
        system = f"{stems.pop()} {rng.choice(SYSTEMS)}"
        systems.append(system)
    ids: set[str] = set()
    taken: set[tuple[str, str]] = set()  # (system, month and year)
    incidents = []
    while len(incidents) < count:
        system = systems[len(incidents)] if len(incidents) < len(systems) else rng.choice(systems)
        day = dt.date(2022, 1, 1) + dt.timedelta(days=rng.randrange(3 * 365))
        start = dt.datetime(day.year, day.month, day.day, rng.randrange(24), rng.randrange(60))
        key = (system, f"{start.month} {start.year}")
        if key in taken:
            continue
        taken.add(key)
        iid = unique((f"INC-{rng.randrange(1000, 10000)}" for _ in iter(int, 1)), ids, "incident ids")
        people = [unique(person_names(rng, pools, rng.random() < 0.5), names, "person names") for _ in range(5)]
        incidents.append(
            Incident(
                iid,
                system,
                start,
                rng.choice(CITIES),
                rng.randrange(len(CAUSES)),
                rng.randint(6, 340),
                people[0],
                people[1],
                people[2],
                tuple(people[3:]),
            )  # fmt: skip
        )
    return incidents


# --- rendering ---------------------------------------------------------------------------------


def fmt_date(d: dt.date, how: int) -> str:
    month = MONTHS[d.month - 1]
    return (f"{d.day} {month} {d.year}", f"{month} {d.day}, {d.year}", d.isoformat())[how]


def clock(t: dt.datetime) -> str:
    return f"{t.hour:02d}:{t.minute:02d}"


def first(name: str) -> str:
    return name.split()[0]


def fields(i: Incident, rng: random.Random) -> dict[str, str]:
    cause, _, fix = CAUSES[i.cause]
    date = fmt_date(i.start.date(), rng.randrange(3))
    return {"id": i.id, "sys": i.system, "date": date, "site": i.site, "cause": cause,
            "Cause": cause[0].upper() + cause[1:], "fix": fix, "min": str(i.minutes), "det": i.detector,
            "res": i.resolver, "own": i.owner}  # fmt: skip


def postmortem(i: Incident, v: dict[str, str], rng: random.Random, fillers: list[str]) -> tuple[str, str]:
    title = rng.choice(("Postmortem {id}: {sys} outage", "{sys} outage review ({id})")).format(**v)
    opener = rng.choice((
        "On {date}, the {sys} stopped responding for customers served from the {site} data centre.",
        "The {sys} went down on {date} at our {site} site.",
    ))  # fmt: skip
    body = [
        rng.choice(("{det} noticed the alerts first and paged the on-call engineer.",
                    "The first alert was picked up by {det}.")),
        rng.choice(("The investigation traced the failure to {cause}.", "Root cause: {cause}.")),
        rng.choice(("{res} led the recovery and had the service back after {min} minutes.",
                    "Service came back after {min} minutes, once {res} rolled out a fix.")),
        rng.choice(("{own} has taken the action to {fix}.", "To prevent a repeat, {own} will {fix}.")),
    ]  # fmt: skip
    rng.shuffle(body)
    return title, " ".join(s.format(**v) for s in [opener, *body[:2], *fillers, *body[2:]])


def ticket(i: Incident, v: dict[str, str], rng: random.Random, fillers: list[str]) -> tuple[str, str]:
    lines = [
        "Service: {sys}", "Opened: {date}", "Site: {site} data centre", "Reported by: {det}", "Root cause: {cause}",
        "Resolved by: {res}", "Time to restore: {min} min", "Follow-up: {fix} (owner: {own})",
    ]  # fmt: skip
    head, rest = lines[:2], lines[2:]
    rng.shuffle(rest)
    notes = ["Notes: " + " ".join(fillers)] if fillers else []
    return v["id"], "\n".join([f"Ticket {v['id']}", *(x.format(**v) for x in head + rest), *notes])


def timeline(i: Incident, v: dict[str, str], rng: random.Random, fillers: list[str]) -> tuple[str, str]:
    t0 = i.start
    at = sorted(rng.sample(range(1, i.minutes), 2)) if i.minutes > 3 else [1, 2]
    steps = [
        f"{clock(t0)} Alert fired; {v['det']} acknowledged it.",
        f"{clock(t0 + dt.timedelta(minutes=at[0]))} {v['res']} took over as incident lead.",
        f"{clock(t0 + dt.timedelta(minutes=at[1]))} Cause found: {v['cause']}.",
        f"{clock(t0 + dt.timedelta(minutes=i.minutes))} Service restored, {v['min']} minutes after the alert.",
    ]
    head = f"{v['id']}: {v['sys']}, {v['site']} data centre, {v['date']}."
    tail = [f"Action for {v['own']}: {v['fix']}.", *fillers]
    return f"{v['id']} timeline", "\n".join([head, *steps, *tail])


def minutes(i: Incident, v: dict[str, str], rng: random.Random, fillers: list[str]) -> tuple[str, str]:
    held = fmt_date((i.start + dt.timedelta(days=rng.randint(2, 9))).date(), rng.randrange(3))
    present = [v["res"], *i.attendees]
    rng.shuffle(present)
    item = rng.choice((
        "{id} ({sys}, {date}): the outage at the {site} data centre lasted {min} minutes and was caused by {cause}. "
        "{res} handled the recovery. Agreed: {own} to {fix}.",
        "{id} on the {sys}: {Cause} took it down on {date} in {site}. {res} brought it back after {min} minutes. "
        "Action: {fix}; owner {own}.",
    )).format(**v)  # fmt: skip
    other = rng.choice(OTHER_ITEMS).format(p=i.attendees[0])
    text = f"Minutes of the operations review held on {held}. Present: {', '.join(present)}.\n1. {item}"
    text += "".join(f" {f}" for f in fillers) + f"\n2. {other}"
    return f"Operations review, {held}", text


def email(i: Incident, v: dict[str, str], rng: random.Random, fillers: list[str]) -> tuple[str, str]:
    body = [
        "Hi all, the {sys} is healthy again.",
        rng.choice(("It was down for {min} minutes on {date} at the {site} data centre; the culprit was {cause}.",
                    "On {date} it was out for {min} minutes in {site}, and {cause} was to blame.")),
        "Thanks to {det} for spotting it early.",
        rng.choice(("{own} will {fix} next sprint.", "Next sprint {own} is going to {fix}.")),
    ]  # fmt: skip
    text = "\n".join([f"From: {v['res']}", "To: operations list", f"Subject: {v['id']} resolved", "", ""])
    sign = f"{first(v['res'])} ({v['res']}, who handled the recovery)"
    text += " ".join([*(s.format(**v) for s in body), *fillers])
    return f"Re: {v['id']} resolved", f"{text}\n{sign}"


RENDER = {"postmortem": postmortem, "ticket": ticket, "timeline": timeline, "minutes": minutes, "email": email}
WORD = re.compile(r"[A-Za-z0-9']+")


def word_count(text: str) -> int:
    return len(WORD.findall(text))


def document(i: Incident, style: str, rng: random.Random) -> tuple[str, str]:
    """(title, text) of the incident in `style`, padded with filler sentences to at least MIN_WORDS words."""
    v = fields(i, rng)
    pool = list(FILLERS)
    rng.shuffle(pool)
    n = rng.choice((0, 1, 2))
    while True:
        title, text = RENDER[style](i, v, random.Random(rng.random()), pool[:n])
        if word_count(text) >= MIN_WORDS or n >= len(pool):
            break
        n += 1
    if not MIN_WORDS <= word_count(text) <= MAX_WORDS:
        raise SystemExit(f"error: {style} document for {i.id} has {word_count(text)} words:\n{text}")
    return title, text


def styles_for(rng: random.Random, k: int) -> Sequence[str]:
    return rng.sample(STYLES, k)
