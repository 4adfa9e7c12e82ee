"""Probe accuracy of the training objectives (lm, distill, mix) on the elements example.

Each objective trains its own bank (same corpus, tree, seed and memory layers) and is scored on
probes.jsonl and on probes-rephrased.jsonl (the same facts in words no prompt rule writes), next to
the anchor alone and the open-book ceiling (oracle-rag: the probe's document in the prompt).
Compute is reported as student tokens trained and wall-clock seconds (the teacher pass included).

    python benchmarks/objectives.py [--epochs lm=12,distill=12,mix=6] [--out demo-out/objectives]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
console = Console()


def memctl(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "memctl", *args], env=env, text=True, stdout=subprocess.PIPE)
    if proc.returncode:
        sys.exit(f"memctl {' '.join(args)} failed with exit code {proc.returncode}")
    return proc.stdout


def scores(env: dict[str, str], bank: str, probes: Path, setups: str) -> dict[str, dict]:
    out = json.loads(memctl(env, "eval", "--bank", bank, "--probes", str(probes), "--setups", setups, "--json"))
    return {r["setup"]: r for r in out["setups"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", default="lm=12,distill=12,mix=6")
    ap.add_argument("--memory-layers", default="last:10")
    ap.add_argument("--out", default=str(ROOT / "demo-out" / "objectives"))
    a = ap.parse_args()
    out = Path(a.out)
    env = dict(os.environ, MEMCTL_HOME=str(out / "home"))
    data = out / "data"
    subprocess.run(
        [sys.executable, str(ROOT / "examples/elements/build.py"), "--out", str(data)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    probe_sets = {"probes": data / "probes.jsonl", "rephrased": data / "probes-rephrased.jsonl"}
    rows: dict[str, dict] = {}
    for spec in a.epochs.split(","):
        objective, epochs = spec.split("=")
        bank = f"obj-{objective}"
        if not (out / "home/banks" / bank).exists():
            memctl(
                env,
                "ingest",
                str(data / "elements.jsonl"),
                "--id-field",
                "id",
                "--bank",
                bank,
                "--memory-layers",
                a.memory_layers,
            )
        t = time.perf_counter()
        trained = json.loads(
            memctl(env, "train", "--bank", bank, "--objective", objective, "--epochs", epochs, "--retrain", "--json")
        )
        seconds = time.perf_counter() - t
        first = not rows
        setups = "anchor,oracle-rag,fetched" if first else "fetched"
        res = {name: scores(env, bank, path, setups) for name, path in probe_sets.items()}
        if first:
            for base in ("anchor", "oracle-rag"):
                rows[base] = {"seconds": 0.0, "tokens": 0, **{n: res[n][base] for n in probe_sets}}
        rows[objective] = {
            "seconds": seconds,
            "tokens": trained["tokens"],
            "epochs": int(epochs),
            **{n: res[n]["fetched"] for n in probe_sets},
        }
        console.print(f"{objective}: {seconds:.0f}s, {trained['tokens']:,} tokens")
    ceiling = {n: rows["oracle-rag"][n]["accuracy"] for n in probe_sets}
    table = Table(title="elements: fetched-memory probe accuracy by training objective")
    for col in (
        "setup",
        "train s",
        "tokens",
        "probes (95% CI)",
        "% of open book",
        "rephrased (95% CI)",
        "% of open book",
    ):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        cells = []
        for n in probe_sets:
            acc, (lo, hi) = r[n]["accuracy"], r[n]["ci95"]
            cells += [
                f"{100 * acc:.1f}% ({100 * lo:.0f}–{100 * hi:.0f})",
                f"{100 * acc / ceiling[n]:.0f}%" if ceiling[n] else "-",
            ]
        table.add_row(name, f"{r['seconds']:.0f}", f"{r['tokens']:,}", *cells)
    console.print(table)
    (out / "objectives.json").write_text(json.dumps(rows, indent=2))
    console.print(f"wrote {out / 'objectives.json'}")


if __name__ == "__main__":
    main()
