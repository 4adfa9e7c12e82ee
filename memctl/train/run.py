"""Train memory blocks on a frozen anchor, one isolated unit at a time.

A unit is a level-1 subtree (its level-1 block and every deeper block under it) or the generic
memory. Each unit has its own data order, RNG stream, optimizer state and gradient clipping, so a
unit can be (re)trained alone with identical results: the basis of exact forgetting, resumption
and distributed training. Checkpoints are written every few steps; a rerun resumes from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..core.config import TrainConfig
from ..core.placement import AUTO, Placement, dtype_name, placement
from ..model.anchor import attach
from ..registry import Registry, dumps, memctl_home, now
from ..registry.lock import bank_lock
from ..registry.runs import interrupt_dead_runs, retrained_since
from .distributed import World, train_distributed
from .events import INTERRUPTED, TrainEvent, TrainingInterrupted, TrainResult
from .loop import (
    load_bank_anchor,
    prepare_training,
    sigint_flag,
    train_unit,
)
from .plan import default_dtype, plan_training
from .records import commit_unit, start_run, stop_run
from .units import units_to_train


def train(
    name: str,
    overrides: dict[str, Any] | None = None,
    *,
    subtree: int | None = None,
    retrain: bool = False,
    restart: bool = False,
    home: Path | None = None,
    progress: Callable[[TrainEvent], None] | None = None,
    max_steps: int | None = None,
    dp: int = 1,
    device: str | None = None,
    dtype: str | None = None,
) -> TrainResult:
    """Train every unit that needs it (or one `subtree`), resuming from checkpoints.

    `overrides` are TrainConfig fields given by the user. `max_steps` stops each unit after that
    many steps with a checkpoint, as an interruption would (used by tests). Under torchrun (WORLD_SIZE
    above 1) the units are shared out across the ranks (memctl.train.distributed); rank 0 alone writes.
    `dp` ranks train each unit together (data-parallel); WORLD_SIZE must be a multiple of it.
    `device` and `dtype` place the anchor (memctl.core.placement; default cpu, and the dtype the bank
    was last trained in, or auto for a bank never trained: bf16 on a CPU with native bf16, fp32 elsewhere;
    `cuda` under torchrun is each rank's own GPU).
    """
    world = World.from_env()
    home = home or memctl_home()
    place = placement(device, dtype or AUTO, world.local_rank, world.size)  # a bad --dtype fails first
    if dtype is None:
        reg = Registry.open(name, home)
        try:
            place = placement(device, default_dtype(reg, checkpoint=not restart), world.local_rank, world.size)
        finally:
            reg.close()
    if world.size > 1 or dp != 1:
        return train_distributed(
            world, name, overrides, subtree=subtree, retrain=retrain, restart=restart, home=home,
            progress=progress, max_steps=max_steps, dp=dp, place=place,
        )  # fmt: skip
    asked = now()
    with bank_lock(name, home) as waited:  # one writer at a time (memctl.registry.lock)
        reg = Registry.open(name, home)
        interrupt_dead_runs(reg)  # we hold the lock: a run still 'running' is a killed process's
        tcfg, todo, done = plan_training(reg, overrides, subtree, retrain, restart, place)
        if waited and retrain:  # units another writer retrained alike while we waited are done
            pending, _ = units_to_train(reg, subtree, False)
            config = dumps(dataclasses.asdict(tcfg))
            fresh = [u for u in retrained_since(reg, todo, asked, config) if u not in pending]
            todo, done = [u for u in todo if u not in fresh], done + fresh
        return _train_units(reg, home, place, tcfg, todo, done, progress, max_steps)


def _train_units(
    reg: Registry,
    home: Path,
    place: Placement,
    tcfg: TrainConfig,
    todo: list[str],
    done: list[str],
    progress: Callable[[TrainEvent], None] | None,
    max_steps: int | None,
) -> TrainResult:
    name = reg.name
    result = TrainResult(bank=name, skipped=done, placement=place.label)
    if not todo:
        return result
    anchor = load_bank_anchor(reg, home, place)
    torch.manual_seed(tcfg.seed)
    handle = attach(anchor.model, reg.config.memory.layers)
    try:
        result.prepare, split_head = prepare_training(reg, anchor, tcfg, todo, progress)
        with sigint_flag() as flag:
            for i, unit in enumerate(todo):
                run_id = start_run(reg, unit, tcfg, dtype_name(place.dtype))
                tu = train_unit(reg, anchor, handle, unit, tcfg, i, len(todo), progress, flag, max_steps, split_head)
                if tu is None:
                    stop_run(reg, run_id)
                    result.interrupted = True
                    if flag["stop"]:
                        raise TrainingInterrupted(INTERRUPTED)
                    continue
                result.units.append(commit_unit(reg, tu, run_id))
    finally:
        handle.detach()
    return result
