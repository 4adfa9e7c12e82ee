"""The PEFT LoRA baseline of benchmarks/train.py: LoRA on gate/up/down of every layer of its own copy of
the anchor, trained on memctl's batches with memctl's losses (imported by train.py, not a script)."""

from __future__ import annotations

from pathlib import Path

import torch
from train_common import Key, Turns

from memctl.core.config import TrainConfig
from memctl.core.placement import CPU, Placement
from memctl.core.probes import PROBE_TOKENS, Probe
from memctl.model.anchor import Anchor, attach, decoder_layers, greedy, load_anchor
from memctl.model.prefix import head_split_matches
from memctl.train.batches import Sample, batch_loss, collate
from memctl.train.optim import lr_at

FFN = ("gate_proj", "up_proj", "down_proj")
LORA = 1  # LoRA's run index in Turns (memctl's is 0)


def lora_rank(anchor: Anchor, params: int) -> int:
    """Rank whose LoRA on every layer's gate/up/down has `params` parameters (rounded)."""
    per_rank = sum(getattr(layer.mlp, n).in_features + getattr(layer.mlp, n).out_features
                   for layer in decoder_layers(anchor.model) for n in FFN)  # fmt: skip
    return max(1, round(params / per_rank))


LoraOut = tuple[Anchor, dict[Key, tuple[int, float]], float, int, list[float]]


def lora_run(
    spec: str,
    home: Path,
    stream: list[tuple[Key, list[Sample]]],
    tcfg: TrainConfig,
    rank: int,
    lr: float,
    turns: Turns,
    place: Placement = CPU,
) -> LoraOut:
    """Train LoRA on `stream` in order, with memctl's loss for each batch (`batch_loss`: next-token for
    windows, distillation against the cached teacher for prompts), the whole model run (no prefix
    cache: every layer adapts). Per batch (tokens, seconds); seconds of the whole run; trainable
    parameters; losses. Timed on `turns`' clock, taking turns with memctl's run."""
    from peft import LoraConfig, get_peft_model

    turns.begin(LORA)
    try:
        t_all = turns.clock(LORA)
        la = load_anchor(spec, home, place)  # its own copy: LoRA layers go into it
        torch.manual_seed(tcfg.seed)
        cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=list(FFN), bias="none")
        model = get_peft_model(la.model, cfg).get_base_model()  # the same HF model, LoRA layers injected
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr, betas=tcfg.betas, eps=tcfg.eps, weight_decay=tcfg.weight_decay)
        pad = la.tokenizer.pad_token_id
        ids, mask, _ = collate(stream[0][1][:2], pad)
        split_head = head_split_matches(model, ids, mask)
        times, losses = {}, []
        for i, (key, batch) in enumerate(stream):
            t = turns.clock(LORA)
            ids, mask, labels = collate(batch, pad)
            for g in opt.param_groups:
                g["lr"] = lr_at(i, len(stream), lr, tcfg.warmup, tcfg.min_lr_ratio)
            loss = batch_loss(model, batch, ids, mask, labels, None, 0, split_head)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            times[key] = (int(mask.sum()), turns.clock(LORA) - t)
            losses.append(float(loss.detach()))
            turns.step_done(LORA)
        wall = turns.clock(LORA) - t_all
    finally:
        turns.finish(LORA)
    return Anchor(model, la.tokenizer, la.path, la.digest), times, wall, sum(p.numel() for p in params), losses


def lora_answers(la: Anchor, probes: list[Probe]) -> list[str]:
    handle = attach(la.model, ())  # no memory layers: plain greedy generation with memctl's settings
    texts: list[str] = []
    for i in range(0, len(probes), 16):
        texts += greedy(la, handle, [p.prompt for p in probes[i : i + 16]], None, PROBE_TOKENS)
    return texts
