"""FFN-memory math (pure torch; knows no files).

A block of rank r at level l holds, for each of the L memory layers, r extra SwiGLU neurons:
gate (L, r, d), up (L, r, d), down (L, r, d). Fetching the blocks of a path concatenates their
neurons onto the anchor FFN's inner dimension:

    y = down(act(gate x) * up x) + sum_l  act(x G_l^T) * (x U_l^T) @ D_l

Every sample in a batch may fetch different blocks: a LevelFetch holds the U distinct blocks of
one level used by the batch, stacked, and `index` maps each sample to one of them (or -1: none).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

Act = Callable[[torch.Tensor], torch.Tensor]
PARTS = ("gate", "up", "down")


@dataclass
class LevelFetch:
    gate: torch.Tensor  # (U, L, r, d)
    up: torch.Tensor  # (U, L, r, d)
    down: torch.Tensor  # (U, L, r, d)
    index: torch.Tensor  # (B,) long, into U; -1 = this sample fetches nothing at this level

    def shared(self) -> bool:
        """One block serves the whole batch: a plain matmul, no per-sample gather."""
        return self.gate.shape[0] == 1 and bool((self.index == 0).all())


@dataclass
class Fetched:
    """What one forward pass uses: the fetched blocks of each level for each sample."""

    levels: list[LevelFetch]
    batch: int
    # int8 serving: (rows of the batch, the int8 pack of the blocks those rows fetch, every level
    # concatenated); forward passes then use these instead of `levels`
    packed: list[tuple[torch.Tensor, Packed]] | None = None

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

    def level_weights(
        self, lv: LevelFetch, slot: int, rows: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Level `lv` at memory layer `slot`: (G, U, D, mask), G/U/D (r, d) when one block serves
        every row, else (B, r, d) with mask (B,) zero where a row fetches nothing. `rows`: the batch
        the layer sees; a multiple of `batch` (beams, several samples per prompt, expanded the way
        transformers expands inputs) repeats each sample's blocks."""
        if lv.shared():
            return lv.gate[0, slot], lv.up[0, slot], lv.down[0, slot], None
        index = self.row_index(lv, rows)
        idx = index.clamp(min=0)
        mask = (index >= 0).to(lv.gate.dtype)  # (B,)
        return lv.gate[idx, slot], lv.up[idx, slot], lv.down[idx, slot], mask


# The blocks of one path for int8 serving: per memory layer, their gate and up rows as one
# dynamically quantized Linear (d -> 2r, r the path's total rank), their down as another (r -> d), and r.
Packed = list[tuple[nn.Module, nn.Module, int]]


def pack_int8(blocks: list[dict[str, torch.Tensor]]) -> Packed:
    """The neurons of a path's blocks as int8 weights, with activations quantized on the fly (torch's
    dynamic quantization, fbgemm/x86 kernels on CPU). A batch-1 decode reads every weight once per
    token, so int8 reads a quarter of the bytes fp32 reads; the outputs differ by rounding. One pair
    of kernels per layer for the whole path: each call quantizes its input, a fixed cost per call."""
    out: Packed = []
    block = {p: torch.cat([b[p] for b in blocks], dim=1) for p in PARTS}  # (L, r_total, d)
    n_layers, rank, hidden = block["gate"].shape
    for slot in range(n_layers):
        gu = nn.Linear(hidden, 2 * rank, bias=False)
        dn = nn.Linear(rank, hidden, bias=False)
        with torch.no_grad():
            gu.weight.copy_(torch.cat([block["gate"][slot], block["up"][slot]]).float())
            dn.weight.copy_(block["down"][slot].T.float())
        pair = nn.ModuleList([gu, dn]).requires_grad_(False)
        with warnings.catch_warnings():  # torch marks its quantized tensors deprecated (still in 2.13)
            warnings.simplefilter("ignore")
            spec: dict[Any, Any] = {nn.Linear: torch.ao.quantization.default_dynamic_qconfig}
            q = torch.ao.quantization.quantize_dynamic(pair, spec, dtype=torch.qint8, inplace=True)
        out.append((q[0], q[1], rank))
    return out


def packed_bytes(packed: Packed) -> int:
    """Bytes of the int8 weights (scales and zero points aside)."""
    return sum(2 * r * gu.in_features + dn.out_features * r for gu, dn, r in packed)


def _packed_delta(x: torch.Tensor, fetched: Fetched, slot: int, act: Act) -> torch.Tensor:
    assert fetched.packed is not None

    def ffn(z: torch.Tensor, packed: Packed) -> torch.Tensor:
        gu, dn, r = packed[slot]
        h = gu(z.float())
        return dn(act(h[..., :r]) * h[..., r:]).to(z.dtype)

    if len(fetched.packed) == 1 and fetched.packed[0][0].numel() == fetched.batch:
        return ffn(x, fetched.packed[0][1])  # one path serves every row
    per = fetched.rows_per_sample(x.shape[0])  # rows of an expanded batch follow their sample
    out = torch.zeros_like(x)
    for rows, packed in fetched.packed:
        rows = (rows[:, None] * per + torch.arange(per)).reshape(-1)
        out[rows] = ffn(x[rows], packed)
    return out


def memory_delta(x: torch.Tensor, fetched: Fetched, slot: int, act: Act) -> torch.Tensor:
    """Extra FFN output of the fetched neurons at memory layer `slot`. x: (B, T, d) -> (B, T, d)."""
    if fetched.packed is not None:
        return _packed_delta(x, fetched, slot, act)
    delta = torch.zeros_like(x)
    for lv in fetched.levels:
        g, u, dn, mask = fetched.level_weights(lv, slot, x.shape[0])
        g = g.to(x.dtype)
        u = u.to(x.dtype)
        dn = dn.to(x.dtype)
        if g.dim() == 2:  # shared (r, d)
            h = act(x @ g.T) * (x @ u.T)  # (B, T, r)
            delta = delta + h @ dn  # (B, T, d)
        else:  # per sample (B, r, d)
            h = act(torch.bmm(x, g.transpose(1, 2))) * torch.bmm(x, u.transpose(1, 2))  # (B, T, r)
            out = torch.bmm(h, dn)  # (B, T, d)
            if mask is not None:
                out = out * mask.to(x.dtype)[:, None, None]
            delta = delta + out
    return delta


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
