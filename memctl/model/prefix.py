"""Shortcuts a frozen anchor allows: a frozen-prefix activation cache, and the output head run
only on real (non-padding) positions.

When memories sit only in layers >= s, layers < s see nothing trainable: their output for a window
never changes, so it is computed once and reused every epoch. Training then runs layers s.. and the
head only. `suffix_forward` checks itself against the full model once and refuses to be used for an
architecture where the two disagree (e.g. one that rescales inputs_embeds).

The vocabulary head is the largest matmul of a small model (49k x 576 for SmolLM2): `logits_at`
applies it to the positions a loss needs only, instead of to every padded position. It too is
checked against the model's own logits before use (a model may scale or soft-cap its logits).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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


@contextmanager
def layer_outputs(model: nn.Module, layers: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """While open, the output hidden states (B, T, d) of decoder layers `layers` at the latest forward
    pass, by layer index (gradients flow through them; layers skipped by `suffix_only` still count
    by their index in the whole model). No layers: an empty dict and no hooks."""
    found: dict[int, torch.Tensor] = {}
    all_layers = decoder_layers_any(model)
    hooks = []
    for i in layers:

        def grab(_mod: nn.Module, _args: Any, out: Any, i: int = i) -> None:
            found[i] = out[0] if isinstance(out, tuple) else out

        hooks.append(all_layers[i].register_forward_hook(grab))
    try:
        yield found
    finally:
        for h in hooks:
            h.remove()


def on_model(model: nn.Module, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors on the model's device (no copy when they are there already, as on the CPU)."""
    device = next(model.parameters()).device
    return tuple(t.to(device) for t in tensors)


@torch.no_grad()
def prefix_states(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
    """Input of decoder layer `start`: (B, T) ids -> (B, T, d). Layers from `start` on never run."""
    ids, mask = on_model(model, ids, mask)
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
    states, mask = on_model(model, states, mask)
    with suffix_only(model, start):
        return model(inputs_embeds=states, attention_mask=mask, use_cache=False).logits


@torch.no_grad()
def suffix_matches(model: Any, ids: torch.Tensor, mask: torch.Tensor, start: int, tol: float = 1e-4) -> bool:
    """Does prefix cache + suffix forward reproduce the full model's logits on this batch?"""
    ids, mask = on_model(model, ids, mask)
    full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    part = suffix_logits(model, prefix_states(model, ids, mask, start), mask, start)
    valid = mask.bool()
    return bool(torch.allclose(full[valid], part[valid], atol=tol, rtol=tol))


def _hidden(model: Any, ids: torch.Tensor, mask: torch.Tensor, states: torch.Tensor | None, start: int) -> torch.Tensor:
    """Final-norm hidden states (B, T, d) of the base decoder, from ids or from cached states."""
    ids, mask = on_model(model, ids, mask)
    base = model.base_model
    if states is None:
        return base(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    with suffix_only(model, start):
        return base(inputs_embeds=states, attention_mask=mask, use_cache=False).last_hidden_state


def logits_at(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    states: torch.Tensor | None = None,
    start: int = 0,
    split_head: bool = True,
) -> torch.Tensor:
    """Logits (N, V) at positions (rows[i], cols[i]) only. With `split_head` the vocabulary head runs
    on those rows alone; with `states` (B, T, d) only layers[start:] run (the prefix is cached)."""
    ids, mask, rows, cols = on_model(model, ids, mask, rows, cols)
    if split_head:
        h = _hidden(model, ids, mask, states, start)  # (B, T, d)
        return model.get_output_embeddings()(h[rows, cols])
    if states is None:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (B, T, V)
    else:
        logits = suffix_logits(model, states, mask, start)
    return logits[rows, cols]


@torch.no_grad()
def head_split_matches(model: Any, ids: torch.Tensor, mask: torch.Tensor, tol: float = 1e-4) -> bool:
    """Is lm_head(base hidden) the model's logits? (False for models that scale or cap logits.)"""
    if model.get_output_embeddings() is None:
        return False
    ids, mask = on_model(model, ids, mask)
    full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    h = _hidden(model, ids, mask, None, 0)
    part = model.get_output_embeddings()(h)
    valid = mask.bool()
    return bool(torch.allclose(full[valid], part[valid], atol=tol, rtol=tol))
