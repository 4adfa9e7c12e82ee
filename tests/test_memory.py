"""FFN-memory math, attachment, and the frozen anchor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from memctl.model import memory
from memctl.model.anchor import attach, decoder_layers
from memctl.model.memory import Fetched, LevelFetch, block_generator, init_block, memory_delta


def _model(path: Path) -> torch.nn.Module:
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _random_level(u: int, n_layers: int, r: int, d: int, index: list[int], seed: int) -> LevelFetch:
    g = torch.Generator().manual_seed(seed)
    return LevelFetch(*(torch.randn(u, n_layers, r, d, generator=g) * 0.1 for _ in range(3)), index=torch.tensor(index))


def test_memory_equals_widened_mlp(tiny_anchor: Path) -> None:
    """Fetched neurons == the anchor MLP with its inner dimension widened by them."""
    model = _model(tiny_anchor)
    mlp = decoder_layers(model)[1].mlp
    d = model.config.hidden_size
    x = torch.randn(3, 5, d)
    levels = [_random_level(2, 3, 4, d, [0, 1, 1], 1), _random_level(3, 3, 2, d, [2, 0, 1], 2)]
    fetched = Fetched(levels, batch=3)
    got = mlp(x) + memory_delta(x, fetched, slot=1, act=mlp.act_fn)
    for b in range(3):
        gate = torch.cat([mlp.gate_proj.weight] + [lv.gate[lv.index[b], 1] for lv in levels])  # (inner+R, d)
        up = torch.cat([mlp.up_proj.weight] + [lv.up[lv.index[b], 1] for lv in levels])
        down = torch.cat([mlp.down_proj.weight.T] + [lv.down[lv.index[b], 1] for lv in levels])  # (inner+R, d)
        ref = (mlp.act_fn(x[b] @ gate.T) * (x[b] @ up.T)) @ down
        torch.testing.assert_close(got[b], ref, rtol=1e-5, atol=1e-5)


def test_shared_block_path_equals_per_sample_path(tiny_anchor: Path) -> None:
    model = _model(tiny_anchor)
    mlp = decoder_layers(model)[0].mlp
    d = model.config.hidden_size
    x = torch.randn(4, 6, d)
    shared = _random_level(1, 3, 4, d, [0, 0, 0, 0], 3)
    per_sample = LevelFetch(
        shared.gate.expand(4, -1, -1, -1),
        shared.up.expand(4, -1, -1, -1),
        shared.down.expand(4, -1, -1, -1),
        torch.arange(4),
    )
    a = memory_delta(x, Fetched([shared], 4), 0, mlp.act_fn)
    b = memory_delta(x, Fetched([per_sample], 4), 0, mlp.act_fn)
    torch.testing.assert_close(a, b)


def test_untrained_blocks_leave_logits_bit_identical_and_detach_restores(tiny_anchor: Path) -> None:
    model = _model(tiny_anchor)
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    before = model(ids).logits
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    n = model.config.num_hidden_layers
    handle = attach(model, tuple(range(n)))
    blocks = [init_block(n, 4, model.config.hidden_size, 0.2, block_generator(0, 1, i)) for i in range(2)]
    lv = LevelFetch(
        torch.stack([b["gate"] for b in blocks]),
        torch.stack([b["up"] for b in blocks]),
        torch.stack([b["down"] for b in blocks]),
        torch.tensor([0, 1]),
    )
    with handle.using(Fetched([lv], 2)):
        during = model(ids).logits
    assert torch.equal(before, during)
    handle.detach()
    assert torch.equal(before, model(ids).logits)
    after = model.state_dict()
    assert all(torch.equal(state_before[k], after[k]) for k in state_before)
    assert all(type(layer.mlp).__name__ != "MemoryMLP" for layer in decoder_layers(model))


def test_each_sample_gets_its_own_blocks(tiny_anchor: Path) -> None:
    """A batch that mixes paths gives each row what it would get alone."""
    model = _model(tiny_anchor)
    n = model.config.num_hidden_layers
    handle = attach(model, tuple(range(n)))
    ids = torch.randint(0, model.config.vocab_size, (2, 5))
    lv = _random_level(2, n, 4, model.config.hidden_size, [1, 0], 7)
    with handle.using(Fetched([lv], 2)):
        both = model(ids).logits
    for row, block in ((0, 1), (1, 0)):
        alone = LevelFetch(
            lv.gate[block : block + 1], lv.up[block : block + 1], lv.down[block : block + 1], torch.tensor([0])
        )
        with handle.using(Fetched([alone], 1)):
            single = model(ids[row : row + 1]).logits
        torch.testing.assert_close(both[row : row + 1], single, rtol=1e-4, atol=1e-5)
    handle.detach()


def test_gradients_reach_only_fetched_blocks_and_never_the_anchor(tiny_anchor: Path) -> None:
    model = _model(tiny_anchor)
    n = model.config.num_hidden_layers
    handle = attach(model, tuple(range(n)))
    d = model.config.hidden_size
    g = torch.Generator().manual_seed(0)
    params = {p: (torch.randn(4, n, 3, d, generator=g) * 0.1).requires_grad_(True) for p in ("gate", "up", "down")}
    ids = torch.randint(0, model.config.vocab_size, (2, 6))
    with handle.using(Fetched([LevelFetch(params["gate"], params["up"], params["down"], torch.tensor([2, 0]))], 2)):
        model(ids).logits.square().mean().backward()
    for p in params.values():
        assert p.grad is not None
        touched = p.grad.abs().flatten(1).sum(1) > 0
        assert touched.tolist() == [True, False, True, False]
    assert all(p.grad is None for p in model.parameters())
    handle.detach()


@pytest.mark.parametrize("fuse", [-1, memory.FUSE_WASTE])
def test_rows_in_runs_give_what_scattered_rows_give(
    tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch, fuse: int
) -> None:
    """A batch whose rows sit in runs by block (a training batch, sorted by path) takes split and
    concatenate; the same rows scattered take gather and scatter: the same delta and gradients. Block by
    block (fuse -1) and as one widened FFN alike."""
    monkeypatch.setattr(memory, "FUSE_WASTE", fuse)
    model = _model(tiny_anchor)
    act = decoder_layers(model)[0].mlp.act_fn
    d = model.config.hidden_size
    g = torch.Generator().manual_seed(5)
    parts = [(torch.randn(3, 2, 4, d, generator=g) * 0.1).requires_grad_(True) for _ in range(3)]
    x = torch.randn(6, 5, d, generator=g).requires_grad_(True)
    index = torch.tensor([1, 1, -1, 0, 0, 2])  # block 1 twice, a row that fetches nothing, block 0 twice, block 2
    perm = torch.tensor([3, 0, 5, 2, 1, 4])
    in_runs, scattered = LevelFetch(*parts, index=index), LevelFetch(*parts, index=index[perm])
    assert in_runs.runs(index) == [(1, 2), (-1, 1), (0, 2), (2, 1)] and scattered.runs(index[perm]) is None
    a = memory_delta(x, Fetched([in_runs], 6), 1, act)
    b = memory_delta(x[perm], Fetched([scattered], 6), 1, act)
    torch.testing.assert_close(a[perm], b)
    assert a[2].abs().max() == 0 and a.abs().max() > 0
    grads_a = torch.autograd.grad(a.square().sum(), [x, *parts])
    grads_b = torch.autograd.grad(b.square().sum(), [x, *parts])
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(ga, gb)


def test_training_batches_hold_each_blocks_rows_in_one_run() -> None:
    """epoch_batches puts a batch's samples in path order, so memory_delta never gathers or scatters."""
    from memctl.core.config import TrainConfig
    from memctl.train.batches import Sample, epoch_batches

    rng = torch.Generator().manual_seed(0)
    paths = [(int(a), 2 + 2 * int(a) + int(b)) for a, b in torch.randint(0, 2, (200, 2), generator=rng)]
    target = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2)
    samples = [
        Sample(f"p{i}", "d", [1] * int(n), p, n_prompt=1, topk_idx=target[0], topk_logp=target[1])
        for i, (p, n) in enumerate(zip(paths, torch.randint(3, 40, (200,), generator=rng), strict=True))
    ]
    batches = epoch_batches(samples, "0", 2, TrainConfig(), 0)
    assert sorted(i for b in batches for i in b) == list(range(200))
    for batch in batches:
        for level in (0, 1):
            blocks = [samples[i].path[level] for i in batch]
            index = torch.tensor(blocks)
            assert LevelFetch(*(torch.zeros(1),) * 3, index=index).runs(index) is not None, blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_widened_ffn_equals_block_by_block(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """A batch run as one widened FFN (every block its rows fetch, each row's other neurons masked) gives
    each row the delta and every block the gradient that block-by-block gives: two levels of different
    ranks, a row that fetches nothing at one level, a block no row fetches, fp32 blocks under bf16
    activations. The widened weights are made once per forward pass and serve every memory layer."""
    g = torch.Generator().manual_seed(11)
    d, n_layers = 16, 3
    parts = [
        [(torch.randn(u, n_layers, r, d, generator=g) * 0.2).requires_grad_(True) for _ in range(3)]
        for u, r in ((2, 4), (5, 2))
    ]
    index = [torch.tensor([0, 0, 1, 1, 0]), torch.tensor([3, -1, 0, 0, 4])]  # level 2: blocks 1 and 2 unused
    x = torch.randn(5, 7, d, generator=g).to(dtype).requires_grad_(True)

    def run(fuse: int) -> tuple[list[torch.Tensor], list[torch.Tensor], Fetched]:
        monkeypatch.setattr(memory, "FUSE_WASTE", fuse)
        fetched = Fetched([LevelFetch(*p, index=i) for p, i in zip(parts, index, strict=True)], 5)
        outs = [memory_delta(x, fetched, slot, torch.nn.functional.silu) for slot in range(n_layers)]
        loss = sum((o.float() * torch.linspace(-1, 1, d)).sum() for o in outs)
        grads = torch.autograd.grad(loss, [x] + [t for p in parts for t in p])
        return outs, list(grads), fetched

    fused_out, fused_grads, fetched = run(memory.FUSE_WASTE)
    plain_out, plain_grads, plain = run(-1)
    (widened,) = fetched._fused.values()
    assert widened is not None and widened.rank == 2 * 4 + 3 * 2 and widened.gate_up[0].dtype == dtype
    assert widened.mask is not None and widened.mask[1].sum() == 4  # row 1: its level-1 block only
    assert list(plain._fused.values()) == [None]
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for a, b in zip(fused_out, plain_out, strict=True):
        torch.testing.assert_close(a, b, **tol)
    for a, b in zip(fused_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, **tol)
    unused = fused_grads[1 + 3 :]  # level 2's gate, up, down
    assert all(t[1:3].abs().max() == 0 and t[[0, 3, 4]].abs().max() > 0 for t in unused)


def test_a_batch_of_many_blocks_runs_block_by_block() -> None:
    """When each row would compute more than FUSE_WASTE neurons of blocks it does not fetch (a batch across
    many leaves, or blocks of large ranks), the batch runs block by block: no widened FFN of them all."""
    g = torch.Generator().manual_seed(2)
    r = 8
    n = memory.FUSE_WASTE // r + 2
    level = LevelFetch(*(torch.randn(n, 1, r, 8, generator=g) for _ in range(3)), index=torch.arange(n))
    fetched = Fetched([level], n)
    x = torch.randn(n, 4, 8, generator=g)
    act = torch.nn.functional.silu
    out = memory_delta(x, fetched, 0, act)
    assert list(fetched._fused.values()) == [None]
    for row in range(n):
        one = slice(row, row + 1)
        alone = Fetched([LevelFetch(level.gate[one], level.up[one], level.down[one], torch.tensor([0]))], 1)
        torch.testing.assert_close(out[one], memory_delta(x[one], alone, 0, act))
