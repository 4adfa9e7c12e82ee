"""Shared pieces of benchmarks/train.py: step timing, turn-taking, the training stream, the FLOP model.

Imported by train.py and train_lora.py (not a script)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from memctl.core.config import TrainConfig
from memctl.core.placement import CPU, Placement
from memctl.model.anchor import Anchor, decoder_layers
from memctl.registry import Registry
from memctl.train.batches import Sample, epoch_batches, load_samples
from memctl.train.units import GENERIC, units_to_train

console = Console()
if not console.is_terminal:  # logs and pipes: wide enough for the tables
    console.width = 160
Key = tuple[str, int]  # (unit, index of the batch in the unit's own sequence)


@dataclass
class Timed:
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens, self.seconds, self.steps = self.tokens + tokens, self.seconds + seconds, self.steps + 1

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    def to_dict(self) -> dict[str, float]:
        ms = 1000 * self.seconds / max(1, self.steps)
        return {"tokens": self.tokens, "seconds": self.seconds, "steps": self.steps, "tok_s": self.tok_s, "ms_step": ms}


class Turns:
    """Two runs take turns on the CPU, `seconds` at a time (each hands over after a step), so that a
    drift in the machine's speed falls on both alike: on this shared 2-core machine the same step's
    speed moves by ±20% within minutes. Each run's `clock` stops while it waits for its turn.
    Run 0 starts; run 1 calls `begin` first. A finished run hands over for good."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.cond = threading.Condition()
        self.owner = 0
        self.since = time.perf_counter()
        self.waited = [0.0, 0.0]
        self.done = [False, False]
        self.handovers = 0

    def clock(self, me: int) -> float:
        return time.perf_counter() - self.waited[me]

    def _wait(self, me: int) -> None:
        t = time.perf_counter()
        self.cond.wait_for(lambda: self.owner == me)
        self.waited[me] += time.perf_counter() - t
        self.since = time.perf_counter()

    def begin(self, me: int) -> None:
        with self.cond:
            self._wait(me)

    def step_done(self, me: int) -> None:
        with self.cond:
            if time.perf_counter() - self.since < self.seconds or self.done[1 - me]:
                return
            self.owner, self.handovers = 1 - me, self.handovers + 1
            self.cond.notify_all()
            self._wait(me)

    def finish(self, me: int) -> None:
        with self.cond:
            self.done[me], self.owner = True, 1 - me
            self.cond.notify_all()


def bank_units(reg: Registry) -> list[str]:
    """Level-1 units with data (the generic memory is not fetched by routing: left out)."""
    return [u for u in units_to_train(reg, None, True)[0] if u != GENERIC]


def unit_stream(reg: Registry, anchor: Anchor, tcfg: TrainConfig) -> list[tuple[Key, list[Sample]]]:
    """Every unit's batches as train_unit orders them, units interleaved epoch by epoch (units are
    independent for memctl; a single LoRA adapter would forget early units if they came one by one)."""
    per: dict[str, list[list[list[Sample]]]] = {}
    for u in bank_units(reg):
        samples = load_samples(reg, anchor, u, tcfg.objective, tcfg.questions > 0)
        per[u] = [[[samples[i] for i in b] for b in epoch_batches(samples, u, reg.config.tree.k, tcfg, e)]
                  for e in range(tcfg.epochs)]  # fmt: skip
    stream, seen = [], dict.fromkeys(per, 0)
    for e in range(tcfg.epochs):
        for j in range(max(len(per[u][e]) for u in per)):
            for u in per:
                if j < len(per[u][e]):
                    stream.append(((u, seen[u]), per[u][e][j]))
                    seen[u] += 1
    return stream


def matmul_gflops(seconds: float = 1.5, place: Placement = CPU) -> float:
    """Best matmul rate of an FFN-shaped (1024 x 576 @ 576 x 1536) and a square 1024 product, on the
    device and in the dtype training runs in (fp32 on the CPU)."""
    best = 0.0
    sync = torch.cuda.synchronize if place.device.type == "cuda" else (lambda: None)
    for m, k, n in ((1024, 576, 1536), (1024, 1024, 1024)):
        a = torch.randn(m, k, device=place.device, dtype=place.dtype)
        b = torch.randn(k, n, device=place.device, dtype=place.dtype)
        a @ b  # warm-up
        sync()
        reps, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds / 2:
            a @ b
            reps += 1
            if reps % 64 == 0:
                sync()
        sync()
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - t) / 1e9)
    return best


def mean_keys(lengths: list[int]) -> float:
    """Keys a token attends to on average under causal attention, over sequences of these lengths."""
    return sum(n * (n + 1) / 2 for n in lengths) / sum(lengths)


def flops_per_token(
    anchor: Anchor, n_fwd: int, n_bwd: int, t_att: float, extra: int, weight_grads: bool, head_frac: float = 1.0
) -> dict:
    """FLOP per trained token: the forward of the `n_fwd` decoder layers that run and the head, the
    backward (input gradients) of the `n_bwd` layers gradients flow through and the head, causal
    attention over `t_att` keys on average (backward 2x forward), and 6 FLOP per trainable extra
    parameter (memory or adapter: forward, input and weight gradients). The head runs on the
    positions the loss covers, `head_frac` of the tokens (all but one per window for next-token
    loss, the answer positions of a distillation prompt). `weight_grads`: the anchor's own weight
    gradients too (fine-tuning it). `issue`: the issue's 4 x (parameters that run)."""
    layer = sum(m.weight.numel() for m in decoder_layers(anchor.model)[0].modules() if isinstance(m, torch.nn.Linear))
    head = anchor.model.get_output_embeddings().weight.numel()
    fwd, bwd = 2 * (n_fwd * layer + head_frac * head), 2 * (n_bwd * layer + head_frac * head)
    att = 4 * anchor.hidden * t_att * (n_fwd + 2 * n_bwd)
    total = fwd + bwd + (bwd if weight_grads else 0) + att + 6 * extra
    issue = 2 * (n_fwd * layer + head) + 2 * (n_bwd * layer + head)
    return {"flop": total, "issue": issue, "attention": att, "extra": 6 * extra}


def show(title: str, cols: tuple[str, ...], rows: list[list[str]]) -> None:
    t = Table(title=title)
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*r)
    console.print(t)
