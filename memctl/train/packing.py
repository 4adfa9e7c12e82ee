"""Tensors plus JSON in one safetensors buffer: what memctl writes and sends where others would pickle.

A pack is a safetensors buffer whose tensors are the caller's and whose one extra uint8 tensor holds
everything else as JSON (a tensor, not header metadata: no size limit). Reading a pack parses a
header and copies bytes; unlike a pickle, a planted or forged pack can never run code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

JSON_KEY = "__json__"


class PackError(ValueError):
    """A buffer or file that is not a well-formed pack (truncated, corrupted, or something else)."""


def pack(tensors: dict[str, torch.Tensor], data: Any) -> bytes:
    """`tensors` (moved to the CPU) and `data` (plain JSON types; NaN allowed) as one buffer."""
    if JSON_KEY in tensors:
        raise ValueError(f"tensor name {JSON_KEY!r} is reserved")
    blob = json.dumps(data).encode()
    out = {k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}
    out[JSON_KEY] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return st_save(out)


def unpack(buf: bytes) -> tuple[dict[str, torch.Tensor], Any]:
    """(tensors, data) of a buffer made by `pack`; PackError when it is not one."""
    try:
        tensors = st_load(bytes(buf))
    except Exception as e:  # safetensors' SafetensorError: header too large, incomplete, malformed...
        raise PackError(f"not a safetensors buffer: {e}") from None
    blob = tensors.pop(JSON_KEY, None)
    return tensors, _json(blob)


def read_data(path: Path) -> Any:
    """The JSON part of a pack file, without reading its other tensors."""
    try:
        with safe_open(str(path), framework="pt") as f:
            blob = f.get_tensor(JSON_KEY) if JSON_KEY in f.keys() else None  # noqa: SIM118 (not a dict)
    except OSError:
        raise
    except Exception as e:
        raise PackError(f"not a safetensors file: {e}") from None
    return _json(blob)


def _json(blob: torch.Tensor | None) -> Any:
    if blob is None or blob.dtype != torch.uint8 or blob.dim() != 1:
        raise PackError("no JSON part")
    try:
        return json.loads(blob.numpy().tobytes())
    except (UnicodeDecodeError, ValueError) as e:
        raise PackError(f"its JSON part is malformed: {e}") from None
