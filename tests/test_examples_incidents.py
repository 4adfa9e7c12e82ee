"""examples/incidents/build.py: a deterministic corpus of invented outages, whose subjects are events,
with probes that name the system and the month in wording no document uses."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
from corpus_files import check_deterministic, load, ngrams, run_build, whole_word

BUILD = Path(__file__).resolve().parents[1] / "examples" / "incidents" / "build.py"
FILES = ("incidents.jsonl", "probes.jsonl", "probes-questions.jsonl")
KINDS = {"cause", "duration", "site", "resolver", "owner"}


def run(out: Path, *args: str) -> str:
    return run_build(BUILD, out, *args)


def style_of(text: str) -> str:
    first = text.split("\n", 1)[0]
    if first.startswith("Ticket INC-"):
        return "ticket"
    if first.startswith("From: "):
        return "email"
    if first.startswith("Minutes of "):
        return "minutes"
    if "\n" in text and re.match(r"INC-\d+: ", first):
        return "timeline"
    return "postmortem"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("incidents")
    return out, run(out)


@pytest.fixture()
def module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """build.py imported, so a test can change its templates."""
    spec = importlib.util.spec_from_file_location("incidents_build", BUILD)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "path", list(sys.path))  # build.py puts its folders first; undone after the test
    spec.loader.exec_module(mod)
    return mod


def test_deterministic(built: tuple[Path, str], tmp_path: Path) -> None:
    check_deterministic(BUILD, *built, tmp_path, FILES, "--incidents", "20")


def test_documents(built: tuple[Path, str]) -> None:
    out, stdout = built
    docs = load(out / "incidents.jsonl")
    assert all(set(d) == {"id", "title", "text"} for d in docs)
    ids = [d["id"] for d in docs]
    assert len(set(ids)) == len(ids)
    assert "incidents: 200" in stdout
    firsts = [i for i in ids if not i.endswith("-2")]
    assert len(firsts) == 200 and 0 < len(ids) - len(firsts) < 100
    assert all(i.removesuffix("-2") in firsts for i in ids)
    assert Counter(style_of(d["text"]) for d in docs).keys() == {"ticket", "email", "minutes", "timeline", "postmortem"}
    # a review meeting's minutes are titled by its date: the title names neither the incident nor its system
    minutes = [d for d in docs if style_of(d["text"]) == "minutes"]
    assert minutes and all(d["title"].startswith("Operations review, ") for d in minutes)
    words = [len(re.findall(r"[A-Za-z0-9']+", d["text"])) for d in docs]
    assert 45 <= min(words) and max(words) <= 150


def test_probes(built: tuple[Path, str]) -> None:
    out, _ = built
    docs = load(out / "incidents.jsonl")
    texts = {d["id"]: d["text"] for d in docs}
    doc_grams = set().union(*(ngrams(t) for t in texts.values()))
    statements, questions = load(out / "probes.jsonl"), load(out / "probes-questions.jsonl")
    assert len(statements) == len(questions) == 1000
    assert Counter(p["kind"] for p in statements) == dict.fromkeys(KINDS, 200)
    for s, q in zip(statements, questions, strict=True):
        assert (s["doc"], s["kind"], s["answers"], s["subject"]) == (q["doc"], q["kind"], q["answers"], q["subject"])
        assert q["prompt"].startswith("Question: ") and q["prompt"].endswith("?\nAnswer:")
    for p in statements + questions:
        renderings = [t for i, t in texts.items() if i.removesuffix("-2") == p["doc"]]
        assert 1 <= len(renderings) <= 2
        for text in renderings:  # every document of the incident states the fact
            assert all(whole_word(a, text) for a in p["answers"]), (p, text)
            assert p["subject"] in text
        assert p["subject"] in p["prompt"] and re.search(r" (19|20)\d\d\b", p["prompt"]), p["prompt"]
        prompt_grams = set().union(*(ngrams(part) for part in p["prompt"].split(p["subject"])))
        assert not prompt_grams & doc_grams, (p["prompt"], prompt_grams & doc_grams)
    # a probe names its incident by system and month: no two incidents share both
    causes = [q for q in questions if q["kind"] == "cause"]
    named = {(q["subject"], re.search(r" outage in (\w+ \d{4})\?", q["prompt"]).group(1)) for q in causes}
    assert len(named) == len(causes) == 200


def test_a_probe_in_document_wording_is_refused(module: ModuleType, tmp_path: Path) -> None:
    module.STATEMENTS["cause"] = "The investigation traced the failure of the {sys} in {when} to"
    with pytest.raises(SystemExit, match="shares 'investigation traced the failure' with a document"):
        module.build(tmp_path / "out", 0, 40)
    assert not (tmp_path / "out").exists()


def test_an_answer_missing_from_a_document_is_refused(module: ModuleType, tmp_path: Path) -> None:
    module.facts = lambda i: [("site", ["Atlantis"])]
    with pytest.raises(SystemExit, match="site answer 'Atlantis' not in the text"):
        module.build(tmp_path / "out", 0, 5)
    assert not (tmp_path / "out").exists()
