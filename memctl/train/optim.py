"""AdamW over stacked blocks that updates only the blocks a step touched.

Parameters are tensors whose first dimension indexes blocks, e.g. gate (n_blocks, L, r, d).
Moments and step counts are kept per block; a block that received no gradient in a step is left
exactly as it is (no weight-decay drift, no moment decay), so units and blocks stay isolated.

The update runs as torch's fused AdamW kernel (`torch._fused_adamw_`, what `torch.optim.AdamW(fused=True)`
calls) on views of the touched blocks, each with its own step count: one pass over each block's
parameter, gradient and moments, in place. Where that kernel is missing (an older torch, another
device), the same update runs as separate tensor operations.
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
        # float32 counts (the fused kernel reads them so); exact up to 2**24 steps
        self.steps = [torch.zeros(p.shape[0], dtype=torch.float32, device=p.device) for p in params]
        self.fused = all(_fused_available(p.device) for p in params)

    @torch.no_grad()
    def step(self, touched: list[torch.Tensor]) -> None:
        """touched[i]: 1-D long tensor of the block rows of params[i] that were used this step."""
        views: tuple[list[torch.Tensor], ...] = ([], [], [], [], [])  # params, grads, m, v, steps
        for i, (p, rows) in enumerate(zip(self.params, touched, strict=True)):
            if p.grad is None or rows.numel() == 0:
                continue
            for r in rows.unique().tolist():
                for out, t in zip(views, (p, p.grad, self.m[i], self.v[i], self.steps[i]), strict=True):
                    out.append(t[r])  # a view of block r: updated in place
        if not views[0]:
            return
        torch._foreach_add_(views[4], 1.0)
        if self.fused:
            b1, b2 = self.betas
            torch._fused_adamw_(
                *views[:4], [], views[4], lr=self.lr, beta1=b1, beta2=b2, weight_decay=self.weight_decay,
                eps=self.eps, amsgrad=False, maximize=False,
            )  # fmt: skip
        else:
            for p, g, m, v, t in zip(*views, strict=True):
                self._update(p, g, m, v, float(t))

    def _update(self, p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: float) -> None:
        """AdamW on one block at its step t, in place: p <- p (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)."""
        b1, b2 = self.betas
        p.mul_(1 - self.lr * self.weight_decay)
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = v.div(1 - b2**t).sqrt_().add_(self.eps)
        p.addcdiv_(m, denom, value=-self.lr / (1 - b1**t))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict[str, list[torch.Tensor]]:
        return {"m": self.m, "v": self.v, "steps": self.steps}

    def load_state_dict(self, state: dict[str, list[torch.Tensor]]) -> None:
        """Also reads checkpoints written before step counts were float32 (they were int64)."""
        for dst, src in zip(self.m + self.v + self.steps, state["m"] + state["v"] + state["steps"], strict=True):
            dst.copy_(src)


_FUSED: dict[str, bool] = {}


def _fused_available(device: torch.device) -> bool:
    """Whether torch's fused AdamW kernel runs on this device type (tried once on a tiny tensor)."""
    if device.type not in _FUSED:
        try:
            p, g = torch.zeros(2, device=device), torch.ones(2, device=device)
            m, v, t = torch.zeros(2, device=device), torch.zeros(2, device=device), torch.ones((), device=device)
            torch._fused_adamw_([p], [g], [m], [v], [], [t], lr=0.1, beta1=0.9, beta2=0.95, weight_decay=0.0,
                                eps=1e-8, amsgrad=False, maximize=False)  # fmt: skip
            _FUSED[device.type] = bool(p[0] < 0)
        except (AttributeError, NotImplementedError, RuntimeError):
            _FUSED[device.type] = False
    return _FUSED[device.type]


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Clip the unit's gradients to `max_norm` (global L2). Returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = math.sqrt(sum(float(n) ** 2 for n in torch._foreach_norm(grads)))
    if norm > max_norm > 0:
        torch._foreach_mul_(grads, max_norm / (norm + 1e-6))
    return norm


def lr_at(step: int, total: int, peak: float, warmup: float, min_ratio: float) -> float:
    """Linear warmup to `peak`, then cosine decay to peak * min_ratio at `total`."""
    n_warm = max(1, int(round(warmup * total)))
    if step < n_warm:
        return peak * (step + 1) / n_warm
    progress = min(1.0, (step - n_warm) / max(1, total - n_warm))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
