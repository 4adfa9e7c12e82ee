"""Fault injection: kill memctl commands with SIGKILL at random points, then check that `memctl doctor`
passes (after `--repair` where needed), that re-running the command completes the work, and that the
finished bank equals one built without interruption (same block checksums: training is deterministic).

Commands: ingest (a new bank, and more documents into a trained one), train, forget, block, import
and merge, each on a tiny bank (a tiny random Llama, the deterministic `hash` embedder). Each runs as
a subprocess (`python -m memctl ...`) and is killed after a random delay drawn from the span of its
uninterrupted run; the re-run and the checks run in this process.

    python benchmarks/crash.py                 # 36 kill points, a table of points tried and recovered
    python benchmarks/crash.py --points 60 --seed 1

tests/test_crash.py runs a short version of the same harness.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

BANK = "b"
TRAIN = ["--epochs", "2", "--batch-size", "2", "--objective", "lm", "--preserve", "0"]
FORGET_DOC = "metals/0.txt"
# kill points per command in the long run (36 in all)
MIX = {"ingest": 6, "ingest-more": 4, "train": 8, "forget": 6, "block": 3, "import": 4, "merge": 5}
TOPICS = {
    "metals": ["Iron is a strong metal used in steel.", "Copper conducts electricity well.", "Gold is soft."],
    "gases": ["Helium is a light gas used in balloons.", "Neon glows red in signs.", "Argon is inert."],
    "animals": ["The fox is quick.", "The owl hunts at night.", "The whale is the largest animal."],
    "cities": ["Paris is the capital of France.", "Rome has many ruins.", "Oslo is cold in winter."],
}


@dataclass
class Point:
    command: str
    delay: float  # seconds after the start when SIGKILL was sent
    killed: bool = False  # the command was still running (a kill, not a finished run)
    doctor_clean: bool = False  # doctor passed at once, without --repair
    repaired: bool = False  # doctor --repair was needed and then passed
    recovered: bool = False  # the re-run completed and doctor passed after it
    equal: bool = False  # the finished bank equals the uninterrupted one
    findings: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return (self.doctor_clean or self.repaired) and self.recovered and self.equal


@dataclass
class Scenario:
    name: str
    setup: str  # which prepared home to start from: empty | ingested | trained
    args: list[str]  # the memctl command
    done: Callable[[Path], bool]  # whether the work is already complete (re-run not needed)
    reference: dict[str, Any] = field(default_factory=dict)  # bank state after an uninterrupted run
    seconds: float = 0.0  # how long the uninterrupted run took


def bank_state(home: Path) -> dict[str, Any]:
    """What 'the same bank' means: blocks (state, sha256, blocked), documents, windows and prompts
    (data fingerprint), the tree, and provenance."""
    from memctl.registry import Registry
    from memctl.train.merge import data_fingerprint, tree_fingerprint

    if not Registry.exists(BANK, home):
        return {"exists": False}
    reg = Registry.open(BANK, home)
    try:
        return {
            "exists": True,
            "blocks": {r["id"]: [r["state"], r["sha256"], r["blocked"]] for r in reg.blocks()},
            "docs": sorted(reg.doc_hashes().items()),
            "data": data_fingerprint(reg),
            "tree": tree_fingerprint(reg),
            "provenance": sorted(map(list, reg.db.execute("select block_id, doc_id, tokens from block_docs"))),
        }
    finally:
        reg.close()


class Harness:
    def __init__(self, root: Path, seed: int = 0, log: Callable[[str], None] = print) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.log = log
        self.tmp = root / "tmp"  # TMPDIR of every command: their temp directories are ours to check
        self.points: list[Point] = []
        self.startup = 0.0
        self.scenarios: dict[str, Scenario] = {}

    # ---- running memctl ----------------------------------------------------------------------------
    def env(self, home: Path) -> dict[str, str]:
        return {**os.environ, "MEMCTL_HOME": str(home), "TMPDIR": str(self.tmp), "PYTHONPATH": str(ROOT)}

    def spawn(self, home: Path, args: list[str]) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "memctl", *args]
        return subprocess.Popen(cmd, env=self.env(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def cli(self, home: Path, args: list[str]) -> None:
        """Run a command in this process (as the CLI would); raise on a non-zero exit."""
        from typer.testing import CliRunner

        from memctl.cli import app

        res = CliRunner().invoke(app, args, env={"MEMCTL_HOME": str(home), "TMPDIR": str(self.tmp)})
        if res.exit_code != 0:
            raise RuntimeError(f"memctl {' '.join(args[:2])} exited {res.exit_code}: {res.output.strip()[-300:]}")

    # ---- preparation ---------------------------------------------------------------------------------
    def prepare(self, only: list[str] | None = None, in_process: bool = False) -> None:
        """The tiny anchor, a corpus, the homes commands start from, and each command's reference run
        (`only` these commands; the reference runs in this process with `in_process`)."""
        from tiny import build_tiny_llama

        tempfile.tempdir = str(self.tmp)  # doctor looks for leftovers under the commands' TMPDIR
        self.tmp.mkdir(parents=True, exist_ok=True)
        anchor = build_tiny_llama(self.root / "llama")
        corpus, extra = self.root / "docs", self.root / "more"
        for topic, sents in TOPICS.items():
            where = extra if topic == "cities" else corpus
            (where / topic).mkdir(parents=True, exist_ok=True)
            for i, s in enumerate(sents):
                (where / topic / f"{i}.txt").write_text(f"{s}\n\nMore about {topic}: note {i} of the {topic} notes.\n")
        ingest = ["ingest", str(corpus), "--bank", BANK, "--anchor", str(anchor), "--embedder", "hash", "--tree", "2,2"]
        homes = {
            "empty": self.root / "h-empty",
            "ingested": self.root / "h-ingested",
            "trained": self.root / "h-trained",
        }
        homes["empty"].mkdir(parents=True, exist_ok=True)
        self.cli(homes["ingested"], ingest)
        shutil.copytree(homes["ingested"], homes["trained"])
        self.cli(homes["trained"], ["train", "--bank", BANK, *TRAIN])
        archive = self.root / "bank.memctl"
        if only is None or "import" in only:
            self.cli(homes["trained"], ["export", "--bank", BANK, str(archive)])
        outs = [self.root / f"out-{u}" for u in ("0", "1", "generic")]
        for u, out in zip(("0", "1", None), outs, strict=True):
            if only is None or "merge" in only:
                unit = ["--subtree", u] if u is not None else ["--generic"]
                self.cli(homes["ingested"], ["train", "--bank", BANK, *TRAIN, "--out", str(out), *unit])
        self.homes = homes

        def has_bank(home: Path) -> bool:
            return (home / "banks" / BANK / "registry.db").is_file()

        def forgotten(home: Path) -> bool:
            return FORGET_DOC not in dict(bank_state(home).get("docs", []))

        all_scenarios = [
            Scenario("ingest", "empty", ingest, has_bank),
            Scenario("ingest-more", "trained", ["ingest", str(extra), "--bank", BANK], lambda h: False),
            Scenario("train", "ingested", ["train", "--bank", BANK, *TRAIN], lambda h: False),
            Scenario("forget", "trained", ["forget", "--bank", BANK, "--doc", FORGET_DOC, "--yes"], forgotten),
            Scenario("block", "trained", ["block", "--bank", BANK, "--node", "1:0", "--reason", "r"], lambda h: False),
            Scenario("import", "empty", ["import", str(archive), "--bank", BANK], has_bank),
            Scenario("merge", "ingested", ["merge", *map(str, outs), "--bank", BANK], lambda h: False),
        ]
        t0 = time.perf_counter()  # a command's start-up (interpreter, torch): kills before it change nothing
        probe = self.spawn(homes["ingested"], ["info", "--bank", BANK, "--json"])
        probe.communicate(timeout=600)
        self.startup = time.perf_counter() - t0
        self.log(f"start-up of a command: {self.startup:.1f} s")
        for sc in all_scenarios:
            if only is not None and sc.name not in only:
                continue
            home = self.fresh(sc, "reference")
            t0 = time.perf_counter()
            if in_process:  # quicker; the re-runs check that it matches a subprocess run all the same
                self.cli(home, sc.args)
                sc.seconds = self.startup + time.perf_counter() - t0
            else:
                proc = self.spawn(home, sc.args)
                _, err = proc.communicate(timeout=600)
                sc.seconds = time.perf_counter() - t0
                if proc.returncode != 0:
                    raise RuntimeError(f"reference run of {sc.name} failed: {err.decode()[-500:]}")
            sc.reference = bank_state(home)
            self.scenarios[sc.name] = sc
            self.log(f"reference {sc.name}: {sc.seconds:.1f} s")

    def fresh(self, sc: Scenario, tag: str) -> Path:
        home = self.root / "runs" / f"{sc.name}-{tag}"
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(self.homes[sc.setup], home)
        return home

    # ---- one kill point ----------------------------------------------------------------------------------
    def kill_point(self, name: str) -> Point:
        from memctl.core.errors import BankNotFound
        from memctl.ops.doctor import doctor

        sc = self.scenarios[name]
        start = min(self.startup, 0.5 * sc.seconds)  # no kills during start-up, where nothing happens
        point = Point(name, round(self.rng.uniform(start, sc.seconds), 2))
        home = self.fresh(sc, str(len(self.points)))
        self.points.append(point)
        try:
            proc = self.spawn(home, sc.args)
            time.sleep(point.delay)
            point.killed = proc.poll() is None
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if not point.killed:  # it ran faster than its reference (the machine's load varies): aim earlier
                sc.seconds = max(1.05 * self.startup, 0.9 * point.delay)
            try:
                first = doctor(BANK, home)
                point.findings = [f.message for f in first.findings if f.problem]
                point.doctor_clean = first.healthy
                if not first.healthy:
                    point.repaired = doctor(BANK, home, repair=True).healthy
            except BankNotFound:  # killed before anything was written: nothing to check
                point.doctor_clean = True
            if not sc.done(home):
                self.cli(home, sc.args)
            point.recovered = doctor(BANK, home).healthy
            state = bank_state(home)
            point.equal = state == sc.reference
            if not point.equal:
                point.error = _diff(state, sc.reference)
        except Exception as e:  # reported in the table, never hidden
            point.error = f"{type(e).__name__}: {e}"
        finally:
            shutil.rmtree(home, ignore_errors=True)
        return point

    def run(self, counts: dict[str, int]) -> list[Point]:
        order = [name for name, n in counts.items() for _ in range(n) if name in self.scenarios]
        for i, name in enumerate(order):
            p = self.kill_point(name)
            state = "ok" if p.ok else f"FAILED {p.error}"
            how = "clean" if p.doctor_clean else "repaired" if p.repaired else "doctor failed"
            kill = "killed" if p.killed else "had finished"
            self.log(f"[{i + 1}/{len(order)}] {name} at {p.delay:.2f}s ({kill}): doctor {how}; {state}")
        return self.points


def _diff(got: dict[str, Any], want: dict[str, Any]) -> str:
    keys = [k for k in set(got) | set(want) if got.get(k) != want.get(k)]
    if "blocks" in keys:
        ids = [b for b in want.get("blocks", {}) if got.get("blocks", {}).get(b) != want["blocks"][b]]
        return f"blocks differ: {', '.join(ids[:4])}" + (f" (and {', '.join(k for k in keys if k != 'blocks')})")
    return f"differs in {', '.join(sorted(keys))}"


def table(points: list[Point]) -> str:
    rows = ["command      tried  killed  doctor clean  repaired  recovered  equal  ok"]
    names = list(dict.fromkeys(p.command for p in points))
    for name in [*names, "all"]:
        ps = [p for p in points if name in ("all", p.command)]
        n = [len(ps), sum(p.killed for p in ps), sum(p.doctor_clean for p in ps), sum(p.repaired for p in ps)]
        n += [sum(p.recovered for p in ps), sum(p.equal for p in ps), sum(p.ok for p in ps)]
        rows.append(f"{name:<12} {n[0]:>5} {n[1]:>7} {n[2]:>13} {n[3]:>9} {n[4]:>10} {n[5]:>6} {n[6]:>3}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=sum(MIX.values()), help="kill points in all (spread as MIX)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write every point to this file")
    args = ap.parse_args()
    scale = args.points / sum(MIX.values())
    counts = {k: max(1, round(v * scale)) for k, v in MIX.items()}
    with tempfile.TemporaryDirectory(prefix="memctl-crash-") as tmp:
        h = Harness(Path(tmp), args.seed)
        h.prepare()
        points = h.run(counts)
    print(table(points))
    if args.json:
        args.json.write_text(json.dumps([p.__dict__ | {"ok": p.ok} for p in points], indent=1))
    failed = [p for p in points if not p.ok]
    killed = sum(p.killed for p in points)
    print(f"{len(points)} kill points tried, {killed} killed mid-run, {len(points) - len(failed)} recovered")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
