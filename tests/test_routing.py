"""Routing rules: the nearest window's path (new banks) and the paper's greedy tree descent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tree_digest
from typer.testing import CliRunner

from memctl.build.routing import Router, WindowIndex, route_prompts
from memctl.cli import app
from memctl.core.config import BankConfig
from memctl.core.relevance import NEAREST_SHARE
from memctl.core.tree import Tree, route
from memctl.registry import Registry

runner = CliRunner()


def unit(*v: float) -> np.ndarray:
    a = np.array(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def misleading_tree() -> tuple[Tree, np.ndarray, np.ndarray]:
    """k=2, p=2 in 2-D. Subtree 0's centroid (1, 0) lies nearest the query (0.6, 0.8) at level 1, but
    the window most like the query, (0.5, 0.87), sits in leaf 2 under subtree 1: greedy descent
    goes wrong at the first level, the nearest window does not."""
    l1 = np.stack([unit(1, 0), unit(-1, 0.2)])
    l2 = np.stack([unit(1, -0.1), unit(1, 0.1), unit(0.5, 0.87), unit(-1, 0)])
    tree = Tree(k=2, p=2, centroids=[l1, l2], sizes=[])
    vecs = np.stack([unit(1, -0.1), unit(1, 0.1), unit(0.5, 0.87), unit(-1, 0)])
    paths = np.array([[0, 0], [0, 1], [1, 2], [1, 3]], dtype=np.int64)
    return tree, vecs, paths


def test_nearest_routing_takes_the_path_of_the_nearest_window_where_greedy_descent_goes_wrong() -> None:
    tree, vecs, paths = misleading_tree()
    q = unit(0.6, 0.8)[None]
    assert route(tree, q)[0].tolist() == [0, 1]  # greedy: subtree 0 at level 1, wrong
    nearest = Router(tree, "nearest", WindowIndex.build(vecs, paths, 4))
    assert nearest.route(q)[0].tolist() == [1, 2]
    assert Router(tree, "tree").route(q)[0].tolist() == [0, 1]
    # each window routes to its own path, so a window's prompts train the blocks its questions fetch
    assert nearest.route(vecs).tolist() == paths.tolist()


def test_inverted_file_search_agrees_with_exact_search_when_it_probes_every_leaf() -> None:
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(300, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    leaf_c = rng.normal(size=(9, 8)).astype(np.float32)
    tree = Tree(k=3, p=2, centroids=[leaf_c[::3].copy(), leaf_c], sizes=[])
    leaves = rng.integers(0, 9, size=300)
    paths = np.stack([leaves // 3, leaves], axis=1)
    index = WindowIndex.build(vecs, paths, 9)
    q = rng.normal(size=(20, 8)).astype(np.float32)
    exact = [int(c[np.argmax(s)]) for c, s in index.scores(tree, q)]
    probed = [int(c[np.argmax(s)]) for c, s in index.scores(tree, q, exact_limit=0, nprobe=9)]
    assert exact == probed
    brute = np.argmax(q @ vecs.T, axis=1)  # index order differs from input order: compare the vectors
    assert np.allclose(index.vecs[exact], vecs[brute]) and index.nearest(tree, q).tolist() == exact
    few = list(index.scores(tree, q, exact_limit=0, nprobe=2))
    assert all(len(c) < 300 for c, _ in few)  # only the windows of two leaves are scored


def test_routing_around_blocked_nodes_and_beams_of_distinct_leaves() -> None:
    tree, vecs, paths = misleading_tree()
    r = Router(tree, "nearest", WindowIndex.build(vecs, paths, 4))
    q = unit(0.6, 0.8)
    assert r.route_avoiding(q, {(2, 2)}).tolist() == [0, 1]  # leaf 2 blocked: the next nearest window's path
    assert r.route_avoiding(q, {(1, 1)}).tolist() == [0, 1]
    assert r.route_avoiding(q, {(1, 0), (1, 1)}).tolist() == [-1, -1]  # nothing left
    beams = r.beam(q[None], 3)[0]
    assert beams[:, 1].tolist() == [2, 1, 0]  # the leaves of the nearest windows, best first
    six = r.beam(q[None], 6)[0]
    assert sorted(six[:4, 1].tolist()) == [0, 1, 2, 3]  # four leaves, then the last path repeats
    assert six[4:].tolist() == [six[3].tolist()] * 2


def test_the_gate_reads_the_nearest_window_of_the_fetched_leaf_and_calibrates_on_neighbours() -> None:
    tree, vecs, paths = misleading_tree()
    r = Router(tree, "nearest", WindowIndex.build(vecs, paths, 4))
    q = unit(0.6, 0.8)[None]
    assert r.similarity(q, r.route(q))[0] == pytest.approx(float(unit(0.5, 0.87) @ q[0]), abs=1e-6)
    assert r.similarity(q, np.array([[0, 0]]))[0] == pytest.approx(float(unit(1, -0.1) @ q[0]), abs=1e-6)
    assert np.isnan(r.similarity(q, np.array([[-1, -1]]))[0])  # gated rows have no leaf
    second = []  # each window's cosine to its nearest other window, by hand
    for i in range(4):
        others = [float(vecs[i] @ vecs[j]) for j in range(4) if j != i]
        second.append(max(others))
    assert r.calibrate(vecs) == pytest.approx(NEAREST_SHARE * float(np.median(second)), abs=1e-6)
    t = Router(tree, "tree")
    assert t.similarity(q, t.route(q))[0] == pytest.approx(float(tree.centroids[1][1] @ q[0]), abs=1e-6)


def tiny_bank(home: Path, corpus: Path, tiny_anchor: Path, *extra: str) -> Registry:
    args = ["ingest", str(corpus), "--bank", "b", "--anchor", str(tiny_anchor), "--embedder", "hash", "--tree", "2,2"]
    res = runner.invoke(app, [*args, *extra])
    assert res.exit_code == 0, res.output
    return Registry.open("b", home)


def test_new_banks_route_by_nearest_window_and_older_configs_by_the_tree(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    reg = tiny_bank(home, corpus, tiny_anchor)
    assert reg.config.routing == "nearest"
    old = json.loads(reg.config.to_json())
    del old["routing"]
    assert BankConfig.from_json(json.dumps(old)).routing == "tree"
    rows = list(reg.db.query("select path, embedding from windows"))
    x = np.stack([np.frombuffer(r["embedding"], dtype=np.float32) for r in rows])
    own = [[int(v) for v in r["path"].split(",")] for r in rows]
    assert Router.for_bank(reg).route(x).tolist() == own
    reg.close()
    res = runner.invoke(
        app,
        ["ingest", str(corpus), "--bank", "t", "--anchor", str(tiny_anchor), "--embedder", "hash", "--tree", "2,2",
         "--routing", "tree"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert Registry.open("t", home).config.routing == "tree"


def test_training_prompts_take_the_nearest_window_of_their_own_document(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    """So that forgetting one document never moves where another's prompts train."""
    reg = tiny_bank(home, corpus, tiny_anchor)
    rows = list(reg.db.query("select doc_id, path, embedding from windows order by id"))
    vec = {r["doc_id"]: np.frombuffer(r["embedding"], dtype=np.float32) for r in rows}
    path = {r["doc_id"]: [int(v) for v in r["path"].split(",")] for r in rows}
    docs = sorted(vec)
    d, e = next((a, b) for a in docs for b in docs if path[a] != path[b])
    x = vec[d][None]  # a prompt that is d's window itself, written from e's document
    assert Router.for_bank(reg).route(x)[0].tolist() == path[d]  # a question goes to d
    assert route_prompts(reg, x, [e])[0].tolist() == path[e]  # e's prompt trains e's own path
    assert route_prompts(reg, x, [d])[0].tolist() == path[d]
    reg.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--routing", "closest"], "--routing must be one of nearest, tree"),
        (["--bank", "b", "--routing", "tree"], "only apply when a bank is created"),
        (["--lexical", "-1"], "--lexical must be between 0 and 10"),
        (["--lexical", "nan"], "--lexical must be between 0 and 10"),
        (["--lexical", "0.5", "--routing", "tree"], "--lexical weighs words in `nearest` routing"),
        (["--bank", "b", "--lexical", "0.5"], "only apply when a bank is created"),
    ],
)
def test_bad_routing_is_one_line_and_changes_nothing(
    home: Path, corpus: Path, tiny_anchor: Path, args: list[str], message: str
) -> None:
    res = runner.invoke(app, ["ingest", str(corpus), "--bank", "b", "--anchor", str(tiny_anchor), "--embedder", "hash"])
    assert res.exit_code == 0, res.output
    before = tree_digest(home)
    rest = [a for a in args if a not in ("--bank", "b")]
    res = runner.invoke(app, ["ingest", str(corpus), "--bank", "b" if "--bank" in args else "new", *rest])
    assert res.exit_code != 0
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], res.output
    assert tree_digest(home) == before
