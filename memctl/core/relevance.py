"""The relevance gate: memories serve contexts about the bank, and leave unrelated ones to the anchor.

Routing always finds a leaf, however unrelated the context: a Python docstring routed into an
element bank fetches the blocks of whichever chemistry cluster lies nearest, and those blocks,
trained to answer questions about their cluster, change how the anchor reads the docstring
(measured on the elements example: 27 unrelated documents 9.7% more perplexing with fetched
memories, against a 2% bar). Preservation training narrows that; it cannot close it at every scale.

The gate asks the embedder first. A context whose cosine similarity to the centroid of the leaf
it routed to is below the bank's floor fetches nothing and retrieves nothing (RAG): the anchor
answers alone, exactly as without memories. The floor is calibrated per bank from its own windows,
so it follows the embedder: `RELEVANCE_SHARE` times the median similarity of the bank's windows to
their own leaves (on the elements bank with MiniLM, 0.3 x 0.756 = 0.227; its 384 probe questions
lie at 0.33 and above, the 27 unrelated docstrings and some small talk at 0.16 and below). `min_relevance` overrides it;
0 turns the gate off.

That is the rule of a bank that routes by the tree. A bank that routes by its nearest window
(memctl.build.routing, the default for new banks) reads the cosine to the nearest window of the leaf it
fetches, a sharper test of "about the bank" than a centroid that averages a whole cluster, and
calibrates its floor on how close the bank's windows lie to one another (`NEAREST_SHARE`).

Pure numeric code over the tree's centroids; the registry read that samples the windows is
`memctl.serve.api.Memories.relevance_floor`.
"""

from __future__ import annotations

import numpy as np

from .tree import Tree, route

RELEVANCE_SHARE = 0.3  # floor = this share of the median window's similarity to its own leaf
# A bank that routes by its nearest window (memctl.build.routing) gates on the cosine to that window, and
# its floor is this share of the median cosine of a window to its nearest other window. Measured on
# three corpora with MiniLM (docs/corpora.md), as multiples of that median: the probes' lowest reading
# 0.63 (fictional), 0.70 (foldoc), 0.91 (elements); the 27 unrelated docstrings' highest 0.45, 1.05,
# 0.40 (foldoc's computing definitions lie close to Python docstrings). 0.6 would separate them
# best on these three, with no margin on fictional; a corpus of templated windows (tickets, forms)
# lies closer together than its questions lie to it, so the floor keeps a wide margin below.
NEAREST_SHARE = 0.45
CALIBRATION_WINDOWS = 4096  # windows sampled (evenly by id) to calibrate a bank's floor


def leaf_similarity(tree: Tree, x: np.ndarray, paths: np.ndarray) -> np.ndarray:
    """(B, dim) embeddings and their (B, p) routes -> (B,) cosine similarity of each row to the
    centroid of its leaf; NaN where the row has no leaf (-1)."""
    x = np.asarray(x, dtype=np.float32)
    leaf = np.asarray(paths, dtype=np.int64)[:, -1]
    out = np.full(x.shape[0], np.nan, dtype=np.float64)
    ok = leaf >= 0
    if ok.any():
        c = tree.centroids[-1][leaf[ok]].astype(np.float64)  # (b, dim)
        xv = x[ok].astype(np.float64)
        den = np.linalg.norm(c, axis=1) * np.linalg.norm(xv, axis=1)
        out[ok] = (c * xv).sum(1) / np.where(den > 0, den, 1.0)
    return out


def calibrate(tree: Tree, windows: np.ndarray, share: float = RELEVANCE_SHARE) -> float:
    """The floor for a bank whose windows embed as `windows` (N, dim): `share` times their median
    similarity to the leaf each routes to (0 for a bank without windows: nothing is gated)."""
    if len(windows) == 0:
        return 0.0
    sims = leaf_similarity(tree, windows, route(tree, windows))
    sims = sims[~np.isnan(sims)]
    return float(share * np.median(sims)) if sims.size else 0.0


def below_floor(sims: np.ndarray, floor: float) -> np.ndarray:
    """(B,) leaf similarities -> (B,) bool: rows the gate leaves to the anchor alone. A floor of 0 or
    less gates nothing; NaN (no leaf) counts as unrelated."""
    if floor <= 0:
        return np.zeros(len(sims), dtype=bool)
    return ~(np.asarray(sims) >= floor)


def unrelated(tree: Tree, x: np.ndarray, paths: np.ndarray, floor: float) -> np.ndarray:
    """(B,) bool: rows the gate leaves to the anchor alone (similarity to their leaf below `floor`)."""
    if floor <= 0:  # nothing to compare
        return np.zeros(len(paths), dtype=bool)
    return below_floor(leaf_similarity(tree, x, paths), floor)


def gate(paths: np.ndarray, off: np.ndarray) -> np.ndarray:
    """A copy of (B, p) or (B, n, p) paths where the rows in `off` fetch nothing (-1 at every level)."""
    out = np.array(paths, dtype=np.int64, copy=True)
    out[np.asarray(off, dtype=bool)] = -1
    return out


def sample_ids(lo: int, hi: int, limit: int = CALIBRATION_WINDOWS) -> list[int]:
    """Up to `limit` ids spread evenly over [lo, hi] (every id when there are no more than `limit`)."""
    if hi - lo + 1 <= limit:
        return list(range(lo, hi + 1))
    return sorted({int(v) for v in np.linspace(lo, hi, limit).round()})
