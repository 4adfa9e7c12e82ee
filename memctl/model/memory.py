"""FFN-memory math (pure torch; knows no files).

A block of rank r at level l holds, for each of the L memory layers, r extra SwiGLU neurons:
gate (L, r, d), up (L, r, d), down (L, r, d). Fetching the blocks of a path concatenates their
neurons onto the anchor FFN's inner dimension:

    y = down(act(gate x) * up x) + sum_l  act(x G_l^T) * (x U_l^T) @ D_l

Every sample in a batch may fetch different blocks: a LevelFetch holds the U distinct blocks of
one level used by the batch, stacked, and `index` maps each sample to one of them (or -1: none).

A batch whose rows fetch few distinct blocks (a training batch: one level-1 block and a few of its
children) runs every memory layer as one widened FFN: the neurons of all the blocks its rows fetch,
concatenated once per forward pass (and cast to the activations' dtype once), with a mask that zeroes
each row's neurons of blocks it does not fetch. Three matmuls per layer, whatever the batch's paths.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

Act = Callable[[torch.Tensor], torch.Tensor]
PARTS = ("gate", "up", "down")
# a batch runs as one widened FFN (`_Fused`) while the neurons of all the blocks its rows fetch exceed the
# neurons one row fetches by at most this many (each row computes the others, masked, for nothing); beyond,
# block by block. Measured on training batches, forward and backward (docs/history.md): fictional's (ranks
# 64/32, four level-2 blocks: 96 neurons more than a row's 96) ran 5-16% faster widened; foldoc's (168/80:
# 240 more than a row's 248) 4-5% slower
FUSE_WASTE = 128


@dataclass
class LevelFetch:
    gate: torch.Tensor  # (U, L, r, d)
    up: torch.Tensor  # (U, L, r, d)
    down: torch.Tensor  # (U, L, r, d)
    index: torch.Tensor  # (B,) long, into U; -1 = this sample fetches nothing at this level
    _views: dict[tuple[torch.dtype, torch.device], list[list[tuple[torch.Tensor, torch.Tensor]]]] = field(
        default_factory=dict, repr=False, compare=False
    )
    _runs: dict[int, list[tuple[int, int]] | None] = field(default_factory=dict, repr=False, compare=False)

    def shared(self) -> bool:
        """One block serves the whole batch: a plain matmul, no per-sample gather."""
        return self.gate.shape[0] == 1 and bool((self.index == 0).all())

    def runs(self, index: torch.Tensor) -> list[tuple[int, int]] | None:
        """(block, rows) of each run of equal `index` values, when every block's rows are one run (a
        training batch sorted by path); None when some block's rows are scattered. Read once per
        fetch and batch size: every layer asks."""
        key = int(index.numel())
        if key not in self._runs:
            values, counts = torch.unique_consecutive(index.cpu(), return_counts=True)
            vs = values.tolist()
            self._runs[key] = list(zip(vs, counts.tolist(), strict=True)) if len(set(vs)) == len(vs) else None
        return self._runs[key]

    def weights(self, slot: int, dtype: torch.dtype, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per block, at memory layer `slot`: its gate and up rows stacked (2r, d) and its down (r, d), in
        `dtype` on `device`.

        Cast once per fetch, and views of that one copy: in training, the backward pass then writes each
        stacked (U, L, r, d) gradient once. Casting or indexing per layer would make autograd write a
        gradient of the whole stack for every layer and every block it used."""
        key = (dtype, device)
        if key not in self._views:
            gate_up = torch.cat([self.gate, self.up], dim=2).to(device=device, dtype=dtype)  # (U, L, 2r, d)
            down = self.down.to(device=device, dtype=dtype)
            self._views[key] = [
                list(zip(gu.unbind(0), dn.unbind(0), strict=True))
                for gu, dn in zip(gate_up.unbind(1), down.unbind(1), strict=True)
            ]
        return self._views[key][slot]


