"""Build an incidents corpus: a made-up company's outage reports, with fact probes the anchor cannot know.

Usage: python examples/incidents/build.py --out DIR [--seed 0] [--incidents 200]

Writes DIR/incidents.jsonl (one document per incident, in one of five styles an operations team writes:
postmortem, ticket, timeline, review meeting minutes, e-mail; a second one in another style for about a
fifth of them), DIR/probes.jsonl (statement completions: "When the Quorvane ledger failed in May 2023,
the thing to blame turned out to be" -> ["certificate"]) and DIR/probes-questions.jsonl (the same facts
asked as questions). Unlike the fictional corpus's people and firms, a document's subject is an event:
the probes name the system and the month ("the Quorvane ledger outage in May 2023"), which the documents
give as an id and a date in one of three forms; a review meeting's minutes are titled by the meeting's
date, and mention other people. No probe wording occurs in any document: the build fails if a probe,
its system's name taken out, shares a 4-word sequence with a text, or if an answer is missing from
any document of its incident. Only the standard library is used; output is a function of --seed and
--incidents alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
FICTIONAL = HERE.parent / "fictional"  # its name pools and probe checks
sys.path[:0] = [str(HERE), str(FICTIONAL)]
from entities import make_pools  # noqa: E402
from events import CAUSES, STYLES, Incident, document, make_incidents, word_count  # noqa: E402

_spec = importlib.util.spec_from_file_location("fictional_build", FICTIONAL / "build.py")
assert _spec and _spec.loader
fictional = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fictional)
ngrams, prompt_ngrams, whole_word = fictional.ngrams, fictional.prompt_ngrams, fictional.whole_word

STATEMENTS = {
    "cause": "When the {sys} failed in {when}, the thing to blame turned out to be",
    "duration": "Counted in minutes, the {when} interruption of the {sys} went on for",
    "site": "The {when} trouble with the {sys} happened at the servers housed in the city of",
    "resolver": "The {when} problem on the {sys} was fixed by an engineer named",
    "owner": "The remaining work after the {sys} failure of {when} was handed to",
}
QUESTIONS = {
    "cause": "Question: What caused the {sys} outage in {when}?\nAnswer:",
    "duration": "Question: How many minutes was the {sys} down in {when}?\nAnswer:",
    "site": "Question: Which data centre did the {sys} incident of {when} hit?\nAnswer:",
    "resolver": "Question: Who fixed the {sys} outage in {when}?\nAnswer:",
    "owner": "Question: Who was given the follow-up work after the {sys} incident in {when}?\nAnswer:",
}
KINDS = tuple(STATEMENTS)


def facts(i: Incident) -> list[tuple[str, list[str]]]:
    """(kind, answers) for each probed fact of `i`: the exact strings the documents use."""
    return [
        ("cause", [CAUSES[i.cause][1]]),
        ("duration", [str(i.minutes)]),
        ("site", [i.site]),
        ("resolver", [i.resolver]),
        ("owner", [i.owner]),
    ]


def build(out: Path, seed: int = 0, count: int = 200) -> dict[str, Counter[str]]:
    rng = random.Random(seed)
    incidents = make_incidents(rng, make_pools(rng), count)
    docs: list[dict[str, str]] = []
    statements: list[dict[str, object]] = []
    questions: list[dict[str, object]] = []
    counts: dict[str, Counter[str]] = {"styles": Counter(), "statements": Counter(), "questions": Counter()}
    problems: list[str] = []
    for inc in incidents:
        styles = rng.sample(STYLES, 2)[: 2 if rng.random() < 0.2 else 1]
        slug = inc.id.lower()
        texts = []
        for n, style in enumerate(styles):
            title, text = document(inc, style, rng)
            doc_id = slug if n == 0 else f"{slug}-2"
            docs.append({"id": doc_id, "title": title, "text": text})
            texts.append((doc_id, text))
            counts["styles"][style] += 1
        for kind, answers in facts(inc):
            for doc_id, text in texts:
                missing = [a for a in answers if not whole_word(a, text)]
                problems += [f"{doc_id}: {kind} answer {a!r} not in the text" for a in missing]
            for file, templates in (("statements", STATEMENTS), ("questions", QUESTIONS)):
                prompt = templates[kind].format(sys=inc.system, when=inc.month_year)
                probe = {"doc": slug, "kind": kind, "prompt": prompt, "answers": answers, "subject": inc.system}
                (statements if file == "statements" else questions).append(probe)
                counts[file][kind] += 1
    doc_grams: set[tuple[str, ...]] = set().union(*(ngrams(d["text"]) for d in docs))
    for p in statements + questions:
        shared = sorted(prompt_ngrams(str(p["prompt"]), str(p["subject"])) & doc_grams)
        if shared:
            problems.append(f"probe {p['prompt']!r} shares {' '.join(shared[0])!r} with a document")
    if problems:
        raise SystemExit("error: bad corpus\n  " + "\n  ".join(sorted(set(problems))[:50]))

    out.mkdir(parents=True, exist_ok=True)
    files = (("incidents.jsonl", docs), ("probes.jsonl", statements), ("probes-questions.jsonl", questions))
    for filename, records in files:
        lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        (out / filename).write_text("".join(lines), encoding="utf-8")

    words = [word_count(d["text"]) for d in docs]
    systems = len({i.system for i in incidents})
    print(f"incidents: {len(incidents)} on {systems} systems")
    print(f"documents: {len(docs)} ({len(docs) - len(incidents)} second renderings) -> {out / 'incidents.jsonl'}")
    print(f"words: {sum(words)} (per document {min(words)}-{max(words)}, mean {sum(words) / len(words):.0f})")
    print("styles: " + ", ".join(f"{s} {counts['styles'][s]}" for s in STYLES))
    for file, filename in (("statements", "probes.jsonl"), ("questions", "probes-questions.jsonl")):
        print(f"probes: {sum(counts[file].values())} -> {out / filename}")
        for kind in KINDS:
            print(f"  {kind}: {counts[file][kind]}")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--incidents", type=int, default=200, help="incidents (default 200)")
    args = parser.parse_args(argv)
    if not 1 <= args.incidents <= 2000:
        parser.error("--incidents must be between 1 and 2000")
    build(args.out, args.seed, args.incidents)
    return 0


if __name__ == "__main__":
    sys.exit(main())
