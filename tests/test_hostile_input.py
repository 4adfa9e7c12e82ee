"""Hostile input (issue 26), the corpus readers and windowing: random and malformed files give documents or
one error naming the file, and huge lines are windowed in linear work, streamed, into the same windows as
before for normal text. The command line, --json, archives and the network: test_hostile.py."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memctl.build.corpus as corpus
import memctl.build.windowing as windowing
from memctl.build.corpus import Document, iter_documents, read_documents, split_windows
from memctl.build.ingest import ingest
from memctl.build.windowing import windows_of
from memctl.core.errors import InputError
from memctl.registry import Registry

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def words(text: str) -> int:
    return len(text.split())


def quarter(text: str) -> int:  # about a real tokenizer's 4 characters per token
    return (len(text) + 3) // 4


# ---- readers: every input is documents or one InputError naming the file ---------------------------
def _read_or_error(path: Path, stream: int | None) -> tuple[str, list[str]]:
    try:
        return "ok", [d.sha256 for d in iter_documents([path], stream_bytes=stream)]
    except InputError as e:
        msg = str(e)
        assert "\n" not in msg and str(path) in msg, msg
        return "error", []


@FAST
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".txt", ".md", ".jsonl"]))
def test_random_bytes_give_documents_or_one_line_naming_the_file(tmp_path: Path, data: bytes, suffix: str) -> None:
    path = tmp_path / f"f{suffix}"
    path.write_bytes(data)
    whole = _read_or_error(path, None)
    assert _read_or_error(path, 0) == whole  # the streamed reader agrees with the whole one


@pytest.mark.parametrize("data", [b"\x1c", b"\x1c\x1d\n\x1f", "\u00a0\u2003\n".encode()])
def test_unicode_whitespace_alone_is_an_empty_file_for_both_readers(tmp_path: Path, data: bytes) -> None:
    """str.strip() knows more whitespace than bytes.strip(): the whole-file reader once took b'\\x1c'
    for text while the streamed one called it empty (found by the test above)."""
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    assert _read_or_error(path, None) == _read_or_error(path, 0) == ("error", [])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".csv", ".json", ".parquet"]))
def test_random_bytes_in_tables(tmp_path: Path, data: bytes, suffix: str) -> None:
    path = tmp_path / f"f{suffix}"
    path.write_bytes(data)
    _read_or_error(path, None)


@FAST
@given(
    lines=st.lists(st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=30), min_size=1),
    at=st.integers(min_value=0),
    bad=st.sampled_from([b"\xff", b"\xc3", b"\xe9", b"\xed\xa0\x80"]),
    block=st.integers(min_value=1, max_value=9),
)
def test_invalid_utf8_names_its_line(tmp_path: Path, lines: list[str], at: int, bad: bytes, block: int) -> None:
    at %= len(lines)
    data = b"\n".join(ln.replace("\n", " ").replace("\r", " ").encode() for ln in lines)
    head = b"\n".join(ln.replace("\n", " ").replace("\r", " ").encode() for ln in lines[:at])
    data = head + (b"\n" if at else b"") + b"word " + bad + data[len(head) + (1 if at else 0) :]
    path = tmp_path / "doc.txt"
    path.write_bytes(data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(corpus, "BLOCK_BYTES", block)  # the bad byte also falls across read blocks
        for stream in (None, 0):
            with pytest.raises(InputError, match=rf"doc\.txt line {at + 1}: not UTF-8") as e:
                list(iter_documents([path], stream_bytes=stream))
            assert "\n" not in str(e.value)


def test_latin1_and_nul_bytes(tmp_path: Path) -> None:
    (tmp_path / "l.txt").write_bytes("one\ntwo caf\xe9\n".encode("latin-1"))
    (tmp_path / "b.md").write_bytes(b"text\n\nmore\x00\x01")
    with pytest.raises(InputError, match=r"l\.txt line 2: not UTF-8 text \(bad byte at offset 11\)"):
        read_documents([tmp_path / "l.txt"])
    with pytest.raises(InputError, match=r"b\.md line 3: looks binary"):
        read_documents([tmp_path / "b.md"])


@FAST
@given(
    rows=st.lists(st.text(min_size=1, max_size=20).filter(str.strip), min_size=1, max_size=8),
    at=st.integers(min_value=0),
    broken=st.sampled_from(['{"text": "x"', "{not json", "[1, 2", '"text"', "nul\x00l", "[" * 5000]),
    blank=st.booleans(),
)
def test_a_broken_jsonl_line_is_named(tmp_path: Path, rows: list[str], at: int, broken: str, blank: bool) -> None:
    at %= len(rows) + 1
    lines = [json.dumps({"text": r}) for r in rows]
    lines.insert(at, broken)
    if blank:
        lines.insert(0, "")  # blank lines count as lines
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=rf"t\.jsonl line {at + 1 + blank}: ") as e:
        read_documents([path])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("nofield.jsonl", '{"body": "x"}\n', r"nofield\.jsonl line 1 has no column 'text'"),
        ("late.jsonl", '{"text": "a"}\n{"body": "x"}\n', r"late\.jsonl line 2 has no column 'text'"),
        ("num.jsonl", '{"text": "a"}\n{"text": 5}\n', r"num\.jsonl line 2: 'text' is empty or not text"),
        ("null.jsonl", '{"text": null}\n', r"null\.jsonl line 1: 'text' is empty or not text"),
        ("list.jsonl", '{"text": ["a"]}\n', r"list\.jsonl line 1: 'text' is empty or not text"),
        ("blank.jsonl", '{"text": "a"}\n\n{"text": "  \\n "}\n', r"blank\.jsonl line 3: 'text' is empty"),
        ("array.jsonl", "[1, 2]\n", r"array\.jsonl line 1: not a JSON object"),
        ("nocol.csv", "body,key\nx,1\n", r"nocol\.csv has no column 'text'"),
        ("emptycell.csv", 'text\n"a"\n""\n', r"emptycell\.csv line 3: 'text' is empty"),
        ("numeric.csv", "text\n1\n2\n", r"numeric\.csv line 2: 'text' is empty or not text"),
        ("bad.json", '[{"text": "a"},\n {"text": }]', r"bad\.json line 2: not valid JSON"),
        ("space.txt", " \n\t\n  ", r"space\.txt is empty"),
        ("empty.md", "", r"empty\.md is empty"),
        ("UPPER.JSONL", '{"text": "fine"}\n', None),
        # JSON's escapes can spell a lone surrogate, which no tokenizer or SQLite column takes
        ("esc.jsonl", '{"text": "caf\\udce9 au lait"}\n', r"esc\.jsonl line 1: 'text' is not valid UTF-8"),
    ],
)
def test_bad_rows_are_named(tmp_path: Path, name: str, content: str, message: str | None) -> None:
    path = tmp_path / name
    path.write_text(content)
    if message is None:
        assert [d.text for d in read_documents([path])] == ["fine"]
        return
    with pytest.raises(InputError, match=message):
        read_documents([path])


def test_hidden_entries_of_a_directory_are_left_out(tmp_path: Path) -> None:
    d = tmp_path / "notes"
    (d / ".git").mkdir(parents=True)
    (d / ".git" / "description.txt").write_text("Unnamed repository; edit this file")
    (d / ".obsidian").mkdir()
    (d / ".obsidian" / "app.json").write_text('{"text": "editor settings"}')
    (d / ".draft.md").write_text("an editor's swap copy")
    (d / "sub").mkdir()
    (d / "sub" / "kept.md").write_text("Corvale lies on the Ister.")
    (d / "a.txt").write_text("Mira Tovel founded Corvale.")
    assert [x.id for x in read_documents([d])] == ["a.txt", "sub/kept.md"]
    assert corpus.hidden_below([d]) == 3  # .git and .obsidian once each, not their files; .draft.md
    assert [x.id for x in read_documents([d / ".draft.md"])] == [".draft.md"]  # named: read
    assert corpus.hidden_below([d / ".draft.md", d / "sub"]) == 0
    hidden_root = tmp_path / ".private"
    hidden_root.mkdir()
    (hidden_root / "x.txt").write_text("A root that is itself hidden is read.")
    assert [x.id for x in read_documents([hidden_root])] == ["x.txt"]
    hidden = tmp_path / "only-hidden"
    (hidden / ".cache").mkdir(parents=True)
    (hidden / ".notes.md").write_text("left out")
    with pytest.raises(
        InputError, match=r"no \.txt/.* files in this directory \(2 hidden file\(s\) or folder\(s\) left out\)"
    ):
        read_documents([hidden])


def test_a_file_name_that_is_not_utf8_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    d = tmp_path / "docs"
    d.mkdir()
    (d / "ok.txt").write_text("Mira Tovel founded Corvale.")
    bad = os.fsdecode(bytes(d) + b"/caf\xe9.txt")  # how a latin-1 byte in a name reaches Python
    try:
        with open(os.fsencode(bad), "w") as f:
            f.write("Cafe Lumina opened in 1990.")
    except OSError:  # a file system that takes only UTF-8 names (APFS): nothing to refuse
        pytest.skip("this file system refuses names that are not UTF-8")
    whole = re.escape(f"{d}/caf\\xe9.txt")  # the whole path, the byte shown as \xNN
    with pytest.raises(
        InputError, match=rf"^the file {whole} is not valid UTF-8 \(the bytes shown as \\xNN\); rename it$"
    ):
        read_documents([d])
    with pytest.raises(InputError, match=rf"^the path {whole} is not valid UTF-8"):
        read_documents([bad])
    home = tmp_path / "home"
    with pytest.raises(InputError, match="not valid UTF-8"):
        ingest("b", [d], anchor="unused", embedder="hash", home=home)
    assert not (home / "banks" / "b").exists()
    rows = tmp_path / "rows.jsonl"  # a JSON escape that spells a lone surrogate, in a row after a good one
    rows.write_text('{"text": "Mira Tovel founded Corvale."}\n{"text": "caf\\udce9 au lait"}\n')
    with pytest.raises(InputError, match=r"rows\.jsonl line 2: 'text' is not valid UTF-8"):
        ingest("r", [rows], anchor="unused", embedder="hash", home=home)
    assert not (home / "banks" / "r").exists()


def test_links_missing_and_unreadable_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = tmp_path / "loop.txt"
    loop.symlink_to(loop)
    with pytest.raises(InputError, match="link loop"):
        read_documents([loop])
    d = tmp_path / "d"
    d.mkdir()
    (d / "ok.txt").write_text("fine")
    (d / "a.txt").symlink_to(d / "b.txt")
    (d / "b.txt").symlink_to(d / "a.txt")
    with pytest.raises(InputError, match=r"a\.txt: a broken symbolic link or a link loop"):
        read_documents([d])
    (d / "a.txt").unlink()
    (d / "b.txt").unlink()
    (d / "up").symlink_to(d)  # a directory link is not followed: no endless walk
    assert [x.id for x in read_documents([d])] == ["ok.txt"]
    with pytest.raises(InputError, match="no such file or directory"):
        read_documents([tmp_path / "nope"])
    secret = d / "secret.txt"
    secret.write_text("hidden")
    secret.chmod(0)
    if os.geteuid() == 0:  # root reads it anyway: make the open fail as it would for a user
        real = Path.open

        def deny(self: Path, *a: Any, **k: Any) -> Any:
            if self.name == "secret.txt":
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *a, **k)

        monkeypatch.setattr(Path, "open", deny)
    for stream in (None, 0):
        with pytest.raises(InputError, match=r"secret\.txt: permission denied"):
            list(iter_documents([d], stream_bytes=stream))


# ---- windowing -----------------------------------------------------------------------------------
def _old_split(text: str, limit: int, count: Any) -> list[tuple[int, int, str, int]]:
    """The windowing of memctl before issue 26, verbatim in substance: the reference for normal text."""
    para, sent = re.compile(r"\n\s*\n"), re.compile(r"(?<=[.!?])\s+")

    def spans(pat: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
        out, pos = [], start
        for m in pat.finditer(text, start, end):
            if m.start() > pos:
                out.append((pos, m.start()))
            pos = m.end()
        return out + ([(pos, end)] if pos < end else [])

    def hard(start: int, end: int) -> list[tuple[int, int]]:
        out, pos = [], start
        while pos < end:
            lo, hi = pos + 1, end
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if count(text[pos:mid]) <= limit else (lo, mid - 1)
            cut, gap = lo, text.rfind(" ", pos + 1, lo)
            cut = gap if cut < end and gap > pos else cut
            out.append((pos, cut))
            pos = cut
            while pos < end and text[pos].isspace():
                pos += 1
        return out

    segs: list[tuple[int, int]] = []
    for ps, pe in spans(para, 0, len(text)):
        if count(text[ps:pe]) <= limit:
            segs.append((ps, pe))
            continue
        for ss, se in spans(sent, ps, pe):
            segs += [(ss, se)] if count(text[ss:se]) <= limit else hard(ss, se)
    spans_out: list[tuple[int, int]] = []
    cur: tuple[int, int] | None = None
    for s, e in segs:
        if not text[s:e].strip():
            continue
        if cur is not None and count(text[cur[0] : e]) <= limit:
            cur = (cur[0], e)
            continue
        spans_out += [cur] if cur else []
        cur = (s, e)
    spans_out += [cur] if cur else []
    out = []
    for s, e in spans_out:
        piece = text[s:e]
        s2 = s + len(piece) - len(piece.lstrip())
        e2 = e - (len(piece) - len(piece.rstrip()))
        out.append((s2, e2, text[s2:e2], count(text[s2:e2])))
    return out


PIECES = ["a", "bb", "word", ".", "!", "?", " ", " ", "  ", "\n", "\n\n", " \n \n", "\t", "x" * 40, "é", "\u00a0"]
texts = st.lists(st.sampled_from(PIECES), max_size=200).map("".join)


def _blocks(text: str, cuts: list[int]) -> Iterator[str]:
    pos = 0
    for c in cuts:
        yield text[pos : pos + c]
        pos += c
    yield text[pos:]


def _spans_of(wins: Any) -> list[tuple[int, int, str, int]]:
    return [(w.char_start, w.char_end, w.text, w.n_tokens) for w in wins]


@settings(max_examples=150, deadline=None)
@given(text=texts, limit=st.sampled_from([1, 2, 3, 8]), count=st.sampled_from([words, quarter]))
def test_normal_text_windows_as_before(text: str, limit: int, count: Any) -> None:
    got = split_windows(Document("d", text, "s", "t"), limit, count)
    assert _spans_of(got) == _old_split(text, limit, count)
    assert [w.idx for w in got] == list(range(len(got)))


@settings(max_examples=150, deadline=None)
@given(
    text=texts,
    limit=st.sampled_from([1, 2, 5]),
    count=st.sampled_from([words, quarter]),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=40),
)
def test_any_blocking_gives_the_same_windows(text: str, limit: int, count: Any, cuts: list[int]) -> None:
    """Long spans too: with SPAN_CHARS tiny, every paragraph and sentence here is 'long'."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(windowing, "SPAN_CHARS", 4)
        whole = _spans_of(windows_of("d", [text], limit, count))
        assert _spans_of(windows_of("d", _blocks(text, cuts), limit, count)) == whole
    for s, e, piece, n in whole:
        assert text[s:e] == piece and piece == piece.strip() and piece
        assert n <= limit
    assert [c for _, _, p, _ in whole for c in p if not c.isspace()] == [c for c in text if not c.isspace()]


