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

Between "unrelated" and "about the bank" the gate ramps rather than cuts (`anchor_share`): a context
just above the floor is answered on a mixture of the memories' and the anchor's next-token
distributions (memctl.model.mix), the anchor's share falling from all of it at the floor to none at
`RELEVANCE_RAMP` times the floor. foldoc's computing definitions lie so close to Python docstrings that
some docstrings read above its floor and met memories that rewrote them (+3.4% perplexity over 27,
+11.9% on the 7 that passed); the ramp gives those back to the anchor in part while the probes, which
read about twice the floor and more, keep the memories alone (docs/corpora.md).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import InputError
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
# The anchor's share ramps from 1 at the floor to 0 at this multiple of it (1: a hard gate, no ramp). The
# probes' readings, as multiples of the floor (docs/corpora.md): the lowest 2.0 on elements, 1.4 on fictional
# (its 5% quantile 1.9), 1.6 on foldoc (its 10% quantile about 2); foldoc's unrelated docstrings reach 2.3.
RELEVANCE_RAMP = 2.0
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


def check_ramp(ramp: float) -> float:
    if not 1 <= ramp < math.inf:  # NaN fails too
        raise InputError(
            f"--relevance-ramp is a multiple of the relevance floor, 1 (a hard gate) or more and finite; got {ramp}"
        )
    return float(ramp)


def anchor_share(sims: np.ndarray, floor: float, ramp: float) -> np.ndarray:
    """(B,) gate readings -> (B,) the anchor's share of each next-token distribution: 1 at the floor and
    below (rows the gate leaves to the anchor alone), 0 at `ramp` times the floor and above, linear between.
    Zeros where there is no ramp (ramp 1) or no gate (floor 0); NaN (no leaf) reads as unrelated: 1."""
    sims = np.asarray(sims, dtype=np.float64)
    if floor <= 0 or ramp <= 1:
        return np.zeros(sims.shape, dtype=np.float64)
    top = ramp * floor
    share = np.clip((top - sims) / (top - floor), 0.0, 1.0)
    return np.where(np.isnan(sims), 1.0, share)


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
