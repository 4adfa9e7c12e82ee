"""The anchor mixture: (1 - w) p(memories) + w p(anchor), in generation, chat, scoring, eval and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.core.config import TrainConfig
from memctl.core.errors import InputError
from memctl.eval.perplexity import token_losses
from memctl.model.anchor import left_padded
from memctl.model.mix import check_mix, mixed_logprobs, with_anchor_rows
from memctl.serve.chat import Chat, ChatSettings, describe
from memctl.serve.session import BankSession
from memctl.train.run import train

runner = CliRunner()
QUERIES = ["Iron is a strong metal", "Neon is a noble gas", "The owl hunts at night", "copper conducts"]


def test_mixed_logprobs_is_the_log_of_the_weighted_mean_of_probabilities() -> None:
    g = torch.Generator().manual_seed(0)
    m, a = torch.randn(3, 7, generator=g) * 3, torch.randn(3, 7, generator=g) * 3
    for w in (0.0, 0.2, 0.5, 1.0):
        got = mixed_logprobs(m, a, w)
        want = torch.log((1 - w) * m.softmax(-1) + w * a.softmax(-1))
        assert torch.allclose(got, want, atol=1e-6), w
        assert torch.allclose(got.logsumexp(-1), torch.zeros(3), atol=1e-6)  # a distribution
    assert torch.equal(mixed_logprobs(m, a, 0.0), m.log_softmax(-1))
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(InputError, match="--anchor-mix"):
            check_mix(bad)


def _logits(s: BankSession, ids: torch.Tensor, mask: torch.Tensor, fetched: object) -> torch.Tensor:
    with torch.no_grad(), s.handle.using(fetched):  # type: ignore[arg-type]
        return s.anchor.model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("int8", [False, True])
def test_anchor_rows_fetch_nothing_and_the_others_keep_their_blocks(home: Path, mixing_bank: str, int8: bool) -> None:
    """A doubled batch gives each row's memories in its first half and the anchor alone in its
    second, in one pass (fp32 blocks and int8 packs)."""
    with BankSession("s", home, int8=int8) as s:
        enc = left_padded(s.anchor.tokenizer, QUERIES)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        paths = s.route(QUERIES)
        assert len({tuple(p) for p in paths.tolist()}) >= 2  # rows on different paths
        fetched = s.store.fetch_paths(paths)
        mem, alone = _logits(s, ids, mask, fetched), _logits(s, ids, mask, None)
        assert not torch.allclose(mem, alone, atol=1e-4)  # the memories change something
        both = _logits(s, torch.cat([ids, ids]), torch.cat([mask, mask]), with_anchor_rows(fetched))
        n = len(QUERIES)
        assert torch.allclose(both[:n], mem, atol=1e-4) and torch.allclose(both[n:], alone, atol=1e-4)


def _mixed_greedy(s: BankSession, prompt: str, fetched: object, w: float, steps: int) -> list[int]:
    """Reference: one token at a time, full forward passes with and without the memories, no cache."""
    ids = s.anchor.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    out: list[int] = []
    for _ in range(steps):
        mask = torch.ones_like(ids)
        logp = mixed_logprobs(_logits(s, ids, mask, fetched)[:, -1], _logits(s, ids, mask, None)[:, -1], w)
        nxt = int(logp.argmax(-1))
        out.append(nxt)
        if nxt == s.anchor.tokenizer.eos_token_id:
            break
        ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    return out


def test_generation_picks_each_token_on_the_mixture(home: Path, mixing_bank: str) -> None:
    """Batched, left-padded, cached generation on the doubled batch picks, row by row, the tokens a
    plain step-by-step decoder picks on (1 - w) p(memories) + w p(anchor); w = 1 is the anchor alone."""
    steps = 6
    with BankSession("s", home, min_relevance=0) as s:
        fetched = [s.store.fetch_paths(p[None]) for p in s.route(QUERIES)]

        def greedy(w: float) -> list[list[int]]:
            return [_mixed_greedy(s, q, f, w, steps) for q, f in zip(QUERIES, fetched, strict=True)]

        memories, anchor = greedy(0.0), greedy(1.0)
        # a weight at which some answer on the mixture is neither the memories' alone nor the anchor's alone (on
        # this bank 0.1 is), so that a decoder that dropped either side of the mixture, or its weight, fails below
        for w in (0.1, 0.2, 0.05, 0.3, 0.5):
            want = greedy(w)
            if any(x not in (m, a) for x, m, a in zip(want, memories, anchor, strict=True)):
                break
        else:
            raise AssertionError("no weight tells the mixture from either side on this bank")
    with BankSession("s", home, anchor_mix=w, min_relevance=0) as s:
        tok = s.anchor.tokenizer
        answers = s.generate(QUERIES, max_new_tokens=steps)
        for q, got, ids in zip(QUERIES, answers, want, strict=True):
            assert got.text == tok.decode(ids, skip_special_tokens=True), (q, w)
    with BankSession("s", home, anchor_mix=1.0, min_relevance=0) as s1, BankSession("s", home, min_relevance=0) as s0:
        assert [a.text for a in s1.generate(QUERIES, max_new_tokens=steps)] == [
            a.text for a in s0.generate(QUERIES, mode="none", max_new_tokens=steps)
        ]


def test_chat_streams_the_mixed_answer(home: Path, mixing_bank: str) -> None:
    with BankSession("s", home, anchor_mix=0.5, min_relevance=0) as s:
        chat = Chat(s, ChatSettings(max_new_tokens=5))
        pieces: list[str] = []
        turn = chat.turn(QUERIES[1], pieces.append)
        assert "".join(pieces).strip() == turn.reply
        assert turn.reply == s.generate([QUERIES[1]], max_new_tokens=5, chat=True)[0].text.strip()
        assert turn.blocks and turn.anchor_mix == 0.5  # memories were fetched, so the mixture ran
        assert "anchor mix 0.5" in describe(turn)
        alone = chat.turn(QUERIES[1], settings=ChatSettings(mode="none", max_new_tokens=5), history=[])
        assert alone.anchor_mix == 0.0 and "anchor mix" not in describe(alone)


def test_losses_score_the_mixture_and_the_anchor_alone_unmixed(home: Path, mixing_bank: str) -> None:
    with BankSession("s", home, anchor_mix=0.3, min_relevance=0) as s:
        tok = s.anchor.tokenizer
        seqs = [tok(q, add_special_tokens=False)["input_ids"] for q in QUERIES]
        fetched = s.store.fetch_paths(s.route(QUERIES))
        got = token_losses(s, seqs, fetched)
        for i, seq in enumerate(seqs):
            ids = torch.tensor([seq])
            one = s.store.fetch_paths(s.route(QUERIES[i : i + 1]))
            mask = torch.ones_like(ids)
            logp = mixed_logprobs(_logits(s, ids, mask, one)[0, :-1], _logits(s, ids, mask, None)[0, :-1], 0.3)
            want = -logp.gather(1, ids[0, 1:, None]).sum()
            assert got[i].tokens == len(seq) - 1 and got[i].nll == pytest.approx(float(want), rel=1e-4)
        alone = token_losses(s, seqs, None)
        s.anchor_mix = 0.0
        assert [x.nll for x in alone] == pytest.approx([x.nll for x in token_losses(s, seqs, None)])
        assert sum(x.nll for x in got) != pytest.approx(sum(x.nll for x in token_losses(s, seqs, fetched)))


def test_cli_anchor_mix(home: Path, mixing_bank: str, tmp_path: Path) -> None:
    """ask reports the mix it served; eval records it, so a mixed run is a new run, not a resumed one;
    a share outside [0, 1] is a one-line error."""
    res = runner.invoke(app, ["ask", QUERIES[1], "--bank", "s", "--json", "--anchor-mix", "0.5",
                              "--min-relevance", "0", "--max-new-tokens", "3"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["anchor_mix"] == 0.5
    line = runner.invoke(app, ["ask", QUERIES[1], "--bank", "s", "--anchor-mix", "0.5", "--min-relevance", "0",
                               "--max-new-tokens", "3"])  # fmt: skip
    assert line.exit_code == 0 and "anchor mix 0.5" in line.stderr
    bad = runner.invoke(app, ["ask", QUERIES[1], "--bank", "s", "--anchor-mix", "2"])
    assert bad.exit_code == 2 and "--anchor-mix" in bad.stderr and "Traceback" not in bad.output
    probes = tmp_path / "probes.jsonl"
    probes.write_text(json.dumps({"prompt": "Neon is a", "answers": ["gas"], "doc": "gases/1.txt"}) + "\n")
    base = ["eval", "--bank", "s", "--probes", str(probes), "--setups", "fetched", "--json", "--min-relevance", "0"]
    plain = runner.invoke(app, base)
    assert plain.exit_code == 0, plain.output
    first = json.loads(plain.stdout)
    mixed = runner.invoke(app, [*base, "--anchor-mix", "0.5"])
    assert mixed.exit_code == 0, mixed.output
    m = json.loads(mixed.stdout)
    assert m["run"] != first["run"] and not m["resumed"] and m["params"]["anchor_mix"] == 0.5
    assert "anchor_mix" not in first["params"]


def test_kd_and_lm_losses_train_the_mixture(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a share w, the student whose loss is taken is (1 - w) p(memories) + w p(anchor); the
    anchor's logits carry no gradient."""
    import memctl.train.batches as batches

    torch.manual_seed(0)
    student = torch.nn.Linear(1, 1)  # stands for the model: its logits at position t are w[t]
    student.w = torch.nn.Parameter(torch.randn(4, 30) * 2)
    anchor = torch.randn(4, 30) * 2
    monkeypatch.setattr(batches, "logits_at", lambda model, ids, mask, rows, cols, *rest: model.w[cols])
    pos = torch.stack([torch.zeros(4, dtype=torch.long), torch.arange(4)], 1)
    top = torch.randn(4, 30).log_softmax(-1).topk(5, dim=-1)
    mixed = mixed_logprobs(student.w, anchor, 0.4)
    want = -(top.values.softmax(-1) * mixed.gather(1, top.indices)).sum(-1).mean()
    got = batches.kd_loss(student, torch.zeros(1, 4), torch.ones(1, 4), pos, top.indices, top.values,
                          anchor_logits=anchor, mix=0.4)  # fmt: skip
    assert torch.allclose(got, want)
    got.backward()
    assert student.w.grad is not None and student.w.grad.abs().sum() > 0
    labels = torch.tensor([[5, 6, 7, 8, 9]])
    lm = batches.lm_loss(student, torch.zeros(1, 5), torch.ones(1, 5), labels, anchor_logits=anchor, mix=0.4)
    assert torch.allclose(lm, -mixed[torch.arange(4), labels[0, 1:]].mean())
    with pytest.raises(InputError, match="--anchor-mix"):
        TrainConfig(anchor_mix=1.0).validate()


def test_a_bank_trained_for_the_mixture_serves_it(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    """`train --anchor-mix w` trains through the mixture (held-out scoring included) and the bank then
    serves with w unless told otherwise; a bank trained without it serves the memories alone."""
    ingest("m", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    res = train("m", {"epochs": 2, "batch_size": 2, "anchor_mix": 0.5}, home=home)
    assert res.units and all(u.steps > 0 for u in res.units)
    with BankSession("m", home) as s, BankSession("m", home, anchor_mix=0.0) as s0:
        assert s.anchor_mix == 0.5 and s0.anchor_mix == 0.0
    plain = runner.invoke(app, ["ask", QUERIES[1], "--bank", "m", "--json", "--min-relevance", "0",
                                "--max-new-tokens", "2"])  # fmt: skip
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["anchor_mix"] == 0.5
    bad = runner.invoke(app, ["train", "--bank", "m", "--anchor-mix", "1", "--retrain"])
    assert bad.exit_code == 2 and "--anchor-mix" in bad.stderr
