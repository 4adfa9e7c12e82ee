"""Data-parallel ranks inside one unit: every rank of a group takes its share of each batch, and the
group sums the gradients of the blocks that batch touched, nothing else.

A batch is grouped by cluster, so it touches one path's blocks (a level-1 block and the leaves its
samples route to). Each rank computes the loss of its rows scaled by its share of the batch's loss
positions, so the group's summed gradient is the gradient of the whole batch's mean loss, as one
process computes it (up to float summation order). After the reduction every rank holds the same
gradient, clips it and steps the same optimizer, so the ranks' blocks stay equal without sending them.
Bytes sent per step: the touched blocks' gradients, not the bank (dense data parallelism sends all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..core.errors import InputError


@dataclass
class DataParallel:
    """This rank's place in its group of `ranks` (global ranks; the first is the group's leader)."""

    group: Any  # torch.distributed ProcessGroup
    ranks: list[int]
    index: int  # position of this rank in `ranks`
    steps: int = 0  # reductions so far, the bytes they summed, and what summing every block would take
    bytes_reduced: int = 0
    bytes_dense: int = 0

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def leader(self) -> bool:
        return self.index == 0

    def shard(self, rows: list[int]) -> list[int]:
        """This rank's rows of a batch (strided: rows of similar length spread across ranks)."""
        return rows[self.index :: self.size]

    def reduce(self, params: list[torch.Tensor], rows: list[torch.Tensor], numbers: list[float]) -> list[float]:
        """Sum over the group the gradient rows `rows[i]` of `params[i]` and a few `numbers` (the loss,
        a stop flag). Afterwards each param's gradient is the sum on `rows[i]` and zero elsewhere."""
        parts = []
        for p, r in zip(params, rows, strict=True):
            if p.grad is None:
                parts.append(torch.zeros(r.numel() * p[0].numel(), dtype=p.dtype, device=p.device))
            else:
                parts.append(p.grad[r].reshape(-1))
        device = params[0].device
        buf = torch.cat([*parts, torch.tensor(numbers, dtype=params[0].dtype, device=device)])
        dist.all_reduce(buf, group=self.group)
        self.steps += 1
        self.bytes_reduced += buf.numel() * buf.element_size()
        self.bytes_dense += sum(p.numel() * p.element_size() for p in params)
        at = 0
        for p, r in zip(params, rows, strict=True):
            n = r.numel() * p[0].numel()
            grad = torch.zeros_like(p)
            grad[r] = buf[at : at + n].view(r.numel(), *p.shape[1:])
            p.grad = grad
            at += n
        return [float(x) for x in buf[at:]]

    def broadcast(self, obj: Any) -> Any:
        """The leader's `obj` on every rank of the group (a held-out score, a checkpoint's state)."""
        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[0], group=self.group)
        return box[0]


def check_dp(dp: int, world_size: int) -> None:
    """The request `--dp N` against the job's size; the same one-line error on every rank."""
    if dp < 1:
        raise InputError(f"--dp must be at least 1 (got {dp})")
    if dp > 1 and world_size == 1:
        raise InputError(f"--dp {dp} needs a job of {dp} or more ranks: launch with `torchrun --nproc-per-node N`")
    if world_size % dp:
        raise InputError(f"WORLD_SIZE={world_size} is not a multiple of --dp {dp}")


def make_groups(world_size: int, dp: int, rank: int) -> DataParallel | None:
    """Split the job into world_size / dp groups of dp consecutive ranks (every rank creates every
    group, as torch.distributed requires); None when dp is 1."""
    if dp == 1:
        return None
    mine = None
    for g in range(world_size // dp):
        ranks = list(range(g * dp, (g + 1) * dp))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = DataParallel(group, ranks, ranks.index(rank))
    return mine
