"""How often each routing rule sends a probe into a leaf that holds its document.

No model runs: only the embedder, the bank's tree and its windows. For each probe file, the share of
probes whose route ends in a leaf with a window of the probe's document, by rule:

* greedy:    the paper's descent (memctl.core.tree.route; `--routing tree`), the baseline;
* beam N:    any of the N leaves kept by a beam search down the tree (what `eval --beam N` fetches);
* flat leaf: the leaf whose centroid is nearest, compared with every leaf at once;
* nearest:   the leaf of the nearest window (memctl.build.routing, `--routing nearest`, exact search);
* nearest within N leaves: the same, searching only the windows of the N nearest leaves (what
  banks above memctl.build.routing.EXACT_WINDOWS windows do, with N = NPROBE).

    python benchmarks/routing.py HOME BANK PROBES.jsonl [PROBES.jsonl ...]
    python benchmarks/routing.py --scale 10000,100000,262144   # time only, random unit vectors

HOME is a MEMCTL_HOME (for example a home that benchmarks/corpora.py left under --out/homes).
--scale times routing on synthetic banks of N random 384-d windows (tree 11x2): one query, 2,000
queries, and the relevance gate's calibration, nearest window against greedy descent (the baseline).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from memctl.build.embed import get_embedder
from memctl.build.routing import Router, WindowIndex
from memctl.core.tree import Tree, route, route_beam
from memctl.registry import Registry


def scale(sizes: list[int], console: Console) -> None:
    rng = np.random.default_rng(0)
    table = Table(title="routing time on random banks (384-d windows, tree 11x2, 2 CPU cores)")
    for c in ("windows", "index build s", "1 query: greedy ms", "nearest ms", "2,000 queries: greedy s", "nearest s",
              "nearest/greedy", "gate calibration s"):  # fmt: skip
        table.add_column(c, justify="right")
    for n in sizes:
        x = rng.normal(size=(n, 384)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        tree = Tree(k=11, p=2, centroids=[x[:11].copy(), x[:121].copy()], sizes=[])
        paths = route(tree, x)
        t = time.perf_counter()
        router = Router(tree, "nearest", WindowIndex.build(x, paths, 121))
        build = time.perf_counter() - t
        q = x[:2000] + 0.01 * rng.normal(size=(2000, 384)).astype(np.float32)
        times = []
        for fn in (lambda v, t=tree: route(t, v), router.route):
            t = time.perf_counter()
            fn(q[:1])
            one = time.perf_counter() - t
            t = time.perf_counter()
            fn(q)
            times.append((one, time.perf_counter() - t))
        t = time.perf_counter()
        router.calibrate(x[:4096])
        cal = time.perf_counter() - t
        (g1, g), (n1, nn) = times
        table.add_row(f"{n:,}", f"{build:.2f}", f"{1e3 * g1:.2f}", f"{1e3 * n1:.2f}", f"{g:.3f}", f"{nn:.3f}",
                      f"{nn / g:.0f}x", f"{cal:.2f}")  # fmt: skip
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("home", nargs="?")
    ap.add_argument("bank", nargs="?")
    ap.add_argument("probes", nargs="*")
    ap.add_argument("--scale", default="", help="comma-separated window counts: time routing on random banks")
    a = ap.parse_args()
    console = Console(width=160)
    if a.scale:
        scale([int(v) for v in a.scale.split(",")], console)
        return
    if not (a.home and a.bank and a.probes):
        ap.error("give HOME BANK PROBES.jsonl..., or --scale N,...")
    reg = Registry.open(a.bank, Path(a.home))
    tree = reg.load_tree()
    emb = get_embedder(reg.config.embedder)
    index = WindowIndex.from_registry(reg, tree)
    nearest = Router(tree, "nearest", index)
    leaves: dict[str, set[int]] = {}
    for doc, path in reg.db.execute("select doc_id, path from windows"):
        leaves.setdefault(doc, set()).add(int(path.split(",")[-1]))
    n_leaves = len(tree.centroids[-1])
    table = Table(title=f"bank {a.bank}: {len(index)} windows, tree {tree.k}x{tree.p} ({n_leaves} leaves)")
    table.add_column("probes")
    rules = ["greedy (base)", "beam 2", "beam 3", "flat leaf", "nearest"] + [
        f"nearest in {n} leaves" for n in (2, 4, 8) if n < n_leaves
    ]
    for r in rules:
        table.add_column(r, justify="right")
    table.add_column("nearest/greedy", justify="right")
    table.add_column("ms/probe (greedy, nearest)", justify="right")
    for f in a.probes:
        probes = [json.loads(line) for line in Path(f).open() if line.strip()]
        probes = [p for p in probes if p["doc"] in leaves]
        x = emb.encode([p["prompt"] for p in probes])

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
        ratio = row[4] / row[0] if row[0] else float("inf")
        ms = f"{1e3 * t_greedy / len(x):.3f}, {1e3 * t_near / len(x):.3f}"
        table.add_row(f"{Path(f).name} ({len(probes)})", *(f"{100 * v:.1f}%" for v in row), f"{ratio:.2f}x", ms)
    reg.close()
    console.print(table)


if __name__ == "__main__":
    main()
