"""Read a private corpus and cut it into windows of at most N anchor tokens.

Directories give one document per .txt/.md file; .jsonl files give one document per line (read
here, so an error names its line); .json/.csv/.parquet files give one per row, read through the
`datasets` local loaders. Every window keeps its document id, source path, character offsets and
sha256. A text file above `STREAM_BYTES` is streamed: hashed in a first pass, then windowed block
by block (`iter_windows`), so a single document far larger than memory costs bounded memory.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..core.errors import InputError, check_path, check_text
from .windowing import Counter, Window, long_span, paragraphs, sha256_text, windows_of

__all__ = ["Counter", "Document", "Window", "iter_documents", "iter_windows", "long_span", "paragraphs"]
__all__ += ["read_documents", "sha256_text", "split_windows"]

TEXT_SUFFIXES = {".txt", ".md"}
TABLE_SUFFIXES = {".jsonl", ".json", ".csv", ".parquet"}
STREAM_BYTES = 8 * 2**20  # text files larger than this are streamed, never held whole
BLOCK_BYTES = 2**20  # read size of a streamed file
HEAD_CHARS = 65536  # where a streamed file's title is looked for, and where NUL bytes mean binary


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    source: str
    title: str
    file: Path | None = None  # a streamed text file: `text` is empty and `blocks()` reads the file
    digest: str = ""  # sha256 of a streamed file's text, from its first pass
    chars: int = 0  # characters of a streamed file's text

    @property
    def sha256(self) -> str:
        return self.digest or sha256_text(self.text)

    @property
    def n_chars(self) -> int:
        return self.chars if self.file is not None else len(self.text)

    def blocks(self) -> Iterator[str]:
        """The text, in order: whole, or a streamed file block by block (checked against its digest)."""
        if self.file is None:
            yield self.text
            return
        sha, dec = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")()
        try:
            with _open(self.file) as f:
                while block := f.read(BLOCK_BYTES):
                    sha.update(block)
                    yield dec.decode(block)
                yield dec.decode(b"", final=True)
        except UnicodeDecodeError:
            raise InputError(f"{self.file} changed while it was read; ingest it again") from None
        if sha.hexdigest() != self.digest:
            raise InputError(f"{self.file} changed while it was read; ingest it again")


def _open(path: Path) -> IO[bytes]:
    try:
        return path.open("rb")
    except PermissionError:
        raise InputError(f"{path}: permission denied; make it readable (chmod u+r) or leave it out") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None


def _read_bytes(path: Path) -> bytes:
    with _open(path) as f:
        try:
            return f.read()
        except OSError as e:
            raise InputError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None


def _not_utf8(path: Path, offset: int, line: int) -> InputError:
    return InputError(f"{path} line {line}: not UTF-8 text (bad byte at offset {offset}); convert it to UTF-8")


def _check_bytes(path: Path, textual: bool) -> bytes:
    data = _read_bytes(path)
    if not data.strip():
        raise InputError(f"{path} is empty (or only whitespace)")
    if textual:
        if b"\x00" in data[:HEAD_CHARS]:
            line = data.count(b"\n", 0, data.index(b"\x00")) + 1
            raise InputError(f"{path} line {line}: looks binary (NUL bytes); give UTF-8 text files")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _not_utf8(path, e.start, data.count(b"\n", 0, e.start) + 1) from None
    return data


def _title_of(text: str, fallback: str) -> str:
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line[:80]
    return fallback


def _read_text_file(path: Path, doc_id: str, stream_bytes: int | None) -> Document:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    if stream_bytes is not None and size > stream_bytes:
        return _scan_text_file(path, doc_id)
    text = _check_bytes(path, textual=True).decode("utf-8")
    if not text.strip():  # whitespace as str.strip knows it (e.g. U+001C, U+00A0), as the streamed reader
        raise InputError(f"{path} is empty (or only whitespace)")
    return Document(id=doc_id, text=text, source=str(path), title=_title_of(text, path.stem))


def _scan_text_file(path: Path, doc_id: str) -> Document:
    """First pass over a large text file: checks (UTF-8, not binary, not blank), sha256, length, title."""
    sha, dec = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")()
    chars, offset, line, head, blank = 0, 0, 1, "", True
    with _open(path) as f:
        while True:
            block = f.read(BLOCK_BYTES)
            if offset < HEAD_CHARS and b"\x00" in block[: HEAD_CHARS - offset]:
                at = line + block.count(b"\n", 0, block.index(b"\x00"))
                raise InputError(f"{path} line {at}: looks binary (NUL bytes); give UTF-8 text files")
            pending = dec.getstate()[0]
            try:
                text = dec.decode(block, final=not block)
            except UnicodeDecodeError as e:
                seen = pending + block
                raise _not_utf8(path, offset - len(pending) + e.start, line + seen.count(b"\n", 0, e.start)) from None
            sha.update(block)
            chars += len(text)
            offset += len(block)
            line += block.count(b"\n")
            if len(head) < HEAD_CHARS:
                head += text[: HEAD_CHARS - len(head)]
            blank = blank and not text.strip()
            if not block:
                break
    if blank:
        raise InputError(f"{path} is empty (or only whitespace)")
    title = _title_of(head, path.stem)
    return Document(id=doc_id, text="", source=str(path), title=title, file=path, digest=sha.hexdigest(), chars=chars)


def _load_table(path: Path) -> Any:
    import datasets

    datasets.disable_progress_bars()
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a malformed file is our one-line error, not its log
    try:
        return _dataset_of(datasets, path)
    finally:
        datasets.logging.set_verbosity(verbosity)


def _dataset_of(datasets: Any, path: Path) -> Any:
    suffix = path.suffix.lower()
    data = _check_bytes(path, textual=suffix != ".parquet")
    kind = {".json": "json", ".csv": "csv", ".parquet": "parquet"}[suffix]
    with tempfile.TemporaryDirectory(prefix=f"memctl-ds-{os.getpid()}-") as cache:
        try:
            ds = datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache, keep_in_memory=True)
        except Exception as e:  # datasets raises many types for malformed files
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            where = _json_error(data) if kind == "json" else ""
            raise InputError(f"cannot read {path}{where or ': ' + first[:200]}") from None
        return ds


def _json_error(data: bytes) -> str:
    """' line N: what is wrong' for JSON (or JSON lines) that does not parse, else ''."""
    text = data.decode("utf-8")
    try:
        json.loads(text)
        return ""
    except RecursionError:
        return " line 1: nested too deeply"
    except json.JSONDecodeError as e:
        if not e.msg.startswith("Extra data"):
            return f" line {e.lineno}: not valid JSON ({e.msg}, column {e.colno})"
    except ValueError as e:
        return f" line 1: not valid JSON ({e})"
    for n, line in enumerate(text.splitlines(), start=1):  # JSON lines: the first line that does not parse
        if line.strip() and (err := _json_line(line)[1]):
            return f" line {n}: {err}"
    return ""


def _json_line(line: str | bytes) -> tuple[Any, str]:
    """(value, '') for a line of JSON, or (None, what is wrong with it)."""
    try:
        return json.loads(line), ""
    except RecursionError:
        return None, "not valid JSON (nested too deeply)"
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg}, column {e.colno})"
    except ValueError as e:
        return None, f"not valid JSON ({e})"


def _fields_error(path: Path, where: str, field: str, opt: str, cols: Sequence[str]) -> InputError:
    shown = ", ".join(str(c)[:40] for c in list(cols)[:20]) or "none"
    return InputError(f"{path}{where} has no column {field!r}; pick one with {opt} (columns: {shown})")


def _row_document(
    path: Path, where: str, row: dict[str, Any], row_no: int, text_field: str, id_field: str | None
) -> Document:
    text = row.get(text_field)
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{path}{where}: {text_field!r} is empty or not text")
    doc_id = str(row[id_field]) if id_field else f"{path.stem}:{row_no}"
    title = str(row["title"]) if row.get("title") else _title_of(text, doc_id)
    # JSON's "\udce9" escapes decode to lone surrogates, which no tokenizer or SQLite column takes
    for name, value in ((text_field, text), (id_field or "id", doc_id), ("title", title)):
        check_text(value, f"{path}{where}: {name!r}")
    return Document(id=doc_id, text=text, source=str(path), title=title)


def _read_jsonl(path: Path, text_field: str, id_field: str | None) -> Iterator[Document]:
    """One document per line of a JSON-lines file, streamed; every error names its line."""
    rows = 0
    with _open(path) as f:
        offset = 0
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _not_utf8(path, offset + e.start, line_no) from None
            offset += len(raw)
            if not line.strip():
                continue
            row, err = _json_line(line)
            if err:
                raise InputError(f"cannot read {path} line {line_no}: {err}")
            if not isinstance(row, dict):
                raise InputError(f"{path} line {line_no}: not a JSON object; give one object per line")
            for field, opt in ((text_field, "--text-field"), (id_field, "--id-field")):
                if field and field not in row:
                    raise _fields_error(path, f" line {line_no}", field, opt, list(row))
            yield _row_document(path, f" line {line_no}", row, rows, text_field, id_field)
            rows += 1
    if rows == 0:
        raise InputError(f"{path} is empty (or only whitespace)")


def _csv_line(path: Path, row_no: int) -> str:
    """' line N' where data row `row_no` (0-based) of a CSV file starts, or ' row N' if unknown."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            start, seen = 1, -1
            for rec in reader:
                if rec and seen == row_no:
                    return f" line {start}"
                seen += 1 if rec else 0
                start = reader.line_num + 1
    except (OSError, csv.Error, UnicodeDecodeError):
        pass
    return f" row {row_no + 1}"


