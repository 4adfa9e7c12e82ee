"""Serving cost of memories on a trained bank (default: the elements bank that `make demo` builds).

1. Latency of a 40-token answer, anchor alone vs with fetched memories, and the overhead split into
   routing, fetching (cold: read from disk; warm: from the cache) and extra compute; and the cost of
   mixing the anchor's own distribution in (`--anchor-mix`: the batch runs twice over) against memories alone.
2. Peak resident memory of `memctl ask` against this bank and against a bank ten times larger (the
   same tree shape with k raised, every block filled with synthetic parameters): memory depends on
   the fetched path, not on the bank.
3. Bytes read from disk per question for a stream of 50 questions, topic-clustered (a few questions
   per element, elements visited subtree by subtree) and shuffled, against a flat bank (one level,
   leaves of the same fetched size), with the same cache budget: the paper's compositionality.

    python benchmarks/serve.py [--home demo-out/home] [--bank elements] [--out demo-out/serve.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
console = Console()
ANCHOR_MIX = 0.5  # the anchor's share timed in the third run (`--anchor-mix`; any share above 0 costs the same)


def median_time(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def latency(home: Path, bank: str, prompts: list[str], tokens: int, repeats: int, int8: bool = False) -> dict:
    """With `int8`, the memories are served as int8 weights (`--int8`): a cold fetch then includes
    packing the path's blocks."""
    from memctl.model.anchor import generate
    from memctl.serve.session import BankSession
    from memctl.serve.store import BlockStore

    rows = []
    with BankSession(bank, home, int8=int8) as s:
        tok = s.anchor.tokenizer
        t = time.perf_counter()
        floor = s.relevance_floor  # the gate's floor, calibrated once per session on the bank's windows
        calibrate_s = time.perf_counter() - t
        for q in prompts:
            enc = tok(q, return_tensors="pt", add_special_tokens=False)

            def gen(fetched, enc=enc, mix=0.0) -> None:  # noqa: ANN001
                out = generate(s.anchor, s.handle, enc, fetched, tokens, mix, min_new_tokens=tokens)
                assert out.shape == (1, enc["input_ids"].shape[1] + tokens)

            route_s = median_time(lambda q=q: s.route_gated([q]), repeats)  # embed, route, relevance gate
            r = s.route_gated([q])
            if r.off.any():
                raise SystemExit(f"{q!r} is below the bank's relevance floor ({floor:.3f}): it would fetch nothing")
            paths = r.paths
            cold = []
            for _ in range(repeats):
                s.store = BlockStore(s.reg, int8=int8)  # an empty cache: every block read from disk
                t = time.perf_counter()
                s.store.fetch_paths(paths)
                cold.append(time.perf_counter() - t)
            warm_s = median_time(lambda paths=paths: s.store.fetch_paths(paths), repeats)
            fetched = s.store.fetch_paths(paths)
            gen(None)  # warm up all three
            gen(fetched)
            gen(fetched, mix=ANCHOR_MIX)
            alone, mem, mixed = [], [], []
            for _ in range(repeats):  # interleaved, so drifts hit all alike
                t = time.perf_counter()
                gen(None)
                alone.append(time.perf_counter() - t)
                t = time.perf_counter()
                gen(fetched)
                mem.append(time.perf_counter() - t)
                t = time.perf_counter()
                gen(fetched, mix=ANCHOR_MIX)  # the batch doubled: the anchor's distribution from a second row
                mixed.append(time.perf_counter() - t)
            rows.append({"route_s": route_s, "fetch_cold_s": statistics.median(cold), "fetch_warm_s": warm_s,
                         "anchor_s": statistics.median(alone), "memory_s": statistics.median(mem),
                         "mix_s": statistics.median(mixed)})  # fmt: skip
        fetched_bytes = 4 * s.cfg.memory.fetched_params
    avg = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    extra = avg["memory_s"] - avg["anchor_s"]
    return {
        "questions": len(rows),
        "calibrate_s": calibrate_s,
        "tokens": tokens,
        "fetched_bytes": fetched_bytes,
        **avg,
        "extra_compute_s": extra,
        "overhead_warm": (avg["route_s"] + avg["fetch_warm_s"] + extra) / avg["anchor_s"],
        "overhead_cold": (avg["route_s"] + avg["fetch_cold_s"] + extra) / avg["anchor_s"],
        "anchor_mix": ANCHOR_MIX,
        "mix_vs_memory": avg["mix_s"] / avg["memory_s"],  # the anchor mixture's cost over memories alone
        "per_question": rows,
    }


