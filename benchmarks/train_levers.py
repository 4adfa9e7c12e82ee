"""The levers of benchmarks/train.py: memctl's training step (as in train_unit) with each of its
shortcuts switched on or off, timed step by step on the same first-epoch batches."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from train_common import Timed, bank_units

from memctl.core.config import TrainConfig
from memctl.model.anchor import Anchor, attach
from memctl.registry import Registry
from memctl.train.batches import batch_loss, build_prefix_cache, collate, epoch_batches, load_samples
from memctl.train.optim import BlockAdamW, clip_grad_norm
from memctl.train.units import Unit, UnitParams, unit_of


# ---- levers: memctl's step (as in train_unit) with each shortcut switched on or off -----------------
@dataclass(frozen=True)
class Variant:
    name: str
    full_depth: bool  # memories in every layer (ranks scaled: same fetched parameters)
    grouped: bool  # each batch from one level-1 unit (else: batches over the whole bank)
    anchor_grads: bool  # anchor weight gradients and an AdamW state for it
    cache: bool  # frozen prefix cached


CHAIN = (
    Variant("naive: full-depth memories, anchor grads + AdamW, batches mix clusters", True, False, True, False),
    Variant("+ frozen anchor (no anchor gradients or optimizer state)", True, False, False, False),
    Variant("+ batches grouped by level-1 cluster", True, True, False, False),
    Variant("+ memories in the last layers only", False, True, False, False),
    Variant("+ cached frozen prefix (= memctl)", False, True, False, True),
)


def lever_run(reg: Registry, anchor: Anchor, tcfg: TrainConfig, v: Variant, n_steps: int, split_head: bool) -> Timed:
    cfg, n = reg.config, anchor.n_layers
    mem = cfg.memory
    if v.full_depth:
        scale = len(mem.layers) / n
        mem = dataclasses.replace(mem, layers=tuple(range(n)), ranks=tuple(max(1, round(r * scale)) for r in mem.ranks))
    mcfg = dataclasses.replace(cfg, memory=mem)
    k, p = cfg.tree.k, cfg.tree.p
    units = bank_units(reg)
    samples = {u: load_samples(reg, anchor, u, "lm") for u in units}
    if v.grouped:  # round-robin over the units' first-epoch batches, as the compare stream orders them
        firsts = {u: [[samples[u][i] for i in b] for b in epoch_batches(samples[u], u, k, tcfg, 0)] for u in units}
        jobs = [(u, firsts[u][j]) for j in range(max(map(len, firsts.values()))) for u in units if j < len(firsts[u])]
        owners = {u: unit_of(mcfg, u) for u in units}
    else:  # one unit spanning the bank: every level gathered per sample, whole-bank gradients
        pool = [s for u in units for s in samples[u]]
        jobs = [("bank", [pool[i] for i in b]) for b in epoch_batches(pool, "0", k, tcfg, 0)]
        owners = {"bank": Unit("bank", [(lvl, 0, k**lvl) for lvl in range(1, p + 1)])}
    jobs = jobs[: n_steps + 1]
    start = min(mem.layers)
    cache = build_prefix_cache(anchor, start, [s for _, b in jobs for s in b]) if v.cache else None
    params = {u: UnitParams(mcfg, owners[u], anchor.device) for u in {u for u, _ in jobs}}
    opts = {u: BlockAdamW(pp.flat(), lr=tcfg.lr, betas=tcfg.betas, weight_decay=tcfg.weight_decay)
            for u, pp in params.items()}  # fmt: skip
    handle = attach(anchor.model, mem.layers)
    anchor_opt = None
    if v.anchor_grads:
        for w in anchor.model.parameters():
            w.requires_grad_(True)
        # lr 0: the full AdamW computation, the anchor left as it is
        anchor_opt = torch.optim.AdamW(anchor.model.parameters(), lr=0.0, betas=tcfg.betas)
    timed, pad = Timed(), anchor.tokenizer.pad_token_id
    try:
        for i, (u, batch) in enumerate(jobs):
            t = time.perf_counter()
            ids, mask, labels = collate(batch, pad)
            local = owners[u].local_index([s.path for s in batch])
            states = None
            if cache is not None:
                states = torch.zeros(
                    ids.shape[0], ids.shape[1], anchor.hidden, dtype=anchor.dtype, device=anchor.device
                )
                for j, smp in enumerate(batch):
                    states[j, : len(smp.ids)] = cache[smp.key]
            with handle.using(params[u].fetched(local)):
                loss = batch_loss(anchor.model, batch, ids, mask, labels, states, start, split_head)
            loss.backward()
            clip_grad_norm(params[u].flat(), tcfg.grad_clip)
            opts[u].step(params[u].touched(local))
            opts[u].zero_grad()
            if anchor_opt is not None:
                anchor_opt.step()
                anchor_opt.zero_grad(set_to_none=True)
            if i:  # the first step warms up
                timed.add(int(mask.sum()), time.perf_counter() - t)
    finally:
        handle.detach()
        for w in anchor.model.parameters():
            w.requires_grad_(False)
            w.grad = None
    return timed
