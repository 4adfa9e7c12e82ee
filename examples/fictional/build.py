"""Build a fictional corpus: invented people and organisations, with fact probes the anchor cannot know.

Usage: python examples/fictional/build.py --out DIR [--seed 0] [--entities 300] [--per-document 1]

Writes DIR/fictional.jsonl (one short document per entity, a second one in another style for about
a fifth of them; with --per-document N, long registers of N entities' sections each, several windows
per document), DIR/probes.jsonl (statement completions: "Nesald Thalard came into the world in the
year" -> ["1937"]) and DIR/probes-questions.jsonl (the same facts asked as questions). Every name,
city, organisation and prize is made up from syllable pools, so that a model can only know these
facts from the documents: the stand-in for private data. No probe wording occurs in any document:
the build fails if a probe prompt, its entity's name taken out, shares a 4-word sequence with a text.
Only the standard library is used; output is a function of --seed and --entities alone.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from entities import CITIES, STYLES, Entity, Person, make_orgs, make_people, make_pools
from render import document, pronoun, word_count

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


def registers(sections: list[tuple[str, str]], per_document: int, rng: random.Random) -> list[dict[str, str]]:
    """Long documents: consecutive runs of `per_document` (entity slug, text) sections, one register each,
    titled after a made-up chamber; a section keeps its own style (a table, a memo, Q&A, ...)."""
    docs = []
    for k in range(0, len(sections), per_document):
        part = sections[k : k + per_document]
        n = k // per_document + 1
        title = f"{CITIES[rng.randrange(len(CITIES))]} chamber register, part {n}"
        docs.append({"id": f"register-{n}", "title": title, "text": "\n\n".join(text for _, text in part)})
    return docs


def build(out: Path, seed: int = 0, entities: int = 300, per_document: int = 1) -> dict[str, Counter[str]]:
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
    sections: list[tuple[str, str]] = []  # (doc id, text) in corpus order
    subjects: dict[str, str] = {}  # probe doc -> the entity it asks about
    for e in everyone:
        styles = rng.sample(STYLES, 2)
        texts = [document(e, styles[0], rng)]
        if rng.random() < 0.2:
            texts.append(document(e, styles[1], rng))
        ids = [e.slug, f"{e.slug}-2"][: len(texts)]
        for doc_id, style, text in zip(ids, styles, texts, strict=False):
            docs.append({"id": doc_id, "title": e.name, "text": text})
            sections.append((doc_id, text))
            counts["styles"][style] += 1
        subjects[e.slug] = e.name
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

    if per_document > 1:  # second renderings land in other registers than their first
        order = list(range(len(sections)))
        rng.shuffle(order)
        sections = [sections[i] for i in order]
        where: dict[str, str] = {}  # rendering id -> its register
        docs = registers(sections, per_document, rng)
        for d, k in zip(docs, range(0, len(sections), per_document), strict=True):
            for doc_id, _ in sections[k : k + per_document]:
                where[doc_id] = d["id"]
        for p in statements + questions:
            p["subject"] = subjects[str(p["doc"])]
            p["doc"] = where[str(p["doc"])]
    titles = {d["id"]: d["title"] for d in docs}
    doc_grams: set[tuple[str, ...]] = set().union(*(ngrams(d["text"]) for d in docs))
    for p in statements + questions:
        name = str(p.get("subject", titles[str(p["doc"])]))  # the entity the probe names
        shared = sorted(prompt_ngrams(str(p["prompt"]), name) & doc_grams)
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
    second = sum(doc_id.endswith("-2") for doc_id, _ in sections)
    print(f"entities: {len(everyone)} ({len(people)} people, {len(orgs)} organisations)")
    print(f"documents: {len(docs)} ({len(sections)} renderings, {second} of them second) -> {out / 'fictional.jsonl'}")
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
    parser.add_argument(
        "--per-document", type=int, default=1, help="entities per document: N > 1 writes long registers (default 1)"
    )
    args = parser.parse_args(argv)
    if args.entities < 3:
        parser.error("--entities must be at least 3")
    if args.per_document < 1:
        parser.error("--per-document must be at least 1")
    build(args.out, args.seed, args.entities, args.per_document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
