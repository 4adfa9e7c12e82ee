"""Hierarchical balanced k-means and greedy routing."""

from __future__ import annotations

import numpy as np

from memctl.core.config import EXTRA_LEVEL_MIN_RANK, default_ranks, default_shape, default_tree, resolve_shape
from memctl.core.tree import balanced_kmeans, build_tree, route


def _points(n: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_tree_is_deterministic_for_a_seed() -> None:
    x = _points(400)
    a, b = build_tree(x, 4, 3, seed=5), build_tree(x, 4, 3, seed=5)
    for ca, cb in zip(a.centroids, b.centroids, strict=True):
        assert np.array_equal(ca, cb)
    assert np.array_equal(route(a, x), route(b, x))
    c = build_tree(x, 4, 3, seed=6)
    assert not all(np.array_equal(ca, cc) for ca, cc in zip(a.centroids, c.centroids, strict=True))


def test_levels_have_k_to_the_l_nodes_and_routes_nest() -> None:
    x = _points(300)
    t = build_tree(x, 3, 3, seed=0)
    assert [c.shape[0] for c in t.centroids] == [3, 9, 27]
    r = route(t, x)
    assert r.shape == (300, 3)
    assert np.array_equal(r[:, 1] // 3, r[:, 0]) and np.array_equal(r[:, 2] // 3, r[:, 1])
    assert [int(s.sum()) for s in t.sizes] == [300, 300, 300]


def test_balancing_caps_clusters_on_skewed_data() -> None:
    rng = np.random.default_rng(1)
    # 90% of points in one tight blob: plain k-means would put most of them in one cluster
    blob = rng.normal(size=(900, 8)) * 0.01 + 1.0
    rest = rng.normal(size=(100, 8))
    x = np.concatenate([blob, rest]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    _, plain = balanced_kmeans(x, 4, np.random.default_rng(0), iters=20, balance=100.0)  # no balancing
    assert np.bincount(plain, minlength=4).max() > 0.85 * len(x)
    _, assign = balanced_kmeans(x, 4, np.random.default_rng(0), iters=20, balance=1.5)
    counts = np.bincount(assign, minlength=4)
    # the final assignment is nearest-centre (what routing reproduces); balancing moved centres into the blob
    assert counts.max() <= 1.5 / 4 * len(x), counts
    t = build_tree(x, 4, 1, seed=0)
    assert int((t.sizes[0] > 0).sum()) >= 3


def test_route_matches_brute_force_greedy_descent() -> None:
    x = _points(200, seed=3)
    t = build_tree(x, 4, 2, seed=0)
    q = _points(50, seed=9)
    got = route(t, q)
    for i, v in enumerate(q):
        n1 = int(np.argmin(((t.centroids[0] - v) ** 2).sum(1)))
        kids = t.centroids[1][n1 * 4 : n1 * 4 + 4]
        n2 = n1 * 4 + int(np.argmin(((kids - v) ** 2).sum(1)))
        assert (got[i] == [n1, n2]).all()


def test_tiny_corpora_still_route_everything() -> None:
    x = _points(3)
    t = build_tree(x, 4, 2, seed=0)
    r = route(t, x)
    assert len({tuple(p) for p in r}) == 3  # each point alone in its leaf


def test_default_tree_keeps_a_few_windows_per_leaf() -> None:
    for n in (40, 118, 1000, 20000):
        k, p = default_tree(n)
        assert 2 <= k <= 16 and 1 <= p <= 4
        assert 2 <= n / k**p <= 32, (n, k, p)


def test_default_shape_splits_leaves_once_more_where_the_budget_keeps_ranks() -> None:
    anchor = {"n_layers": 30, "hidden": 576, "anchor_params": 134_515_008}  # SmolLM2-135M, memories in all layers
    # the four benchmark corpora's window counts: each leaf of ~8 windows split once more
    assert default_shape(73, **anchor) == (3, 3, (144, 72, 32))
    assert default_shape(118, **anchor) == (4, 3, (72, 32, 16))
    assert default_shape(356, **anchor) == (7, 3, (24, 11, 4))
    for n in (73, 118, 356, 5000, 20000):
        k, p, ranks = default_shape(n, **anchor)
        assert len(ranks) == p
        assert (k, p) == default_tree(n) or (k, p - 1) == default_tree(n)
        if p > default_tree(n)[1]:
            assert min(ranks) >= EXTRA_LEVEL_MIN_RANK
            assert default_ranks(k, p, 30, 576, 134_515_008) == ranks
    # a deeper tree would leave its leaves rank 1 under the budget: the leaves of ~8 windows stay
    assert default_shape(1000, **anchor) == (11, 2, (32, 16))
    # with memories in fewer layers the budget leaves room for the extra level
    assert default_shape(1000, n_layers=10, hidden=576, anchor_params=134_515_008)[:2] == (11, 3)
    # a corpus with no room for a hierarchy keeps its single level
    assert default_shape(20, **anchor)[1] == 1


def test_resolve_shape_keeps_what_the_user_gave() -> None:
    dims = (30, 576, 134_515_008)
    assert resolve_shape(118, None, None, *dims) == default_shape(118, *dims)
    assert resolve_shape(118, (4, 2), None, *dims) == (4, 2, (168, 80))  # the tree given, the budget's ranks
    assert resolve_shape(118, (5, 2), (8, 4), *dims) == (5, 2, (8, 4))  # both given: as given
    # ranks alone: default_tree's k, at its depth or one level deeper, as the ranks count
    assert resolve_shape(118, None, (64, 32), *dims) == (4, 2, (64, 32))
    assert resolve_shape(118, None, (48, 32, 16), *dims) == (4, 3, (48, 32, 16))
    assert resolve_shape(118, None, (8, 8, 8, 8), *dims)[1] == 2  # neither: ingest reports the mismatch
