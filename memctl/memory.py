"""FFN-memory math (pure torch; knows no files).

A block of rank r at level l holds, for each of the L memory layers, r extra SwiGLU neurons:
gate (L, r, d), up (L, r, d), down (L, r, d). Fetching the blocks of a path concatenates their
neurons onto the anchor FFN's inner dimension:

    y = down(act(gate x) * up x) + sum_l  act(x G_l^T) * (x U_l^T) @ D_l

Every sample in a batch may fetch different blocks: a LevelFetch holds the U distinct blocks of
one level used by the batch, stacked, and `index` maps each sample to one of them (or -1: none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

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

    def layer_weights(
        self, slot: int, rows: int | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """For memory layer `slot`: per level (G, U, D, mask) with G/U/D (r, d) shared or (B, r, d).
        `rows`: the batch the layer sees; a multiple of `batch` (beams, several samples per prompt,
        expanded the way transformers expands inputs) repeats each sample's blocks."""
        out = []
        rows = rows or self.batch
        if rows % self.batch:
            raise ValueError(f"memories were chosen for {self.batch} rows, the model runs {rows}")
        for lv in self.levels:
            if lv.shared():
                out.append((lv.gate[0, slot], lv.up[0, slot], lv.down[0, slot], None))
                continue
            index = lv.index.repeat_interleave(rows // self.batch) if rows != self.batch else lv.index
            idx = index.clamp(min=0)
            mask = (index >= 0).to(lv.gate.dtype)  # (B,)
            out.append((lv.gate[idx, slot], lv.up[idx, slot], lv.down[idx, slot], mask))
        return out


def memory_delta(x: torch.Tensor, fetched: Fetched, slot: int, act: Act) -> torch.Tensor:
    """Extra FFN output of the fetched neurons at memory layer `slot`. x: (B, T, d) -> (B, T, d)."""
    delta = torch.zeros_like(x)
    for g, u, dn, mask in fetched.layer_weights(slot, x.shape[0]):
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
