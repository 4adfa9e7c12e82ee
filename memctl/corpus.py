"""Read a private corpus and cut it into windows of at most N anchor tokens.

Directories give one document per .txt/.md file; .jsonl/.json/.csv/.parquet files give one
document per row, read through the `datasets` local loaders. Every window keeps its document
id, source path, character offsets and sha256.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError

TEXT_SUFFIXES = {".txt", ".md"}
TABLE_SUFFIXES = {".jsonl", ".json", ".csv", ".parquet"}


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    source: str
    title: str

    @property
    def sha256(self) -> str:
        return sha256_text(self.text)


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


def _check_bytes(path: Path, textual: bool) -> bytes:
    data = path.read_bytes()
    if not data.strip():
        raise InputError(f"{path} is empty")
    if textual:
        if b"\x00" in data[:65536]:
            raise InputError(f"{path} looks binary (NUL bytes); give UTF-8 text files")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{path} is not UTF-8 text (bad byte at offset {e.start})") from None
    return data


def _title_of(text: str, fallback: str) -> str:
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line[:80]
    return fallback


def _read_text_file(path: Path, doc_id: str) -> Document:
    text = _check_bytes(path, textual=True).decode("utf-8")
    return Document(id=doc_id, text=text, source=str(path), title=_title_of(text, path.stem))


def _load_table(path: Path) -> Any:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    _check_bytes(path, textual=path.suffix != ".parquet")
    kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}[path.suffix]
    with tempfile.TemporaryDirectory(prefix="memctl-ds-") as cache:
        try:
            ds = datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache, keep_in_memory=True)
        except Exception as e:  # datasets raises many types for malformed files
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise InputError(f"cannot read {path}: {first[:200]}") from None
        return ds


def _read_table(path: Path, text_field: str, id_field: str | None) -> Iterator[Document]:
    ds = _load_table(path)
    cols = list(ds.column_names)
    if text_field not in cols:
        raise InputError(
            f"{path} has no column {text_field!r}; pick one with --text-field (columns: {', '.join(cols)})"
        )
    if id_field and id_field not in cols:
        raise InputError(f"{path} has no column {id_field!r}; pick one with --id-field (columns: {', '.join(cols)})")
    if len(ds) == 0:
        raise InputError(f"{path} has no rows")
    for row_no, row in enumerate(ds):
        text = row[text_field]
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{path} row {row_no + 1}: {text_field!r} is empty or not text")
        doc_id = str(row[id_field]) if id_field else f"{path.stem}:{row_no}"
        title = str(row["title"]) if "title" in cols and row.get("title") else _title_of(text, doc_id)
        yield Document(id=doc_id, text=text, source=str(path), title=title)


def _input_files(paths: Sequence[str | Path]) -> list[tuple[Path, Path | None]]:
    """(file, directory it was found under or None) for every input, checked before any is read."""
    files: list[tuple[Path, Path | None]] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise InputError(f"{raw}: no such file or directory")
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES | TABLE_SUFFIXES
            )
            if not found:
                raise InputError(f"{raw}: no .txt/.md/.jsonl/.json/.csv/.parquet files in this directory")
            files.extend((f, path) for f in found)
        elif path.suffix.lower() in TEXT_SUFFIXES | TABLE_SUFFIXES:
            files.append((path, None))
        else:
            raise InputError(f"{raw}: unsupported file type; use .txt, .md, .jsonl, .json, .csv or .parquet")
    return files


def iter_documents(
    paths: Sequence[str | Path], text_field: str = "text", id_field: str | None = None
) -> Iterator[Document]:
    """The documents under `paths`, one at a time (a table file is read whole, then yielded row by row).
    Missing paths and unsupported types raise InputError at once; a bad file raises when it is reached.
    Repeated ids are not checked here (`read_documents` does; the streaming ingest checks in SQL)."""
    files = _input_files(paths)

    def gen() -> Iterator[Document]:
        for f, root in files:
            if f.suffix.lower() in TEXT_SUFFIXES:
                yield _read_text_file(f, f.relative_to(root).as_posix() if root else f.name)
            else:
                yield from _read_table(f, text_field, id_field)

    return gen()


def read_documents(
    paths: Sequence[str | Path], text_field: str = "text", id_field: str | None = None
) -> list[Document]:
    """All documents under `paths`. Raises InputError on a missing, empty, binary or malformed input."""
    docs = list(iter_documents(paths, text_field, id_field))
    seen: dict[str, str] = {}
    for d in docs:
        if d.id in seen and seen[d.id] != d.sha256:
            raise InputError(f"document id {d.id!r} appears twice with different text; ids must be unique")
        seen[d.id] = d.sha256
    return docs


Counter = Callable[[str], int]

_PARA = re.compile(r"\n\s*\n")
_SENT = re.compile(r"(?<=[.!?])\s+")


def _spans(text: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    out, pos = [], start
    for m in pattern.finditer(text, start, end):
        if m.start() > pos:
            out.append((pos, m.start()))
        pos = m.end()
    if pos < end:
        out.append((pos, end))
    return out


def paragraphs(text: str) -> list[str]:
    """The paragraphs `split_windows` counts first, and their stripped forms (a one-paragraph
    document becomes one window whose text is its stripped paragraph): what to count in a batch."""
    out = [text[s:e] for s, e in _spans(text, _PARA, 0, len(text))]
    return out + [t.strip() for t in out]


def _hard_split(text: str, start: int, end: int, limit: int, count: Counter) -> list[tuple[int, int]]:
    """Split a span with no usable boundary at word gaps (or characters) so each piece fits."""
    out: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        lo, hi = pos + 1, end
        while lo < hi:  # largest piece end that still fits
            mid = (lo + hi + 1) // 2
            if count(text[pos:mid]) <= limit:
                lo = mid
            else:
                hi = mid - 1
        cut = lo
        gap = text.rfind(" ", pos + 1, cut)
        if cut < end and gap > pos:
            cut = gap
        out.append((pos, cut))
        pos = cut
        while pos < end and text[pos].isspace():
            pos += 1
    return out


def split_windows(doc: Document, limit: int, count: Counter) -> list[Window]:
    """Greedy packing of paragraphs (then sentences, then word runs) into windows of <= limit tokens."""
    text = doc.text
    segments: list[tuple[int, int]] = []
    for ps, pe in _spans(text, _PARA, 0, len(text)):
        if count(text[ps:pe]) <= limit:
            segments.append((ps, pe))
            continue
        for ss, se in _spans(text, _SENT, ps, pe):
            if count(text[ss:se]) <= limit:
                segments.append((ss, se))
            else:
                segments.extend(_hard_split(text, ss, se, limit, count))
    windows: list[Window] = []
    cur: tuple[int, int] | None = None
    for s, e in segments:
        if not text[s:e].strip():
            continue
        if cur is not None and count(text[cur[0] : e]) <= limit:
            cur = (cur[0], e)
            continue
        if cur is not None:
            windows.append(_window(doc, len(windows), cur, count))
        cur = (s, e)
    if cur is not None:
        windows.append(_window(doc, len(windows), cur, count))
    return windows


def _window(doc: Document, idx: int, span: tuple[int, int], count: Counter) -> Window:
    s, e = span
    while s < e and doc.text[s].isspace():
        s += 1
    while e > s and doc.text[e - 1].isspace():
        e -= 1
    piece = doc.text[s:e]
    return Window(doc_id=doc.id, idx=idx, char_start=s, char_end=e, text=piece, n_tokens=count(piece))
