"""One safetensors file per memory block: written atomically, checksum verified on load."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..errors import IntegrityError
from ..memory import PARTS


def write_block(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """Write to a temp file, fsync, rename over `path`. Returns the file's sha256."""
    data = st_save({k: tensors[k].detach().contiguous().cpu() for k in PARTS}, metadata=meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


def read_block(path: Path, sha256: str) -> dict[str, torch.Tensor]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(f"block file {path} is missing; retrain the bank (memctl train --retrain)") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise IntegrityError(f"block file {path} does not match its checksum; it was changed or corrupted")
    return st_load(data)
