"""What training reports: a progress event per step, unit stage and epoch (`TrainEvent`), the result of a
`train` run (`TrainResult`), and the error a Ctrl-C ends it with."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import MemctlError
from .distill import PrepareReport
from .records import UnitResult


@dataclass
class TrainEvent:
    unit: str
    unit_no: int
    n_units: int
    step: int
    total_steps: int
    epoch: int
    loss: float
    tokens: int  # tokens trained so far in this unit
    tokens_per_s: float
    heldout: float | None = None  # held-out prompt accuracy after the last finished epoch
    # at the end of an epoch: each batch kind's mean loss in it (lm, kd, keep: memctl.train.diverge),
    # and why the unit now starts over or rolls back at half the learning rate (its loss diverged or drifted)
    epoch_losses: dict[str, float] | None = None
    restart: str | None = None
    # with `restart`: the epochs the unit keeps, rolling back to the end of the last one the guard passed
    # (`--on-drift rollback`; 0: it starts over from its seeded initial state)
    kept: int = 0
    sitting: int | None = None  # at the end of an epoch under `train --retire`: samples sitting the next one out


@dataclass
class TrainResult:
    bank: str
    units: list[UnitResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False
    prepare: PrepareReport | None = None  # prompts and teacher cache (distill and mix)
    placement: str = "cpu fp32"  # where the anchor ran and its dtype (Placement.label)
    rank: int = 0  # under torchrun: this process's rank, the number of ranks, the units it trained
    world: int = 1
    assigned: list[str] = field(default_factory=list)
    dp: int = 1  # ranks that trained each unit together, and this rank's gradient reductions:
    dp_steps: int = 0  # steps, bytes summed, and bytes had every block of the unit been summed
    dp_bytes: int = 0
    dp_dense_bytes: int = 0

    @property
    def tokens(self) -> int:
        return sum(u.tokens for u in self.units)


class TrainingInterrupted(MemctlError):
    """Ctrl-C during training: the last step was checkpointed."""

    exit_code = 130


INTERRUPTED = "training interrupted; checkpoint saved, run `memctl train` to resume"