def synthetic_bank(home: Path, src_home: Path, src: str, name: str, tree: tuple[int, int], ranks: tuple[int, ...],
                   corpus: Path) -> None:  # fmt: skip
    """A bank on the same corpus, anchor, layers and embedder with another tree, every block filled
    with random parameters of the trained blocks' scale (it is read and served, never judged)."""
    from memctl.build.ingest import ingest
    from memctl.registry import Registry, now

    ref = Registry.open(src, src_home)
    layers = ref.config.memory.layers
    spec = f"last:{len(layers)}"
    scale = float(ref.read_block(ref.blocks("level = 1 and file is not null")[0])["down"].std())
    ingest(name, [corpus], id_field="id", tree=tree, ranks=ranks, memory_layers=spec, home=home)
    reg = Registry.open(name, home)
    g = torch.Generator().manual_seed(0)
    d = reg.config.memory.hidden
    with reg.db.atomic():
        for row in reg.blocks("level > 0"):
            r = row["rank"]
            block = {p: torch.randn(len(layers), r, d, generator=g) * scale for p in ("gate", "up", "down")}
            file, sha = reg.write_block(row["level"], row["idx"], block)
            reg.db["blocks"].update(row["id"], {"file": file, "sha256": sha, "state": "trained", "updated": now()})


