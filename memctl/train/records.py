"""Trained units in the registry: their results, their block files, their provenance and their runs.

A unit trained in memory (`TrainedUnit`) is written as new block files first (`write_unit`); one
transaction then points the unit's block rows at them, with provenance (`record_unit`); the files
they replace are swept after the commit. `train`, `merge`, `forget` and distributed training all
record units through these functions, so their blocks are recorded alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..core.config import TrainConfig
from ..registry import Registry, block_id, dumps, now
from ..registry.checkpoints import drop_checkpoint
from .units import Unit, UnitParams


@dataclass
class UnitResult:
    unit: str
    steps: int
    tokens: int
    loss_first: float
    loss_last: float
    seconds: float
    resumed_from: int
    heldout: list[float] = field(default_factory=list)  # held-out prompt accuracy per epoch
    stopped_early: bool = False
    # first and last 5% of the steps: loss_* over the learning batches (per batch kind, averaged
    # over the kinds), preserve_* over the preservation batches (memctl.train.preserve; cross-entropy to
    # the anchor, its entropy included; under `--preserve-by states`, memctl.train.keepstates's loss)
    preserve_first: float = float("nan")
    preserve_last: float = float("nan")
    heldout_loss: list[float] = field(default_factory=list)  # held-out distillation loss per epoch
    restarts: int = 0  # times the unit started over (or rolled back) at half the learning rate (memctl.train.diverge)


@dataclass
class TrainedUnit:
    """A unit trained in memory: its result, its parameters and its provenance, not yet written."""

    result: UnitResult
    unit: Unit
    params: UnitParams
    seen: dict[tuple[int, int], dict[str, int]]  # (level, node) -> doc -> tokens trained


def write_unit(reg: Registry, tu: TrainedUnit) -> dict[tuple[int, int], tuple[str, str]]:
    """Write the unit's trained blocks as new files; returns (level, node) -> (file, sha256).
    Nothing points to them until `record_unit` commits."""
    files = {}
    for pos, (level, first, _n) in enumerate(tu.unit.levels):
        for lvl, node in tu.seen:
            if lvl == level:
                files[(lvl, node)] = reg.write_block(lvl, node, tu.params.block(pos, node - first))
    return files


def record_unit(reg: Registry, tu: TrainedUnit, files: dict[tuple[int, int], tuple[str, str]]) -> None:
    """Point the unit's block rows at their new files, with provenance (inside the caller's
    transaction, if any). Blocks of the unit that saw no data (stale, dropped or withheld ones
    included) go back to their initial state."""
    stamp = now()
    for level, first, n in tu.unit.levels:
        reg.db.execute(
            "update blocks set file = null, sha256 = null, state = 'init', trained_tokens = 0, updated = ? "
            "where level = ? and idx >= ? and idx < ? and (file is not null or state != 'init')",
            [stamp, level, first, first + n],
        )
        reg.db.execute(
            "delete from block_docs where block_id in (select id from blocks where level = ? and idx >= ? and idx < ?)",
            [level, first, first + n],
        )
    for (lvl, node), (file, sha) in files.items():
        bid = block_id(lvl, node)
        reg.db["blocks"].update(
            bid,
            {
                "file": file,
                "sha256": sha,
                "state": "trained",
                "trained_tokens": sum(tu.seen[(lvl, node)].values()),
                "updated": stamp,
            },
        )
        reg.db["block_docs"].insert_all(
            [{"block_id": bid, "doc_id": doc, "tokens": n} for doc, n in tu.seen[(lvl, node)].items()]
        )


def finish_unit(reg: Registry, tu: TrainedUnit) -> None:
    """Write the unit's blocks, switch the registry to them in one transaction, then delete the
    files they replace. An interruption before the commit leaves the old blocks in place."""
    files = write_unit(reg, tu)
    with reg.db.atomic():
        record_unit(reg, tu, files)
    reg.sweep_orphans()


def start_run(reg: Registry, unit: str, tcfg: TrainConfig, dtype: str) -> int:
    """A run row for `unit`, trained with `tcfg` in compute dtype `dtype` (fp32 or bf16)."""
    row = {
        "started": now(), "status": "running", "unit": unit, "config": dumps(dataclasses.asdict(tcfg)), "dtype": dtype,
    }  # fmt: skip
    return int(reg.db["runs"].insert(row).last_pk)


def stop_run(reg: Registry, run_id: int) -> None:
    reg.db["runs"].update(run_id, {"status": "interrupted", "finished": now()})


def run_row(res: UnitResult) -> dict[str, Any]:
    """The `runs` columns of a finished unit."""
    stats = {k: getattr(res, k) for k in ("steps", "tokens", "loss_first", "loss_last", "seconds")}
    return {"status": "done", "finished": now(), **stats}


def commit_unit(reg: Registry, tu: TrainedUnit, run_id: int) -> UnitResult:
    """Write a trained unit's blocks and commit them (one transaction), drop its checkpoint, close its run."""
    finish_unit(reg, tu)
    drop_checkpoint(reg.checkpoint_dir(), tu.unit.name)
    reg.db["runs"].update(run_id, run_row(tu.result))
    return tu.result
