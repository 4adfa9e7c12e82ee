"""A unit whose loss diverges or drifts starts over with half the learning rate (with `--on-drift rollback`,
goes back to the end of the last epoch that did not), and resumes exactly."""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import memctl.train.loop as loop
from memctl.build.ingest import ingest
from memctl.registry import Registry
from memctl.registry.checkpoints import checkpoint_path
from memctl.train.checkpoint import TrainState, decode, encode
from memctl.train.diverge import DIVERGED_RATIO, diverged, epoch_means, kind_counts
from memctl.train.events import TrainEvent, TrainingInterrupted
from memctl.train.run import train


def test_an_epoch_diverges_when_a_kind_doubles_its_best_mean_or_is_not_finite() -> None:
    counts = kind_counts([["kd", "keep", "kd"], ["kd", "kd", "keep"], ["keep", "kd", "kd"]])
    assert counts == [{"kd": 2, "keep": 1}] * 3
    steady = {"kd": [2.0, 1.8, 1.6, 1.5, 1.4, 1.3], "keep": [1.6, 1.62, 1.65]}
    assert epoch_means(steady, counts, 1) == {"kd": pytest.approx(1.55), "keep": pytest.approx(1.62)}
    assert not any(diverged(steady, counts, e) for e in range(3))
    climbed = {"kd": [2.0, 1.8, 1.6, 1.5, 3.4, 3.2], "keep": [1.6, 1.62, 1.65]}  # 3.3 > 2 x 1.55
    assert 3.3 > DIVERGED_RATIO * 1.55 and diverged(climbed, counts, 2)
    broke = {"kd": [2.0, 1.8, 1.6, 1.5, 1.4, 1.3], "keep": [1.6, 1.62, 5.2]}  # preservation too
    assert diverged(broke, counts, 2)
    assert diverged({"kd": [2.0, 1.8, math.nan, 1.5], "keep": [1.6, 1.6]}, counts, 1) == "distillation loss is nan"
    assert not diverged({"kd": [9.0, 9.0]}, counts, 0)  # nothing earlier to compare with


def test_an_epoch_drifts_when_its_preservation_loss_climbs_a_tenth_above_the_first_epochs() -> None:
    counts = kind_counts([["kd", "keep"]] * 5)
    # the epoch means of FOLDOC units at lr 1e-2 (docs/history.md): distillation never twice its best,
    # while preservation crept up (2026-11-27) or rose and came back (2026-11-29, +11.8% on unrelated text)
    kd = [2.835, 2.639, 2.044, 1.867, 2.234]
    drifting = {"kd": kd, "keep": [1.712, 1.889, 1.927, 1.969, 2.175]}
    assert not diverged(drifting, counts, 0)
    assert diverged(drifting, counts, 1) == "preservation loss 1.889 > 1.1x the first epoch's 1.712"
    back = {"kd": [2.811, 2.756, 2.549, 1.993, 1.642], "keep": [1.810, 2.025, 2.028, 1.971, 1.917]}
    assert diverged(back, counts, 1) == "preservation loss 2.025 > 1.1x the first epoch's 1.810"
    # healthy units keep it flat, or let it fall and come back: never above the first epoch's by a tenth
    assert not any(diverged({"kd": kd, "keep": [1.68, 1.66, 1.70, 1.64, 1.66]}, counts, e) for e in range(5))
    fictional = [1.697, 1.744, 1.772, 1.762, 1.727]  # 1.044x at most (2026-11-29)
    assert not any(diverged({"kd": kd, "keep": fictional}, counts, e) for e in range(5))
    assert not diverged({"kd": kd, "keep": [1.7, 1.2, 1.8, 1.85, 1.85]}, counts, 4)  # 1.85 < 1.1 x 1.7
    assert diverged({"kd": kd, "keep": [1.7, 1.2, 1.8, 1.85, 2.5]}, counts, 4)  # 2.5 > 2 x 1.2, the best
    lm_counts = kind_counts([["lm", "keep"]] * 4)  # the drift rule reads the preservation loss only
    assert not diverged({"lm": [3.0, 3.8, 3.8, 3.8], "keep": [1.7, 1.7, 1.7, 1.7]}, lm_counts, 3)


