"""How `forget` retrains a unit exactly as it was trained: with the configuration of its last run,
in the compute dtype of that run (fp32 or bf16, memctl.core.placement), on the CPU."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ..core.config import TrainConfig, train_config_from_json
from ..core.placement import DTYPES, Placement, dtype_name
from ..model.anchor import attach
from ..registry import Registry
from ..serve.session import BankSession
from ..train.loop import load_bank_anchor


def last_training(reg: Registry, unit: str) -> tuple[TrainConfig, str]:
    """The configuration and compute dtype the unit was last trained with (exact retraining repeats
    both; memctl's defaults in fp32 for a unit never trained)."""
    row = reg.db.execute(
        "select config, dtype from runs where unit = ? and status = 'done' order by id desc limit 1", [unit]
    ).fetchone()
    if not row:
        return TrainConfig(), "fp32"
    return train_config_from_json(row[0]), row[1] if row[1] in DTYPES else "fp32"


@contextmanager
def trainers(session: BankSession, dtypes: Sequence[str]) -> Iterator[dict[str, tuple[Any, Any]]]:
    """An anchor with memories attached for each compute dtype in `dtypes`, on the CPU: the session's own
    where its dtype is the one, else the bank's anchor loaded again in that dtype (and let go after)."""
    own = dtype_name(session.anchor.dtype)
    out: dict[str, tuple[Any, Any]] = {}
    handles = []
    try:
        for dt in sorted(set(dtypes)):
            if dt == own:
                out[dt] = (session.anchor, session.handle)
                continue
            anchor = load_bank_anchor(session.reg, session.home, Placement(torch.device("cpu"), DTYPES[dt]))
            handles.append(attach(anchor.model, session.reg.config.memory.layers))
            out[dt] = (anchor, handles[-1])
        yield out
    finally:
        for h in handles:
            h.detach()
