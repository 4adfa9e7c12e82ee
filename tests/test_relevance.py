"""The relevance gate (memctl.core.relevance): a context unrelated to the bank fetches no memory, in ask,
the Python API, chat and eval, and the anchor answers it exactly as it would alone. Tiny model,
test embedder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from memctl import Memories
from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.core.relevance import NEAREST_SHARE, RELEVANCE_SHARE, calibrate, gate, leaf_similarity, unrelated
from memctl.core.tree import Tree, route
from memctl.eval import evaluate as ev
from memctl.eval.report import gate_line
from memctl.serve.chat import Chat, ChatSettings, describe
from memctl.serve.session import BankSession
from memctl.train.run import train

runner = CliRunner()
RELATED = "Neon is a noble gas that glows red in signs."
UNRELATED = "Quarterly invoices reconcile ledger spreadsheets with payroll deductions"


@pytest.fixture()
def bank(home: Path, corpus: Path, tiny_anchor: Path) -> str:
    ingest("g", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    train("g", {"epochs": 1, "batch_size": 2}, home=home)
    return "g"


def test_leaf_similarity_calibration_and_gate_are_plain_cosines() -> None:
    rng = np.random.default_rng(0)
    leaves = rng.normal(size=(4, 8)).astype(np.float32)
    tree = Tree(k=2, p=2, centroids=[leaves.reshape(2, 2, 8).mean(1), leaves], sizes=[np.ones(2), np.ones(4)])
    x = rng.normal(size=(6, 8)).astype(np.float32)
    paths = route(tree, x)
    sims = leaf_similarity(tree, x, paths)
    for i in range(6):
        c = leaves[paths[i, -1]]
        assert sims[i] == pytest.approx(float(c @ x[i] / np.linalg.norm(c) / np.linalg.norm(x[i])), rel=1e-6)
    assert np.isnan(leaf_similarity(tree, x[:1], np.array([[0, -1]])))[0]  # no leaf: NaN, and gated
    assert unrelated(tree, x[:1], np.array([[0, -1]]), 0.1).tolist() == [True]
    assert calibrate(tree, x) == pytest.approx(RELEVANCE_SHARE * float(np.median(sims)))
    floor = float(np.median(sims))
    off = unrelated(tree, x, paths, floor)
    assert off.tolist() == (sims < floor).tolist() and 0 < off.sum() < 6
    assert not unrelated(tree, x, paths, 0.0).any()  # 0: the gate is off
    g = gate(paths, off)
    assert (g[off] == -1).all() and (g[~off] == paths[~off]).all() and (paths >= 0).all()  # a copy


@pytest.fixture(params=["nearest", "tree"])
def routed_bank(request: pytest.FixtureRequest, home: Path, corpus: Path, tiny_anchor: Path) -> str:
    ingest("r", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home, routing=request.param)
    train("r", {"epochs": 1, "batch_size": 2}, home=home)
    return "r"


def test_floor_is_calibrated_on_the_banks_windows(home: Path, routed_bank: str) -> None:
    bank = routed_bank
    with Memories(bank, home) as mem:
        _, x = mem.reg.embeddings()
        if mem.router.routing == "tree":  # cosine to the leaf's centroid, a share of the windows' median
            sims = leaf_similarity(mem.tree, x, route(mem.tree, x))
            assert mem.relevance_floor == pytest.approx(RELEVANCE_SHARE * float(np.median(sims)))
        else:  # cosine to the nearest window; floor: a share of the median cosine to the nearest other window
            s = x @ x.T
            np.fill_diagonal(s, -np.inf)
            assert mem.relevance_floor == pytest.approx(NEAREST_SHARE * float(np.median(s.max(1))), rel=1e-5)
            sims = mem.router.similarity(x, mem.router.route(x))
            assert np.allclose(sims, 1.0, atol=1e-5)  # a window is its own nearest window
        assert 0 < mem.relevance_floor < float(sims.min())  # every window of the bank passes its own gate
        off = mem.unrelated(mem.embedder.encode([RELATED, UNRELATED]), mem.route([RELATED, UNRELATED]))
        assert off.tolist() == [False, True]
        r = mem.route_gated([RELATED, UNRELATED])  # the verdict without fetching
        assert r.off.tolist() == [False, True] and r.relevance[1] < mem.relevance_floor <= r.relevance[0]
        assert (r.gated[1] == -1).all() and (r.gated[0] == r.paths[0]).all() and (r.paths >= 0).all()
        assert mem.route_gated([]).paths.shape == (0, mem.tree.p)
    assert Memories(bank, home, min_relevance=0.5).relevance_floor == 0.5
    with pytest.raises(Exception, match="min-relevance"):
        Memories(bank, home, min_relevance=2.0)


def _last_logits(s: BankSession, prompts: list[str]) -> torch.Tensor:
    enc = s.anchor.tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        return s.anchor.model(**enc).logits[:, -1]


@pytest.mark.parametrize("mode", ["fetched", "generic"])
def test_an_unrelated_prompt_gets_the_anchor_alone_bit_for_bit(home: Path, bank: str, mode: str) -> None:
    prompts = [RELATED, UNRELATED]
    with BankSession(bank, home) as s:
        s.handle.set(None)
        alone = _last_logits(s, prompts)
        paths = s.use(prompts, mode=mode)
        gated = _last_logits(s, prompts)
        assert torch.equal(gated[1], alone[1])  # unrelated: nothing fetched, the anchor's own logits
        assert not torch.equal(gated[0], alone[0])  # related: its memories change the answer
        if mode == "fetched":
            assert paths is not None and (paths[1] == -1).all() and (paths[0] >= 0).all()
        answers = s.generate(prompts, mode=mode, max_new_tokens=3)
        assert [a.unrelated for a in answers] == [False, True]
        assert answers[1].blocks == [] and answers[0].blocks
        assert answers[1].relevance is not None and answers[1].relevance < s.relevance_floor <= answers[0].relevance
        assert answers[1].text == s.generate([UNRELATED], mode="none", max_new_tokens=3)[0].text
    with BankSession(bank, home, min_relevance=0.0) as s:  # the gate off: every context fetches
        paths = s.use(prompts, mode=mode)
        assert not torch.equal(_last_logits(s, prompts)[1], alone[1])
        assert not s.generate(prompts, mode=mode, max_new_tokens=3)[1].unrelated


def test_ask_and_chat_say_when_the_gate_left_a_prompt_to_the_anchor(home: Path, bank: str) -> None:
    res = runner.invoke(app, ["ask", UNRELATED, "--bank", bank, "--json", "--max-new-tokens", "2"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["unrelated"] and d["blocks"] == [] and d["relevance"] < d["relevance_floor"]
    assert d["store"]["misses"] == 0  # not a block was read
    res = runner.invoke(app, ["ask", UNRELATED, "--bank", bank, "--max-new-tokens", "2"])
    assert res.exit_code == 0 and "unrelated to the bank" in res.output
    args = ["ask", UNRELATED, "--bank", bank, "--json", "--min-relevance", "0", "--max-new-tokens", "2"]
    forced = runner.invoke(app, args)
    f = json.loads(forced.stdout)
    assert not f["unrelated"] and len(f["blocks"]) == 2 and f["relevance_floor"] == 0.0
    bad = runner.invoke(app, ["ask", RELATED, "--bank", bank, "--min-relevance", "3"])
    assert bad.exit_code != 0 and "min-relevance" in bad.output and "Traceback" not in bad.output
    with BankSession(bank, home) as s:
        turn = Chat(s, ChatSettings(max_new_tokens=2)).turn(UNRELATED)
        assert turn.unrelated and turn.blocks == [] and "unrelated to the bank" in describe(turn)
        assert not Chat(s, ChatSettings(max_new_tokens=2)).turn(RELATED).unrelated


def test_eval_gates_unrelated_text_and_says_how_much(home: Path, bank: str, tmp_path: Path) -> None:
    doc = tmp_path / "held.txt"
    doc.write_text(UNRELATED + ". " + UNRELATED.lower() + ".")
    opts = ev.EvalOptions(("anchor", "generic", "fetched"))
    with BankSession(bank, home) as s:
        res = ev.run_eval(s, [], opts, perplexity=doc, store=False)
        rows = {r["setup"]: r for r in res["perplexity"]["rows"]}
        assert rows["fetched"]["perplexity"] == rows["anchor"]["perplexity"] == rows["generic"]["perplexity"]
        assert any("relevance gate" in n and "1 of 1 perplexity documents" in n for n in res["notes"])
        pp = res["perplexity"]
        assert pp["gated"] == 1 and pp["documents"][0]["gated"] and rows["fetched"]["fetched_docs"] == 0
        assert rows["fetched"]["ratio_on_fetched"] is None
        assert gate_line(pp) == "the relevance gate left 1 of 1 documents to the anchor alone"
        assert res["params"]["relevance_floor"] == s.relevance_floor
    with BankSession(bank, home, min_relevance=0.0) as s:
        res = ev.run_eval(s, [], opts, perplexity=doc, store=False)
        rows = {r["setup"]: r for r in res["perplexity"]["rows"]}
        assert rows["fetched"]["perplexity"] != rows["anchor"]["perplexity"]
        assert not any("relevance gate" in n for n in res["notes"])
        assert res["perplexity"]["gated"] == 0 and gate_line(res["perplexity"]) is None


def test_eval_perplexity_reads_the_documents_that_fetched_apart(home: Path, bank: str, tmp_path: Path) -> None:
    """A gated document scores exactly as the anchor, so it dilutes the whole-set ratio: the ratio over
    the documents that fetched memories is reported apart, per document too."""
    docs = tmp_path / "held"
    docs.mkdir()
    (docs / "a.txt").write_text(UNRELATED + ". " + UNRELATED.lower() + ".")
    (docs / "b.txt").write_text(RELATED + " " + RELATED)
    with BankSession(bank, home) as s:
        res = ev.run_eval(s, [], ev.EvalOptions(("anchor", "generic", "fetched")), perplexity=docs, store=False)
    pp = res["perplexity"]
    rows = {r["setup"]: r for r in pp["rows"]}
    off = next(d for d in pp["documents"] if d["gated"])
    on = next(d for d in pp["documents"] if not d["gated"])
    assert pp["gated"] == 1 and rows["fetched"]["fetched_docs"] == 1
    assert off["nll"]["fetched"] == off["nll"]["generic"] == off["nll"]["anchor"]
    alone = math.exp((on["nll"]["fetched"] - on["nll"]["anchor"]) / on["tokens"])
    assert rows["fetched"]["ratio_on_fetched"] == pytest.approx(alone) and alone != 1.0
    assert abs(math.log(rows["fetched"]["ratio_to_anchor"])) < abs(math.log(alone))  # diluted by the gated one
    line = gate_line(pp)
    assert line is not None and line.startswith("the relevance gate left 1 of 2 documents to the anchor alone")
    assert f"fetched {100 * (alone - 1):+.1f}%" in line
    res = runner.invoke(app, ["eval", "--bank", bank, "--setups", "anchor,fetched", "--perplexity", str(docs)])
    assert res.exit_code == 0, res.output
    assert "the relevance gate left 1 of 2 documents to the anchor alone; on the other 1: fetched" in " ".join(
        res.output.split()
    )


def test_eval_leaves_a_gated_probe_to_the_anchor_in_every_setup_but_the_diagnostic(home: Path, bank: str) -> None:
    """An unrelated probe next to a related one: in generic, fetched, rag, rag+fetched, beam and
    blocked setups the unrelated one fetches and retrieves nothing and answers as the anchor does;
    fetched-corrupted (the wrong leaf's blocks, a diagnostic about parameters) stays ungated."""
    from memctl.core.probes import Probe

    probes = [Probe("", "k", RELATED, ("red",)), Probe("", "k", UNRELATED, ("x",))]
    setups = ("anchor", "generic", "fetched", "rag", "rag+fetched", "fetched-corrupted")
    opts = ev.EvalOptions(setups, beam=2, fractions=(0.0, 0.5), blocking="reroute")
    with BankSession(bank, home) as s:
        plan = ev.plan_eval(s, probes, opts)
        assert plan.retrieved[1] is None and plan.retrieved[0] is not None
        assert any("relevance gate" in n and "1 of 2 probes" in n and "fetched-corrupted" in n for n in plan.notes)
        by = {(j.group, j.index): j for j in plan.jobs if j.group != "fetched-corrupted"}
        for group in ("fetched", "rag+fetched", "fetched beam=2", "fetched blocked=0.5"):
            unrel, rel = by[(group, 1)], by[(group, 0)]
            assert unrel.paths is not None and (unrel.paths == -1).all(), group
            if group != "fetched blocked=0.5":  # (rerouted: judged on its new leaf, which may be far)
                assert rel.paths is not None and (rel.paths >= 0).any(), group
        assert by[("generic", 1)].off and not by[("generic", 0)].off
        assert by[("rag", 1)].prompt == UNRELATED and by[("rag", 0)].prompt != RELATED  # retrieved context
        corrupted = [j for j in plan.jobs if j.group == "fetched-corrupted" and j.index == 1]
        assert corrupted and all((j.paths >= 0).all() for j in corrupted)  # never gated
        res = ev.run_jobs(s, plan, 4, {})
        answer = {(j.group, j.index): res[j.item].answer for j in plan.jobs if j.group != "fetched-corrupted"}
        for group in ("generic", "fetched", "rag", "rag+fetched", "fetched beam=2", "fetched blocked=0.5"):
            assert answer[(group, 1)] == answer[("anchor", 1)], group
    with BankSession(bank, home, min_relevance=0.0) as s:  # the gate off: the same probe fetches and retrieves
        plan = ev.plan_eval(s, probes, opts)
        assert plan.retrieved[1] is not None
        assert all((j.paths >= 0).any() for j in plan.jobs if j.index == 1 and j.paths is not None)
        assert not any("relevance gate" in n for n in plan.notes)


def test_rag_retrieves_nothing_for_a_prompt_the_gate_left_to_the_anchor(home: Path, bank: str) -> None:
    with BankSession(bank, home) as s:
        for mode in ("none", "fetched"):
            rel, unrel = s.generate([RELATED, UNRELATED], mode=mode, max_new_tokens=2, rag=True)
            assert rel.retrieved is not None and not rel.unrelated
            assert unrel.retrieved is None and unrel.unrelated and unrel.blocks == []
            assert unrel.text == s.generate([UNRELATED], mode="none", max_new_tokens=2)[0].text
        turn = Chat(s, ChatSettings(max_new_tokens=2, rag=True)).turn(UNRELATED)
        assert turn.unrelated and turn.retrieved is None and "nothing retrieved" in describe(turn)
    res = runner.invoke(app, ["ask", UNRELATED, "--bank", bank, "--rag", "--max-new-tokens", "2"])
    assert res.exit_code == 0 and "nothing retrieved" in res.output
    bad = runner.invoke(app, ["ask", RELATED, "--bank", bank, "--min-relevance", "-0.1"])
    assert bad.exit_code != 0 and "[0, 1]" in bad.output and "Traceback" not in bad.output


def test_calibration_samples_ids_evenly_and_survives_gaps(home: Path, routed_bank: str) -> None:
    bank = routed_bank
    from memctl.core.relevance import sample_ids

    assert sample_ids(3, 7) == [3, 4, 5, 6, 7]
    ids = sample_ids(1, 100_000, limit=100)
    assert len(ids) == 100 and ids[0] == 1 and ids[-1] == 100_000
    assert max(np.diff(ids)) - min(np.diff(ids)) <= 1  # evenly spread
    with Memories(bank, home) as mem:
        floor = mem.relevance_floor
        docs = [r["doc_id"] for r in mem.reg.db.query("select doc_id from windows group by doc_id order by min(id)")]
        mem.reg.remove_documents(docs[1::2])  # gaps in the window ids, as forgetting leaves them
        _, x = mem.reg.embeddings()
        mem._floor = None
        expected = calibrate(mem.tree, x) if mem.router.routing == "tree" else mem.router.calibrate(x)
        assert mem.relevance_floor == pytest.approx(expected) and floor > 0
