"""examples/foldoc/build.py: the FOLDOC corpus and its hand-written probes.

The markup cleaning and the probe checks run everywhere; the tests that build the corpus need Debian's
dict-foldoc package (apt-get install dict-foldoc) and are skipped without it."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "foldoc" / "build.py"
INDEX = Path("/usr/share/dictd/foldoc.index")


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("foldoc_build", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = load_build()

RAW = """Widget Language
WL

   <language, history> /wij'it/ (WL) A {programming language}
   designed by Ada Example at {Acme Labs} in 1984 for {widgets}.
   It has    {first-class
   functions}.

   It was {standardised} in 1990.

   See also {gadget}.

   {Home page (http://example.org/wl/)}.

   E-mail: <wl@example.org>.

   ["The Widget Report", A. Example, 1985].

   (1999-01-01)

"""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_clean_drops_dictd_markup() -> None:
    text, tags, prose = build.clean(RAW)
    assert text == (
        "(WL) A programming language designed by Ada Example at Acme Labs in 1984 for widgets. "
        "It has first-class functions.\n\nIt was standardised in 1990."
    )
    assert tags == {"language", "history"}
    assert prose


def test_clean_marks_code_and_several_senses_as_not_prose() -> None:
    code = "X\n\n   <language> A language from 1990.\n\n    print 1\n\n   (2000-01-01)\n"
    senses = "Y\n\n   1. <language> A language from 1990.\n\n   2. <unit> A unit.\n"
    assert not build.clean(code)[2]
    assert not build.clean(senses)[2]


def test_decode_reads_dictd_base64() -> None:
    assert build.decode("A") == 0
    assert build.decode("BA") == 64
    assert build.decode("/") == 63


def test_probe_checks() -> None:
    doc = {"id": "widget-language", "title": "Widget Language", "text": build.clean(RAW)[0]}
    good = {"entry": "Widget Language", "kind": "place", "prompt": "The lab behind WL was", "answers": ["Acme"]}
    good["question"] = "Which lab made WL?"
    statements, questions, dropped, problems = build.make_probes([doc], [good])
    assert statements == [
        {"doc": "widget-language", "kind": "place", "prompt": "The lab behind WL was", "answers": ["Acme"]}
    ]
    assert questions[0]["prompt"] == "Question: Which lab made WL?\nAnswer:"
    assert not dropped and not problems

    absent = {**good, "answers": ["Acme", "Initech"]}
    assert build.make_probes([doc], [absent])[2] == ["Widget Language: 'Initech' not a whole word of the document"]
    copied = {**good, "prompt": "It was designed by Ada Example at"}
    assert "copies" in build.make_probes([doc], [copied])[3][0]
    giveaway = {**good, "question": "Was WL made at Acme Labs?"}
    assert "gives away" in build.make_probes([doc], [giveaway])[3][0]


def test_missing_dictionary_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    argv = ["build.py", "--out", str(tmp_path / "out"), "--dict-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    assert build.main() == 2
    assert "apt-get install dict-foldoc" in capsys.readouterr().err


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not INDEX.is_file():
        pytest.skip("dict-foldoc is not installed")
    out = tmp_path_factory.mktemp("foldoc")
    assert build.build(build.DICT_DIR, out, 150) == 0
    return out


def test_build_is_deterministic(built: Path, tmp_path: Path) -> None:
    assert build.build(build.DICT_DIR, tmp_path, 150) == 0
    for name in ("foldoc.jsonl", "probes.jsonl", "probes-questions.jsonl"):
        assert (tmp_path / name).read_bytes() == (built / name).read_bytes(), name


def test_documents_are_clean_prose(built: Path) -> None:
    docs = read_jsonl(built / "foldoc.jsonl")
    assert len(docs) == 150
    assert len({d["id"] for d in docs}) == len(docs)
    for doc in docs:
        text = str(doc["text"])
        assert build.MIN_WORDS <= len(text.split()) <= build.MAX_WORDS, doc["id"]
        assert not re.search(r"[{}]|https?:|\(\d{4}-\d\d-\d\d\)$", text), doc["id"]


def test_probes_match_their_documents(built: Path) -> None:
    texts = {str(d["id"]): str(d["text"]) for d in read_jsonl(built / "foldoc.jsonl")}
    statements = read_jsonl(built / "probes.jsonl")
    questions = read_jsonl(built / "probes-questions.jsonl")
    assert len(statements) == len(questions) >= 150
    assert len({p["doc"] for p in statements}) >= 100
    for statement, question in zip(statements, questions, strict=True):
        assert statement["doc"] == question["doc"] and statement["answers"] == question["answers"]
        assert str(question["prompt"]).startswith("Question: ") and str(question["prompt"]).endswith("\nAnswer:")
        text = texts[str(statement["doc"])]
        for answer in statement["answers"]:
            assert build.has_word(text, answer), (statement["doc"], answer)
        for probe in (statement, question):
            assert build.shared_run(str(probe["prompt"]), text) is None, probe["prompt"]


def test_probe_source_is_well_formed() -> None:
    records = build.load_source(build.SOURCE)
    assert len(records) >= 150
    for record in records:
        assert set(record) == {"entry", "kind", "prompt", "question", "answers"}, record
        assert record["answers"] and all(isinstance(a, str) and 0 < len(a.split()) <= 3 for a in record["answers"])
        assert not str(record["question"]).startswith("Question:")
