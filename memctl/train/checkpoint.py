"""Training checkpoints: one file per unit, `checkpoints/unit-NAME.safetensors`, with no pickle.

The unit's parameters and optimizer moments and step counts are tensors; everything else (step,
tokens, losses, provenance, held-out scores, the training configuration, the placement) is JSON in
the same file (memctl.train.packing). A checkpoint is written whole and private (temp file, fsync, rename,
0600). The data order needs no saving: it follows from the seed. Checkpoints written by older
memctl versions (`unit-NAME.pt`) were pickles: they are never loaded, only deleted by `--restart`.
Under `train --on-drift rollback`, while the drift guard may still fire, a checkpoint also carries the unit's
*mark*, its whole state at the end of the last epoch the guard passed (tensors under `mark.`), so that a
resumed unit can go back to it exactly as an uninterrupted one would (memctl.train.diverge).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.errors import BankStateError
from ..registry.private import write_private
from .optim import BlockAdamW
from .packing import PackError, pack, read_data, unpack
from .retire import Retired
from .retire import decode as decode_retired
from .retire import encode as encode_retired

FORMAT = "memctl-checkpoint/1"
OPT_PARTS = ("m", "v", "steps")


def damaged(path: Path, why: str) -> BankStateError:
    return BankStateError(
        f"checkpoint {path} is unreadable ({why}); pass --restart (`memctl train --restart`) to drop it and start over"
    )


@dataclass
class TrainState:
    """What `train_unit` needs to go on exactly where it stopped."""

    params: list[torch.Tensor]  # UnitParams.flat(), on the CPU
    opt: dict[str, list[torch.Tensor]]  # BlockAdamW.state_dict(): m, v, steps
    step: int
    tokens: int
    losses: dict[str, list[float]]  # by batch kind
    seen: dict[tuple[int, int], dict[str, int]]  # (level, node) -> doc -> tokens trained
    scores: list[float]
    heldout_loss: list[float]
    unit: str
    seconds: float
    config: str  # TrainConfig as JSON
    placement: str  # Placement.kind
    restarts: int = 0  # times the unit started over (or rolled back) after its loss diverged or drifted
    retired: Retired = field(default_factory=dict)  # samples sitting epochs out (memctl.train.retire)
    # `--on-drift rollback`: the unit's state at the end of the last epoch the guard passed (memctl.train.diverge),
    # where it goes back to when a later epoch diverges or drifts; None before the first epoch ends, once no
    # restart is left, and under the default (`restart`)
    mark: TrainState | None = None

    def copy(self) -> TrainState:
        """A copy that shares no tensor, list or dict with this state (a mark outlives the live ones)."""
        return TrainState(
            params=[t.detach().clone() for t in self.params],
            opt={k: [t.detach().clone() for t in v] for k, v in self.opt.items()},
            step=self.step,
            tokens=self.tokens,
            losses={k: list(v) for k, v in self.losses.items()},
            seen={k: dict(v) for k, v in self.seen.items()},
            scores=list(self.scores),
            heldout_loss=list(self.heldout_loss),
            unit=self.unit,
            seconds=self.seconds,
            config=self.config,
            placement=self.placement,
            restarts=self.restarts,
            retired={i: list(v) for i, v in self.retired.items()},
            mark=None,
        )

    def restore(self, params: list[torch.Tensor], opt: BlockAdamW, path: Path) -> None:
        """Copy the saved parameters and optimizer state in place; refused unless every shape fits."""
        mine = opt.state_dict()
        pairs = list(zip(params, self.params, strict=False)) + [
            (d, s) for k in OPT_PARTS for d, s in zip(mine[k], self.opt[k], strict=False)
        ]
        sizes_ok = len(self.params) == len(params) and all(len(self.opt[k]) == len(mine[k]) for k in OPT_PARTS)
        if not sizes_ok or any(d.shape != s.shape for d, s in pairs):
            raise damaged(path, "its tensors do not fit this unit's blocks")
        with torch.no_grad():
            for dst, src in zip(params, self.params, strict=True):
                dst.copy_(src)
        opt.load_state_dict(self.opt)


def encode(state: TrainState) -> bytes:
    tensors, data = _parts(state)
    if state.mark is not None:
        mark_tensors, data["mark"] = _parts(state.mark)
        tensors |= {f"{MARK}{k}": t for k, t in mark_tensors.items()}
    return pack(tensors, data)


MARK = "mark."  # the mark's tensors in a checkpoint, beside the state's own


def _parts(state: TrainState) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {f"params.{i}": t for i, t in enumerate(state.params)}
    tensors |= {f"opt.{k}.{i}": t for k in OPT_PARTS for i, t in enumerate(state.opt[k])}
    data = {
        "format": FORMAT,
        "n_params": len(state.params),
        "step": state.step,
        "tokens": state.tokens,
        "losses": state.losses,
        "seen": [[level, node, docs] for (level, node), docs in state.seen.items()],  # in training order
        "scores": state.scores,
        "heldout_loss": state.heldout_loss,
        "unit": state.unit,
        "seconds": state.seconds,
        "config": state.config,
        "placement": state.placement,
        "restarts": state.restarts,
        "retired": encode_retired(state.retired),
    }
    return tensors, data


def decode(buf: bytes, path: Path, unit: str | None = None) -> TrainState:
    """The state in `buf` (read from `path`); a one-line BankStateError naming `path` when it is
    damaged, not a checkpoint, or (with `unit`) another unit's."""
    try:
        tensors, data = unpack(buf)
    except PackError as e:
        raise damaged(path, str(e)) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise damaged(path, "not a memctl checkpoint")
    own = {k: t for k, t in tensors.items() if not k.startswith(MARK)}
    state = _state(own, data, path)
    if data.get("mark") is not None:  # none in checkpoints written before marks existed
        marked = {k[len(MARK) :]: t for k, t in tensors.items() if k.startswith(MARK)}
        if not isinstance(data["mark"], dict):
            raise damaged(path, "malformed mark")
        state.mark = _state(marked, data["mark"], path)
        if state.mark.unit != state.unit or state.mark.step > state.step:
            raise damaged(path, "its mark is not an earlier state of the same unit")
    elif len(own) != len(tensors):
        raise damaged(path, "it holds tensors no checkpoint has")
    if unit is not None and state.unit != unit:
        raise damaged(path, f"it is unit {state.unit!r}'s, not {unit!r}'s")
    return state