def test_the_restart_count_travels_in_the_checkpoint() -> None:
    state = TrainState([torch.zeros(2)], {"m": [torch.zeros(2)], "v": [torch.zeros(2)], "steps": [torch.zeros(1)]},
                       3, 10, {}, {}, [], [], "0", 1.0, "{}", "cpu", restarts=2)  # fmt: skip
    assert decode(encode(state), Path("x"), "0").restarts == 2


def test_the_mark_travels_in_the_checkpoint_and_shares_nothing_with_the_live_state() -> None:
    def state(step: int, value: float) -> TrainState:
        t = torch.full((2,), value)
        opt = {"m": [t.clone()], "v": [t.clone()], "steps": [torch.ones(1)]}
        return TrainState([t], opt, step, 10, {"kd": [value]}, {(1, 0): {"a": 3}}, [0.5], [], "0", 1.0, "{}", "cpu")

    live = state(8, 2.0)
    live.mark = state(4, 1.0).copy()
    live.mark.retired = {3: [(2, 4)]}
    back = decode(encode(live), Path("x"), "0")
    assert back.mark is not None and back.mark.step == 4 and back.mark.losses == {"kd": [1.0]}
    assert torch.equal(back.mark.params[0], torch.ones(2)) and torch.equal(back.params[0], torch.full((2,), 2.0))
    assert back.mark.seen == {(1, 0): {"a": 3}} and back.mark.mark is None
    kept = back.mark.copy()
    back.mark.params[0].add_(1.0)
    back.mark.losses["kd"].append(9.0)
    back.mark.seen[(1, 0)]["a"] = 7
    back.mark.opt["m"][0].add_(1.0)
    back.mark.retired[3].append((5, 6))
    assert torch.equal(kept.params[0], torch.ones(2)) and kept.losses == {"kd": [1.0]} and kept.seen[(1, 0)]["a"] == 3
    assert torch.equal(kept.opt["m"][0], torch.ones(2)) and kept.retired == {3: [(2, 4)]}
    assert decode(encode(state(3, 1.0)), Path("x"), "0").mark is None  # no mark, none read back
    later = state(2, 1.0)
    later.mark = state(5, 1.0)  # a mark later than its state is no earlier state of it
    with pytest.raises(Exception, match="its mark is not an earlier state"):
        decode(encode(later), Path("x"), "0")


def _blocks(reg: Registry) -> dict[str, dict[str, torch.Tensor]]:
    return {r["id"]: reg.read_block(r) for r in reg.blocks("file is not null")}


def _same_blocks(banks: dict[str, Registry], ref: str, names: tuple[str, ...]) -> None:
    """Every block of each of `names` is bit-identical to `ref`'s."""
    want = _blocks(banks[ref])
    assert want and len(want) >= 2
    for name in names:
        got = _blocks(banks[name])
        assert set(got) == set(want)
        for bid in want:
            for part in ("gate", "up", "down"):
                assert torch.equal(got[bid][part], want[bid][part]), (name, bid, part)


DRIFTED = "preservation loss 2.0 > 1.1x the first epoch's 1.7"


def _fires_once(at: int, why: str, fired: dict[str, bool]) -> Callable[[Any, Any, int], str | None]:
    """A stand-in for memctl.train.diverge.diverged that fires after epoch `at` while fired["done"] is False."""

    def diverged(losses: Any, counts: Any, epoch: int) -> str | None:
        if epoch == at and not fired["done"]:
            fired["done"] = True
            return why
        return None

    return diverged


def _record_rates(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, float]]:
    """(step, peak learning rate) of every step the training loop takes from now on."""
    rates: list[tuple[int, float]] = []
    real_lr_at = loop.lr_at

    def lr_at(step: int, total: int, peak: float, warmup: float, min_ratio: float) -> float:
        rates.append((step, peak))
        return real_lr_at(step, total, peak, warmup, min_ratio)

    monkeypatch.setattr(loop, "lr_at", lr_at)
    return rates