@dataclass
class _Fused:
    """The blocks a batch fetches as one widened FFN: per memory layer, gate and up rows stacked (2R, d)
    and down (R, d), in the activations' dtype; `mask` (rows, R) 1 where a row fetches the neuron, None
    when every row fetches every neuron."""

    gate_up: list[torch.Tensor]
    down: list[torch.Tensor]
    mask: torch.Tensor | None
    rank: int


@dataclass
class Fetched:
    """What one forward pass uses: the fetched blocks of each level for each sample."""

    levels: list[LevelFetch]
    batch: int
    # int8 serving: (rows of the batch, the int8 pack of the blocks those rows fetch, every level
    # concatenated); forward passes then use these instead of `levels`
    packed: list[tuple[torch.Tensor, Packed]] | None = None
    # (rows, dtype, device) -> the widened FFN (None: block by block), made at the first memory layer of a
    # forward pass and reused by the others; a Fetched serves one forward pass (or one generation) of
    # weights that do not change meanwhile
    _fused: dict[tuple[int, torch.dtype, torch.device], _Fused | None] = field(
        default_factory=dict, repr=False, compare=False
    )

    def rows_per_sample(self, rows: int) -> int:
        """How many rows of a batch of `rows` each sample has (beams, several samples per prompt,
        expanded the way transformers expands inputs)."""
        if rows % self.batch:
            raise ValueError(f"memories were chosen for {self.batch} rows, the model runs {rows}")
        return rows // self.batch

    def row_index(self, lv: LevelFetch, rows: int | None = None) -> torch.Tensor:
        """The level's per-row block index for a batch of `rows` (a multiple of `batch`)."""
        per = self.rows_per_sample(rows or self.batch)
        return lv.index.repeat_interleave(per) if per != 1 else lv.index


# The blocks of one path for int8 serving: per memory layer, their gate and up rows as one int8
# matrix (d -> 2r, r the path's total rank) and their down as another (r -> d), each prepacked for
# torch's dynamic-quantization kernel (fbgemm on x86), with r and d.
Packed = list[tuple[Any, Any, int, int]]
PACKERS = 2  # layers packed at once


def _prepack(weight: torch.Tensor) -> Any:
    """One (out, in) weight quantized as torch.ao's `quantize_dynamic` quantizes nn.Linear under
    `default_dynamic_qconfig` (per-tensor symmetric qint8), prepacked for `quantized::linear_dynamic`."""
    observer = torch.ao.quantization.default_dynamic_qconfig.weight()
    observer(weight)
    scale, zero = observer.calculate_qparams()
    qweight = torch.quantize_per_tensor(weight, float(scale), int(zero), torch.qint8)
    return torch.ops.quantized.linear_prepack(qweight, None)


def pack_int8(blocks: list[dict[str, torch.Tensor]]) -> Packed:
    """The neurons of a path's blocks as int8 weights, with activations quantized on the fly (torch's
    dynamic quantization, fbgemm/x86 kernels on CPU). A batch-1 decode reads every weight once per
    token, so int8 reads a quarter of the bytes fp32 reads; the outputs differ by rounding. One pair
    of kernels per layer for the whole path: each call quantizes its input, a fixed cost per call."""
    n_layers, _, hidden = blocks[0]["gate"].shape
    rank = sum(b["gate"].shape[1] for b in blocks)

    def layer(slot: int) -> tuple[Any, Any, int, int]:  # one copy of each layer's rows, not of the whole path
        gate_up = torch.cat([b[p][slot] for p in ("gate", "up") for b in blocks]).float()  # (2 r_total, d)
        down = torch.cat([b["down"][slot] for b in blocks]).float().T.contiguous()  # (d, r_total)
        return _prepack(gate_up), _prepack(down), rank, hidden

    # Two layers at a time: linear_prepack holds the GIL, but the copies and the quantization around it
    # do not (a demo-shaped path: 55 ms one layer at a time, 34-37 ms two at a time). Torch marks its
    # quantized tensors deprecated (still in 2.13): the warning is silenced here, in the calling
    # thread, for the whole pool; catch_warnings inside the workers raced (one worker's exit restored
    # the filters while another warned) and let the warning through.
    with warnings.catch_warnings(), ThreadPoolExecutor(PACKERS) as pool:
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor", category=UserWarning)
        return list(pool.map(layer, range(n_layers)))