class Tally:
    """A counter that adds up the characters it is asked to count."""

    def __init__(self) -> None:
        self.chars = 0
        self.longest = 0

    def __call__(self, text: str) -> int:
        self.chars += len(text)
        self.longest = max(self.longest, len(text))
        return quarter(text)


@pytest.mark.parametrize("sentences", [False, True])
def test_a_huge_line_costs_linear_work(sentences: bool) -> None:
    """Counting work per character stays flat as one line grows (it grew with the line: quadratic)."""
    unit = "lorem ipsum dolor sit amet. " if sentences else "lorem ipsum dolor sit amet "
    ratios = []
    for n in (50_000, 400_000):
        text = (unit * (n // len(unit) + 1))[:n]
        tally = Tally()
        wins = split_windows(Document("d", text, "s", "t"), 64, tally)
        assert all(w.n_tokens <= 64 for w in wins)
        assert tally.longest <= windowing.long_span(64)
        ratios.append(tally.chars / n)
    assert ratios[1] < 1.3 * ratios[0] + 1 and ratios[1] < 40, ratios


def test_a_streamed_file_is_read_in_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file above STREAM_BYTES is never held whole: text empty, windows from blocks, the same windows."""
    monkeypatch.setattr(corpus, "BLOCK_BYTES", 4096)
    text = "Fermium is named after Enrico Fermi and it is heavy " * 20_000  # ~1 MB, one line
    path = tmp_path / "one.txt"
    path.write_text(text)
    (doc,) = list(iter_documents([path], stream_bytes=64 * 1024))
    assert doc.text == "" and doc.file == path and doc.n_chars == len(text)
    assert doc.sha256 == Document("x", text, "s", "t").sha256 and doc.title.startswith("Fermium")
    tally = Tally()
    got = _spans_of(split_windows(doc, 64, tally))
    assert tally.longest <= windowing.long_span(64)
    assert got == _spans_of(split_windows(Document("one.txt", text, "s", "t"), 64, quarter))
    path.write_text(text.replace("heavy", "light", 1))  # changed between the passes: refused
    with pytest.raises(InputError, match="changed while it was read"):
        split_windows(doc, 64, quarter)


def test_a_huge_line_streams_through_ingest(tiny_anchor: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "STREAM_BYTES", 32 * 1024)
    monkeypatch.setattr(corpus, "BLOCK_BYTES", 8 * 1024)
    d = tmp_path / "docs"
    d.mkdir()
    (d / "small.txt").write_text("Iron is a metal used in steel.")
    big = "Hydrogen was discovered by Henry Cavendish in 1766 and it is light " * 4000  # 270 KB, one line
    (d / "big.txt").write_text(big)
    t0 = time.perf_counter()
    res = ingest("b", [d], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=tmp_path / "h", chunk=64)
    assert time.perf_counter() - t0 < 60
    reg = Registry.open("b", tmp_path / "h")
    rows = reg.db.execute("select char_start, char_end, text from windows where doc_id = 'big.txt' order by idx")
    rows = list(rows)
    assert res.docs_added == 2 and len(rows) > 64  # more than one chunk of one document
    assert all(big[s:e] == t for s, e, t in rows)
    assert reg.db.execute("select n_chars from documents where id = 'big.txt'").fetchone()[0] == len(big)
