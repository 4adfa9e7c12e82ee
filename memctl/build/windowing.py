"""Cutting a document's text into windows of at most N tokens: greedy packing of paragraphs, then
sentences, then word runs. The text may arrive in blocks (a streamed file); any blocking gives the
windows of the whole text at once, and work and memory stay linear in its length, however long a line.

Whitespace runs: memory stays bounded (about `long_span` characters, times a few, plus one block)
however long a run of whitespace is (500 MB of spaces, of newlines, or a long run and then text).
A whitespace run is never cut into a window, since windows are stripped, and no window is longer
than `long_span(limit)` characters: so a run longer than that is only ever a boundary between
windows; and every string the windowing counts is at most `long_span` characters and starts at a
non-space, right after a paragraph break or at the text's start, so it holds a whole newline-free
part of a run only if that part is short, and otherwise reaches its first `long_span` characters. The
windower therefore keeps of each run only: the first `long_run(limit)` characters before its first
newline, that newline, the first `long_run` characters up to its last newline, that newline, and
the first `long_run` characters after it (see `_collapse`); the rest is dropped as it arrives. This
is exact, not an approximation: the windows (their text, token counts and character offsets, which
still refer to the original text) are those the same windowing gives with the whole run in memory,
for any token counter, since nothing dropped is ever counted or part of a window; and documents are
embedded and trained on their windows' text only, so no text anything learns from changes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    doc_id: str
    idx: int  # position within its document
    char_start: int
    char_end: int
    text: str
    n_tokens: int

    @property
    def sha256(self) -> str:
        return sha256_text(self.text)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


Counter = Callable[[str], int]

_PARA = re.compile(r"\n\s*\n")
_SENT = re.compile(r"(?<=[.!?])\s+")
_WS = re.compile(r"\s*")
_WS3 = re.compile(r"\s{3,}")
SPAN_CHARS = 16384  # a span longer than max(this, 32 * limit) characters is never counted whole


def long_span(limit: int) -> int:
    """Characters beyond which a paragraph or sentence is cut without counting it whole (no real
    tokenizer fits that many characters in `limit` tokens); also the longest window, in characters."""
    return max(SPAN_CHARS, 32 * limit)


def long_run(limit: int) -> int:
    """Characters kept of each newline-free part of a whitespace run (module docstring): one more
    than `long_span`, so a run still reads as longer than any window or counted string."""
    return long_span(limit) + 1


def _collapse(run: str, keep: int) -> str:
    """What the windowing keeps of the whitespace run `run`: its parts before the first newline,
    between the first and last newlines, and after the last, each cut to `keep` characters. The
    newlines that decide a paragraph break (`_PARA` spans the first to the last) stay; so does where
    the run starts, ends and, when it is shorter than `keep`, all of it."""
    f = run.find("\n")
    if f < 0:
        return run[:keep]
    last = run.rfind("\n")
    if last == f:
        return run[:f][:keep] + "\n" + run[f + 1 :][:keep]
    return run[:f][:keep] + "\n" + run[f + 1 : last][:keep] + "\n" + run[last + 1 :][:keep]


def _spans(text: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    out, pos = [], start
    for m in pattern.finditer(text, start, end):
        if m.start() > pos:
            out.append((pos, m.start()))
        pos = m.end()
    if pos < end:
        out.append((pos, end))
    return out


def paragraphs(text: str, limit: int = 0) -> list[str]:
    """The paragraphs `split_windows` counts first, and their stripped forms (a one-paragraph
    document becomes one window whose text is its stripped paragraph): what to count in a batch.
    Paragraphs longer than `long_span(limit)` are left out: they are never counted whole."""
    big = long_span(limit)
    out = [text[s:e] for s, e in _spans(text, _PARA, 0, len(text)) if e - s <= big]
    return out + [t.strip() for t in out]


class _Windower:
    """Greedy packing of paragraphs (then sentences, then word runs) into windows of <= limit tokens,
    over a text that arrives in blocks. Text is cut into segments only where the blocks so far decide
    it (a separator followed by more text), so any blocking gives the windows of the whole text at once.
    Memory: the open window, the unfinished span (at most `long_span` characters), the last whitespace
    run (at most about 3 `long_run` characters kept: `_take`) and one block."""

    def __init__(self, doc_id: str, limit: int, count: Counter) -> None:
        self.doc_id, self.limit, self.count = doc_id, limit, count
        self.big = long_span(limit)
        self.buf, self.base = "", 0  # the text kept, and the offset of buf[0] in the document
        self.a = 0  # (in buf) text before it is cut into segments
        # "para": at a paragraph's start; "sent": at a sentence of a long paragraph; "hard": in a long sentence
        self.mode = "para"
        self.cur: tuple[int, int] | None = None  # (in buf) the window being packed
        self.out: list[Window] = []
        self.idx = 0  # windows emitted so far
        self.look = 8 * limit  # characters tokenized ahead when cutting a long run
        self.prefix_end: Callable[[str, int], int | None] | None = getattr(count, "prefix_end", None)
        self.run = long_run(limit)  # characters kept of each part of a whitespace run
        self.long_ws = re.compile(rf"(?<!\s)\s{{{self.run + 1},}}")  # runs that `_collapse` may cut
        self.drops: list[tuple[int, int]] = []  # (in buf) (start of a cut run, characters dropped from it)

    def feed(self, block: str, final: bool = False) -> list[Window]:
        self._take(block)
        self._advance(final)
        if final and self.cur is not None:
            self._emit(self.cur)
            self.cur = None
        keep = max(0, min(self.a, self.cur[0] if self.cur else self.a) - 1)  # one more: a lookbehind sees it
        if keep:
            self.buf, self.base, self.a = self.buf[keep:], self.base + keep, self.a - keep
            self.cur = (self.cur[0] - keep, self.cur[1] - keep) if self.cur else None
            self.base += sum(d for r, d in self.drops if r < keep)
            self.drops = [(r - keep, d) for r, d in self.drops if r >= keep]
        out, self.out = self.out, []
        return out

    def _take(self, block: str) -> None:
        """Append `block` to the buffer, cutting every whitespace run to what `_collapse` keeps of it:
        the run the buffer ends with (never yet looked at: `_advance` stops before it) goes on in the
        block, so it is cut again as it grows; collapsing twice keeps what collapsing once keeps."""
        buf = self.buf
        start = len(buf.rstrip())  # where the buffer's last whitespace run starts (the buffer keeps it whole)
        buf += block
        parts, pos, gone = [], 0, 0
        for s, e in self._long_runs(buf, start):
            kept = _collapse(buf[s:e], self.run)
            if len(kept) == e - s:
                continue
            parts += [buf[pos:s], kept]
            pos = e
            at, d = s - gone, e - s - len(kept)
            gone += d
            if self.drops and self.drops[-1][0] == at:  # the buffer's last run, cut again as it went on
                d += self.drops.pop()[1]
            self.drops.append((at, d))
        self.buf = "".join([*parts, buf[pos:]]) if parts else buf

    def _long_runs(self, buf: str, start: int) -> Iterator[tuple[int, int]]:
        """The whitespace runs of buf[start:] longer than `self.run` (start: not inside a run). Such a run
        holds three or more of every `step`-th character in a row, all whitespace: only around those the
        regex runs (scanning every character costs more than the rest of the windowing with a fast counter)."""
        step = max(1, (self.run + 1) // 4)
        for m in _WS3.finditer(buf[start::step]):
            lo, hi = start + (m.start() - 1) * step, start + m.end() * step
            for r in self.long_ws.finditer(buf, max(start, lo), min(len(buf), hi)):
                yield r.span()

    def _at(self, i: int) -> int:
        """The offset in the document of buf[i] (i not inside a cut whitespace run)."""
        return self.base + i + sum(d for r, d in self.drops if r < i)

    def _advance(self, final: bool) -> None:
        buf, n = self.buf, len(self.buf)
        lim = n if final else len(buf.rstrip())  # every break before lim is final: more text follows it
        while True:
            a = self.a
            if self.mode == "para":
                end = n if final else max((m.end() for m in _PARA.finditer(buf, a, lim)), default=a)
                for ps, pe in _spans(buf, _PARA, a, end):
                    self._para(ps, pe)
                self.a = a = end
                if final or lim - a <= self.big:
                    return
                self.mode = "sent"  # the open paragraph is longer than `big`: it goes by sentences
                continue
            pm = _PARA.search(buf, a, lim)
            pe, after = (pm.start(), pm.end()) if pm else ((n, n) if final else (-1, -1))
            if self.mode == "sent":
                if pe >= 0:
                    for ss, se in _spans(buf, _SENT, a, pe):
                        self._sentence(ss, se)
                    self.a, self.mode = after, "para"
                    continue
                end = max((m.end() for m in _SENT.finditer(buf, a, lim)), default=a)
                for ss, se in _spans(buf, _SENT, a, end):
                    self._sentence(ss, se)
                self.a = a = end
                if lim - a <= self.big:
                    return
                self.mode = "hard"  # the open sentence is longer than `big`: it is cut in pieces
                continue
            sm = _SENT.search(buf, a, pe if pe >= 0 else lim)
            if sm is not None:
                self._hard(a, sm.start())
                self.a, self.mode = sm.end(), "sent"
            elif pe >= 0:
                self._hard(a, pe)
                self.a, self.mode = after, "para"
            else:
                self.a = self._hard(a, None, lim - self.big)
                return

    def _para(self, ps: int, pe: int) -> None:
        if pe - ps <= self.big and self.count(self.buf[ps:pe]) <= self.limit:
            self._segment(ps, pe)
            return
        for ss, se in _spans(self.buf, _SENT, ps, pe):
            self._sentence(ss, se)

    def _sentence(self, ss: int, se: int) -> None:
        if se - ss <= self.big and self.count(self.buf[ss:se]) <= self.limit:
            self._segment(ss, se)
        else:
            self._hard(ss, se)

    def _hard(self, pos: int, end: int | None, stop: int = 0) -> int:
        """Cut [pos, end) (end None: a run known to go on past `stop + big`) at word gaps (or characters).
        A piece of a run longer than `big` becomes a window of its own, counted once."""
        buf = self.buf
        while pos < end if end is not None else pos < stop:
            if end is None or end - pos > self.big:
                cut = self._far_piece(pos)
            else:
                cut = self._piece(pos, pos + 1, end)
                gap = buf.rfind(" ", pos + 1, cut)
                if cut < end and gap > pos:
                    cut = gap
                self._segment(pos, cut)
            pos = _WS.match(buf, cut, end if end is not None else len(buf)).end()  # type: ignore[union-attr]
        return pos

    def _piece(self, pos: int, lo: int, hi: int) -> int:
        """The largest end in [lo, hi] whose piece from `pos` fits (lo is taken to fit): bisection."""
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.count(self.buf[pos:mid]) <= self.limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _far_piece(self, pos: int) -> int:
        """Emit the next piece of a run longer than `big` (at most `big` characters, cut at a word gap)
        as a window; returns its end. The cut comes from the tokenizer's offsets when the counter has
        them (one pass over a little more than the piece), else from galloping then bisection."""
        hi, buf = pos + self.big, self.buf
        look = min(self.big, max(self.look, 1))
        if self.prefix_end is not None:
            while True:
                c = self.prefix_end(buf[pos : pos + look], self.limit)
                if c is not None or look >= self.big:
                    break
                look = min(self.big, 2 * look)
            cut = min(hi, pos + max(1, c if c is not None else look))
        else:
            lo, probe = pos + 1, min(hi, pos + look)
            while True:
                if self.count(buf[pos:probe]) <= self.limit:
                    lo = probe
                    if probe == hi:
                        break
                    probe = min(hi, pos + 2 * (probe - pos))
                else:
                    hi = probe - 1
                    break
            cut = self._piece(pos, lo, hi)
        for _ in range(2):  # the offsets' cut rarely overshoots once recounted alone: bisect then
            gap = buf.rfind(" ", pos + 1, cut)
            cut = gap if gap > pos else cut
            s, e = self._strip(pos, cut)
            n = self.count(buf[s:e])
            if n <= self.limit or cut <= pos + 1:
                break
            cut = self._piece(pos, pos + 1, cut - 1)
        self.look = max(2 * self.limit, (cut - pos) * 5 // 4)
        if self.cur is not None:
            self._emit(self.cur)
            self.cur = None
        if e > s:
            self._add(s, e, n)
        return cut

    def _segment(self, s: int, e: int) -> None:
        if not self.buf[s:e].strip():
            return
        cur = self.cur
        if cur is not None and e - cur[0] <= self.big and self.count(self.buf[cur[0] : e]) <= self.limit:
            self.cur = (cur[0], e)
            return
        if cur is not None:
            self._emit(cur)
        self.cur = (s, e)

    def _strip(self, s: int, e: int) -> tuple[int, int]:
        buf = self.buf
        while s < e and buf[s].isspace():
            s += 1
        while e > s and buf[e - 1].isspace():
            e -= 1
        return s, e

    def _emit(self, span: tuple[int, int]) -> None:
        s, e = self._strip(*span)
        self._add(s, e, self.count(self.buf[s:e]))

    def _add(self, s: int, e: int, n: int) -> None:
        self.out.append(Window(self.doc_id, self.idx, self._at(s), self._at(e), self.buf[s:e], n))
        self.idx += 1


def windows_of(doc_id: str, blocks: Iterable[str], limit: int, count: Counter) -> Iterator[Window]:
    """The windows of a text given as consecutive blocks, in order, as the blocks arrive."""
    w = _Windower(doc_id, limit, count)
    for block in blocks:
        yield from w.feed(block)
    yield from w.feed("", final=True)
