"""Retiring learned prompts (memctl.train.retire): the epoch plan, the agreement it reads off the
training forward, and a retiring run that resumes exactly."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from memctl.build.ingest import ingest
from memctl.registry import Registry
from memctl.train.batches import Sample, kd_loss
from memctl.train.retire import decode, encode, epoch_plan, retire, sits_out
from memctl.train.run import train


def _kd(n: int) -> Sample:
    return Sample(f"p{n}", "d", list(range(n)), (0, 0), None, 1, torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2))


def _keep(i: int) -> Sample:
    return Sample(
        f"k{i}", "", list(range(8)), (0, 0), None, 1, torch.zeros(8, 2, dtype=torch.long), torch.zeros(8, 2), keep=True
    )


def test_a_learned_sample_sits_out_its_epochs_then_trains_again() -> None:
    retired: dict[int, list[tuple[int, int]]] = {}
    retire(retired, 3, epoch=2, epochs_out=2)
    assert [sits_out(retired, 3, e) for e in range(6)] == [False, False, False, True, True, False]
    assert not sits_out(retired, 4, 3)
    retire(retired, 3, epoch=5, epochs_out=2)
    assert sits_out(retired, 3, 6) and sits_out(retired, 3, 7) and not sits_out(retired, 3, 8)
    retire(retired, 5, epoch=0, epochs_out=0)  # 0: never retired
    assert 5 not in retired
    assert decode(encode(retired)) == retired


def test_epoch_plan_drops_sitting_samples_and_thins_preservation_to_their_share() -> None:
    samples = [_kd(10), _kd(10), _kd(20)] + [_keep(i) for i in range(400)]
    batches = [[0, 1], [2], list(range(3, 203)), list(range(203, 403))]
    assert epoch_plan(samples, batches, {}, 4, [0, 1]) == batches  # nothing retired: the schedule as it is
    retired = {2: [(4, 6)]}  # half the distillation tokens sit epoch 4 out
    plan = epoch_plan(samples, batches, retired, 4, [0, 1])
    assert plan[0] == [0, 1] and plan[1] == []  # an empty batch: its step is skipped
    kept = len(plan[2]) + len(plan[3])
    assert 160 < kept < 240  # about half the 400 preservation sequences
    assert plan == epoch_plan(samples, batches, retired, 4, [0, 1])  # seeded: a resumed run rebuilds it
    assert epoch_plan(samples, batches, retired, 6, [0, 1]) == batches  # back in epoch 6, and all preservation


def test_kd_loss_reports_rows_whose_every_target_is_the_teachers_top_token(tiny_anchor: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_anchor, dtype=torch.float32)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    mask = torch.ones_like(ids)
    pos = torch.tensor([[0, 1], [0, 2], [1, 1], [1, 2]])
    with torch.no_grad():
        top = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)  # (2, 4)
    own = torch.stack([top[0, 1], top[0, 2], top[1, 1], top[1, 2]])
    other = (own + 1) % model.config.vocab_size
    idx = torch.stack([own, other], 1)  # the teacher's top-1 is the student's own choice everywhere...
    idx[3] = torch.stack([other[3], own[3]])  # ...except at row 1's second target
    logp = torch.log(torch.tensor([[0.7, 0.3]] * 4))
    agree: list[torch.Tensor] = []
    kd_loss(model, ids, mask, pos, idx, logp, agree=agree)
    assert agree[0].tolist() == [True, False]


def test_retiring_trains_fewer_tokens_and_resumes_exactly(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    def bank(name: str) -> Registry:
        ingest(name, [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
        return Registry.open(name, home)

    cfg = {"epochs": 6, "batch_size": 2, "checkpoint_every": 1000, "objective": "distill", "lr": 5e-2, "study": 0}
    bank("all")
    full = train("all", cfg, home=home)
    ref = bank("ref")
    whole = train("ref", {**cfg, "retire": 2}, home=home)
    spent = {u.unit: u.tokens for u in whole.units}
    assert sum(spent.values()) < sum(u.tokens for u in full.units)  # some prompts sat epochs out
    want = {r["id"]: ref.read_block(r) for r in ref.blocks("file is not null")}
    cut = bank("cut")
    assert train("cut", {**cfg, "retire": 2}, home=home, max_steps=9).interrupted
    again = train("cut", home=home)  # the checkpoint carries which prompts sit out
    assert {u.unit: u.tokens for u in again.units} == spent
    got = {r["id"]: cut.read_block(r) for r in cut.blocks("file is not null")}
    assert set(got) == set(want) and want
    for bid in want:
        for part in ("gate", "up", "down"):
            assert torch.equal(got[bid][part], want[bid][part]), (bid, part)
