"""AdamW over stacked blocks that updates only the blocks a step touched.

Parameters are tensors whose first dimension indexes blocks, e.g. gate (n_blocks, L, r, d).
Moments and step counts are kept per block; a block that received no gradient in a step is left
exactly as it is (no weight-decay drift, no moment decay), so units and blocks stay isolated.
"""

from __future__ import annotations

import math

import torch


class BlockAdamW:
    def __init__(
        self,
        params: list[torch.Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 1e-3,
    ) -> None:
        self.params = params
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.steps = [torch.zeros(p.shape[0], dtype=torch.long, device=p.device) for p in params]

    @torch.no_grad()
    def step(self, touched: list[torch.Tensor]) -> None:
        """touched[i]: 1-D long tensor of the block rows of params[i] that were used this step."""
        for i, (p, rows) in enumerate(zip(self.params, touched, strict=True)):
            if p.grad is None or rows.numel() == 0:
                continue
            rows = rows.unique()
            self.steps[i][rows] += 1
            if rows.numel() == p.shape[0]:  # every block: in place, no gather or scatter
                self._update(p, p.grad, self.m[i], self.v[i], self.steps[i])
                continue
            p_r, m_r, v_r = p.index_select(0, rows), self.m[i].index_select(0, rows), self.v[i].index_select(0, rows)
            self._update(p_r, p.grad.index_select(0, rows), m_r, v_r, self.steps[i][rows])
            p.index_copy_(0, rows, p_r)
            self.m[i].index_copy_(0, rows, m_r)
            self.v[i].index_copy_(0, rows, v_r)

    def _update(self, p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, steps: torch.Tensor) -> None:
        """AdamW on blocks (first dimension), each with its own step count, all in place:
        p <- p (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)."""
        b1, b2 = self.betas
        t = steps.to(p.dtype).view(-1, *([1] * (p.dim() - 1)))
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = v.div(1 - b2**t).sqrt_().add_(self.eps).mul_(1 - b1**t)  # m / denom = m_hat / (sqrt(v_hat) + eps)
        p.mul_(1 - self.lr * self.weight_decay).addcdiv_(m, denom, value=-self.lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict[str, list[torch.Tensor]]:
        return {"m": self.m, "v": self.v, "steps": self.steps}

    def load_state_dict(self, state: dict[str, list[torch.Tensor]]) -> None:
        for dst, src in zip(self.m + self.v + self.steps, state["m"] + state["v"] + state["steps"], strict=True):
            dst.copy_(src)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Clip the unit's gradients to `max_norm` (global L2). Returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = math.sqrt(sum(float(torch.linalg.vector_norm(g)) ** 2 for g in grads))
    if norm > max_norm > 0:
        for g in grads:
            g.mul_(max_norm / (norm + 1e-6))
    return norm


def lr_at(step: int, total: int, peak: float, warmup: float, min_ratio: float) -> float:
    """Linear warmup to `peak`, then cosine decay to peak * min_ratio at `total`."""
    n_warm = max(1, int(round(warmup * total)))
    if step < n_warm:
        return peak * (step + 1) / n_warm
    progress = min(1.0, (step - n_warm) / max(1, total - n_warm))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