def _read_table(path: Path, text_field: str, id_field: str | None) -> Iterator[Document]:
    if path.suffix.lower() == ".jsonl":
        yield from _read_jsonl(path, text_field, id_field)
        return
    ds = _load_table(path)
    cols = list(ds.column_names)
    for field, opt in ((text_field, "--text-field"), (id_field, "--id-field")):
        if field and field not in cols:
            raise _fields_error(path, "", field, opt, cols)
    if len(ds) == 0:
        raise InputError(f"{path} has no rows")
    csv_file = path.suffix.lower() == ".csv"
    for row_no, row in enumerate(ds):
        text = row[text_field]
        if not isinstance(text, str) or not text.strip():
            where = _csv_line(path, row_no) if csv_file else f" row {row_no + 1}"
            raise InputError(f"{path}{where}: {text_field!r} is empty or not text")
        yield _row_document(path, f" row {row_no + 1}", row, row_no, text_field, id_field)


def _walk(root: Path, hidden: list[str] | None = None) -> list[Path]:
    """The readable files under `root` with a known suffix, sorted; symlinked directories are not followed
    (as `rglob`); a broken or looping link, or a directory that cannot be listed, is an error. Hidden files
    and directories below `root` (a name that starts with "."; `.git`, `.obsidian`, editors' backups) are
    left out, as `ls` and `git` leave them (their names are appended to `hidden`); a hidden file named on the
    command line is read."""

    def fail(e: OSError) -> None:
        raise InputError(f"cannot read directory {e.filename}: {e.strerror}; make it readable or leave it out")

    found: list[Path] = []
    for top, dirs, names in os.walk(root, onerror=fail):
        if hidden is not None:
            hidden.extend(n for n in dirs + names if n.startswith("."))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            p = Path(top) / name
            if p.suffix.lower() not in TEXT_SUFFIXES | TABLE_SUFFIXES:
                continue
            if p.is_symlink() and not p.exists():
                raise InputError(f"{p}: a broken symbolic link or a link loop; fix or remove it")
            if p.is_file():
                found.append(p)
    return sorted(found)


