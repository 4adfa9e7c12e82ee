"""Exact forgetting on the elements example, with its proof.

Builds the elements corpus, keeps 8 elements apart as *reference* documents (never trained: the
'unseen' baseline), ingests the other 110, trains, then forgets a few elements with
`memctl forget --mode exact --probes` and re-checks them with `memctl verify-forgotten`. Prints:

* per forgotten document: its loss with the anchor alone, under the bank before and after, its
  memorisation gain (anchor loss - bank loss) before and after next to the reference documents'
  gains, its probes before and after, and the verdict;
* retained documents' probe accuracy before and after (the goal: at least 95% kept);
* the cost: units retrained and seconds, against the time the whole bank took to train.

    python benchmarks/forget.py [--epochs 6] [--forget neon,uranium] [--out demo-out/forget]
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
REFERENCE_EVERY, REFERENCE_AT = 15, 7  # documents i with i % 15 == 7 (8 of 118) are references


def memctl(env: dict[str, str], *args: str, check: bool = True) -> str:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "memctl", *args], env=env, text=True, stdout=subprocess.PIPE)
    console.print(f"[dim]memctl {' '.join(args[:3])} ... {time.perf_counter() - t:.0f} s[/dim]", highlight=False)
    if check and proc.returncode:
        sys.exit(f"memctl {' '.join(args)} failed with exit code {proc.returncode}")
    return proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", default="6")
    ap.add_argument("--forget", default="neon,uranium")
    ap.add_argument("--memory-layers", default="last:10")
    ap.add_argument("--out", default=str(ROOT / "demo-out" / "forget"))
    a = ap.parse_args()
    out = Path(a.out)
    env = dict(os.environ, MEMCTL_HOME=str(out / "home"))
    shutil.rmtree(out / "home" / "banks" / "forget", ignore_errors=True)
    data = out / "data"
    subprocess.run([sys.executable, str(ROOT / "examples/elements/build.py"), "--out", str(data)], check=True)
    docs = [json.loads(line) for line in (data / "elements.jsonl").read_text().splitlines()]
    refs = [d for i, d in enumerate(docs) if i % REFERENCE_EVERY == REFERENCE_AT]
    kept = [d for i, d in enumerate(docs) if i % REFERENCE_EVERY != REFERENCE_AT]
    gone = a.forget.split(",")
    if not set(gone) <= {d["id"] for d in kept}:
        sys.exit(f"--forget must name bank documents, not references ({', '.join(d['id'] for d in refs)})")
    for name, rows in (("bank.jsonl", kept), ("references.jsonl", refs), ("forgotten.jsonl", [
        d for d in kept if d["id"] in gone
    ])):  # fmt: skip
        (data / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    bank = ["--bank", "forget"]
    t0 = time.perf_counter()
    memctl(env, "ingest", str(data / "bank.jsonl"), "--id-field", "id", *bank, "--memory-layers", a.memory_layers)
    memctl(env, "ingest", str(data / "references.jsonl"), "--id-field", "id", *bank, "--reference")
    t = time.perf_counter()
    trained = json.loads(memctl(env, "train", *bank, "--epochs", a.epochs, "--json"))
    train_s = time.perf_counter() - t
    args = ["forget", *bank, "--probes", str(data / "probes.jsonl"), "--yes", "--json"]
    for doc in gone:
        args += ["--doc", doc]
    t = time.perf_counter()
    report = json.loads(memctl(env, *args))
    forget_s = time.perf_counter() - t
    verify = json.loads(
        memctl(env, "verify-forgotten", str(data / "forgotten.jsonl"), "--id-field", "id", *bank, "--json", check=False)
    )
    results = {
        "train": {"seconds": train_s, "units": [u["unit"] for u in trained["units"]]},
        "forget": report,
        "forget_seconds": forget_s,
        "verify": verify,
        "total_seconds": time.perf_counter() - t0,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))

    ref, fref = report["reference"]["gain"], report["reference"]["fact_gain"]
    table = Table(title=f"exact forgetting on elements ({len(kept)} documents, {len(refs)} unseen references)")
    for col in ("document", "text gain before → after (z)", "fact gain before → after (z)", "probes before → after",
                "verdict after", "verify-forgotten"):  # fmt: skip
        table.add_column(col, justify="right")
    checks = {d["doc"]: d for d in verify["documents"]}
    for p in report["proofs"]:
        b, af = p["probes_before"], p["probes_after"]
        v = checks.get(p["doc"], {})
        table.add_row(
            p["doc"],
            f"{p['gain_before']:+.3f} → {p['gain_after']:+.3f} ({p['z_before']:+.1f} → {p['z_after']:+.1f})",
            f"{p['fact_gain_before']:+.3f} → {p['fact_gain_after']:+.3f} "
            f"({p['fact_z_before']:+.1f} → {p['fact_z_after']:+.1f})",
            f"{b[0]}/{b[1]} → {af[0]}/{af[1]}" if b and af else "-",
            p["verdict"],
            ("ok" if v.get("ok") else "FAILED") + f" ({len(v.get('traces', []))} files with its text)",
        )
    console.print(table)
    console.print(
        f"reference documents (unseen): text gain {ref['mean']:+.3f} ± {ref['sd']:.3f}, fact gain "
        f"{fref['mean']:+.3f} ± {fref['sd']:.3f}; z = gain in their standard deviations above their mean; "
        "SEEN when a z passes 3"
    )
    rp = report["retained_probes"]
    console.print(
        f"retained probes ({rp['n']}): {100 * rp['before']:.1f}% → {100 * rp['after']:.1f}% "
        f"({100 * rp['kept']:.1f}% kept; goal ≥ 95%)"
    )
    console.print(
        f"cost: retrained units {', '.join(report['units'])} ({report['blocks_replaced']} blocks) in "
        f"{forget_s:.0f} s including the proof; training the whole bank took {train_s:.0f} s "
        f"({len(trained['units'])} units)"
    )


if __name__ == "__main__":
    main()
