"""Frozen-prefix activation cache.

When memories sit only in layers >= s, layers < s see nothing trainable: their output for a window
never changes, so it is computed once and reused every epoch. Training then runs layers s.. and the
head only. `suffix_forward` checks itself against the full model once and refuses to be used for an
architecture where the two disagree (e.g. one that rescales inputs_embeds).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .anchor import decoder_layers_any

CACHE_BYTES = 4 * 2**30  # beyond this, fall back to full forward passes


def _owner(model: nn.Module, layers: nn.ModuleList) -> tuple[nn.Module, str]:
    for module in model.modules():
        for name, child in module.named_children():
            if child is layers:
                return module, name
    raise RuntimeError("decoder layers have no parent module")


@contextmanager
def suffix_only(model: nn.Module, start: int) -> Iterator[None]:
    """Temporarily run only decoder layers[start:] (fed with inputs_embeds = cached activations)."""
    layers = decoder_layers_any(model)
    owner, name = _owner(model, layers)
    setattr(owner, name, nn.ModuleList(list(layers)[start:]))
    try:
        yield
    finally:
        setattr(owner, name, layers)


class _Stop(Exception):
    pass


@torch.no_grad()
def prefix_states(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
    """Input of decoder layer `start`: (B, T) ids -> (B, T, d). Layers from `start` on never run."""
    layers = decoder_layers_any(model)
    captured: dict[str, torch.Tensor] = {}

    def grab(_mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured["h"] = args[0] if args else kwargs["hidden_states"]
        raise _Stop

    hook = layers[start].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    except _Stop:
        pass
    finally:
        hook.remove()
    return captured["h"]


def suffix_logits(model: nn.Module, states: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
    with suffix_only(model, start):
        return model(inputs_embeds=states, attention_mask=mask, use_cache=False).logits


@torch.no_grad()
def suffix_matches(model: Any, ids: torch.Tensor, mask: torch.Tensor, start: int, tol: float = 1e-4) -> bool:
    """Does prefix cache + suffix forward reproduce the full model's logits on this batch?"""
    full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    part = suffix_logits(model, prefix_states(model, ids, mask, start), mask, start)
    valid = mask.bool()
    return bool(torch.allclose(full[valid], part[valid], atol=tol, rtol=tol))
