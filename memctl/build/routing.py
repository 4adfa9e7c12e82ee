"""Routing: which path of the tree a context fetches the blocks of.

A bank routes by one of two rules, fixed when it is created (`BankConfig.routing`), because every
training prompt is routed by the same rule (`route_prompts`) and trains the blocks of its route:

- `nearest` (new banks): the path of the bank's window most similar to the context (cosine of the
  embeddings). A training prompt takes the path of the nearest window of its own document, so a
  question about a window fetches the blocks that window's prompts trained, and forgetting one
  document never moves another's prompts.
  Exact search up to `EXACT_WINDOWS` windows; above, among the windows of the `NPROBE` leaves whose
  centroids lie nearest the context (an inverted-file search over the tree's leaves).
  A bank made with a lexical weight (`BankConfig.lexical`, new banks 0.3) scores a window by its
  cosine plus that weight times its BM25 score for the context's words over the best window's
  (memctl.build.lexical): names the embedder has never seen still find their window. A training
  prompt is scored so among its own document's windows, with its document's word statistics.
- `tree`: the paper's greedy descent (`memctl.core.tree.route`): at each level, the child whose centroid
  is nearest. Every bank made before `nearest` existed routes this way.

Why `nearest` for new banks: a private corpus is small beside the paper's pretraining set, and a
question is worded unlike the window that holds its answer. Greedy descent commits at the first
level on centroids that average many windows. Measured on every probe of three corpora
(benchmarks/routing.py, docs/corpora.md), it sends 44%, 60% and 65% of the statement probes
(fictional, foldoc, elements) into a leaf that holds their document, and the nearest window 92%,
96% and 99%; of the question-form probes 39%, 48% and 59% against 90%, 94% and 99%.

Pure numeric code: the registry read that builds the index is `WindowIndex.from_registry`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import InputError
from ..core.relevance import NEAREST_SHARE, calibrate, leaf_similarity
from ..core.tree import Tree, route, route_avoiding, route_beam
from ..registry.access import doc_tags
from .embed import Progress, get_embedder
from .lexical import LexicalIndex, relative, top

if TYPE_CHECKING:
    from ..registry import Registry

ROUTINGS = ("nearest", "tree")
DEFAULT_ROUTING = "nearest"  # new banks; a bank's config without the field routes by "tree"
EXACT_WINDOWS = 262_144  # windows searched exhaustively; a larger bank searches NPROBE leaves
NPROBE = 16
CHUNK = 2048  # queries routed at a time at most
SCORE_BUDGET = 1 << 24  # floats in one (queries, windows) score matrix: 64 MiB
CALIBRATION_NEAREST = 1024  # windows whose nearest neighbour calibrates the gate of a `nearest` bank
LEXICAL_CANDIDATES = 64  # above EXACT_WINDOWS, the windows with the best BM25 scores join a context's candidates


def check_routing(routing: str) -> str:
    if routing not in ROUTINGS:
        raise InputError(f"--routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    return routing


@dataclass(frozen=True)
class WindowIndex:
    """The bank's window embeddings, grouped by leaf, with each window's path."""

    vecs: np.ndarray  # (N, dim) float32, unit rows, sorted by leaf
    paths: np.ndarray  # (N, p) int64
    starts: np.ndarray  # (leaves + 1,) windows of leaf l are vecs[starts[l]:starts[l + 1]]
    lexical: LexicalIndex | None = None  # the windows' words, in the same order; None: cosine alone
    weight: float = 0.0  # of the relative BM25 score beside the cosine

    @staticmethod
    def build(
        vecs: np.ndarray, paths: np.ndarray, leaves: int, texts: Sequence[str] | None = None, weight: float = 0.0
    ) -> WindowIndex:
        """`texts` (the windows', in the order of `vecs`) and `weight` > 0: score by words as well."""
        vecs = np.asarray(vecs, dtype=np.float32)
        paths = np.asarray(paths, dtype=np.int64).reshape(len(vecs), -1)
        order = np.argsort(paths[:, -1], kind="stable") if len(paths) else np.zeros(0, np.int64)
        counts = np.bincount(paths[order, -1], minlength=leaves) if len(paths) else np.zeros(leaves, np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        lexical = LexicalIndex.build([texts[i] for i in order]) if texts is not None and weight > 0 else None
        return WindowIndex(np.ascontiguousarray(vecs[order]), paths[order], starts, lexical, weight)

    @staticmethod
    def from_registry(
        reg: Registry, tree: Tree, lexical: float | None = None, allow: frozenset[str] | None = None
    ) -> WindowIndex:
        """`lexical`: the words' weight (None: the bank's). `allow`: only the words of documents with one
        of these tags count (a session under `--allow`): a word only a hidden document holds moves no route."""
        weight = reg.config.lexical if lexical is None else lexical
        extra = ", text, doc_id" if weight > 0 else ""
        rows = reg.db.execute(f"select path, embedding{extra} from windows").fetchall()
        if not rows:
            empty = np.zeros((0, tree.dim), np.float32)
            return WindowIndex.build(empty, np.zeros((0, tree.p), np.int64), len(tree.centroids[-1]))
        vecs, paths = _window_arrays(rows)
        texts = None
        if weight > 0:
            tags = doc_tags(reg) if allow is not None else {}
            seen = (lambda d: bool(tags.get(d, frozenset()) & allow)) if allow is not None else (lambda d: True)
            texts = [r[2] if seen(r[3]) else "" for r in rows]
        return WindowIndex.build(vecs, paths, len(tree.centroids[-1]), texts, weight)

    def __len__(self) -> int:
        return len(self.vecs)

    def candidates(self, tree: Tree, x: np.ndarray, nprobe: int) -> list[np.ndarray]:
        """Per row of x, the indices of the windows in its `nprobe` nearest leaves (by centroid)."""
        c = tree.centroids[-1]
        d2 = (c**2).sum(1)[None, :] - 2.0 * (x @ c.T)  # (B, leaves)
        near = np.argsort(d2, axis=1, kind="stable")[:, :nprobe]
        return [np.concatenate([np.arange(self.starts[j], self.starts[j + 1]) for j in row]) for row in near]

    def scores(
        self,
        tree: Tree,
        x: np.ndarray,
        exact_limit: int = EXACT_WINDOWS,
        nprobe: int = NPROBE,
        texts: Sequence[str] | None = None,
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Per row of x (B, dim), one at a time: (window indices searched, their scores): the cosine, plus
        `weight` times the relative BM25 score of the row's text (`texts[i]`) where the index has words
        and texts are given. Score matrices are built SCORE_BUDGET floats at a time, whatever the bank's
        size. Above `exact_limit` windows, a row searches the windows of its `nprobe` nearest leaves and
        the LEXICAL_CANDIDATES windows its words score best."""
        x = np.asarray(x, dtype=np.float32)
        lex = self.lexical if texts is not None else None
        if texts is not None and len(texts) != len(x):
            raise ValueError("routing needs one text per embedding")
        if len(self) <= exact_limit:
            every = np.arange(len(self))
            rows = max(1, min(CHUNK, SCORE_BUDGET // max(1, len(self))))
            for s in range(0, len(x), rows):
                for j, row in enumerate(x[s : s + rows] @ self.vecs.T, start=s):
                    if lex is not None:
                        row = row + self.weight * relative(lex.scores(texts[j]))  # type: ignore[index]
                    yield every, row
            return
        for s in range(0, len(x), CHUNK):
            xb = x[s : s + CHUNK]
            for j, (q, cand) in enumerate(zip(xb, self.candidates(tree, xb, nprobe), strict=True), start=s):
                if lex is None:
                    yield cand, self.vecs[cand] @ q
                    continue
                words = lex.scores(texts[j])  # type: ignore[index]
                cand = np.union1d(cand, top(words, LEXICAL_CANDIDATES))
                yield cand, self.vecs[cand] @ q + self.weight * relative(words[cand])

    def nearest(self, tree: Tree, x: np.ndarray, texts: Sequence[str] | None = None) -> np.ndarray:
        """(B, dim) -> (B,) index (into this index's order) of each row's best window (by `scores`)."""
        return np.array([_best(c, s) for c, s in self.scores(tree, x, texts=texts)], dtype=np.int64).reshape(len(x))


def route_prompts(
    reg: Registry, x: np.ndarray, docs: Sequence[str], tree: Tree | None = None, queries: Sequence[str] | None = None
) -> np.ndarray:
    """Routes of training prompts (B, dim) written from documents `docs` (B,) -> (B, p).

    `tree`: greedy descent, as for any context. `nearest`: the path of the nearest window *of the
    prompt's own document*, by the cosine, plus, in a bank with a lexical weight and given the
    prompts' `queries` (their texts), that weight times the relative BM25 score among the document's
    windows with the document's own word statistics. A prompt's route then depends on its document
    alone, as under greedy descent it depends on the fixed tree alone: forgetting another document never
    changes where this one's facts were trained, so a bank that forgot a document equals one that
    never held it. A question routed to its best window in the whole bank meets the same leaf whenever
    that window is the document's; in a document of several windows, the words may pick another of
    its windows for a question than for the prompt with the same text, since a question's words are
    weighed by their rarity in the bank and a prompt's by their rarity in its document."""
    x = np.asarray(x, dtype=np.float32)
    tree = tree if tree is not None else reg.load_tree()
    if reg.config.routing != "nearest":
        return route(tree, x)
    weight = reg.config.lexical if queries is not None else 0.0
    out = route(tree, x)  # a document without windows (none is expected) keeps the tree's route
    rows: dict[str, list[int]] = {}
    for i, d in enumerate(docs):
        rows.setdefault(d, []).append(i)
    for doc, idx in rows.items():
        sql = f"select path, embedding{', text' if weight > 0 else ''} from windows where doc_id = ? order by id"
        found = reg.db.execute(sql, [doc]).fetchall()  # the words are read only where they weigh
        if not found:
            continue
        vecs, paths = _window_arrays(found)
        s = x[idx] @ vecs.T  # (n, windows)
        if weight > 0 and len(found) > 1:
            lex = LexicalIndex.build([r[2] for r in found])
            s = s + weight * np.stack([relative(lex.scores(queries[i])) for i in idx])  # type: ignore[index]
        out[idx] = paths[np.argmax(s, axis=1)]  # ties: the document's first window
    return out


def route_rows(
    reg: Registry, rows: Sequence[dict[str, Any]], queries: Sequence[str], progress: Progress | None = None
) -> None:
    """Set "path" and "l1" on new prompt rows (each with its "doc_id") in place: each is routed by
    `route_prompts` from its query (`queries[i]`, the text a user would type: a question without its
    chat template), embedded with the bank's embedder."""
    if not rows:
        return
    queries = list(queries)
    x = get_embedder(reg.config.embedder).encode(queries, progress=progress)
    for m, path in zip(rows, route_prompts(reg, x, [m["doc_id"] for m in rows], queries=queries), strict=True):
        m["path"] = ",".join(map(str, path))
        m["l1"] = int(path[0])


def _window_arrays(rows: Sequence[tuple[Any, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """(path, embedding, ...) rows of the windows table -> (N, dim) float32 embeddings, (N, p) paths."""
    vecs = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1)
    paths = np.array([[int(v) for v in r[0].split(",")] for r in rows], dtype=np.int64)
    return vecs, paths


def _best(cand: np.ndarray, s: np.ndarray, ok: np.ndarray | None = None) -> int:
    """Index of the highest score among cand (first among ties), -1 when none is allowed."""
    if ok is not None:
        keep = ok[cand]
        cand, s = cand[keep], s[keep]
    if len(cand) == 0:
        return -1
    return int(cand[int(np.argmax(s))])


class Router:
    """Routes embeddings by the bank's rule. `index` is needed for `nearest` (None for `tree`). The
    contexts' texts, where a method takes them, let a `nearest` bank with a lexical weight score
    windows by words as well; without them, or in any other bank, routing reads the embeddings alone.
    The relevance gate (`similarity`, `calibrate`) always reads the cosine."""

    def __init__(self, tree: Tree, routing: str, index: WindowIndex | None = None) -> None:
        self.tree = tree
        self.routing = check_routing(routing)
        if routing == "nearest" and index is None:
            raise ValueError("nearest routing needs the bank's window index")
        self.index = index

    @staticmethod
    def for_bank(
        reg: Registry, tree: Tree | None = None, lexical: float | None = None, allow: frozenset[str] | None = None
    ) -> Router:
        """`lexical`: the words' weight in `nearest` routing (None: the bank's own); `allow`: the session's
        access tags, whose hidden documents' words weigh nothing (WindowIndex.from_registry)."""
        tree = tree if tree is not None else reg.load_tree()
        routing = reg.config.routing
        index = WindowIndex.from_registry(reg, tree, lexical, allow) if routing == "nearest" else None
        return Router(tree, routing, index)

    def _nearest_ready(self) -> bool:
        return self.routing == "nearest" and self.index is not None and len(self.index) > 0

    def route(self, x: np.ndarray, texts: Sequence[str] | None = None) -> np.ndarray:
        """(B, dim), their B texts -> (B, p) node per level."""
        x = np.asarray(x, dtype=np.float32)
        if not self._nearest_ready():  # a bank with no window yet has only its tree to go by
            return route(self.tree, x)
        assert self.index is not None
        return self.index.paths[self.index.nearest(self.tree, x, texts)]

    def similarity(self, x: np.ndarray, paths: np.ndarray) -> np.ndarray:
        """(B, dim), (B, p) -> (B,) the relevance gate's reading of each row: its cosine to the nearest
        window of the leaf it fetches (`nearest`), or to that leaf's centroid (`tree`); NaN where a row
        has no leaf (-1) or its leaf holds no window."""
        if not self._nearest_ready():
            return leaf_similarity(self.tree, x, paths)
        assert self.index is not None
        x = np.asarray(x, dtype=np.float32)
        out = np.full(len(x), np.nan, dtype=np.float64)
        starts = self.index.starts
        for i, leaf in enumerate(np.asarray(paths, dtype=np.int64)[:, -1].tolist()):
            if 0 <= leaf < len(starts) - 1 and starts[leaf + 1] > starts[leaf]:
                out[i] = float((self.index.vecs[starts[leaf] : starts[leaf + 1]] @ x[i]).max())
        return out

    def calibrate(self, windows: np.ndarray) -> float:
        """The gate's floor from a sample of the bank's own window embeddings (memctl.core.relevance):
        `nearest`: NEAREST_SHARE times the median cosine of a window to its nearest *other* window;
        `tree`: the leaf-centroid calibration."""
        if not self._nearest_ready():
            return calibrate(self.tree, windows)
        assert self.index is not None
        if len(self.index) < 2 or len(windows) == 0:
            return 0.0
        step = max(1, -(-len(windows) // CALIBRATION_NEAREST))
        found = self.index.scores(self.tree, windows[::step])
        second = [float(np.partition(s, -2)[-2]) for _c, s in found if len(s) > 1]
        return float(NEAREST_SHARE * np.median(second)) if second else 0.0

    def route_avoiding(self, x: np.ndarray, blocked: set[tuple[int, int]], text: str | None = None) -> np.ndarray:
        """x (dim,), its text -> (p,): the route that enters no blocked (level, node): for `nearest`, the
        path of the best window none of whose nodes is blocked; -1 at every level when there is none."""
        if not self._nearest_ready():
            return route_avoiding(self.tree, x, blocked)
        assert self.index is not None
        paths = self.index.paths
        ok = np.ones(len(paths), dtype=bool)
        for lvl, node in blocked:
            ok &= paths[:, lvl - 1] != node
        q = np.asarray(x, dtype=np.float32).reshape(1, -1)
        # exhaustive: the nearest leaves may be the blocked ones
        texts = None if text is None else [text]
        ((cand, s),) = self.index.scores(self.tree, q, exact_limit=len(paths), texts=texts)
        best = _best(cand, s, ok)
        return paths[best].copy() if best >= 0 else np.full(self.tree.p, -1, dtype=np.int64)

    def beam(self, x: np.ndarray, n: int, texts: Sequence[str] | None = None) -> np.ndarray:
        """(B, dim), their B texts -> (B, n, p): the n best leaves, best first (`nearest`: the leaves of
        the best windows, each leaf once); with fewer leaves than n the last path repeats."""
        if not self._nearest_ready():
            return route_beam(self.tree, x, n)
        assert self.index is not None
        x = np.asarray(x, dtype=np.float32)
        n = max(1, n)
        out = np.empty((len(x), n, self.tree.p), dtype=np.int64)
        for i, (cand, s) in enumerate(self.index.scores(self.tree, x, texts=texts)):
            order = cand[np.argsort(-s, kind="stable")]
            leaves = self.index.paths[order, -1]
            _, first = np.unique(leaves, return_index=True)
            kept = [self.index.paths[order[j]] for j in sorted(first)[:n]]
            kept += [kept[-1]] * (n - len(kept))
            out[i] = np.stack(kept)
        return out
