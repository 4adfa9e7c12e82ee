"""How often each routing rule sends a probe into a leaf that holds its document.

No model runs: only the embedder, the bank's tree and its windows. For each probe file, the share of
probes whose route ends in a leaf with a window of the probe's document, by rule:

* greedy:    the paper's descent (memctl.core.tree.route; `--routing tree`), the baseline;
* beam N:    any of the N leaves kept by a beam search down the tree (what `eval --beam N` fetches);
* flat leaf: the leaf whose centroid is nearest, compared with every leaf at once;
* nearest:   the leaf of the nearest window (memctl.build.routing, `--routing nearest`, exact search);
* nearest within N leaves: the same, searching only the windows of the N nearest leaves (what
  banks above memctl.build.routing.EXACT_WINDOWS windows do, with N = NPROBE);
* + words W: the nearest window by cosine plus W times the relative BM25 score of the probe's words
  (memctl.build.lexical; new banks route with W = 0.3, the first of --weights).

    python benchmarks/routing.py HOME BANK PROBES.jsonl [PROBES.jsonl ...] [--weights 0.3,0.1,0.5,1]
    python benchmarks/routing.py --corpora elements,fictional,foldoc,incidents --out DIR   # builds and ingests each
    python benchmarks/routing.py --scale 10000,100000,262144   # time only, random unit vectors

HOME is a MEMCTL_HOME (for example a home that benchmarks/corpora.py left under --out/homes). --corpora
builds each corpus with its example script (benchmarks/corpora.py's builds, --entities and --incidents at
their defaults) and ingests it into DIR/homes/CORPUS with memctl's defaults (window, tree, embedder;
no model is trained and no prompt written), then scores its main and question-form probes.
--scale times routing on synthetic banks of N random 384-d windows (tree 11x2): one query, 2,000
queries, and the relevance gate's calibration, nearest window against greedy descent (the baseline).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from memctl.build.embed import get_embedder
from memctl.build.lexical import DEFAULT_WEIGHT
from memctl.build.routing import Router, WindowIndex
from memctl.core.tree import Tree, route, route_beam
from memctl.registry import Registry


def synthetic_texts(rng: np.random.Generator, n: int, words: int = 120, vocab: int = 50_000) -> list[str]:
    """n texts of `words` words drawn from a Zipf-like vocabulary (a corpus's rare words are most of its words)."""
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    ids = rng.choice(vocab, size=(n, words), p=p)
    return [" ".join(f"w{v}" for v in row) for row in ids]


def scale(sizes: list[int], console: Console) -> None:
    rng = np.random.default_rng(0)
    table = Table(title="routing time on random banks (384-d windows of 120 Zipf words, tree 11x2, 2 CPU cores)")
    for c in ("windows", "index build s", "1 query: greedy ms", "nearest ms", "2,000 queries: greedy s", "nearest s",
              "nearest/greedy", "gate calibration s", "words' index build s", "1 query + words ms",
              "2,000 + words s", "+ words/nearest"):  # fmt: skip
        table.add_column(c, justify="right")
    for n in sizes:
        x = rng.normal(size=(n, 384)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        texts = synthetic_texts(rng, n)
        tree = Tree(k=11, p=2, centroids=[x[:11].copy(), x[:121].copy()], sizes=[])
        paths = route(tree, x)
        t = time.perf_counter()
        router = Router(tree, "nearest", WindowIndex.build(x, paths, 121))
        build = time.perf_counter() - t
        t = time.perf_counter()
        worded = Router(tree, "nearest", WindowIndex.build(x, paths, 121, texts, DEFAULT_WEIGHT))
        words_build = time.perf_counter() - t
        q = x[:2000] + 0.01 * rng.normal(size=(2000, 384)).astype(np.float32)
        questions = [" ".join(t.split()[:12]) for t in texts[:2000]]
        times = []

        def by_words(v: np.ndarray, r: Router = worded, qs: list[str] = questions) -> np.ndarray:
            return r.route(v, qs[: len(v)])

        for fn in (lambda v, t=tree: route(t, v), router.route, by_words):
            t = time.perf_counter()
            fn(q[:1])
            one = time.perf_counter() - t
            t = time.perf_counter()
            fn(q)
            times.append((one, time.perf_counter() - t))
        t = time.perf_counter()
        router.calibrate(x[:4096])
        cal = time.perf_counter() - t
        (g1, g), (n1, nn), (w1, ww) = times
        table.add_row(f"{n:,}", f"{build:.2f}", f"{1e3 * g1:.2f}", f"{1e3 * n1:.2f}", f"{g:.3f}", f"{nn:.3f}",
                      f"{nn / g:.0f}x", f"{cal:.2f}", f"{words_build:.2f}", f"{1e3 * w1:.2f}", f"{ww:.3f}",
                      f"{ww / nn:.1f}x")  # fmt: skip
    console.print(table)


def score_bank(home: Path, bank: str, probe_files: list[Path], weights: list[float], console: Console) -> None:
    """One table: each probe file's share of probes routed into a leaf with a window of its document, by rule."""
    reg = Registry.open(bank, home)
    tree = reg.load_tree()
    emb = get_embedder(reg.config.embedder)
    index = WindowIndex.from_registry(reg, tree, lexical=0.0)
    nearest = Router(tree, "nearest", index)
    texts = [r[0] for r in reg.db.execute("select text from windows")]
    t0 = time.perf_counter()
    worded = {w: Router(tree, "nearest", WindowIndex.from_registry(reg, tree, lexical=w)) for w in weights}
    build_s = (time.perf_counter() - t0) / max(1, len(weights))
    leaves: dict[str, set[int]] = {}
    for doc, path in reg.db.execute("select doc_id, path from windows"):
        leaves.setdefault(doc, set()).add(int(path.split(",")[-1]))
    n_leaves = len(tree.centroids[-1])
    title = (f"bank {bank}: {len(index)} windows, tree {tree.k}x{tree.p} ({n_leaves} leaves); the words' index "
             f"built in {build_s:.2f} s ({sum(len(t) for t in texts) / 1e6:.1f} M characters)")  # fmt: skip
    table = Table(title=title)
    table.add_column("probes")
    rules = ["greedy (base)", "beam 2", "beam 3", "flat leaf", "nearest"] + [
        f"nearest in {n} leaves" for n in (2, 4, 8) if n < n_leaves
    ]
    rules += [f"+ words {w:g}" for w in weights]
    for r in rules:
        table.add_column(r, justify="right")
    table.add_column("nearest/greedy", justify="right")
    table.add_column(f"+ words {weights[0]:g}/nearest" if weights else "-", justify="right")
    table.add_column("ms/probe (greedy, nearest, + words)", justify="right")
    for f in probe_files:
        probes = [json.loads(line) for line in Path(f).open() if line.strip()]
        probes = [p for p in probes if p["doc"] in leaves]
        prompts = [p["prompt"] for p in probes]
        x = emb.encode(prompts)

        def share(found: np.ndarray, probes: list = probes) -> float:  # found: (N,) or (N, n) leaves
            rows = zip(found, probes, strict=True)
            ok = [any(int(v) in leaves[p["doc"]] for v in np.atleast_1d(row)) for row, p in rows]
            return float(np.mean(ok))

        t0 = time.perf_counter()
        greedy = route(tree, x)[:, -1]
        t_greedy = time.perf_counter() - t0
        t0 = time.perf_counter()
        near = nearest.route(x)[:, -1]
        t_near = time.perf_counter() - t0
        beams = route_beam(tree, x, 3)[:, :, -1]
        c = tree.centroids[-1]
        flat = np.argmin((c**2).sum(1)[None, :] - 2.0 * x @ c.T, axis=1)
        row = [share(greedy), share(beams[:, :2]), share(beams), share(flat), share(near)]
        for n in (2, 4, 8):
            if n < n_leaves:
                found = [int(cand[np.argmax(s)]) for cand, s in index.scores(tree, x, exact_limit=0, nprobe=n)]
                best = np.array(found, dtype=np.int64)
                row.append(share(index.paths[best, -1]))
        t_words = 0.0
        for i, w in enumerate(weights):
            t0 = time.perf_counter()
            row.append(share(worded[w].route(x, prompts)[:, -1]))
            t_words = time.perf_counter() - t0 if i == 0 else t_words
        ratio = row[4] / row[0] if row[0] else float("inf")
        words_ratio = f"{row[-len(weights)] / row[4]:.2f}x" if weights and row[4] else "-"
        ms = f"{1e3 * t_greedy / len(x):.3f}, {1e3 * t_near / len(x):.3f}, {1e3 * t_words / len(x):.3f}"
        table.add_row(f"{Path(f).name} ({len(probes)})", *(f"{100 * v:.1f}%" for v in row), f"{ratio:.2f}x",
                      words_ratio, ms)  # fmt: skip
    reg.close()
    console.print(table)


def ingest_corpora(names: list[str], out: Path, console: Console) -> list[tuple[Path, str, list[Path]]]:
    """Each corpus built by its example script and ingested with memctl's defaults (no training)."""
    import os

    from corpora import CORPORA, build_data, memctl

    found = []
    for name in names:
        if name not in CORPORA:
            sys.exit(f"unknown corpus {name!r}: {', '.join(CORPORA)}")
        log = out / "routing.log"
        out.mkdir(parents=True, exist_ok=True)
        data = build_data(name, out, 300, log)
        home = out / "homes" / name
        if not (home / "banks" / name).is_dir():
            env = dict(os.environ, MEMCTL_HOME=str(home))
            memctl(env, log, "ingest", str(data / CORPORA[name][1]), "--id-field", "id", "--bank", name, "--json")
        found.append((home, name, [data / CORPORA[name][2], data / CORPORA[name][3]]))
        console.print(f"{name}: {home}")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("home", nargs="?")
    ap.add_argument("bank", nargs="?")
    ap.add_argument("probes", nargs="*")
    ap.add_argument("--scale", default="", help="comma-separated window counts: time routing on random banks")
    ap.add_argument(
        "--corpora", default="", help="comma-separated corpora of benchmarks/corpora.py to ingest and score"
    )
    ap.add_argument("--out", default="demo-out/routing", help="with --corpora: where their data and banks go")
    ap.add_argument("--weights", default=f"{DEFAULT_WEIGHT:g},0.1,0.5,1", help="the words' weights to score")
    a = ap.parse_args()
    console = Console(width=200)
    weights = [float(v) for v in a.weights.split(",") if v.strip()]
    if a.scale:
        scale([int(v) for v in a.scale.split(",")], console)
        return
    if a.corpora:
        for home, bank, files in ingest_corpora([c.strip() for c in a.corpora.split(",") if c.strip()], Path(a.out),
                                                console):  # fmt: skip
            score_bank(home, bank, files, weights, console)
        return
    if not (a.home and a.bank and a.probes):
        ap.error("give HOME BANK PROBES.jsonl..., --corpora C,..., or --scale N,...")
    score_bank(Path(a.home), a.bank, [Path(p) for p in a.probes], weights, console)


if __name__ == "__main__":
    main()
