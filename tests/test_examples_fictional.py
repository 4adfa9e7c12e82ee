"""examples/fictional/build.py: a deterministic corpus of invented facts, with probes worded unlike any document."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from corpus_files import check_deterministic, load, ngrams, run_build, whole_word

BUILD = Path(__file__).resolve().parents[1] / "examples" / "fictional" / "build.py"
FILES = ("fictional.jsonl", "probes.jsonl", "probes-questions.jsonl")


def run(out: Path, *args: str) -> str:
    return run_build(BUILD, out, *args)


def style_of(text: str) -> str:
    if "\nQ: " in text:
        return "qa"
    if text.startswith("MEMO\n"):
        return "memo"
    if " | " in text:
        return "table"
    if "\n- " in text:
        return "bullets"
    if text.startswith("name: "):
        return "record"
    return "narrative"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("fictional")
    return out, run(out)


def test_deterministic(built: tuple[Path, str], tmp_path: Path) -> None:
    check_deterministic(BUILD, *built, tmp_path, FILES, "--entities", "30")


def test_documents(built: tuple[Path, str]) -> None:
    out, stdout = built
    docs = load(out / "fictional.jsonl")
    assert all(set(d) == {"id", "title", "text"} for d in docs)
    ids = [d["id"] for d in docs]
    assert len(set(ids)) == len(ids)
    per_entity = Counter(d["title"] for d in docs)
    assert len(per_entity) >= 300
    assert "entities: 300" in stdout
    twice = sum(n == 2 for n in per_entity.values())
    assert 0 < twice < len(per_entity) and max(per_entity.values()) == 2
    styles = Counter(style_of(d["text"]) for d in docs)
    assert len(styles) >= 4, styles
    words = [len(re.findall(r"\w+(?:[-'’,./]\w+)*", d["text"])) for d in docs]
    assert 40 <= min(words) and max(words) <= 120


def test_probes(built: tuple[Path, str]) -> None:
    out, _ = built
    docs = load(out / "fictional.jsonl")
    by_id = {d["id"]: d for d in docs}
    texts_of: dict[str, list[str]] = {}
    for d in docs:
        texts_of.setdefault(d["title"], []).append(d["text"])
    doc_grams = set().union(*(ngrams(d["text"]) for d in docs))
    statements, questions = load(out / "probes.jsonl"), load(out / "probes-questions.jsonl")
    assert len(statements) == len(questions) > 0
    kinds = Counter(p["kind"] for p in statements)
    people = {"birth_year", "birth_city", "employer", "role"}
    orgs = {"founding_year", "headquarters", "founder"}
    assert set(kinds) == people | orgs
    for s, q in zip(statements, questions, strict=True):
        assert (s["doc"], s["kind"], s["answers"]) == (q["doc"], q["kind"], q["answers"])
        assert q["prompt"].startswith("Question: ") and q["prompt"].endswith("?\nAnswer:")
    for p in statements + questions:
        doc = by_id[p["doc"]]
        answers = p["answers"]
        assert answers and all(1 <= len(a.split()) <= 3 for a in answers)
        for text in texts_of[doc["title"]]:  # every rendering of the entity states the fact the same way
            assert all(whole_word(a, text) for a in answers), (p, text)
        name = doc["title"]
        assert name in p["prompt"]
        prompt_grams = set().union(*(ngrams(part) for part in p["prompt"].split(name)))
        assert not prompt_grams & doc_grams, (p["prompt"], prompt_grams & doc_grams)


def test_registers_gather_sections_into_long_documents(built: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = built
    reg = tmp_path / "registers"
    stdout = run(reg, "--per-document", "12")
    docs, single = load(reg / "fictional.jsonl"), load(out / "fictional.jsonl")
    assert len(docs) == -(-len(single) // 12) and f"documents: {len(docs)}" in stdout
    sections = sorted(s for d in docs for s in d["text"].split("\n\n"))
    assert sections == sorted(s for d in single for s in d["text"].split("\n\n"))  # every rendering, once
    assert all(re.fullmatch(r"\w+ chamber register, part \d+", d["title"]) for d in docs)
    by_id = {d["id"]: d["text"] for d in docs}
    for name in ("probes.jsonl", "probes-questions.jsonl"):
        probes, plain = load(reg / name), load(out / name)
        assert [(p["kind"], p["prompt"], p["answers"]) for p in probes] == [
            (p["kind"], p["prompt"], p["answers"]) for p in plain
        ]  # the same facts, asked the same way
        for p in probes:  # each names its entity, whose section is in the register it points to
            assert p["subject"] in p["prompt"] and p["subject"] in by_id[p["doc"]]
            assert any(whole_word(a, by_id[p["doc"]]) for a in p["answers"])
    bad = subprocess.run([sys.executable, str(BUILD), "--out", str(tmp_path / "x"), "--per-document", "0"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "--per-document must be at least 1" in bad.stderr
