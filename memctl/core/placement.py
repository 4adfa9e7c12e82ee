"""Where the anchor runs: a torch device and its compute dtype (`--device`, `--dtype`).

The anchor is loaded in float32 (its de-quantised cache stays float32) and then cast and moved.
Memory blocks keep float32 master weights and optimizer state whatever the dtype: the forward pass
casts them to the activations' dtype (memctl.model.memory), so under bf16 the anchor takes half the memory
and runs the GPU's bf16 matmuls while every update keeps full precision. Blocks are stored as float32.
Losses are computed in float32 from the logits (memctl.train.batches, memctl.train.distill).

`--dtype auto` picks bf16 on a CPU that multiplies bf16 in hardware (AVX512-BF16 or AMX), fp32
elsewhere. On this project's 2-core AMD EPYC (AVX512-BF16) the anchor's forward and backward run 3x as
fast in bf16 as in fp32 (679 against 227 tokens/s, 2026-11-27); a CPU without those instructions
emulates bf16 and ran it about 5x slower than fp32. On a GPU, auto is fp32: on an H200 bf16 gained
nothing for the 135M anchor (docs/scaling.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import InputError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
AUTO = "auto"


@dataclass(frozen=True)
class Placement:
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32

    @property
    def label(self) -> str:
        return f"{self.device} {dtype_name(self.dtype)}"

    @property
    def kind(self) -> str:
        """Device type and dtype: what a checkpoint must resume on (any GPU of the kind will do)."""
        return f"{self.device.type} {dtype_name(self.dtype)}"


CPU = Placement()


def dtype_name(dtype: torch.dtype) -> str:
    return next((k for k, v in DTYPES.items() if v == dtype), str(dtype).removeprefix("torch."))


def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX tiles)."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):  # a torch without these probes: assume not
        return False


def auto_dtype(device: torch.device) -> str:
    """What `--dtype auto` means on `device`: bf16 on a CPU with native bf16, fp32 otherwise."""
    return "bf16" if device.type == "cpu" and native_bf16_cpu() else "fp32"


def placement(device: str | None = None, dtype: str | None = None, local_rank: int = 0, ranks: int = 1) -> Placement:
    """Check `--device` (cpu, cuda, cuda:N) and `--dtype` (fp32, bf16, auto; default fp32). Plain `cuda` under torchrun
    (`ranks` above 1) is this rank's own GPU, cuda:LOCAL_RANK, and no other GPU may be named there."""
    name = (device or "cpu").strip().lower()
    if name == "cuda":
        name = f"cuda:{local_rank}"
    elif ranks > 1 and name.startswith("cuda:") and name != f"cuda:{local_rank}":
        raise InputError(f"--device {device}: under torchrun each rank uses its own GPU; pass --device cuda")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise InputError(f"--device {device!r}: use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise InputError(f"--device {device!r}: use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {device}: this machine's torch sees no CUDA GPU; use --device cpu")
        index = 0 if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise InputError(f"--device {name}: there are only {torch.cuda.device_count()} GPU(s)")
        dev = torch.device("cuda", index)
    key = (dtype or "fp32").strip().lower()
    if key == AUTO:
        key = auto_dtype(dev)
    if key not in DTYPES:
        raise InputError(f"--dtype {dtype!r}: use {', '.join(DTYPES)} or {AUTO}")
    if key == "bf16" and dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] < 8:
        raise InputError(f"--dtype bf16: the GPU {dev} has no native bf16 (before Ampere); use --dtype fp32")
    return Placement(dev, DTYPES[key])
