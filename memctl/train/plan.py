"""What a training run will do: the request and the bank checked, the configuration resolved, the
units to train and those already trained. No model is loaded here."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.config import TrainConfig, train_config_from_json
from ..core.errors import BankStateError, InputError
from ..core.placement import AUTO, CPU, DTYPES, Placement
from ..registry import Registry
from ..registry.checkpoints import drop_checkpoints, pending_checkpoints, refuse_legacy
from .checkpoint import checkpoint_settings
from .units import units_to_train


def plan_training(
    reg: Registry,
    overrides: dict[str, Any] | None,
    subtree: int | None,
    retrain: bool,
    restart: bool,
    place: Placement = CPU,
) -> tuple[TrainConfig, list[str], list[str]]:
    """Check the request and the bank; (configuration, units to train, units already trained).
    `restart` drops pending checkpoints; a pending one made on another device or dtype than `place`
    is refused."""
    if reg.count("windows") == 0:
        raise BankStateError(f"bank {reg.name!r} has no documents; ingest some first")
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = set(overrides) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise InputError(f"unknown training option(s): {', '.join(sorted(unknown))}")
    if restart:
        drop_checkpoints(reg.checkpoint_dir())
    refuse_legacy(reg.checkpoint_dir())
    tcfg = _resolve_config(reg, overrides, place)
    todo, done = units_to_train(reg, subtree, retrain)
    return tcfg, todo, done


def default_dtype(reg: Registry, checkpoint: bool = True) -> str:
    """`--dtype` when none is given: a pending checkpoint's dtype (unless `checkpoint` is False: `--restart`),
    else that of the bank's last finished run (training more of a bank repeats how it was trained), else
    auto (memctl.core.placement)."""
    pending = pending_checkpoints(reg.checkpoint_dir()) if checkpoint else []
    if pending:
        kind = checkpoint_settings(pending[0])[1].split()[-1]  # Placement.kind: "cpu bf16"
        if kind in DTYPES:
            return kind
    row = reg.db.execute("select dtype from runs where status = 'done' order by id desc limit 1").fetchone()
    return row[0] if row and row[0] in DTYPES else AUTO


def _resolve_config(reg: Registry, overrides: dict[str, Any], place: Placement) -> TrainConfig:
    """A pending checkpoint fixes the configuration; otherwise the bank's last training configuration
    (defaults for a new bank) plus the user's options, so that retraining stale or dropped blocks
    repeats how the bank was trained unless told otherwise."""
    pending = pending_checkpoints(reg.checkpoint_dir())
    if pending:
        config, where = checkpoint_settings(pending[0])
        saved = train_config_from_json(config)
        if where != place.kind:
            raise InputError(
                f"an interrupted run on {where} is pending; resume it with that --device and --dtype, or pass --restart"
            )
        clash = {k: v for k, v in overrides.items() if getattr(saved, k) != (tuple(v) if isinstance(v, list) else v)}
        if clash:
            pending_settings = ", ".join(f"{k}={getattr(saved, k)}" for k in clash)
            raise InputError(
                f"an interrupted run with other settings is pending ({pending_settings}); "
                "rerun without them to resume, or pass --restart"
            )
        return saved
    if "betas" in overrides:
        overrides["betas"] = tuple(overrides["betas"])
    last = reg.db.execute("select config from runs where status = 'done' order by id desc limit 1").fetchone()
    base = train_config_from_json(last[0]) if last else TrainConfig()
    tcfg = dataclasses.replace(base, **overrides)
    if tcfg.objective == "lm" and "echo" not in overrides:  # echo questions are distilled: none unless asked for
        tcfg = dataclasses.replace(tcfg, echo=0)
    if tcfg.objective == "lm" and "echo_kinds" not in overrides:
        tcfg = dataclasses.replace(tcfg, echo_kinds=0)
    if tcfg.objective == "lm" and "event_names" not in overrides:  # naming prompts are distilled too
        tcfg = dataclasses.replace(tcfg, event_names=False)
    if not tcfg.event_names and "echo_names" not in overrides:  # they ask the naming prompts back
        tcfg = dataclasses.replace(tcfg, echo_names=0)
    tcfg.validate()
    return tcfg
