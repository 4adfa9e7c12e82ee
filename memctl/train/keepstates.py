"""Preservation on the anchor's hidden states (`train --preserve-by states`): a cheaper way to make
memories leave unrelated text alone.

Output preservation (memctl.train.preserve, the default) runs each pool sequence through the whole
anchor with the memories fetched, forward and backward, so the student can match the anchor's
next-token distribution: half of a unit's training tokens go there. But a memory block changes
the model only through what its neurons add to the FFN output of its layers: where that addition
is zero at every memory layer, the model computes exactly what the anchor computes. So the pool's
hidden states can be read once, from the anchor alone, and every later preservation step asks the
blocks on a sampled path to add nothing to them:

    loss = mean over memory layers l of  mean_t ||delta_l(x_l,t)||^2 / s_l

with x_l,t the input of layer l's FFN at pool token t (the anchor's, cached per unit), delta_l the
fetched neurons' output (memctl.model.memory.memory_delta) and s_l the mean squared norm of the
anchor's own FFN output there (so every layer counts alike, whatever its scale). A step costs a few
small matmuls per layer instead of a pass through the model. It is stricter than output preservation
(a block may not move the hidden state even in directions the head ignores) and it reads the states
of the anchor alone, not those the memories of earlier layers have already moved: where every block
keeps its own output near zero the two agree.

Pure torch over a model with memories attached (memctl.model.anchor.MemoryMLP)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..model.anchor import MemoryMLP
from ..model.memory import Fetched, memory_delta

# the states loss's weight against the distillation losses of the other batches, measured on registers
# (docs/history.md): at 100 the unit diverged at lr 1e-2 and, restarted at half of it, learned less; at
# 10 it trained at 1e-2 and answered as many facts as output preservation on the same bank at half the
# tokens, but text routed into its memories was 14.4% more perplexing against 6.0%
WEIGHT = 10.0
MODES = ("output", "states")


class PoolStates:
    """The anchor's FFN inputs at every memory layer for the pool sequences of one unit, and each
    layer's scale: read once, before the unit trains."""

    def __init__(self, states: dict[str, torch.Tensor], scale: torch.Tensor, acts: list[Any]) -> None:
        self.states = states  # sample key -> (L, T, d), the anchor's dtype
        self.scale = scale  # (L,) float32: mean ||anchor FFN output||^2 per memory layer
        self.acts = acts  # each memory layer's activation function

    def batch(self, keys: Sequence[str]) -> torch.Tensor:
        """(L, B, T, d): the states of a batch's samples (equal lengths: pool sequences)."""
        return torch.stack([self.states[k] for k in keys], dim=1)

    def loss(self, fetched: Fetched, keys: Sequence[str]) -> torch.Tensor:
        """WEIGHT x the mean over memory layers of the fetched neurons' mean squared output on the
        batch's states, relative to the anchor's own FFN output there."""
        x = self.batch(keys)
        terms = []
        for slot in range(x.shape[0]):
            d = memory_delta(x[slot], fetched, slot, self.acts[slot]).float()
            terms.append(d.pow(2).sum(-1).mean() / self.scale[slot])
        return WEIGHT * torch.stack(terms).mean()


def memory_mlps(model: torch.nn.Module) -> list[MemoryMLP]:
    """The model's memory-wrapped FFNs, in slot order."""
    found = sorted((m for m in model.modules() if isinstance(m, MemoryMLP)), key=lambda m: m.slot)
    if not found:
        raise ValueError("no memories are attached to this model")
    return found


@torch.no_grad()
def read_pool_states(model: torch.nn.Module, handle: Any, seqs: dict[str, list[int]], batch: int = 16) -> PoolStates:
    """Run each sequence (key -> token ids, all of one length) through the anchor alone and keep the
    input of every memory layer's FFN, and the mean squared norm of the anchor's FFN output there."""
    mlps = memory_mlps(model)
    device = next(model.parameters()).device
    caught: list[torch.Tensor | None] = [None] * len(mlps)
    sums = torch.zeros(len(mlps), dtype=torch.float64)
    count = 0

    def hook(slot: int) -> Any:
        def grab(module: MemoryMLP, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            caught[slot] = args[0].detach()
            sums[slot] += float(out.float().pow(2).sum(-1).sum())

        return grab

    hooks = [m.register_forward_hook(hook(m.slot)) for m in mlps]
    states: dict[str, torch.Tensor] = {}
    keys = list(seqs)
    try:
        with handle.using(None):  # the anchor alone: its FFN output is the anchor's own
            for s in range(0, len(keys), batch):
                part = keys[s : s + batch]
                ids = torch.tensor([seqs[k] for k in part], dtype=torch.long, device=device)
                model(input_ids=ids)
                count += ids.numel()
                stacked = torch.stack([c for c in caught if c is not None], dim=1)  # (B, L, T, d)
                for i, k in enumerate(part):
                    states[k] = stacked[i].clone()
    finally:
        for h in hooks:
            h.remove()
    scale = (sums / max(count, 1)).clamp_min(1e-12).to(torch.float32)
    return PoolStates(states, scale, [m.mlp.act_fn for m in mlps])