def packed_bytes(packed: Packed) -> int:
    """Bytes of the int8 weights (scales and zero points aside)."""
    return sum(3 * r * d for _, _, r, d in packed)


_LINEAR_INT8 = torch.ops.quantized.linear_dynamic


def _packed_delta(x: torch.Tensor, fetched: Fetched, slot: int, act: Act) -> torch.Tensor:
    assert fetched.packed is not None

    def ffn(z: torch.Tensor, packed: Packed) -> torch.Tensor:
        # the kernel called directly, as the quantized nn.Linear calls it (7-bit activations,
        # reduce_range): skipping the module call took a quarter off this path in a micro-benchmark
        gu, dn, r, _ = packed[slot]
        h = _LINEAR_INT8(z.float(), gu, True)
        return _LINEAR_INT8(act(h[..., :r]) * h[..., r:], dn, True).to(z.dtype)

    if len(fetched.packed) == 1 and fetched.packed[0][0].numel() == fetched.batch:
        return ffn(x, fetched.packed[0][1])  # one path serves every row
    per = fetched.rows_per_sample(x.shape[0])  # rows of an expanded batch follow their sample
    out = torch.zeros_like(x)
    for rows, packed in fetched.packed:
        rows = (rows[:, None] * per + torch.arange(per)).reshape(-1)
        out[rows] = ffn(x[rows], packed)
    return out


def memory_delta(x: torch.Tensor, fetched: Fetched, slot: int, act: Act) -> torch.Tensor:
    """Extra FFN output of the fetched neurons at memory layer `slot`. x: (B, T, d) -> (B, T, d).

    A batch whose rows fetch few distinct blocks runs as one widened FFN (`_fuse`). Otherwise rows are
    grouped by the block they fetch: one plain matmul per distinct block of a level, on that block's
    own weights (no per-row copy of the weights, and one weight gradient per block)."""
    if fetched.packed is not None:
        return _packed_delta(x, fetched, slot, act)
    key = (int(x.shape[0]), x.dtype, x.device)
    if key not in fetched._fused:
        fetched._fused[key] = _fuse(fetched, *key)
    fused = fetched._fused[key]
    if fused is not None:
        h = x @ fused.gate_up[slot].T
        a = act(h[..., : fused.rank]) * h[..., fused.rank :]
        if fused.mask is not None:
            a = a * fused.mask.view(fused.mask.shape[0], *([1] * (x.dim() - 2)), fused.rank)
        return a @ fused.down[slot]
    delta: torch.Tensor | None = None
    for lv in fetched.levels:
        blocks = lv.weights(slot, x.dtype, x.device)
        if lv.shared():
            out = _ffn(x, blocks[0], act)
            delta = out if delta is None else delta + out
            continue
        index = fetched.row_index(lv, x.shape[0])
        runs = lv.runs(index)
        if runs is not None:  # each block's rows are one run: split and concatenate, no gather or scatter
            parts = x.split([n for _, n in runs], dim=0)
            out = torch.cat([_ffn(z, blocks[b], act) if b >= 0 else torch.zeros_like(z) for z, (b, _) in
                             zip(parts, runs, strict=True)])  # fmt: skip
            delta = out if delta is None else delta + out
            continue
        for b in index.unique().tolist():
            if b < 0:  # these rows fetch nothing at this level
                continue
            rows = (index == b).nonzero().squeeze(1).to(x.device)  # indices stay on the CPU: no device sync
            if rows.numel() == x.shape[0]:
                out = _ffn(x, blocks[b], act)
                delta = out if delta is None else delta + out
            else:
                out = _ffn(x.index_select(0, rows), blocks[b], act)
                delta = (torch.zeros_like(x) if delta is None else delta).index_add(0, rows, out)
    return torch.zeros_like(x) if delta is None else delta


