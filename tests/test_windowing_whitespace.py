"""Windowing of huge whitespace runs (issue 26): memory stays bounded however long a run of spaces or
newlines is, and the windows stay those of the same windowing with the whole text in memory."""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hostile_input import PIECES, _blocks, _old_split, _spans_of, quarter, words

import memctl.build.windowing as windowing
from memctl.build.windowing import windows_of

MB = 2**20


class Quarter:
    """`quarter` with the tokenizer offsets' shortcut (`prefix_end`), as TokenCounter has."""

    def __call__(self, text: str) -> int:
        return quarter(text)

    def prefix_end(self, text: str, n: int) -> int | None:
        return 4 * n if len(text) > 4 * n else None


def spacey(text: str) -> int:
    """A counter for which whitespace costs tokens (as in GPT2-style BPE: runs of spaces are tokens)."""
    return len(text.split()) + text.count(" ") // 3 + text.count("\n") // 2


COUNTERS = [words, quarter, Quarter(), spacey]
WS = [" ", "\n", "\t", " \n", "\n ", "  \n\n", "\r\n", "\u00a0", ". \n"]
runs = st.builds(lambda c, n: c * n, st.sampled_from(WS), st.integers(min_value=1, max_value=400))
mixed = st.lists(st.one_of(st.sampled_from(PIECES), runs), max_size=60).map("".join)


def _unbounded(text: str, limit: int, count: Any) -> list[tuple[int, int, str, int]]:
    """The windowing as it was before runs were cut: the whole text at once, every run kept whole."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(windowing, "long_run", lambda limit: 10**8)
        return _spans_of(windows_of("d", [text], limit, count))


@settings(max_examples=300, deadline=None)
@given(
    text=mixed,
    limit=st.sampled_from([1, 2, 5]),
    count=st.sampled_from(COUNTERS),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=40),
)
def test_long_whitespace_runs_give_the_unbounded_windows(text: str, limit: int, count: Any, cuts: list[int]) -> None:
    """With SPAN_CHARS tiny, runs of up to 1,600 characters are 'long' (cut to `long_run`): streamed in
    any blocking, the windows (text, offsets, counts) are those of the windowing that keeps them whole."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(windowing, "SPAN_CHARS", 4)
        want = _unbounded(text, limit, count)
        assert _spans_of(windows_of("d", [text], limit, count)) == want
        assert _spans_of(windows_of("d", _blocks(text, cuts), limit, count)) == want
    for s, e, piece, _ in want:
        assert text[s:e] == piece


@settings(max_examples=150, deadline=None)
@given(
    text=mixed,
    limit=st.sampled_from([1, 2, 3, 8]),
    count=st.sampled_from([words, quarter]),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=20),
)
def test_moderate_whitespace_runs_give_the_windows_as_before(
    text: str, limit: int, count: Any, cuts: list[int]
) -> None:
    """Runs far below `long_span`: streamed, the windows of the windowing before issue 26."""
    assert _spans_of(windows_of("d", _blocks(text, cuts), limit, count)) == _old_split(text, limit, count)


def _chunks(head: str, run: str, n_bytes: int, tail: str, chunk: int = MB) -> Iterator[str]:
    """`head`, then `run` repeated to `n_bytes` characters, then `tail`: in blocks of `chunk`, never whole."""
    yield head
    block = run * (chunk // len(run))
    for _ in range(n_bytes // len(block)):
        yield block
    yield tail


SHAPES = {
    "spaces only": ("", " ", ""),
    "newlines only": ("", "\n", ""),
    "mixed whitespace only": ("", " \t\r\n\u00a0", ""),
    "text, spaces, text": ("Alpha beta gamma.", " ", "Delta epsilon."),
    "text, newlines, text": ("Alpha beta gamma", "\n", "Delta epsilon."),
    "text, spaces then a paragraph break, text": ("Alpha beta.", " " * 1000 + "\n\n", "  Delta epsilon."),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_huge_whitespace_run_keeps_the_buffer_bounded(shape: str) -> None:
    """50 MB of whitespace (fed in 1 MB blocks): the buffer never holds more than a few `long_span`
    characters past one block (it held the whole run: `_advance` leaves a trailing run undecided)."""
    head, run, tail = SHAPES[shape]
    limit, n_bytes = 64, 50 * MB
    w = windowing._Windower("d", limit, quarter)
    bound = 4 * windowing.long_span(limit) + 64
    wins, size = [], 0
    for block in _chunks(head, run, n_bytes, tail):
        wins += w.feed(block)
        size += len(block)
        assert len(w.buf) <= bound, (shape, size, len(w.buf))
    wins += w.feed("", final=True)
    got = [(x.char_start, x.char_end, x.text) for x in wins]
    want = [(0, len(head), head)] if head else []
    want += [(size - len(tail.lstrip()), size, tail.lstrip())] if tail else []
    assert got == want
    assert [x.idx for x in wins] == list(range(len(wins)))


@pytest.mark.parametrize("count", [quarter, Quarter(), spacey], ids=["quarter", "offsets", "spacey"])
def test_huge_runs_stream_in_flat_memory(count: Callable[[str], int]) -> None:
    """Through `windows_of`, text between runs of 16 MB of spaces and of newlines: the traced peak stays
    a few blocks (it was the runs' size), and the windows and their offsets are the text's own."""
    words_ = "The quick brown fox jumps over the lazy dog. " * 30

    def doc() -> Iterator[str]:
        for run in (" ", "\n", " \n"):
            yield from _chunks(words_, run, 16 * MB, "")
        yield words_

    tracemalloc.start()
    try:
        wins = list(windows_of("d", doc(), 64, count))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * MB, peak
    starts, pos = [], 0
    for _ in range(4):
        starts.append(pos)
        pos += len(words_) + 16 * MB
    assert {x.char_start for x in wins} >= set(starts)
    assert all(x.char_end - x.char_start == len(x.text) and x.n_tokens <= 64 for x in wins)
    assert "".join(x.text for x in wins).replace(" ", "") == (words_ * 4).replace(" ", "")


def test_collapse_keeps_what_decides_a_window() -> None:
    k = 3
    assert windowing._collapse("     ", k) == "   "
    assert windowing._collapse("  ", k) == "  "
    assert windowing._collapse("     \n     ", k) == "   \n   "
    assert windowing._collapse("     \n \t \n\n\n  \n     ", k) == "   \n \t \n   "
    assert windowing._collapse("\n" * 9, k) == "\n" * 5
    for run in ["     \n \t \n\n\n  \n     ", "\n" * 20, " \n" * 9, "\t" * 7 + "\n"]:
        once = windowing._collapse(run, k)
        assert windowing._collapse(once, k) == once
        for cut in range(len(run)):  # a run arriving in two blocks: collapsing again keeps the same
            assert windowing._collapse(windowing._collapse(run[:cut], k) + run[cut:], k) == once


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.tuples(st.sampled_from(["x", " ", "\n", "\t "]), st.integers(min_value=1, max_value=120)), max_size=30
    ),
    limit=st.sampled_from([1, 2]),
)
def test_long_runs_are_all_found(parts: list[tuple[str, int]], limit: int) -> None:
    """The sampled search finds exactly the runs a full scan finds (runs of 30 to 40 characters are
    the edge with SPAN_CHARS tiny: `long_run` is 33 at limit 1, 65 at limit 2)."""
    text = "".join(c * n for c, n in parts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(windowing, "SPAN_CHARS", 4)
        w = windowing._Windower("d", limit, words)
    want = [m.span() for m in re.finditer(r"\s+", text) if m.end() - m.start() > w.run]
    assert list(w._long_runs(text, 0)) == want
