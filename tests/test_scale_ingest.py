"""Large corpora: the chunked ingest equals a one-chunk ingest, fails without leaving anything
half-written, and the faiss and numpy k-means backends agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tree_digest

from memctl.build.ingest import ingest
from memctl.core.errors import InputError
from memctl.core.tree import Tree, balanced_kmeans, build_tree, route
from memctl.registry import Registry

faiss = pytest.importorskip("faiss")


def snapshot(home: Path, name: str = "b") -> dict[str, Any]:
    reg = Registry.open(name, home)
    db = reg.db
    docs = [tuple(r) for r in db.execute("select id, sha256, n_chars, tags from documents order by id")]
    wins = [
        tuple(r)
        for r in db.execute("select id, doc_id, idx, char_start, char_end, text, n_tokens, path, l1 from windows")
    ]
    emb = [np.frombuffer(r[0], dtype=np.float32) for r in db.execute("select embedding from windows order by id")]
    tree = reg.load_tree()
    blocks = [tuple(r) for r in db.execute("select id, level, idx, rank, state from blocks order by id")]
    out = {"docs": docs, "windows": wins, "emb": np.stack(emb), "tree": tree, "blocks": blocks, "config": reg.config}
    reg.close()
    return out


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["docs"] == b["docs"] and a["windows"] == b["windows"] and a["blocks"] == b["blocks"]
    assert a["config"] == b["config"]
    np.testing.assert_array_equal(a["emb"], b["emb"])
    ta, tb = a["tree"], b["tree"]
    for ca, cb, sa, sb in zip(ta.centroids, tb.centroids, ta.sizes, tb.sizes, strict=True):
        np.testing.assert_allclose(ca, cb, atol=1e-6)
        np.testing.assert_array_equal(sa, sb)


def opts(anchor: Path, home: Path, chunk: int, **extra: Any) -> dict[str, Any]:
    return {"anchor": str(anchor), "embedder": "hash", "home": home, "chunk": chunk, **extra}


@pytest.mark.parametrize("tree", [(2, 2), None])
def test_chunked_ingest_equals_one_chunk(corpus: Path, tiny_anchor: Path, tmp_path: Path, tree: Any) -> None:
    dup = tmp_path / "dup"
    dup.mkdir()
    (dup / "copy.txt").write_text((corpus / "metals" / "0.txt").read_text())  # same text, other id
    snaps = []
    for chunk in (3, 10**6):
        home = tmp_path / f"home{chunk}"
        res = ingest("b", [corpus, dup], tree=tree, **opts(tiny_anchor, home, chunk))
        assert res.docs_added == 12 and res.docs_skipped == 1 and res.created and res.reclustered
        snaps.append(snapshot(home))
    assert len(snaps[0]["windows"]) >= 12
    assert all(w[7] and w[8] >= 0 for w in snaps[0]["windows"])  # every window routed
    assert_same(*snaps)


def test_chunked_second_ingest_reclusters_like_one_chunk(corpus: Path, tiny_anchor: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    for i in range(7):
        (extra / f"x{i}.txt").write_text(f"Cobalt note {i}: a metal used in magnets.\n\nBatteries hold cobalt {i}.")
    snaps = []
    for chunk in (2, 10**6):
        home = tmp_path / f"home{chunk}"
        ingest("b", [corpus], tree=(2, 2), **opts(tiny_anchor, home, chunk))
        res = ingest("b", [extra, corpus], home=home, chunk=chunk, tags=frozenset({"team"}))
        assert (res.docs_added, res.docs_skipped, res.tagged, res.reclustered) == (7, 12, 12, True)
        snaps.append(snapshot(home))
    assert_same(*snaps)
    # routes stored for the old windows are those of the new tree
    s = snaps[0]
    routes = route(s["tree"], s["emb"])
    assert [w[7] for w in s["windows"]] == [",".join(map(str, p)) for p in routes.tolist()]


def test_a_bad_file_late_in_the_stream_leaves_nothing(corpus: Path, tiny_anchor: Path, tmp_path: Path) -> None:
    many = tmp_path / "many"
    many.mkdir()
    for i in range(300):  # more than the documents read ahead before the model loads
        (many / f"d{i:03d}.txt").write_text(f"Document number {i} talks about item {i % 17}.")
    (many / "zzz.txt").write_bytes("caf\xe9".encode("latin-1"))
    home = tmp_path / "home"
    home.mkdir()
    before = tree_digest(home)  # no file: the staging directory is gone too
    with pytest.raises(InputError, match="not UTF-8"):
        ingest("b", [many], tree=(2, 2), **opts(tiny_anchor, home, 16))
    assert tree_digest(home) == before and not Registry.exists("b", home)
    ingest("b", [corpus], tree=(2, 2), **opts(tiny_anchor, home, 16))
    before = tree_digest(home / "banks")
    with pytest.raises(InputError, match="not UTF-8"):
        ingest("b", [many], home=home, chunk=16)
    assert tree_digest(home / "banks") == before


def test_an_id_repeated_with_other_text_across_chunks_fails(tiny_anchor: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d, text in ((a, "Tin is a soft metal."), (b, "Lead is a heavy metal.")):
        d.mkdir()
        (d / "same.txt").write_text(text)
    home = tmp_path / "home"
    with pytest.raises(InputError, match="appears twice with different text"):
        ingest("b", [a, b], tree=(2, 1), **opts(tiny_anchor, home, 1))
    assert not Registry.exists("b", home)


def blobs(n: int, dim: int = 24, centres: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centres, dim))
    x = c[rng.integers(centres, size=n)] + 0.3 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_faiss_and_numpy_kmeans_agree() -> None:
    x = blobs(3000)
    ca, aa = balanced_kmeans(x, 6, np.random.default_rng(3), backend="numpy")
    cb, ab = balanced_kmeans(x, 6, np.random.default_rng(3), backend="faiss")
    np.testing.assert_array_equal(aa, ab)
    np.testing.assert_allclose(ca, cb, atol=1e-5)
    ta, tb = build_tree(x, 4, 2, seed=1, backend="numpy"), build_tree(x, 4, 2, seed=1, backend="faiss")
    np.testing.assert_array_equal(route(ta, x), route(tb, x))
    for a, b in zip(ta.centroids, tb.centroids, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def reference_route(tree: Tree, x: np.ndarray) -> np.ndarray:
    """Per-row greedy descent, written the slow obvious way."""
    out = np.empty((len(x), tree.p), dtype=np.int64)
    for i, v in enumerate(x):
        node = 0
        for lvl in range(tree.p):
            kids = np.arange(node * tree.k, (node + 1) * tree.k)
            d = ((tree.centroids[lvl][kids] - v) ** 2).sum(1)
            node = out[i, lvl] = kids[int(np.argmin(d))]
    return out


def test_batched_route_matches_per_row_descent_in_any_chunking() -> None:
    x = blobs(700, seed=4)
    t = build_tree(x, 3, 3, seed=0)
    q = blobs(300, seed=5)
    want = reference_route(t, q)
    np.testing.assert_array_equal(route(t, q), want)
    np.testing.assert_array_equal(route(t, q, chunk=7), want)
    np.testing.assert_array_equal(route(t, q[:1]), want[:1])


def test_batched_token_counts_give_the_same_windows(tiny_anchor: Path) -> None:
    from transformers import AutoTokenizer

    from memctl.build.corpus import Document, paragraphs, split_windows
    from memctl.build.stream import TokenCounter

    tok = AutoTokenizer.from_pretrained(tiny_anchor)
    texts = [
        "Iron is a metal.\n\nIt is used in steel. " * 6,
        "  Hydrogen was discovered in 1766.  ",
        " ".join(f"w{i}" for i in range(200)),
    ]
    docs = [Document(str(i), t, "s", "t") for i, t in enumerate(texts)]
    plain = TokenCounter(tok)
    batched = TokenCounter(tok)
    batched.prime([p for d in docs for p in paragraphs(d.text)])
    assert batched.memo
    for d in docs:
        assert split_windows(d, 24, batched) == split_windows(d, 24, plain)
