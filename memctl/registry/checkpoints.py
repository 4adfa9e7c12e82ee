"""Training checkpoint files in a bank's `checkpoints/` directory: their names, which exist, and
dropping them. Their format (tensors plus JSON, no pickle) is memctl.train.checkpoint's."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import BankStateError

SUFFIX = ".safetensors"
GLOB = f"unit-*{SUFFIX}"
LEGACY_GLOB = "unit-*.pt"  # pickles from older versions: never loaded


def checkpoint_path(directory: Path, unit: str) -> Path:
    return directory / f"unit-{unit}{SUFFIX}"


def pending_checkpoints(directory: Path) -> list[Path]:
    return sorted(directory.glob(GLOB))


def has_checkpoint(directory: Path, unit: str) -> bool:
    """Whether the unit has an interrupted run: a checkpoint, or a legacy one that `--restart` must drop."""
    return checkpoint_path(directory, unit).exists() or (directory / f"unit-{unit}.pt").exists()


def drop_checkpoint(directory: Path, unit: str) -> None:
    checkpoint_path(directory, unit).unlink(missing_ok=True)
    (directory / f"unit-{unit}.pt").unlink(missing_ok=True)


def drop_checkpoints(directory: Path) -> None:
    """Every checkpoint, legacy ones included, and temp files left by a killed write."""
    for pattern in (GLOB, LEGACY_GLOB, f".unit-*{SUFFIX}.tmp*"):
        for p in directory.glob(pattern):
            p.unlink(missing_ok=True)


def refuse_legacy(directory: Path) -> None:
    """A checkpoint from an older memctl is a pickle (loading it could run code): refuse, never load."""
    legacy = sorted(directory.glob(LEGACY_GLOB))
    if legacy:
        raise BankStateError(
            f"{legacy[0]} is a checkpoint from an older memctl, which this one never loads (a pickle can run "
            "code); pass --restart to delete it and start that training over"
        )