def test_a_diverged_unit_starts_over_at_half_the_learning_rate_and_resumes_exactly(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fired = {"done": False}
    once = _fires_once(0, "distillation loss is nan", fired)
    monkeypatch.setattr(loop, "diverged", once)
    cfg = {"epochs": 3, "batch_size": 2, "checkpoint_every": 1000, "lr": 1e-2, "preserve": 0.5, "study": 1}
    banks = {}
    for name in ("ref", "cut", "half"):
        ingest(name, [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
        banks[name] = Registry.open(name, home)
    ref = train("ref", cfg, subtree=0, home=home).units[0]
    assert ref.restarts == 1
    per_epoch = ref.steps // 3
    assert per_epoch >= 2 and ref.tokens > 0
    # killed after the restart, one step into the second start: the checkpoint says it restarted
    fired["done"] = False
    first = train("cut", cfg, subtree=0, home=home, max_steps=per_epoch + 1)
    assert first.interrupted and fired["done"]
    second = train("cut", home=home, subtree=0).units[0]
    assert second.restarts == 1 and second.tokens == ref.tokens
    # starting over is a fresh run at half the learning rate; the steps of the first start still count
    fired["done"] = True
    half = train("half", {**cfg, "lr": 5e-3}, subtree=0, home=home).units[0]
    assert half.restarts == 0 and half.steps == ref.steps and ref.tokens > half.tokens
    _same_blocks(banks, "ref", ("cut", "half"))


def test_a_rollback_unit_that_drifts_after_an_epoch_passed_goes_back_to_that_epochs_end_and_resumes_exactly(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fired = {"done": False}
    second = _fires_once(1, DRIFTED, fired)
    rates = _record_rates(monkeypatch)
    restored: list[list[torch.Tensor]] = []  # the live blocks and moments right after each restore
    real_restore = TrainState.restore

    def restore(self: TrainState, params: list[torch.Tensor], opt: Any, path: Path) -> None:
        real_restore(self, params, opt, path)
        restored.append([t.detach().clone() for t in [*params, *opt.m, *opt.v]])

    monkeypatch.setattr(loop, "diverged", second)
    monkeypatch.setattr(TrainState, "restore", restore)
    cfg = {"epochs": 3, "batch_size": 2, "checkpoint_every": 1000, "lr": 1e-2, "preserve": 0.5, "study": 1,
           "on_drift": "rollback"}  # fmt: skip
    banks = {}
    for name in ("ref", "epoch1", "before", "after"):
        ingest(name, [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
        banks[name] = Registry.open(name, home)
    events: list[TrainEvent] = []
    ref = train("ref", cfg, subtree=0, home=home, progress=events.append).units[0]
    per_epoch = ref.steps // 3
    assert ref.restarts == 1 and per_epoch >= 2 and fired["done"]
    # epochs 1 and 2 at the full rate, then epoch 2 again and epoch 3 at half: epoch 1 is kept, not trained again
    full, half = 1e-2, 5e-3
    want_rates = [(s, full) for s in range(2 * per_epoch)] + [(s, half) for s in range(per_epoch, 3 * per_epoch)]
    assert rates == want_rates
    went_back = [e for e in events if e.restart]
    assert len(went_back) == 1 and went_back[0].kept == 1 and went_back[0].epoch == 1
    assert len(ref.heldout) == 3  # the held-out scores of the epoch gone back from are dropped
    # what it went back to is the state at the end of epoch 1: a unit stopped there holds the same blocks and moments
    stopped = train("epoch1", cfg, subtree=0, home=home, max_steps=per_epoch)
    assert stopped.interrupted and len(restored) == 1
    ckpt = checkpoint_path(banks["epoch1"].checkpoint_dir(), "0")
    epoch1 = decode(ckpt.read_bytes(), ckpt, "0")
    assert epoch1.step == per_epoch and epoch1.mark is not None and epoch1.mark.step == per_epoch
    want_state = [*epoch1.params, *epoch1.opt["m"], *epoch1.opt["v"]]
    assert len(restored[0]) == len(want_state)
    assert all(torch.equal(a, b) for a, b in zip(restored[0], want_state, strict=True))
    # killed in epoch 2 before it drifts: the checkpoint carries epoch 1's end, and the unit goes back to it
    fired["done"] = False
    first = train("before", cfg, subtree=0, home=home, max_steps=per_epoch + 1)
    assert first.interrupted and not fired["done"]
    resumed = train("before", home=home, subtree=0).units[0]
    assert fired["done"] and resumed.restarts == 1 and resumed.tokens == ref.tokens

    # killed one step after going back: the checkpoint says so, and the run goes on from there
    def interrupt(ev: TrainEvent) -> None:
        if ev.restart:
            os.kill(os.getpid(), signal.SIGINT)  # the training loop's Ctrl-C: stop at the next step

    fired["done"] = False
    with pytest.raises(TrainingInterrupted):
        train("after", cfg, subtree=0, home=home, progress=interrupt)
    assert fired["done"]
    ckpt = checkpoint_path(banks["after"].checkpoint_dir(), "0")
    state = decode(ckpt.read_bytes(), ckpt, "0")
    assert state.restarts == 1 and state.step == per_epoch + 1 and state.mark is not None
    assert state.mark.step == per_epoch and state.mark.seen == epoch1.seen and state.mark.losses == epoch1.losses
    assert all(torch.equal(a, b) for a, b in zip(state.mark.params, epoch1.params, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(state.params, epoch1.params, strict=True))  # one step on
    resumed = train("after", home=home, subtree=0).units[0]
    assert resumed.restarts == 1 and resumed.tokens == ref.tokens
    _same_blocks(banks, "ref", ("before", "after"))


def test_by_default_a_unit_that_drifts_after_an_epoch_passed_starts_over_and_carries_no_mark(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rates = _record_rates(monkeypatch)
    fired = {"done": False}
    once = _fires_once(1, DRIFTED, fired)
    monkeypatch.setattr(loop, "diverged", once)
    cfg = {"epochs": 3, "batch_size": 2, "checkpoint_every": 1000, "lr": 1e-2, "preserve": 0.5, "study": 1}
    for name in ("ref", "stopped"):
        ingest(name, [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    events: list[TrainEvent] = []
    ref = train("ref", cfg, subtree=0, home=home, progress=events.append).units[0]
    per_epoch = ref.steps // 3
    assert ref.restarts == 1 and fired["done"]
    # two epochs at the full rate, then all three again at half: nothing of the first start is kept
    assert rates == [(s, 1e-2) for s in range(2 * per_epoch)] + [(s, 5e-3) for s in range(3 * per_epoch)]
    assert [e.kept for e in events if e.restart] == [0]
    train("stopped", cfg, subtree=0, home=home, max_steps=per_epoch + 1)
    reg = Registry.open("stopped", home)
    ckpt = checkpoint_path(reg.checkpoint_dir(), "0")
    assert decode(ckpt.read_bytes(), ckpt, "0").mark is None  # checkpoints stay their old size


@pytest.mark.parametrize("value", ["back", ""])
def test_on_drift_other_than_restart_or_rollback_is_one_clear_error(value: str) -> None:
    from memctl.core.config import TrainConfig
    from memctl.core.errors import InputError

    with pytest.raises(InputError, match="--on-drift must be restart or rollback"):
        TrainConfig(on_drift=value).validate()


def test_max_restarts_0_trains_a_diverging_unit_on_as_it_is(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def always(losses: dict[str, list[float]], counts: Any, epoch: int) -> str | None:
        calls.append(epoch)
        return "distillation loss is nan"

    monkeypatch.setattr(loop, "diverged", always)
    cfg = {"epochs": 2, "batch_size": 2, "preserve": 0.5, "study": 1}
    for name, limit in (("guarded", 2), ("off", 0)):
        ingest(name, [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
        unit = train(name, {**cfg, "max_restarts": limit}, subtree=0, home=home).units[0]
        assert unit.restarts == limit
    # the guarded unit restarted after its first epoch twice, then trained on unchecked; the other never checked
    assert calls == [0, 0]


@pytest.mark.parametrize("value", [-1, 9])
def test_max_restarts_out_of_range_is_one_clear_error(value: int) -> None:
    from memctl.core.config import TrainConfig
    from memctl.core.errors import InputError

    with pytest.raises(InputError, match="--max-restarts must be between 0 and 8"):
        TrainConfig(max_restarts=value).validate()
