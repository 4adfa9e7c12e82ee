"""Streaming ingest: read, window, embed and store documents chunk by chunk, then cluster and route.

Resident memory stays bounded by the chunk (`chunk` windows of text and their rows), plus one
float32 embedding matrix (N, dim) that lives in a memory-mapped spool file, never a Python list.
Documents are de-duplicated against SQLite (the rows written so far in this transaction included),
not against an in-memory copy of the bank. The caller owns the transaction (or the staging
directory): an error anywhere leaves the bank as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.config import BankConfig
from ..core.errors import InputError
from ..core.tree import Backend, Tree, build_tree, route
from ..registry import Registry, now
from ..registry.access import join_tags, parse_tags
from .corpus import Counter, Document, Window, iter_windows, paragraphs
from .embed import Embedder

Progress = Callable[[str, int, int], None]
CHUNK_WINDOWS = 4096  # windows embedded and written per chunk
_ROWS = 8192  # rows per SQL round trip when reading embeddings or rewriting paths


class TokenCounter:
    """Anchor tokens in a text (no special tokens). `prime` counts many texts in one batched
    tokenizer call (about 3x faster than one call each) and remembers them until `clear`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.memo: dict[str, int] = {}
        self.offsets = True  # whether the tokenizer reports offsets (see prefix_end)

    def __call__(self, text: str) -> int:
        n = self.memo.get(text)
        if n is None:
            n = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return n

    def prefix_end(self, text: str, n: int) -> int | None:
        """Where the first `n` tokens of `text` end (a character offset), or None if it has fewer
        (or the tokenizer gives no offsets): one tokenizer pass instead of a bisection."""
        if not self.offsets:
            return None
        try:
            spans = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        except (NotImplementedError, KeyError, TypeError, ValueError):
            self.offsets = False  # a slow tokenizer: the caller bisects
            return None
        return int(spans[n - 1][1]) if len(spans) > n else None

    def prime(self, texts: list[str]) -> None:
        todo = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if todo:
            ids = self.tokenizer(todo, add_special_tokens=False)["input_ids"]
            self.memo.update(zip(todo, map(len, ids), strict=True))

    def clear(self) -> None:
        self.memo.clear()


