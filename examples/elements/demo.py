"""The end-to-end demo on the bundled elements example (what `make demo` runs).

Builds the corpus and probes from the mendeleev package, ingests them into a fresh bank, trains
memory blocks on the frozen SmolLM2-135M-Instruct anchor, then compares probe accuracy of the
anchor alone, the generic memory, fetched memories, RAG, the open-book ceiling, corrupted routes and
blocked fractions (`memctl eval`, with a Markdown report and plots); then shows provenance (`audit`), one
document's blocks withheld (`block`, `ask`, `unblock`) and RAG. Everything lives under demo-out/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
console = Console()


def step(name: str, args: list[str], env: dict[str, str], times: dict[str, float], capture: bool = False) -> str:
    console.rule(f"[bold]{name}")
    console.print("$ " + " ".join(args), style="dim", highlight=False)
    t = time.perf_counter()
    proc = subprocess.run(args, env=env, text=True, stdout=subprocess.PIPE if capture else None)
    times[name] = time.perf_counter() - t
    if proc.returncode != 0:
        console.print(f"[red]{name} failed (exit {proc.returncode})")
        sys.exit(proc.returncode)
    console.print(f"[green]{name}: {times[name]:.0f} s")
    return proc.stdout or ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(ROOT / "demo-out"))
    ap.add_argument("--epochs", default=None, help="passes over the windows (default: memctl's default)")
    ap.add_argument("--lr", default="1e-2")
    ap.add_argument("--batch-size", default="4")
    ap.add_argument("--memory-layers", default="last:10")
    ap.add_argument("--objective", default=None, help="lm, distill or mix (default: memctl's default)")
    ap.add_argument("--limit", default=None, help="evaluate a sample of N probes")
    a = ap.parse_args()
    out = Path(a.out)
    env = dict(os.environ, MEMCTL_HOME=str(out / "home"))
    shutil.rmtree(out / "home" / "banks" / "elements", ignore_errors=True)  # a fresh bank each run
    memctl = [sys.executable, "-m", "memctl"]
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    step(
        "build example",
        [sys.executable, str(ROOT / "examples/elements/build.py"), "--out", str(out / "data")],
        env,
        times,
    )
    step(
        "ingest",
        memctl
        + [
            "ingest",
            str(out / "data/elements.jsonl"),
            "--id-field",
            "id",
            "--bank",
            "elements",
            "--memory-layers",
            a.memory_layers,
        ],
        env,
        times,
    )
    step("info", memctl + ["info", "--bank", "elements"], env, times)
    objective = ["--objective", a.objective] if a.objective else []
    epochs = ["--epochs", a.epochs] if a.epochs else []
    train_args = ["train", "--bank", "elements", "--lr", a.lr, "--batch-size", a.batch_size]
    step("train", memctl + train_args + epochs + objective, env, times)
    extra = ["--limit", a.limit] if a.limit else []
    results = {}
    full = ["--block-fraction", "0,0.0625,0.125,0.25"]
    full += ["--perplexity", str(ROOT / "examples/elements/heldout.jsonl"), "--report", str(out / "eval-report")]
    for name, probes, setups in (
        ("evaluate", "probes.jsonl", full),  # every setup, blocked fractions, perplexity, report
        ("evaluate rephrased", "probes-rephrased.jsonl", ["--setups", "anchor,generic,fetched,oracle-rag"]),
    ):
        args = ["eval", "--bank", "elements", "--probes", str(out / "data" / probes), *setups, "--json"]
        raw = step(name, memctl + args + extra, env, times, capture=True)
        results[name] = json.loads(raw)
    # the same unrelated documents with the relevance gate off: what the memories would do to them
    ungated = ["eval", "--bank", "elements", "--setups", "anchor,generic,fetched", "--min-relevance", "0"]
    ungated += ["--perplexity", str(ROOT / "examples/elements/heldout.jsonl"), "--json"]
    results["perplexity ungated"] = json.loads(step("perplexity, gate off", memctl + ungated, env, times, capture=True))
    # privacy and serving in a few seconds each: provenance, a blocked document, RAG
    question = "The atomic number of Neon is"
    step("audit neon", memctl + ["audit", "--bank", "elements", "--doc", "neon"], env, times)
    step("ask", memctl + ["ask", question, "--bank", "elements", "--max-new-tokens", "8"], env, times)
    step(
        "block neon",
        memctl + ["block", "--bank", "elements", "--doc", "neon", "--reason", "demo: withhold one document"],
        env,
        times,
    )
    step("ask blocked", memctl + ["ask", question, "--bank", "elements", "--max-new-tokens", "8"], env, times)
    step("unblock", memctl + ["unblock", "--bank", "elements", "--all", "--reason", "demo done"], env, times)
    step(
        "ask --rag --no-memory",
        memctl + ["ask", question, "--bank", "elements", "--rag", "--no-memory", "--max-new-tokens", "8"],
        env,
        times,
    )
    total = time.perf_counter() - t0
    full_res, reph = results["evaluate"], results["evaluate rephrased"]
    res = {r["setup"]: r for r in full_res["setups"]}
    res2 = {r["setup"]: r for r in reph["setups"]}
    forced = results["perplexity ungated"]
    summary = {
        "evaluate": full_res,
        "rephrased": reph,
        "perplexity_ungated": forced["perplexity"],
        "seconds": times,
        "total_seconds": total,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2))

    def pct(r: dict) -> str:
        return f"{100 * r['accuracy']:.1f}% ({100 * r['ci95'][0]:.1f}–{100 * r['ci95'][1]:.1f})"

    n = full_res["n"]
    table = Table(title=f"elements probes ({n}): accuracy (95% Wilson interval)")
    for col in ("setup", "probes", "atomic_number", "discovery_year", "rephrased probes"):
        table.add_column(col, justify="right")
    for name, r in res.items():
        kinds = r["per_kind"]
        table.add_row(
            name,
            pct(r),
            *(f"{100 * kinds[k]['accuracy']:.1f}%" if k in kinds else "-" for k in ("atomic_number", "discovery_year")),
            pct(res2[name]) if name in res2 else "-",
        )
    console.print(table)
    console.print("rephrased probes: the same facts asked in words that memctl's prompt rules never write")
    blocked = Table(title="full vs blocked bank (best-matching fraction blocked per probe)")
    for col in ("blocked fraction", "nodes per level", "accuracy"):
        blocked.add_column(col, justify="right")
    for r in full_res["blocking"]["rows"]:
        blocked.add_row(f"{r['fraction']:g}", ", ".join(map(str, r["nodes_per_level"])), pct(r))
    console.print(blocked)
    console.print(f"report with plots: {out / 'eval-report' / 'report.md'}")
    ppl = Table(title="perplexity of unrelated documents, vs the anchor alone")
    for col in ("setup", "relevance gate on (default)", "gate off (--min-relevance 0)"):
        ppl.add_column(col, justify="right")
    on = {r["setup"]: r for r in full_res["perplexity"]["rows"]}
    for r in forced["perplexity"]["rows"]:
        gated, forced_ratio = on[r["setup"]]["ratio_to_anchor"], r["ratio_to_anchor"]
        ppl.add_row(r["setup"], f"{100 * (gated - 1):+.1f}%", f"{100 * (forced_ratio - 1):+.1f}%")
    console.print(ppl)
    for note in full_res.get("notes", []):
        console.print(f"note: {note}")
    steps = Table(title="time per step")
    steps.add_column("step")
    steps.add_column("seconds", justify="right")
    for k, v in times.items():
        steps.add_row(k, f"{v:.0f}")
    steps.add_row("[bold]total", f"[bold]{total:.0f}")
    console.print(steps)
    f, an, g = (res[s]["accuracy"] for s in ("fetched", "anchor", "generic"))
    verdict = "beat" if f > an and f > g else "did NOT beat"
    console.print(
        f"fetched memories {verdict} the anchor alone ({100 * an:.1f}%) and the generic memory "
        f"({100 * g:.1f}%): {100 * f:.1f}%"
    )


if __name__ == "__main__":
    main()