def peak_rss(home: Path, bank: str, prompt: str, tokens: int) -> int:
    """Peak resident set (bytes) of one `memctl ask` process."""
    env = dict(os.environ, MEMCTL_HOME=str(home))
    cmd = [sys.executable, "-m", "memctl", "ask", prompt, "--bank", bank, "--max-new-tokens", str(tokens), "--json"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        sys.exit(f"{' '.join(cmd)} failed")
    return usage.ru_maxrss * 1024


def stream_bytes(home: Path, bank: str, prompts: list[str], cache_bytes: int) -> dict:
    from memctl.serve.api import Memories

    with Memories(bank, home, cache_mb=cache_bytes / 2**20) as mem:
        paths = mem.route(prompts)
        for i in range(len(prompts)):
            mem.store.fetch_paths(paths[i : i + 1])
        st = mem.store.stats
        return {"bytes_read": st.bytes_read, "per_question": st.bytes_read / len(prompts), "misses": st.misses,
                "hits": st.hits}  # fmt: skip


def question_stream(home: Path, bank: str, probes: list[dict], n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """(topic-clustered, shuffled): every probe of an element in a row, elements in the order of their
    route (a user exploring one subject, then the next), 50 questions; and the same shuffled."""
    from memctl.serve.api import Memories

    by_doc: dict[str, list[str]] = {}
    for p in probes:
        by_doc.setdefault(p["doc"], []).append(p["prompt"])
    rng = np.random.default_rng(seed)
    docs = [d for d in rng.permutation(sorted(by_doc)) if len(by_doc[d]) >= 2]
    with Memories(bank, home) as mem:
        first = mem.route([by_doc[d][0] for d in docs])
    order = [docs[i] for i in np.lexsort((np.arange(len(docs)), first[:, 1], first[:, 0]))]
    clustered = [q for d in order for q in by_doc[d]][:n]
    return clustered, [clustered[i] for i in rng.permutation(len(clustered))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=str(ROOT / "demo-out" / "home"))
    ap.add_argument("--bank", default="elements")
    ap.add_argument("--data", default=str(ROOT / "demo-out" / "data"), help="elements data (build.py --out)")
    ap.add_argument("--questions", type=int, default=8, help="questions timed for latency")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--stream", type=int, default=50)
    ap.add_argument("--parts", default="1,2,3", help="which measurements to run")
    ap.add_argument("--out", default=str(ROOT / "demo-out" / "serve.json"))
    a = ap.parse_args()
    home, data = Path(a.home), Path(a.data)
    os.environ["MEMCTL_HOME"] = str(home)
    probes = [json.loads(line) for line in (data / "probes.jsonl").read_text().splitlines()]
    from memctl.registry import Registry

    reg = Registry.open(a.bank, home)
    cfg = reg.config
    k, p = cfg.tree.k, cfg.tree.p
    results: dict = {
        "bank": a.bank,
        "tree": [k, p],
        "ranks": list(cfg.memory.ranks),
        "threads": torch.get_num_threads(),
    }

    parts = {int(x) for x in a.parts.split(",")}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="memctl-serve-", dir=Path(a.out).parent))  # synthetic banks, removed after
    fetched_bytes = 4 * cfg.memory.fetched_params
    mib = 2**20
    try:
        if 1 in parts:
            console.rule("1. latency of a 40-token answer")
            t = Table(
                title=f"{a.tokens}-token answer, bank {a.bank} (tree {k}x{p}, fetched {fetched_bytes / mib:.0f} MiB), "
                f"mean of {a.questions} questions, median of {a.repeats} runs"
            )
            for col in ("memories", "anchor alone", "with memories", "route", "fetch cold", "fetch warm",
                        "extra compute", "overhead (warm)", "overhead (cold)",
                        f"+ anchor mix {ANCHOR_MIX:g}", "mix / memories"):  # fmt: skip
                t.add_column(col, justify="right")
            for name, int8 in (("fp32", False), ("int8 (--int8)", True)):
                lat = latency(home, a.bank, [q["prompt"] for q in probes[: a.questions]], a.tokens, a.repeats, int8)
                results["latency_int8" if int8 else "latency"] = lat
                t.add_row(name, f"{lat['anchor_s']:.3f} s", f"{lat['memory_s']:.3f} s",
                          f"{1e3 * lat['route_s']:.1f} ms", f"{1e3 * lat['fetch_cold_s']:.1f} ms",
                          f"{1e3 * lat['fetch_warm_s']:.2f} ms", f"{1e3 * lat['extra_compute_s']:.0f} ms",
                          f"{100 * lat['overhead_warm']:.1f}%", f"{100 * lat['overhead_cold']:.1f}%",
                          f"{lat['mix_s']:.3f} s", f"{lat['mix_vs_memory']:.2f}x")  # fmt: skip
            console.print(t)
            floor_ms = 1e3 * results["latency"]["calibrate_s"]
            console.print(f"route = embed + route + relevance gate; the gate's floor is calibrated once per session "
                          f"on the bank's windows ({floor_ms:.0f} ms here), before the first question")  # fmt: skip
        if 2 in parts:
            console.rule("2. peak resident memory: this bank vs a bank ten times larger")
            units = sum(k ** (lv + 1) * r for lv, r in enumerate(cfg.memory.ranks))
            big_k = next(kk for kk in range(k + 1, 64)
                         if sum(kk ** (lv + 1) * r for lv, r in enumerate(cfg.memory.ranks)) >= 10 * units)  # fmt: skip
            synthetic_bank(work, home, a.bank, "big", (big_k, p), cfg.memory.ranks, data / "elements.jsonl")
            small_bytes, big_bytes = reg.bytes_on_disk(), Registry.open("big", work).bytes_on_disk()
            q = probes[0]["prompt"]
            rss_small = max(peak_rss(home, a.bank, q, a.tokens) for _ in range(2))
            rss_big = max(peak_rss(work, "big", q, a.tokens) for _ in range(2))
            results["memory"] = {"bank_bytes": small_bytes, "big_bank_bytes": big_bytes, "big_tree": [big_k, p],
                                 "rss": rss_small, "rss_big": rss_big, "ratio": rss_big / rss_small}  # fmt: skip
            t = Table(title="peak resident memory of `memctl ask`")
            for col in ("bank", "on disk", "peak RSS"):
                t.add_column(col, justify="right")
            t.add_row(f"{a.bank} ({k}x{p})", f"{small_bytes / mib:.0f} MiB", f"{rss_small / mib:.0f} MiB")
            t.add_row(f"10x: synthetic ({big_k}x{p})", f"{big_bytes / mib:.0f} MiB", f"{rss_big / mib:.0f} MiB")
            console.print(t)
            console.print(f"resident memory ratio, 10x bank / bank: {rss_big / rss_small:.3f} (goal: within 5%)")
        if 3 in parts:
            console.rule("3. bytes read for a 50-question stream: hierarchical vs flat bank")
            synthetic_bank(work, home, a.bank, "flat", (k**p, 1), (sum(cfg.memory.ranks),), data / "elements.jsonl")
            clustered, shuffled = question_stream(home, a.bank, probes, a.stream)  # the same questions for both
            results["stream"] = []
            t = Table(title=f"bytes read from disk per question, {len(clustered)} questions")
            for col in ("cache budget", "bank", "topic-clustered", "shuffled"):
                t.add_column(col, justify="right")
            for mult in (2, 5):
                budget = mult * fetched_bytes
                row = {"cache_bytes": budget, "questions": len(clustered)}
                for name, h, b in (("hierarchical", home, a.bank), ("flat", work, "flat")):
                    row[name] = {"clustered": stream_bytes(h, b, clustered, budget),
                                 "shuffled": stream_bytes(h, b, shuffled, budget)}  # fmt: skip
                    t.add_row(f"{budget / mib:.0f} MiB ({mult} paths)", name,
                              f"{row[name]['clustered']['per_question'] / mib:.1f} MiB",
                              f"{row[name]['shuffled']['per_question'] / mib:.1f} MiB")  # fmt: skip
                results["stream"].append(row)
            console.print(t)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
