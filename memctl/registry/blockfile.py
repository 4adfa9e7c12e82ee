"""One safetensors file per memory block: content-addressed name, written atomically, checksum
verified on load, read through a memory map.

A block's file name carries the start of its sha256 (`L1-000003.<sha16>.safetensors`), so a
retrained block is a *new* file: the registry row switches to it in a transaction, and the old file
is deleted only after that commit. An interrupted write or retrain leaves the old block intact.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as st_save

from ..core.errors import IntegrityError
from .private import private_dir, write_private

SUFFIX = ".safetensors"
MAX_HEADER = 1 << 20  # a block's header is a few hundred bytes; anything bigger is not ours


def write_block(directory: Path, stem: str, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> tuple[Path, str]:
    """Write `tensors` (a block's parts, in the caller's order) to a temp file, fsync, rename to
    `stem.<sha16>.safetensors`. Returns (path, sha256).
    The same tensors and metadata always give the same bytes (`canonical`), so the same training gives
    the same checksums."""
    data = canonical(st_save({k: t.detach().contiguous().cpu() for k, t in tensors.items()}, metadata=meta))
    sha = hashlib.sha256(data).hexdigest()
    private_dir(directory)
    path = directory / f"{stem}.{sha[:16]}{SUFFIX}"
    write_private(path, data)  # 0600: a block is distilled from private text
    return path, sha


def canonical(data: bytes) -> bytes:
    """A safetensors file with its header's keys sorted. safetensors writes the metadata map in a
    random order (a Rust HashMap), so equal blocks would otherwise get different bytes and checksums;
    offsets are relative to the data, which stays as it is. Spaces pad the header to 8 bytes, as
    safetensors does."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.dumps(json.loads(data[8 : 8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data[8 + n :]


def read_block(path: Path, sha256: str) -> dict[str, torch.Tensor]:
    """Map the file, verify its sha256, then copy its tensors out of the map (only this block is touched)."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise IntegrityError(f"block file {path} is missing; retrain the bank (memctl train --retrain)") from None
    with f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                ok = hashlib.sha256(mm).hexdigest() == sha256
        except ValueError:  # an empty file cannot be mapped
            ok = False
        if not ok:
            raise IntegrityError(f"block file {path} does not match its checksum; it was changed or corrupted")
        with safe_open(str(path), framework="pt") as st:  # memory-mapped by safetensors
            return {k: st.get_tensor(k) for k in st.keys()}  # noqa: SIM118 (safe_open is not a dict)


def read_header(path: Path) -> dict[str, Any]:
    """The safetensors header (tensor names -> dtype, shape, offsets), without reading any tensor.
    Raises IntegrityError when the file is not a well-formed safetensors file."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise IntegrityError(f"{path.name} is not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", raw)
            if not 0 < n <= MAX_HEADER:
                raise IntegrityError(f"{path.name} is not a safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n))
            size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise IntegrityError(f"{path.name} is not a readable safetensors file: {e}") from None
    if not isinstance(header, dict):
        raise IntegrityError(f"{path.name} has a malformed safetensors header")
    end = 0
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= set(spec):
            raise IntegrityError(f"{path.name}: tensor {name!r} has a malformed header entry")
        end = max(end, int(spec["data_offsets"][1]))
    if 8 + n + end != size:
        raise IntegrityError(f"{path.name}: header says {8 + n + end} bytes, the file has {size}")
    return header
