"""Build an element corpus and fact probes from the SQLite DB shipped with `mendeleev`.

Usage: python examples/elements/build.py --out DIR

Writes DIR/elements.jsonl (one document per element), DIR/probes.jsonl, and
DIR/probes-rephrased.jsonl: the same facts asked in other words, to measure how far what the
memories learned carries beyond the wording they were trained on.
Only the standard library is used; mendeleev's ORM is never imported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sqlite3
import sys
from collections import Counter
from pathlib import Path

FIELDS = (
    "atomic_number, name, symbol, description, name_origin, sources, uses, "
    "discoverers, discovery_year, discovery_location"
)
YEAR = re.compile(r"\b(?:1\d|20)\d\d\b")  # plausible years only (not "0.0018")
LABELLED = (("Name origin", "name_origin"), ("Sources", "sources"), ("Uses", "uses"))
DISCOVERY = re.compile(r"discover|identif|isolat|first", re.IGNORECASE)
# Sentence end: ., ! or ? after a lowercase letter, digit or closing mark, so that
# initials such as "Sir H. Davy" or "A.A.Bussy" do not split a sentence.
SENTENCE_END = re.compile(r"(?<=[a-z0-9%)\]\"'][.!?])\s+")


def find_db() -> Path | None:
    spec = importlib.util.find_spec("mendeleev")
    locations = list(spec.submodule_search_locations or []) if spec else []
    db = Path(locations[0]) / "elements.db" if locations else None
    return db if db is not None and db.is_file() else None


def clean(value: object) -> str:
    return re.sub(r"\s+", " ", str(value)).strip() if value is not None else ""


def discovery_sentence(name: str, who: str, year: int | None, where: str) -> str:
    if who.lower().startswith("known to the ancients"):
        return f"{name} has been known since ancient times."
    sentence = f"{name} was discovered"
    if who:
        sentence += f" by {who}"
    if year:
        sentence += f" in {year}"
    if where:
        sentence += f" ({where})"
    return sentence + "." if sentence != f"{name} was discovered" else ""


def compose(row: sqlite3.Row) -> str:
    name = clean(row["name"])
    parts = [
        (f"{name} (symbol {clean(row['symbol'])}) is the chemical element with atomic number {row['atomic_number']}."),
        clean(row["description"]),
    ]
    for label, key in LABELLED:
        if clean(row[key]):
            parts.append(f"{label}: {clean(row[key])}")
    who, where = clean(row["discoverers"]), clean(row["discovery_location"])
    parts.append(discovery_sentence(name, who, row["discovery_year"], where))
    return "\n\n".join(p for p in parts if p)


def contradicting_sentence(text: str, year: str) -> str | None:
    """First sentence that mentions discovery and a 4-digit year other than `year`."""
    for paragraph in text.split("\n\n"):
        for sentence in SENTENCE_END.split(paragraph):
            if DISCOVERY.search(sentence) and set(YEAR.findall(sentence)) - {year}:
                return sentence
    return None


REPHRASED = {
    "atomic_number": "In the periodic table, {name} has the atomic number",
    "discovery_year": "The year in which {name} was first discovered is",
}


def build(db: Path, out: Path) -> None:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    query = f"SELECT {FIELDS} FROM elements ORDER BY atomic_number"
    rows: list[sqlite3.Row] = con.execute(query).fetchall()
    con.close()

    docs: list[dict[str, str]] = []
    probes: list[dict[str, object]] = []
    rephrased: list[dict[str, object]] = []  # the same facts asked in words no prompt rule of memctl writes
    kept: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    contradictions: list[str] = []
    for row in rows:
        name, text = clean(row["name"]), compose(row)
        doc_id = name.lower()
        docs.append({"id": doc_id, "title": name, "text": text})
        number, year = str(row["atomic_number"]), row["discovery_year"]
        candidates = [("atomic_number", f"The atomic number of {name} is", number)]
        if year:
            prompt = f"{name} was discovered in"
            candidates.append(("discovery_year", prompt, str(year)))
        else:
            dropped["discovery_year: no year in the database"] += 1
        for kind, prompt, answer in candidates:
            if not re.search(rf"\b{re.escape(answer)}\b", text):
                dropped[f"{kind}: answer not in text"] += 1
                continue
            bad = kind == "discovery_year" and contradicting_sentence(text, answer)
            if bad:
                dropped[f"{kind}: text gives another year"] += 1
                contradictions.append(f"{name} ({answer}): {bad}")
                continue
            kept[kind] += 1
            probe = {"doc": doc_id, "kind": kind, "prompt": prompt, "answers": [answer]}
            probes.append(probe)
            rephrased.append({**probe, "prompt": REPHRASED[kind].format(name=name)})

    out.mkdir(parents=True, exist_ok=True)
    files = (("elements.jsonl", docs), ("probes.jsonl", probes), ("probes-rephrased.jsonl", rephrased))
    for filename, records in files:
        lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        (out / filename).write_text("".join(lines), encoding="utf-8")

    print(f"documents: {len(docs)} -> {out / 'elements.jsonl'}")
    print(f"probes: {len(probes)} -> {out / 'probes.jsonl'}")
    for kind in ("atomic_number", "discovery_year"):
        print(f"  {kind}: {kept[kind]}")
    print(f"dropped: {sum(dropped.values())}")
    for reason, count in sorted(dropped.items()):
        print(f"  {reason}: {count}")
    for line in contradictions:
        print(f"    {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    args = parser.parse_args()
    db = find_db()
    if db is None:
        print("error: mendeleev's elements.db not found", file=sys.stderr)
        return 2
    build(db, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