@dataclass
class StreamResult:
    config: BankConfig
    docs_added: int = 0
    docs_skipped: int = 0
    windows_added: int = 0
    reclustered: bool = False
    stale_blocks: list[str] = field(default_factory=list)
    tagged: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class Spool:
    """Float32 rows appended chunk by chunk to an unnamed temporary file, read back as one read-only
    memmap (N, dim). The file has no name: a killed ingest leaves nothing of it behind."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix=f"memctl-ingest-{os.getpid()}-")
        self.n = 0
        self.dim = 0

    def append(self, rows: np.ndarray) -> None:
        if len(rows) == 0:
            return
        rows = np.ascontiguousarray(rows, dtype=np.float32)  # (b, dim)
        self.dim = self.dim or int(rows.shape[1])
        self._file.write(rows.tobytes())
        self.n += len(rows)

    def array(self) -> np.ndarray:
        self._file.flush()
        if self.n == 0:
            return np.zeros((0, self.dim), np.float32)
        return np.memmap(self._file, dtype=np.float32, mode="r", shape=(self.n, self.dim))

    def close(self) -> None:
        self._file.close()  # a memmap from `array` keeps its own mapping


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, key: str, t0: float) -> float:
        t = time.perf_counter()
        self.seconds[key] = self.seconds.get(key, 0.0) + t - t0
        return t


def add_tags(reg: Registry, doc_ids: list[str], tags: frozenset[str]) -> int:
    """Merge `tags` into the tags of documents already in the bank; returns how many changed."""
    changed = 0
    if not tags:
        return 0
    for doc_id in dict.fromkeys(doc_ids):
        old = parse_tags(reg.db["documents"].get(doc_id)["tags"] or "")
        if not tags <= old:
            reg.db["documents"].update(doc_id, {"tags": join_tags(old | tags)})
            changed += 1
    return changed


class _Dedup:
    """Sorts incoming documents into new ones and ones the bank (or this ingest) already holds."""

    def __init__(self, reg: Registry) -> None:
        self.db = reg.db
        self.name = reg.name
        self.first_rowid = self.db.execute("select coalesce(max(rowid), 0) from documents").fetchone()[0]
        self.refs = self.db.execute("select count(*) from reference_docs").fetchone()[0] > 0
        self.pending_ids: dict[str, str] = {}  # id -> sha256, the chunk not yet written
        self.pending_sha: dict[str, str] = {}  # sha256 -> id

    def holder(self, d: Document) -> str | None:
        """The id under which the bank already holds `d`, or None for a new document."""
        sha = d.sha256
        row = self.db.execute("select sha256, rowid from documents where id = ?", [d.id]).fetchone()
        if row is None and d.id in self.pending_ids:
            row = (self.pending_ids[d.id], self.first_rowid + 1)
        if row is not None:
            if row[0] == sha:
                return d.id
            if row[1] > self.first_rowid:
                raise InputError(f"document id {d.id!r} appears twice with different text; ids must be unique")
            raise InputError(
                f"document {d.id!r} is already in bank {self.name!r} with different text; "
                "forget it first or give it a new id"
            )
        if sha in self.pending_sha:
            return self.pending_sha[sha]
        same = self.db.execute("select id from documents where sha256 = ? limit 1", [sha]).fetchone()
        if same is not None:
            return str(same[0])  # same content under another id
        if self.refs and self.db.execute("select 1 from reference_docs where sha256 = ?", [sha]).fetchone():
            raise InputError(f"document {d.id!r} is a reference document of bank {self.name!r}; references stay unseen")
        self.pending_ids[d.id] = sha
        self.pending_sha[sha] = d.id
        return None

    def flushed(self) -> None:
        self.pending_ids.clear()
        self.pending_sha.clear()


def stream_ingest(
    r: Registry,
    docs: Iterator[Document],
    *,
    embedder: Embedder,
    count: Counter,
    window: int,
    tags: frozenset[str],
    config: BankConfig | None = None,
    finalize: Callable[[int], BankConfig] | None = None,
    chunk: int = CHUNK_WINDOWS,
    backend: Backend = "auto",
    progress: Progress | None = None,
) -> StreamResult:
    """Add `docs` to registry `r` inside the caller's transaction or staging directory.

    An existing bank passes its `config`; a new one passes `finalize(n_windows)`, which picks (and
    validates) the config once the corpus size is known. A trained bank routes the new windows into
    its tree; an untrained one is re-clustered over all its windows."""
    timer = _Timer()
    trained = r.db.execute("select count(*) from blocks where state != 'init'").fetchone()[0] > 0
    tree: Tree | None = r.load_tree() if trained else None
    dedup = _Dedup(r)
    res = StreamResult(config=config) if config is not None else None
    stamp = now()
    added, skipped, tagged, n_windows = 0, 0, 0, 0
    touched: list[np.ndarray] = []  # trained bank: routes of the new windows, per chunk
    with contextlib.closing(Spool()) as spool:
        pend_docs: list[Document] = []
        pend_wins: list[Window] = []

        spooled = False  # whether the windows stored before this ingest are in the spool

        def flush() -> None:
            nonlocal n_windows, spooled
            t0 = time.perf_counter()
            if tree is None and not spooled:  # re-clustering covers the windows stored, in id order
                _spool_stored(r, spool)
                spooled = True
                t0 = timer.add("read", t0)
            vecs = embedder.encode([w.text for w in pend_wins])  # (b, dim)
            t0 = timer.add("embed", t0)
            paths = route(tree, vecs) if tree is not None else None
            if paths is not None:
                touched.append(paths)
                t0 = timer.add("route", t0)
            _write_chunk(r, pend_docs, pend_wins, vecs, paths, stamp, join_tags(tags))
            t0 = timer.add("write", t0)
            if tree is None:
                spool.append(vecs)
            n_windows += len(pend_wins)
            pend_docs.clear()
            pend_wins.clear()
            dedup.flushed()
            if progress:
                progress("ingest", added, added)

        group: list[Document] = []  # new documents windowed together: one batched tokenizer call
        group_size = max(1, min(256, chunk))
        batched = isinstance(count, TokenCounter)

        def window_group() -> None:
            if batched:
                count.prime([p for d in group for p in paragraphs(d.text, window)])
            for d in group:
                pend_docs.append(d)
                for w in iter_windows(d, window, count):
                    pend_wins.append(w)
                    if d.file is not None and len(pend_wins) >= chunk:  # a streamed file: chunk by chunk
                        f0 = time.perf_counter()
                        flush()
                        inner[0] += time.perf_counter() - f0
            if batched:
                count.clear()
            group.clear()

        inner = [0.0]  # seconds of the flushes inside window_group (a streamed file): not reading
        t0 = time.perf_counter()
        for d in docs:
            held = dedup.holder(d)
            if held is not None:
                skipped += 1
                if held in dedup.pending_ids:
                    continue  # held by this chunk, not written yet: it gets the tags when written
                tagged += add_tags(r, [held], tags)
                continue
            if d.file is not None and group:
                window_group()  # a streamed file is windowed alone: its flushes leave no grouped document unwritten
            group.append(d)
            added += 1
            if len(group) >= group_size or d.file is not None:
                window_group()
                if len(pend_wins) >= chunk:
                    timer.add("read", t0 + inner[0])
                    inner[0] = 0.0
                    flush()
                    t0 = time.perf_counter()
        window_group()
        timer.add("read", t0 + inner[0])
        if pend_docs:
            flush()
        if res is None:
            if n_windows == 0:
                raise InputError("the documents hold no text to ingest")
            assert finalize is not None
            res = StreamResult(config=finalize(n_windows))
            r.db.execute("update banks set config = ?", [res.config.to_json()])
        cfg = res.config
        if tree is None and n_windows:
            res.reclustered = True
            _recluster(r, spool.array(), cfg, backend, timer, progress)
        elif touched:
            res.stale_blocks = _mark_stale(r, np.concatenate(touched), cfg, now())
    res.docs_added, res.docs_skipped, res.windows_added, res.tagged = added, skipped, n_windows, tagged
    res.seconds = timer.seconds
    return res


def _spool_stored(r: Registry, spool: Spool) -> None:
    last = 0
    while True:
        rows = r.db.execute(
            "select id, embedding from windows where id > ? order by id limit ?", [last, _ROWS]
        ).fetchall()
        if not rows:
            return
        spool.append(np.stack([np.frombuffer(e, dtype=np.float32) for _, e in rows]))
        last = rows[-1][0]


def _write_chunk(
    r: Registry,
    docs: list[Document],
    wins: list[Window],
    vecs: np.ndarray,
    paths: np.ndarray | None,
    stamp: str,
    tags: str,
) -> None:
    """Insert a chunk's documents and windows; windows of an untrained bank get their path later."""
    r.db["documents"].insert_all(
        (
            {
                "id": d.id,
                "source": d.source,
                "title": d.title,
                "sha256": d.sha256,
                "n_chars": d.n_chars,
                "tags": tags,
                "added": stamp,
            }
            for d in docs
        ),
        batch_size=500,
    )
    rows = (
        {
            "doc_id": w.doc_id,
            "idx": w.idx,
            "char_start": w.char_start,
            "char_end": w.char_end,
            "sha256": w.sha256,
            "text": w.text,
            "n_tokens": w.n_tokens,
            "path": ",".join(map(str, paths[i])) if paths is not None else "",
            "l1": int(paths[i][0]) if paths is not None else -1,
            "embedding": vecs[i].astype(np.float32).tobytes(),
        }
        for i, w in enumerate(wins)
    )
    r.db["windows"].insert_all(rows, batch_size=500)