def _input_files(paths: Sequence[str | Path]) -> list[tuple[Path, Path | None]]:
    """(file, directory it was found under or None) for every input, checked before any is read."""
    files: list[tuple[Path, Path | None]] = []
    for raw in paths:
        check_path(raw, "the path")  # before any message names it
        path = Path(raw).expanduser()
        if not path.exists():
            if path.is_symlink():
                raise InputError(f"{raw}: a broken symbolic link or a link loop; fix or remove it")
            raise InputError(f"{raw}: no such file or directory")
        if path.is_dir():
            hidden: list[str] = []
            found = _walk(path, hidden)
            if not found:
                left = f" ({len(hidden)} hidden file(s) or folder(s) left out)" if hidden else ""
                raise InputError(f"{raw}: no .txt/.md/.jsonl/.json/.csv/.parquet files in this directory{left}")
            for f in found:  # a name the file system could not decode would reach the registry as lone surrogates
                check_path(f, "the file")
            files.extend((f, path) for f in found)
        elif path.suffix.lower() in TEXT_SUFFIXES | TABLE_SUFFIXES:
            files.append((path, None))
        else:
            raise InputError(f"{raw}: unsupported file type; use .txt, .md, .jsonl, .json, .csv or .parquet")
    return files


def hidden_below(paths: Sequence[str | Path]) -> int:
    """Hidden files and folders `iter_documents` leaves out below the directories among `paths` (a hidden
    folder counts once, not its contents), for a summary that says so; the paths are checked when read."""
    hidden: list[str] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            _walk(path, hidden)
    return len(hidden)


def iter_documents(
    paths: Sequence[str | Path],
    text_field: str = "text",
    id_field: str | None = None,
    stream_bytes: int | None = STREAM_BYTES,
) -> Iterator[Document]:
    """The documents under `paths`, one at a time (a .json/.csv/.parquet file is read whole, then yielded
    row by row; a text file above `stream_bytes` is streamed: see `Document.blocks`; None: never).
    Missing paths and unsupported types raise InputError at once; a bad file raises when it is reached.
    Repeated ids are not checked here (`read_documents` does; the streaming ingest checks in SQL)."""
    files = _input_files(paths)

    def gen() -> Iterator[Document]:
        for f, root in files:
            if f.suffix.lower() in TEXT_SUFFIXES:
                yield _read_text_file(f, f.relative_to(root).as_posix() if root else f.name, stream_bytes)
            else:
                yield from _read_table(f, text_field, id_field)

    return gen()


def read_documents(
    paths: Sequence[str | Path], text_field: str = "text", id_field: str | None = None
) -> list[Document]:
    """All documents under `paths`, held whole. Raises InputError on a missing, empty, binary or malformed input."""
    docs = list(iter_documents(paths, text_field, id_field, stream_bytes=None))
    seen: dict[str, str] = {}
    for d in docs:
        if d.id in seen and seen[d.id] != d.sha256:
            raise InputError(f"document id {d.id!r} appears twice with different text; ids must be unique")
        seen[d.id] = d.sha256
    return docs


def iter_windows(doc: Document, limit: int, count: Counter) -> Iterator[Window]:
    """The windows of `doc`, in order, as its text arrives (a streamed file never is whole in memory)."""
    return windows_of(doc.id, doc.blocks(), limit, count)


def split_windows(doc: Document, limit: int, count: Counter) -> list[Window]:
    """Greedy packing of paragraphs (then sentences, then word runs) into windows of <= limit tokens."""
    return list(iter_windows(doc, limit, count))
