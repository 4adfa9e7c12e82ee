"""Training runs in the registry as the writer lock sees them: a run left 'running' by a killed
process, and units another writer retrained while this one waited for the lock."""

from __future__ import annotations

from collections.abc import Sequence

from . import Registry, now


def interrupt_dead_runs(reg: Registry) -> int:
    """Mark runs still 'running' as 'interrupted'; returns how many. Call it only while holding the
    bank's writer lock: every writer that records runs holds it, so such a run's process is dead."""
    with reg.db.atomic():
        cur = reg.db.execute("update runs set status = 'interrupted', finished = ? where status = 'running'", [now()])
    return int(cur.rowcount or 0)


def retrained_since(reg: Registry, units: Sequence[str], since: str, config: str) -> list[str]:
    """Those `units` whose last finished run started at or after `since` (ISO time) with this very
    training configuration: retraining them again would give the same blocks, bit for bit."""
    fresh = []
    for unit in units:
        row = reg.db.execute(
            "select started, config from runs where unit = ? and status = 'done' order by id desc limit 1", [unit]
        ).fetchone()
        if row is not None and row[0] and row[0] >= since and row[1] == config:
            fresh.append(unit)
    return fresh
