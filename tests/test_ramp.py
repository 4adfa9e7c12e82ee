"""The relevance gate's ramp: just above the floor a context is answered and scored on a mixture with the
anchor, whose share falls from 1 at the floor to 0 at `relevance_ramp` times it (memctl.core.relevance).
Tiny model, test embedder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from memctl.cli import app
from memctl.core.errors import InputError
from memctl.core.probes import Probe
from memctl.core.relevance import RELEVANCE_RAMP, anchor_share, check_ramp
from memctl.eval import evaluate as ev
from memctl.eval.perplexity import token_losses
from memctl.model.mix import mixed_logprobs
from memctl.serve.chat import Chat, ChatSettings
from memctl.serve.session import BankSession

runner = CliRunner()
QUERIES = ["Iron is a strong metal", "Neon is a noble gas", "The owl hunts at night", "copper conducts"]


def test_anchor_share_ramps_from_the_floor_to_its_multiple() -> None:
    sims = np.array([0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.9, math.nan])
    got = anchor_share(sims, 0.2, 2.0)  # from 1 at 0.2 to 0 at 0.4
    assert got.tolist() == pytest.approx([1, 1, 0.75, 0.5, 0.25, 0, 0, 1])
    assert anchor_share(sims, 0.2, 1.0).tolist() == [0.0] * 8  # a hard gate: no ramp
    assert anchor_share(sims, 0.0, 2.0).tolist() == [0.0] * 8  # no gate, no ramp
    assert check_ramp(1) == 1.0 and RELEVANCE_RAMP > 1
    for bad in (0.5, -1, math.nan):
        with pytest.raises(InputError, match="--relevance-ramp"):
            check_ramp(bad)


def test_per_row_shares_mix_each_row_by_its_own() -> None:
    g = torch.Generator().manual_seed(1)
    m, a = torch.randn(3, 4, 9, generator=g) * 3, torch.randn(3, 4, 9, generator=g) * 3
    w = [0.0, 0.35, 1.0]
    got = mixed_logprobs(m, a, w)
    for i, wi in enumerate(w):
        assert torch.allclose(got[i], mixed_logprobs(m[i : i + 1], a[i : i + 1], wi)[0], atol=1e-6)
    assert torch.equal(got[0], m[0].log_softmax(-1)) and torch.allclose(got[2], a[2].log_softmax(-1))


def _ramped(home: Path, bank: str) -> tuple[float, float, np.ndarray]:
    """A floor and a ramp that put every query's reading on the ramp (shares strictly between 0 and 1),
    the readings, and the shares they should get."""
    with BankSession(bank, home, min_relevance=0) as s:
        sims = s.route_gated(QUERIES).relevance
    floor = float(np.min(sims)) / 1.2
    ramp = 1.2 * float(np.max(sims)) / floor
    share = (ramp * floor - sims) / ((ramp - 1) * floor)
    assert ((share > 0) & (share < 1)).all() and len(set(share.round(6))) > 1, sims
    return floor, ramp, share


def test_answers_on_the_ramp_are_the_mixture_at_each_rows_share(home: Path, mixing_bank: str) -> None:
    """A batch of contexts on the ramp answers row by row as each would alone with a fixed anchor mix at its
    share; the hard gate (ramp 1) serves the memories alone, and chat streams the same mixture."""
    floor, ramp, want_share = _ramped(home, mixing_bank)
    with BankSession(mixing_bank, home, min_relevance=floor, relevance_ramp=ramp) as s:
        answers = s.generate(QUERIES, max_new_tokens=6)
        assert [a.anchor_mix for a in answers] == pytest.approx(want_share.tolist())
        assert not any(a.unrelated for a in answers)
        turn = Chat(s, ChatSettings(max_new_tokens=4)).turn(QUERIES[1])
        assert turn.anchor_mix == pytest.approx(want_share[1])
    mixed_somewhere = False
    for q, a, w in zip(QUERIES, answers, want_share, strict=True):
        with BankSession(mixing_bank, home, min_relevance=floor, relevance_ramp=1, anchor_mix=float(w)) as fixed:
            assert a.text == fixed.generate([q], max_new_tokens=6)[0].text, q
        with BankSession(mixing_bank, home, min_relevance=floor, relevance_ramp=1) as alone:
            hard = alone.generate([q], max_new_tokens=6)
            assert hard[0].anchor_mix == 0.0
            mixed_somewhere |= hard[0].text != a.text
    assert mixed_somewhere  # the ramp changed an answer on this mixing_bank: the test tells it from the hard gate


def test_eval_scores_and_answers_on_the_ramp(home: Path, mixing_bank: str, tmp_path: Path) -> None:
    """eval's probes answer as generate does, its perplexity takes each document's share, and the ramp is a
    parameter of the run (another ramp: a new run)."""
    floor, ramp, _ = _ramped(home, mixing_bank)
    doc = tmp_path / "held.txt"
    doc.write_text(QUERIES[0] + ". " + QUERIES[3] + ".")
    probes = [Probe("", "k", q, ("x",)) for q in QUERIES]
    opts = ev.EvalOptions(("anchor", "fetched"), answer_tokens=6)
    with BankSession(mixing_bank, home, min_relevance=floor, relevance_ramp=ramp) as s:
        plan = ev.plan_eval(s, probes, opts, [doc.read_text()])
        fetched = [j for j in plan.jobs if j.group == "fetched"]
        assert [j.mix for j in fetched] == pytest.approx(s.route_gated(QUERIES).share.tolist())
        assert all(j.mix == 0 for j in plan.jobs if j.group == "anchor")
        res = ev.run_jobs(s, plan, 4, {})
        gen = s.generate(QUERIES, max_new_tokens=6)
        assert [res[j.item].answer for j in fetched] == [a.text for a in gen]
        ppl = next(j for j in plan.jobs if j.group == "ppl fetched")
        share = float(s.route_gated([doc.read_text()]).share[0])
        assert ppl.mix == pytest.approx(share) and 0 < share < 1
        one = token_losses(s, [ppl.seqs], s.store.fetch_paths(ppl.paths), share)[0]
        assert res[ppl.item].nll == pytest.approx(one.nll, rel=1e-5)
        assert one.nll != pytest.approx(token_losses(s, [ppl.seqs], s.store.fetch_paths(ppl.paths), 0.0)[0].nll)
        out = ev.run_eval(s, probes, opts, store=False)
        assert out["params"]["relevance_ramp"] == ramp
    with BankSession(mixing_bank, home, min_relevance=floor, relevance_ramp=1) as s:
        assert "relevance_ramp" not in ev.run_eval(s, probes, opts, store=False)["params"]


def test_cli_relevance_ramp(home: Path, mixing_bank: str) -> None:
    floor, ramp, share = _ramped(home, mixing_bank)
    base = ["ask", QUERIES[1], "--bank", mixing_bank, "--json", "--min-relevance", str(floor), "--max-new-tokens", "2"]
    d = json.loads(runner.invoke(app, [*base, "--relevance-ramp", str(ramp)]).stdout)
    assert d["anchor_mix"] == pytest.approx(share[1], rel=1e-4) and d["relevance_ramp"] == pytest.approx(ramp)
    assert json.loads(runner.invoke(app, base).stdout)["relevance_ramp"] == RELEVANCE_RAMP
    hard = json.loads(runner.invoke(app, [*base, "--relevance-ramp", "1"]).stdout)
    assert hard["anchor_mix"] == 0.0 and hard["relevance_ramp"] == 1.0
    line = runner.invoke(app, [*(a for a in base if a != "--json"), "--relevance-ramp", str(ramp)])
    assert line.exit_code == 0 and "anchor mix 0." in line.stderr
    bad = runner.invoke(app, [*base, "--relevance-ramp", "0.5"])
    assert bad.exit_code == 2 and "--relevance-ramp" in bad.stderr and "Traceback" not in bad.output