def _recluster(
    r: Registry,
    vecs: np.ndarray,
    cfg: BankConfig,
    backend: Backend,
    timer: _Timer,
    progress: Progress | None,
) -> None:
    """Build the tree over every window (vecs in window-id order), rewrite every path, drop what
    depended on the old tree (prompts; checkpoints are the caller's, after commit)."""
    t0 = time.perf_counter()
    tc = cfg.tree
    tree = build_tree(
        vecs, tc.k, tc.p, seed=tc.seed, iters=tc.iters, balance=tc.balance, progress=progress, backend=backend
    )
    t0 = timer.add("cluster", t0)
    routes = route(tree, vecs)  # (N, p)
    t0 = timer.add("route", t0)
    last, pos = 0, 0
    while pos < len(routes):
        ids = [row[0] for row in r.db.execute("select id from windows where id > ? order by id limit ?", [last, _ROWS])]
        assert ids, "the window table and the embedding spool disagree"
        part = routes[pos : pos + len(ids)]
        r.db.conn.executemany(
            "update windows set path = ?, l1 = ? where id = ?",
            [(",".join(map(str, p)), int(p[0]), wid) for wid, p in zip(ids, part.tolist(), strict=True)],
        )
        last, pos = ids[-1], pos + len(ids)
    r.save_tree(tree)
    r.db.execute("delete from prompts")  # prompts were routed, and checkpoints trained, on the old tree
    r.db.execute("update windows set prompted = 0, questioned = 0, studied = 0")
    timer.add("write", t0)


def _mark_stale(r: Registry, new_routes: np.ndarray, cfg: BankConfig, stamp: str) -> list[str]:
    """A trained bank took new windows: blocks on their paths are stale; node sizes grow."""
    stale: list[str] = []
    for lvl in range(1, cfg.tree.p + 1):
        nodes, counts = np.unique(new_routes[:, lvl - 1], return_counts=True)
        for n, c in zip(nodes.tolist(), counts.tolist(), strict=True):
            row = r.block(lvl, n)
            if row and row["state"] == "trained":
                r.db["blocks"].update(row["id"], {"state": "stale", "updated": stamp})
                stale.append(row["id"])
            r.db.execute(
                "update nodes set n_windows = n_windows + ? where level = ? and idx = ?",
                [c, lvl, n],
            )
    return stale
