"""Reading inputs and cutting windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memctl.build.corpus import Document, read_documents, split_windows
from memctl.core.errors import InputError


def words(text: str) -> int:
    return len(text.split())


def test_windows_respect_limit_offsets_and_boundaries() -> None:
    paras = [" ".join(f"w{p}_{i}." if i % 7 == 6 else f"w{p}_{i}" for i in range(30)) for p in range(5)]
    doc = Document("d", "\n\n".join(paras), "src", "t")
    wins = split_windows(doc, 40, words)
    assert len(wins) >= 4
    for w in wins:
        assert w.n_tokens <= 40
        assert doc.text[w.char_start : w.char_end] == w.text
        assert w.text == w.text.strip()
    # every word is in exactly one window, in order
    assert " ".join(w.text for w in wins).split() == doc.text.split()
    # a paragraph that fits is never cut
    small = split_windows(Document("e", "a b c\n\nd e f", "s", "t"), 4, words)
    assert [w.text for w in small] == ["a b c", "d e f"]


def test_word_runs_without_boundaries_are_hard_split() -> None:
    doc = Document("d", " ".join(f"x{i}" for i in range(100)), "s", "t")
    wins = split_windows(doc, 16, words)
    assert all(w.n_tokens <= 16 for w in wins)
    assert " ".join(w.text for w in wins).split() == doc.text.split()


def test_reads_dirs_and_tables(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.md").write_text("# Title one\n\nBody.")
    (tmp_path / "a" / "skip.bin").write_bytes(b"\x00\x01")
    rows = [{"key": "r1", "body": "first row"}, {"key": "r2", "body": "second row"}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "t.csv").write_text("key,body\nc1,csv row\n")
    docs = read_documents([tmp_path / "a", tmp_path / "t.jsonl"], text_field="body", id_field="key")
    assert [(d.id, d.title) for d in docs] == [("one.md", "Title one"), ("r1", "first row"), ("r2", "second row")]
    assert read_documents([tmp_path / "t.csv"], text_field="body")[0].id == "t:0"


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("empty.txt", b"", "is empty"),
        ("bin.txt", b"abc\x00\x01\x02", "binary"),
        ("latin.txt", "caf\xe9".encode("latin-1"), "not UTF-8"),
        ("bad.jsonl", b'{"text": "ok"}\n{not json\n', "cannot read"),
        ("nofield.jsonl", b'{"body": "x"}\n', "no column 'text'"),
        ("x.pdf", b"%PDF", "unsupported"),
    ],
)
def test_bad_inputs_raise_clear_errors(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(InputError, match=message):
        read_documents([f])


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_documents([tmp_path / "nope"])
