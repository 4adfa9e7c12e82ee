"""Hierarchical balanced k-means and greedy routing (numpy, seeded; knows no files or SQL).

Large inputs (at least `FAISS_MIN_POINTS` points per k-means) use faiss for the nearest-centre
assignment, where the time goes; seeding, balancing and centre updates stay numpy and seeded, so
both backends follow the same algorithm (they can differ only on exact distance ties).

Node numbering: level l (1-based) has k**l nodes; node i at level l has children
i*k + j (j < k) at level l+1. A route is the tuple of node indices (i1, ..., ip), one per level.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

Progress = Callable[[str, int, int], None]
Backend = Literal["auto", "numpy", "faiss"]
Assign = Callable[[np.ndarray, np.ndarray], np.ndarray]
FAISS_MIN_POINTS = 2048  # below this, numpy (small corpora stay bit-comparable with earlier banks)
_ROWS = 16384  # rows per chunk of the temporaries in k-means++ seeding


@dataclass
class Tree:
    k: int
    p: int
    centroids: list[np.ndarray]  # level l-1 -> (k**l, dim) float32
    sizes: list[np.ndarray]  # level l-1 -> (k**l,) int64, training windows per node

    @property
    def dim(self) -> int:
        return int(self.centroids[0].shape[1])


def _kmeans_pp(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding; with fewer distinct points than k the rest repeat the first centre."""
    n = x.shape[0]
    centres = np.empty((k, x.shape[1]), dtype=np.float32)
    centres[0] = x[rng.integers(n)]
    d2 = _sq_dist(x, centres[0])
    for c in range(1, k):
        total = float(d2.sum())
        if total <= 1e-12:
            centres[c:] = centres[0]
            break
        idx = int(rng.choice(n, p=d2 / total))
        centres[c] = x[idx]
        d2 = np.minimum(d2, _sq_dist(x, centres[c]))
    return centres


