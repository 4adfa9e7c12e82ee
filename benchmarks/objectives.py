"""Probe accuracy of the training objectives (lm, distill, mix) on the elements example.

Each objective trains its own bank (same corpus, tree, seed and memory layers) and is scored on
probes.jsonl and on probes-rephrased.jsonl (the same facts in words no prompt rule writes), next to
the anchor alone and the open-book ceiling (oracle-rag: the probe's document in the prompt).
Compute is reported as student tokens trained and wall-clock seconds (the teacher pass included).

The whole run takes hours on a 2-core CPU, so it records each objective in objectives.json as soon
as that objective is scored, and a second run with the same --out goes on where the first stopped:
scored objectives (at the same epochs) are kept, and a bank whose training was cut off resumes from
memctl's own checkpoints (`memctl train` without --retrain). Such a row is marked "resumed": its
wall-clock seconds count only the train calls that finished, while "unit s" (the units' own clocks,
kept in their checkpoints) counts all of their training. --fresh starts over.

    python benchmarks/objectives.py [--epochs distill=12,mix=6,lm=12] [--out demo-out/objectives] [--fresh]
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


def unit_runs(home: Path, bank: str) -> tuple[int, float]:
    """Tokens and seconds of the bank's trained units, from the registry's latest finished run of
    each unit (a resumed unit's run counts its checkpointed steps too)."""
    from memctl.registry import Registry

    reg = Registry.open(bank, home)
    try:
        latest: dict[str, dict] = {}
        for r in reg.db["runs"].rows_where("status = 'done'", order_by="id"):
            latest[r["unit"]] = r
        return sum(r["tokens"] for r in latest.values()), sum(r["seconds"] for r in latest.values())
    finally:
        reg.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", default="distill=12,mix=6,lm=12", help="objective=epochs,... in the order run")
    ap.add_argument("--memory-layers", default="last:10")
    ap.add_argument("--out", default=str(ROOT / "demo-out" / "objectives"))
    ap.add_argument("--fresh", action="store_true", help="drop earlier results and banks under --out")
    a = ap.parse_args()
    out = Path(a.out)
    home = out / "home"
    env = dict(os.environ, MEMCTL_HOME=str(home))
    state_file = out / "objectives.json"
    if a.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    # rows: scored setups; started: objective -> {epochs, seconds of the finished train calls}
    state = json.loads(state_file.read_text()) if state_file.exists() else {"rows": {}, "started": {}}
    rows: dict[str, dict] = state["rows"]

    def save() -> None:
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_file)

    data = out / "data"
    subprocess.run(
        [sys.executable, str(ROOT / "examples/elements/build.py"), "--out", str(data)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    probe_sets = {"probes": data / "probes.jsonl", "rephrased": data / "probes-rephrased.jsonl"}
    for spec in a.epochs.split(","):
        objective, epochs = spec.split("=")
        if rows.get(objective, {}).get("epochs") == int(epochs):
            console.print(f"{objective}: scored by an earlier run ({epochs} epochs), kept")
            continue
        bank = f"obj-{objective}"
        started = state["started"].get(objective)
        resume = started is not None and started["epochs"] == int(epochs) and (home / "banks" / bank).exists()
        if not resume:
            started = state["started"][objective] = {"epochs": int(epochs), "seconds": 0.0, "calls": 0}
            save()
        if not (home / "banks" / bank).exists():
            memctl(env, "ingest", str(data / "elements.jsonl"), "--id-field", "id", "--bank", bank,
                   "--memory-layers", a.memory_layers)  # fmt: skip
        if not started.get("trained"):
            started["calls"] += 1  # counted before the call: a call cut off makes the row "resumed"
            save()
            t = time.perf_counter()
            out_json = json.loads(memctl(env, "train", "--bank", bank, "--objective", objective, "--epochs", epochs,
                                    "--json", *([] if resume else ["--retrain"])))  # fmt: skip
            started["seconds"] += time.perf_counter() - t
            early = [u["unit"] for u in out_json["units"] if u.get("stopped_early")]
            started["stopped_early"] = sorted(set(started.get("stopped_early", [])) | set(early))
            started["trained"] = True
            save()
        tokens, unit_seconds = unit_runs(home, bank)
        setups = "fetched" if "anchor" in rows else "anchor,oracle-rag,fetched"
        res = {name: scores(env, bank, path, setups) for name, path in probe_sets.items()}
        for base in ("anchor", "oracle-rag"):
            if base not in rows:
                rows[base] = {"seconds": 0.0, "tokens": 0, **{n: res[n][base] for n in probe_sets}}
        rows[objective] = {
            "seconds": started["seconds"],
            "unit_seconds": unit_seconds,
            "resumed": started["calls"] > 1,
            "tokens": tokens,
            "epochs": int(epochs),
            "stopped_early": started.get("stopped_early", []),  # units held-out early stopping ended
            **{n: res[n]["fetched"] for n in probe_sets},
        }
        save()
        stopped = ", ".join(started.get("stopped_early", [])) or "none"
        console.print(f"{objective}: {started['seconds']:.0f}s, {tokens:,} tokens; units stopped early: {stopped}")
    ceiling = {n: rows["oracle-rag"][n]["accuracy"] for n in probe_sets}
    table = Table(title="elements: fetched-memory probe accuracy by training objective")
    for col in (
        "setup",
        "epochs",
        "train s",
        "unit s",
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
        seconds = f"{r['seconds']:.0f}" + (" (resumed)" if r.get("resumed") else "")
        units = f"{r['unit_seconds']:.0f}" if "unit_seconds" in r else "-"
        table.add_row(name, str(r.get("epochs", "-")), seconds, units, f"{r['tokens']:,}", *cells)
    console.print(table)
    console.print(f"wrote {state_file}")


if __name__ == "__main__":
    main()
