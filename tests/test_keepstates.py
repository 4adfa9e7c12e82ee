"""Preservation on the anchor's hidden states (`train --preserve-by states`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_preserve import _kl_on
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.core.config import TrainConfig
from memctl.core.errors import InputError
from memctl.model.anchor import MemoryMLP, attach, load_anchor
from memctl.model.memory import Fetched, LevelFetch
from memctl.registry import Registry
from memctl.train.keepstates import read_pool_states
from memctl.train.preserve import sample_pool
from memctl.train.run import train


def _fetched(block: dict[str, torch.Tensor], index: list[int]) -> Fetched:
    return Fetched([LevelFetch(block["gate"], block["up"], block["down"], torch.tensor(index))], len(index))


def _block(n: int, d: int, blocks: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {p: (torch.randn(blocks, n, 8, d, generator=g) * 0.15).requires_grad_(True) for p in ("gate", "up", "down")}


def test_pool_states_are_the_anchors_own_ffn_inputs(tiny_anchor: Path, home: Path) -> None:
    anchor = load_anchor(str(tiny_anchor), home)
    n, d = anchor.n_layers, anchor.hidden
    handle = attach(anchor.model, tuple(range(n)))
    seqs = {f"k{i}": s for i, s in enumerate(sample_pool(anchor, 6, length=16, seed=3))}
    block = _block(n, d)
    handle.set(_fetched(block, [0]))  # fetched memories are set aside while the states are read
    states = read_pool_states(anchor.model, handle, seqs, batch=4)
    assert handle.fetched is not None  # and put back
    assert set(states.states) == set(seqs) and states.scale.shape == (n,) and bool((states.scale > 0).all())
    seen: list[torch.Tensor] = []
    mlps = [m for m in anchor.model.modules() if isinstance(m, MemoryMLP)]
    hook = mlps[2].register_forward_hook(lambda m, a, o: seen.append(a[0]))
    with torch.no_grad(), handle.using(None):
        anchor.model(input_ids=torch.tensor([seqs["k5"]]))
    hook.remove()
    assert torch.allclose(states.states["k5"][2], seen[0][0], atol=1e-6)
    # an untrained block (down = 0) adds nothing: its loss is exactly 0
    zero = {p: t.detach().clone() for p, t in block.items()}
    zero["down"].zero_()
    with torch.no_grad():
        assert float(states.loss(_fetched(zero, [0, 0]), ["k0", "k1"])) == 0.0
        assert float(states.loss(_fetched(block, [0, 0]), ["k0", "k1"])) > 0.0
    handle.detach()


def test_states_loss_reaches_only_the_blocks_on_the_route(tiny_anchor: Path, home: Path) -> None:
    anchor = load_anchor(str(tiny_anchor), home)
    n, d = anchor.n_layers, anchor.hidden
    handle = attach(anchor.model, tuple(range(n)))
    seqs = {f"k{i}": s for i, s in enumerate(sample_pool(anchor, 4, length=16, seed=5))}
    states = read_pool_states(anchor.model, handle, seqs)
    block = _block(n, d, blocks=3)
    states.loss(_fetched(block, [0, 0, 2, 2]), list(seqs)).backward()
    for part in ("gate", "up", "down"):
        grad = block[part].grad
        assert grad is not None
        assert float(grad[1].abs().max()) == 0.0  # the block no row fetched
        assert float(grad[0].abs().max()) > 0.0 and float(grad[2].abs().max()) > 0.0
    handle.detach()


def test_states_preservation_undoes_damage_on_anchor_text_it_never_saw(tiny_anchor: Path, home: Path) -> None:
    anchor = load_anchor(str(tiny_anchor), home)
    with torch.no_grad():  # a confident anchor, as real ones are: the random tiny one is nearly uniform
        anchor.model.model.norm.weight.mul_(12.0)
    n, d = anchor.n_layers, anchor.hidden
    handle = attach(anchor.model, tuple(range(n)))
    pool = {f"k{i}": s for i, s in enumerate(sample_pool(anchor, 64, length=32, seed=0))}
    unseen = sample_pool(anchor, 16, length=32, seed=1234)  # anchor text that is not in the pool
    states = read_pool_states(anchor.model, handle, pool)
    block = _block(n, d)
    before = _kl_on(anchor.model, handle, _fetched(block, [0] * len(unseen)), unseen)
    opt = torch.optim.Adam(block.values(), lr=1e-2)
    keys = list(pool)
    for step in range(60):
        batch = [keys[(8 * step + i) % len(keys)] for i in range(8)]
        loss = states.loss(_fetched(block, [0] * len(batch)), batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = _kl_on(anchor.model, handle, _fetched(block, [0] * len(unseen)), unseen)
    handle.detach()
    assert before > 1.0 and after < 0.5 * before, (before, after)


def test_training_with_states_preservation(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    for name in ("out", "st"):
        ingest(name, [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    base = {"epochs": 2, "objective": "distill", "preserve": 1.0, "study": 0}
    out = train("out", base, home=home)
    st = train("st", {**base, "preserve_by": "states"}, home=home)
    assert all(u.steps > 0 for u in st.units)
    for a, b in zip(out.units, st.units, strict=True):
        assert a.steps == b.steps  # the same batches...
        assert b.tokens < a.tokens  # ...but the preservation ones never run through the model
        assert b.preserve_last == b.preserve_last  # recorded (not NaN): the states loss of its last steps
    reg = Registry.open("st", home)
    row = reg.db.execute("select config from runs where status = 'done' order by id desc limit 1").fetchone()
    assert '"preserve_by": "states"' in row[0]  # retraining (forget) repeats it
    docs = {r["id"] for r in reg.db.query("select id from documents")}
    assert {r["doc_id"] for r in reg.db.query("select distinct doc_id from block_docs")} <= docs


def test_preserve_by_is_checked() -> None:
    with pytest.raises(InputError, match="--preserve-by"):
        TrainConfig(preserve_by="logits").validate()


def test_cli_refuses_an_unknown_preserve_by(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    ingest("c", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    r = CliRunner().invoke(app, ["train", "--bank", "c", "--preserve-by", "logits"])
    assert r.exit_code != 0
    assert "--preserve-by must be output or states" in r.output and "Traceback" not in r.output
