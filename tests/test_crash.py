"""Fault injection, short version (the long one, with a table: benchmarks/crash.py): commands killed
with SIGKILL at random points leave a bank that `memctl doctor` passes (after --repair where needed);
re-running the command completes the work, and the finished bank equals one built without
interruption, block checksum for block checksum."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from crash import Harness, table  # noqa: E402

SHORT = {"ingest": 1, "train": 2, "forget": 1, "import": 1, "merge": 1}


def test_killed_commands_leave_a_bank_doctor_passes_and_a_rerun_completes(tmp_path: Path) -> None:
    seed = int(os.environ.get("MEMCTL_CRASH_SEED") or random.randrange(10_000))
    lines: list[str] = []
    h = Harness(tmp_path, seed, log=lines.append)
    h.prepare(only=list(SHORT), in_process=True)
    points = h.run(SHORT)
    report = table(points)
    print(f"seed {seed} (MEMCTL_CRASH_SEED reruns it)\n" + "\n".join(lines) + "\n" + report)
    assert len(points) == sum(SHORT.values())
    failed = [p for p in points if not p.ok]
    assert not failed, f"seed {seed}: {[(p.command, p.delay, p.error) for p in failed]}\n{report}"