def _sq_dist(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """((x - c)**2).sum(1), in row chunks: the same numbers without an (N, dim) temporary."""
    out = np.empty(x.shape[0], dtype=x.dtype)
    for s in range(0, x.shape[0], _ROWS):
        out[s : s + _ROWS] = ((x[s : s + _ROWS] - c) ** 2).sum(1)
    return out


def _assign(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    # squared L2 without the constant |x|^2 term; ties go to the lowest index
    scores = (centres**2).sum(1)[None, :] - 2.0 * x @ centres.T  # (N, k)
    return scores.argmin(1)


def _assign_faiss(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Nearest centre by faiss's exhaustive L2 search (same result as `_assign` up to exact ties)."""
    import faiss

    index = faiss.IndexFlatL2(centres.shape[1])
    index.add(np.ascontiguousarray(centres, dtype=np.float32))
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # measured on 2 busy cores: 1 thread 1.6x faster than numpy, 2 threads 2x slower
    try:
        _, nearest = index.search(np.ascontiguousarray(x, dtype=np.float32), 1)
    finally:
        faiss.omp_set_num_threads(threads)
    return nearest[:, 0].astype(np.int64)


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def assigner(backend: Backend, n: int) -> Assign:
    """The nearest-centre step for a k-means over `n` points."""
    if backend == "faiss" or (backend == "auto" and n >= FAISS_MIN_POINTS and faiss_available()):
        return _assign_faiss
    return _assign


def _balance(assign: np.ndarray, k: int, limit: float, rng: np.random.Generator) -> np.ndarray:
    """While a cluster holds more than `limit` of the members, give half of its
    assignments (chosen at random) to the smallest cluster (Jegou et al. 2010)."""
    n = assign.shape[0]
    cap = limit * n
    for _ in range(4 * k):
        counts = np.bincount(assign, minlength=k)
        big = int(counts.argmax())
        if counts[big] <= cap or counts[big] < 2:
            break
        small = int(counts.argmin())
        members = np.flatnonzero(assign == big)
        moved = rng.choice(members, size=len(members) // 2, replace=False)
        assign[moved] = small
    return assign


def balanced_kmeans(
    x: np.ndarray,
    k: int,
    rng: np.random.Generator,
    iters: int = 20,
    balance: float = 1.5,
    backend: Backend = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """k-means++ init, EM with balancing at every assignment step. Returns (centres (k,d), assign (N,))."""
    n = x.shape[0]
    if n == 0:
        raise ValueError("balanced_kmeans needs at least one point")
    nearest = assigner(backend, n)
    centres = _kmeans_pp(x, k, rng)
    assign = nearest(x, centres)
    for _ in range(iters):
        assign = _balance(assign, k, balance / k, rng) if n >= k else assign
        new = centres.copy()
        for c in range(k):
            members = x[assign == c]
            if len(members):
                new[c] = members.mean(0)
        converged = np.allclose(new, centres)
        centres = new
        if converged:
            break
        assign = nearest(x, centres)
    # the final assignment is what routing will reproduce: nearest centre, ties to the lowest index
    # (numpy on every backend, so exact ties resolve as `route` resolves them)
    return centres.astype(np.float32), _assign(x, centres)


def build_tree(
    x: np.ndarray,
    k: int,
    p: int,
    seed: int = 0,
    iters: int = 20,
    balance: float = 1.5,
    progress: Progress | None = None,
    backend: Backend = "auto",
) -> Tree:
    """Cluster L2-normalised embeddings `x` (N, dim) root to leaves.

    Each node's members are the points *routed* to it (greedy), so training data and
    inference traffic see the same tree. A node with no members gets children equal to
    its own centroid (never preferred by routing, whose ties go to the lowest index).
    `backend` picks the nearest-centre step of each k-means (see `assigner`).
    `x` may be a read-only memmap: it is read, never copied whole.
    """
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    n, dim = x.shape
    centroids: list[np.ndarray] = []
    members = [np.arange(n)]  # indices of points at each node of the current level
    parent_centres = np.zeros((1, dim), dtype=np.float32)
    total_nodes = sum(k**lvl for lvl in range(p))
    done = 0
    for level in range(1, p + 1):
        level_c = np.empty((k**level, dim), dtype=np.float32)
        next_members: list[np.ndarray] = []
        for node, idx in enumerate(members):
            rng = np.random.default_rng([seed, level, node])
            if len(idx) == 0:
                level_c[node * k : (node + 1) * k] = parent_centres[node]
                next_members.extend(np.empty(0, dtype=np.int64) for _ in range(k))
            else:
                xs = x if len(idx) == n else x[idx]  # the root's members are all of x: no copy
                centres, assign = balanced_kmeans(xs, k, rng, iters, balance, backend)
                level_c[node * k : (node + 1) * k] = centres
                next_members.extend(idx[assign == c] for c in range(k))
            done += 1
            if progress:
                progress("cluster", done, total_nodes)
        centroids.append(level_c)
        members = next_members
        parent_centres = level_c
    tree = Tree(k=k, p=p, centroids=centroids, sizes=[])
    routes = route(tree, x)
    tree.sizes = [np.bincount(routes[:, lvl], minlength=k ** (lvl + 1)) for lvl in range(p)]
    return tree


def route(tree: Tree, x: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Greedy descent: at each level compare with the k children of the current node.

    x: (B, dim) -> (B, p) int64 node indices per level. O(p*k) comparisons per row, done as one
    matmul per (level, parent node) over the rows at that node; ties go to the lowest index.
    BLAS runs single-threaded here: these matmuls are small, and threads only add contention
    (measured on 2 busy cores: 15k windows/s with 2 BLAS threads, over 300k with 1).
    """
    x = np.asarray(x, dtype=np.float32)
    if x.shape[0] < 256:  # a few queries: small matmuls that BLAS keeps on one thread anyway
        return _route(tree, x, chunk)
    with _blas_controller().limit(limits=1, user_api="blas"):
        return _route(tree, x, chunk)


@lru_cache(maxsize=1)
def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()  # finding the loaded BLAS libraries is the slow part: once


def _route(tree: Tree, x: np.ndarray, chunk: int) -> np.ndarray:
    out = np.empty((x.shape[0], tree.p), dtype=np.int64)
    k = tree.k
    for s in range(0, x.shape[0], chunk):
        xb = x[s : s + chunk]  # (b, dim)
        b = xb.shape[0]
        node = np.zeros(b, dtype=np.int64)
        for lvl in range(tree.p):
            cents = tree.centroids[lvl]  # (k**(lvl+1), dim)
            if lvl == 0:
                node = _nearest_child(xb, cents[:k], 0)
            else:
                order = np.argsort(node, kind="stable")
                parents, starts = np.unique(node[order], return_index=True)
                ends = np.append(starts[1:], b)
                nxt = np.empty(b, dtype=np.int64)
                for par, st, en in zip(parents.tolist(), starts.tolist(), ends.tolist(), strict=True):
                    rows = order[st:en]
                    nxt[rows] = _nearest_child(xb[rows], cents[par * k : (par + 1) * k], par * k)
                node = nxt
            out[s : s + b, lvl] = node
    return out


def _nearest_child(xb: np.ndarray, kids: np.ndarray, first: int) -> np.ndarray:
    """(b, dim) rows, (k, dim) children numbered from `first` -> (b,) nearest child index."""
    d2 = (kids**2).sum(1)[None, :] - 2.0 * (xb @ kids.T)  # (b, k)
    return first + d2.argmin(1)


def subtree_of(level_index: int, node: int, k: int) -> int:
    """Level-1 ancestor of `node` at `level_index` (1-based)."""
    return node // (k ** (level_index - 1))


def nodes_to_block(tree: Tree, fraction: float) -> list[int]:
    """How many nodes per level make up `fraction` of the bank: ceil(fraction * k**l) at level l
    (at least one per level for any fraction > 0, as blocking 'the best-matching part' implies)."""
    return [min(tree.k ** (lvl + 1), math.ceil(fraction * tree.k ** (lvl + 1) - 1e-9)) for lvl in range(tree.p)]


def best_matching(tree: Tree, x: np.ndarray, fraction: float) -> list[tuple[int, int]]:
    """The `fraction` of the bank that best matches embedding x (dim,): at every level, the
    nodes whose centroids are nearest x (the paper's adversarial memory blocking). Returns
    (level, node) pairs, level 1-based, nearest first within a level."""
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    out: list[tuple[int, int]] = []
    for lvl, n in enumerate(nodes_to_block(tree, fraction)):
        if n <= 0:
            continue
        c = tree.centroids[lvl]  # (k**l, dim)
        d2 = (c**2).sum(1) - 2.0 * c @ x
        order = np.argsort(d2, kind="stable")[:n]
        out.extend((lvl + 1, int(i)) for i in order)
    return out


def route_beam(tree: Tree, x: np.ndarray, beam: int) -> np.ndarray:
    """The `beam` best leaves of each row by beam search down the tree: at each level keep the
    `beam` nearest among the children of the nodes kept. x (B, dim) -> (B, beam, p), best first;
    beam 1 is the greedy `route`. With fewer leaves than `beam`, the last path repeats."""
    x = np.asarray(x, dtype=np.float32)
    k, b = tree.k, max(1, beam)
    out = np.empty((x.shape[0], b, tree.p), dtype=np.int64)
    for i, q in enumerate(x):
        kept: list[tuple[int, ...]] = [()]
        for lvl in range(tree.p):
            cand = [(*path, (path[-1] if path else 0) * k + j) for path in kept for j in range(k)]
            c = tree.centroids[lvl][[p[-1] for p in cand]]
            d2 = (c**2).sum(1) - 2.0 * c @ q
            kept = [cand[j] for j in np.argsort(d2, kind="stable")[:b]]
        kept += [kept[-1]] * (b - len(kept))
        out[i] = np.array(kept, dtype=np.int64)
    return out


def route_avoiding(tree: Tree, x: np.ndarray, blocked: set[tuple[int, int]]) -> np.ndarray:
    """Greedy routing that never enters a blocked node: at each level the nearest child that is not
    blocked (the paper's blocking 'during retrieval'). x (dim,) -> (p,) node per level, -1 from the
    level where every child is blocked."""
    q = np.asarray(x, dtype=np.float32).reshape(-1)
    out = np.full(tree.p, -1, dtype=np.int64)
    node = 0
    for lvl in range(tree.p):
        child = node * tree.k + np.arange(tree.k)
        c = tree.centroids[lvl][child]
        d2 = (c**2).sum(1) - 2.0 * c @ q
        free = [int(child[j]) for j in np.argsort(d2, kind="stable") if (lvl + 1, int(child[j])) not in blocked]
        if not free:
            break
        node = out[lvl] = free[0]
    return out