def _state(tensors: dict[str, torch.Tensor], data: dict[str, Any], path: Path) -> TrainState:
    try:
        n = int(data["n_params"])
        params = [tensors[f"params.{i}"] for i in range(n)]
        opt = {k: [tensors[f"opt.{k}.{i}"] for i in range(n)] for k in OPT_PARTS}
        state = TrainState(
            params=params,
            opt=opt,
            step=int(data["step"]),
            tokens=int(data["tokens"]),
            losses={str(k): [float(x) for x in v] for k, v in data["losses"].items()},
            seen={(int(lv), int(nd)): {str(d): int(t) for d, t in docs.items()} for lv, nd, docs in data["seen"]},
            scores=[float(x) for x in data["scores"]],
            heldout_loss=[float(x) for x in data["heldout_loss"]],
            unit=str(data["unit"]),
            seconds=float(data["seconds"]),
            config=str(data["config"]),
            placement=str(data["placement"]),
            restarts=int(data.get("restarts", 0)),  # none in checkpoints written before restarts existed
            retired=decode_retired(data.get("retired", [])),  # nor before retiring
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise damaged(path, f"malformed, {type(e).__name__}: {e}") from None
    if len(tensors) != 4 * n:
        raise damaged(path, "it holds tensors no checkpoint has")
    return state


def save_checkpoint(path: Path, state: TrainState) -> None:
    write_private(path, encode(state))


def read_checkpoint(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise damaged(path, e.strerror or type(e).__name__) from None


def checkpoint_settings(path: Path) -> tuple[str, str]:
    """(training configuration as JSON, placement kind) of a checkpoint, without reading its tensors."""
    try:
        data: Any = read_data(path)
    except PackError as e:
        raise damaged(path, str(e)) from None
    except OSError as e:
        raise damaged(path, e.strerror or type(e).__name__) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise damaged(path, "not a memctl checkpoint")
    try:
        return str(data["config"]), str(data["placement"])
    except KeyError as e:
        raise damaged(path, f"malformed: no {e}") from None
