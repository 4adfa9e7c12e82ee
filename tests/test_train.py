"""Training: isolation of units, the sparse optimizer, resumption, the frozen-prefix cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memctl.build.ingest import ingest
from memctl.model.anchor import attach, decoder_layers, load_anchor, neuron_std
from memctl.model.prefix import prefix_states, suffix_logits
from memctl.registry import Registry
from memctl.train.batches import collate, load_samples
from memctl.train.optim import BlockAdamW
from memctl.train.run import train
from memctl.train.stopping import should_stop
from memctl.train.units import UnitParams, unit_of


def _bank(corpus: Path, anchor: Path, home: Path, name: str = "b", layers: str = "all") -> Registry:
    ingest(name, [corpus], anchor=str(anchor), embedder="hash", tree=(2, 2), memory_layers=layers, home=home)
    return Registry.open(name, home)


def _blocks(reg: Registry) -> dict[str, dict[str, torch.Tensor]]:
    return {r["id"]: reg.read_block(r) for r in reg.blocks("file is not null")}


def test_memory_neurons_start_at_the_anchors_own_scale(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    """A new bank stores the spread of the anchor's own gate/up weights in its memory layers, and
    blocks start there (gate and up: a normal of that std truncated at 2 std, whose own std is 0.88
    times it) and at zero (down)."""
    reg = _bank(corpus, tiny_anchor, home, layers="last:2")
    model = load_anchor(str(tiny_anchor), home).model
    layers = decoder_layers(model)
    want = torch.cat([getattr(layers[i].mlp, n).weight.flatten() for i in (1, 2) for n in ("gate_proj", "up_proj")])
    mem = reg.config.memory
    assert mem.layers == (1, 2)
    assert mem.init_std == pytest.approx(float(want.std()), rel=1e-3) == neuron_std(model, (1, 2))
    assert mem.std == mem.init_std != 1 / mem.hidden**0.5  # not the old 1/sqrt(hidden)
    params = UnitParams(reg.config, unit_of(reg.config, "0"))
    gate, up, down = params.flat()[:3]
    for t in (gate, up):
        assert float(t.detach().std()) == pytest.approx(0.8796 * mem.init_std, rel=0.05)
    assert not down.any()


def test_block_adamw_leaves_untouched_blocks_exactly_alone() -> None:
    p = torch.randn(4, 3, 5, requires_grad=True)
    before = p.detach().clone()
    opt = BlockAdamW([p], lr=0.1, weight_decay=0.5)
    for _ in range(3):
        p.grad = torch.zeros_like(p)
        p.grad[1] = 1.0
        opt.step([torch.tensor([1])])
        opt.zero_grad()
    assert torch.equal(p[0], before[0]) and torch.equal(p[2:], before[2:])  # no decay drift
    assert not torch.equal(p[1], before[1])
    assert opt.steps[0].tolist() == [0, 3, 0, 0]


def test_block_adamw_is_adamw_per_block() -> None:
    """Blocks touched at every step follow torch's AdamW; a block touched at some steps only follows
    AdamW over those steps, as if the others had not happened."""
    g = torch.Generator().manual_seed(0)
    init = torch.randn(3, 4, 6, generator=g)
    grads = [torch.randn(3, 4, 6, generator=g) for _ in range(5)]
    p = init.clone().requires_grad_(True)
    opt = BlockAdamW([p], lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ref = [init[i].clone().requires_grad_(True) for i in range(3)]
    refs = [torch.optim.AdamW([r], lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1) for r in ref]
    for step, grad in enumerate(grads):
        rows = [0, 1, 2] if step % 2 == 0 else [0, 2]  # block 1 sits out the odd steps
        p.grad = grad.clone()
        opt.step([torch.tensor(rows)])
        opt.zero_grad()
        for i in rows:
            ref[i].grad = grad[i].clone()
            refs[i].step()
    for i in range(3):
        torch.testing.assert_close(p.detach()[i], ref[i].detach(), rtol=0, atol=1e-6)
    assert opt.steps[0].tolist() == [5, 3, 5]
    assert opt.fused  # torch's fused kernel ran on the CPU


def test_block_adamw_without_the_fused_kernel_gives_the_same_update() -> None:
    """The fallback (separate tensor operations, for a torch or device without the fused kernel) and
    the fused kernel agree to float rounding, untouched blocks left alone by both."""
    g = torch.Generator().manual_seed(1)
    init = torch.randn(4, 3, 5, generator=g)
    grads = [torch.randn(4, 3, 5, generator=g) for _ in range(4)]
    ps = [init.clone().requires_grad_(True) for _ in range(2)]
    opts = [BlockAdamW([p], lr=0.05, weight_decay=0.1) for p in ps]
    opts[1].fused = False
    for step, grad in enumerate(grads):
        rows = torch.tensor([0, 3] if step % 2 else [0, 1, 3])
        for p, opt in zip(ps, opts, strict=True):
            p.grad = grad.clone()
            opt.step([rows])
            opt.zero_grad()
    torch.testing.assert_close(ps[0].detach(), ps[1].detach(), rtol=0, atol=1e-6)
    assert torch.equal(ps[1].detach()[2], init[2]) and torch.equal(ps[0].detach()[2], init[2])
    assert opts[0].steps[0].tolist() == opts[1].steps[0].tolist() == [4, 2, 0, 4]


@pytest.mark.parametrize("objective", ["lm", "distill", "mix"])
def test_resumed_training_matches_an_uninterrupted_run(
    home: Path, corpus: Path, tiny_anchor: Path, objective: str
) -> None:
    cfg = {"epochs": 3, "batch_size": 2, "checkpoint_every": 1000, "objective": objective}
    ref = _bank(corpus, tiny_anchor, home, "ref")
    train("ref", cfg, home=home)
    want = _blocks(ref)
    cut = _bank(corpus, tiny_anchor, home, "cut")
    first = train("cut", cfg, home=home, max_steps=2)
    assert first.interrupted and not first.units
    assert list((cut.path / "checkpoints").glob("unit-*.safetensors"))
    second = train("cut", home=home)
    assert all(u.resumed_from == 2 for u in second.units if u.unit != "generic") or second.units
    got = _blocks(cut)
    assert set(got) == set(want) and len(want) >= 3
    for bid in want:
        for part in ("gate", "up", "down"):
            assert torch.equal(got[bid][part], want[bid][part]), (bid, part)


def test_units_are_isolated_and_retrain_alone(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg = _bank(corpus, tiny_anchor, home)
    train("b", {"epochs": 2, "batch_size": 2}, home=home)
    full = _blocks(reg)
    unit0 = [b for b in full if b != "generic" and int(b.split(":")[1]) // (2 ** (int(b[0]) - 1)) == 0]
    others = {b: full[b] for b in full if b not in unit0}
    res = train("b", {"epochs": 2, "batch_size": 2}, subtree=0, retrain=True, home=home)
    assert [u.unit for u in res.units] == ["0"]
    again = _blocks(reg)
    for b in full:  # unit 0 retrained alone reproduces itself; nothing else moved
        for part in ("gate", "up", "down"):
            assert torch.equal(again[b][part], full[b][part]), b
    assert others and all(torch.equal(again[b]["down"], others[b]["down"]) for b in others)
    trained = [r for r in reg.blocks("file is not null")]
    assert all(not torch.equal(full[r["id"]]["down"], torch.zeros_like(full[r["id"]]["down"])) for r in trained)
    prov = list(reg.db.query("select block_id, sum(tokens) as t from block_docs group by block_id"))
    assert {r["block_id"] for r in prov} == set(full) and all(r["t"] > 0 for r in prov)


def test_prefix_cache_reproduces_the_full_forward(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg = _bank(corpus, tiny_anchor, home, layers="last:1")
    anchor = load_anchor(str(tiny_anchor), home)
    samples = load_samples(reg, anchor, "generic")[:3]
    ids, mask, _ = collate(samples, anchor.tokenizer.pad_token_id)
    start = reg.config.memory.layers[0]
    assert start == anchor.n_layers - 1
    handle = attach(anchor.model, reg.config.memory.layers)
    with torch.no_grad():
        full = anchor.model(input_ids=ids, attention_mask=mask).logits
        part = suffix_logits(anchor.model, prefix_states(anchor.model, ids, mask, start), mask, start)
    valid = mask.bool()
    torch.testing.assert_close(full[valid], part[valid], rtol=1e-5, atol=1e-5)
    handle.detach()


def test_training_with_prefix_cache_equals_training_without(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch
) -> None:  # noqa: ANN001
    a = _bank(corpus, tiny_anchor, home, "a", layers="last:2")
    # fp32: the tolerance below is fp32's float-order noise (bf16 rounds each activation to 8 bits)
    train("a", {"epochs": 1, "batch_size": 2, "objective": "mix"}, home=home, dtype="fp32")
    import memctl.train.loop as tr

    monkeypatch.setattr(tr, "build_prefix_cache", lambda *args, **kw: None)
    b = _bank(corpus, tiny_anchor, home, "b", layers="last:2")
    train("b", {"epochs": 1, "batch_size": 2, "objective": "mix"}, home=home, dtype="fp32")
    ba, bb = _blocks(a), _blocks(b)
    assert set(ba) == set(bb)
    for k in ba:  # float order differs (suffix vs full forward); Adam scales the tiny gradients of
        # near-idle weights up to lr-sized steps, so one in a few hundred weights drifts by ~3e-5
        torch.testing.assert_close(ba[k]["down"], bb[k]["down"], rtol=1e-3, atol=1e-4)


def test_head_on_labelled_positions_only_gives_the_same_loss(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    from memctl.model.prefix import head_split_matches
    from memctl.train.batches import lm_loss

    reg = _bank(corpus, tiny_anchor, home, layers="last:2")
    anchor = load_anchor(str(tiny_anchor), home)
    samples = load_samples(reg, anchor, "generic")[:4]
    ids, mask, labels = collate(samples, anchor.tokenizer.pad_token_id)
    assert mask.sum() < mask.numel()  # the batch really is padded
    assert head_split_matches(anchor.model, ids, mask)
    start = reg.config.memory.layers[0]
    states = prefix_states(anchor.model, ids, mask, start)
    with torch.no_grad():
        logits = anchor.model(input_ids=ids, attention_mask=mask).logits
        reference = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        full = lm_loss(anchor.model, ids, mask, labels)
        split = lm_loss(anchor.model, ids, mask, labels, split_head=True)
        split_cached = lm_loss(anchor.model, ids, mask, labels, states, start, split_head=True)
        torch.testing.assert_close(full, reference)
    torch.testing.assert_close(full, split)
    torch.testing.assert_close(full, split_cached)


def test_early_stopping_waits_until_accuracy_and_loss_both_stall() -> None:
    acc = [0.12, 0.04, 0.04, 0.08, 0.08, 0.08]  # a unit of the demo's bank, epochs 1-6 of 12
    falling = [2.39, 2.40, 2.42, 1.96, 2.00, 1.93]  # its held-out loss: still learning
    rising = [2.39, 1.90, 1.95, 1.96, 2.00, 2.10]
    assert not should_stop(acc, falling, 24, 12, 3)
    assert should_stop(acc, rising, 24, 12, 3)
    assert should_stop(acc, [], 24, 12, 3)  # no teacher cache (objective lm): accuracy decides
    assert not should_stop([0.1, 0.2, 0.3, 0.3, 0.4, 0.4], rising, 24, 12, 3)  # accuracy still rising
    assert not should_stop(acc, rising, 19, 12, 3)  # too few held-out prompts to judge
    assert not should_stop(acc[:5], rising[:5], 24, 12, 3)  # not half the epochs yet