def _fuse(fetched: Fetched, rows: int, dtype: torch.dtype, device: torch.device) -> _Fused | None:
    """The blocks the batch's rows fetch, every level, as one widened FFN (`_Fused`); None when each row would
    compute more than FUSE_WASTE neurons it does not fetch, or when no row fetches anything.

    One copy of the fetched weights per forward pass: in training, the backward pass then writes each
    block's gradient once, not once per layer and block."""
    gates, ups, downs, masks = [], [], [], []
    per_row = 0
    for lv in fetched.levels:
        index = fetched.row_index(lv, rows).cpu()
        used = sorted({b for b in index.tolist() if b >= 0})
        if not used:
            continue
        n, r = lv.gate.shape[0], lv.gate.shape[2]
        pick = None if len(used) == n else torch.tensor(used, device=lv.gate.device)
        gates.append(_columns(lv.gate, pick))
        ups.append(_columns(lv.up, pick))
        downs.append(_columns(lv.down, pick))
        position = torch.full((n,), -1, dtype=torch.long)
        position[torch.tensor(used)] = torch.arange(len(used))
        own = torch.where(index >= 0, position[index.clamp_min(0)], -1)  # each row's block among `used`
        masks.append((own[:, None] == torch.arange(len(used))[None, :]).repeat_interleave(r, dim=1))
        per_row += r
    if not gates:
        return None
    rank = sum(g.shape[1] for g in gates)
    if rank - per_row > FUSE_WASTE:
        return None
    gate_up = torch.cat(gates + ups, dim=1).to(device=device, dtype=dtype)  # (L, 2R, d)
    down = torch.cat(downs, dim=1).to(device=device, dtype=dtype)  # (L, R, d)
    mask = torch.cat(masks, dim=1)
    return _Fused(
        list(gate_up.unbind(0)),
        list(down.unbind(0)),
        None if bool(mask.all()) else mask.to(device=device, dtype=dtype),
        rank,
    )


def _columns(t: torch.Tensor, pick: torch.Tensor | None) -> torch.Tensor:
    """(U, L, r, d) stacked blocks -> (L, n * r, d): the `pick`ed blocks' neurons (None: all) side by side."""
    t = t if pick is None else t.index_select(0, pick)
    n, n_layers, r, d = t.shape
    return t.transpose(0, 1).reshape(n_layers, n * r, d)


def _ffn(x: torch.Tensor, block: tuple[torch.Tensor, torch.Tensor], act: Act) -> torch.Tensor:
    """One block's neurons at one layer: act(x G^T) * (x U^T) @ D, x (..., d), [G; U] (2r, d), D (r, d)."""
    gate_up, down = block
    h = x @ gate_up.T
    r = down.shape[0]
    return (act(h[..., :r]) * h[..., r:]) @ down


def init_block(
    n_layers: int, rank: int, hidden: int, std: float, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """gate/up truncated normal (+-2 std), down zero: an untrained block changes nothing."""
    out: dict[str, torch.Tensor] = {}
    for name in ("gate", "up"):
        t = torch.empty(n_layers, rank, hidden)
        torch.nn.init.trunc_normal_(t, std=std, a=-2 * std, b=2 * std, generator=generator)
        out[name] = t
    out["down"] = torch.zeros(n_layers, rank, hidden)
    return out


def block_generator(seed: int, level: int, index: int) -> torch.Generator:
    """Seeded RNG of one block's initial state, so a block can always be rebuilt from scratch."""
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + level * 10_007 + index) % (2**63 - 1))
    return g
