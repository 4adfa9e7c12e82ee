"""Self-study prompts and context distillation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny import level2_blocks_touched

from memctl.build.ingest import ingest
from memctl.model.anchor import attach, load_anchor
from memctl.registry import Registry
from memctl.train.batches import batch_loss, collate, prompt_samples
from memctl.train.distill import TEACHER_SEPARATOR, TOPK, heldout_loss, heldout_prompts, prepare
from memctl.train.prompts import prompts_for
from memctl.train.run import train
from memctl.train.units import UnitParams, unit_of

TEXT = (
    "Helium (symbol He) is the chemical element with atomic number 2.\n\n"
    "It is a light noble gas. Discovered by Pierre Janssen in 1868.\n\n"
    "Helium was discovered by William Ramsay in 1895 (England)."
)


def test_cloze_prompts_make_the_subject_explicit_and_stop_before_the_span() -> None:
    ps = {(p.kind, p.text, p.answer) for p in prompts_for(TEXT, "Helium")}
    assert ("cloze", "Helium (symbol He) is the chemical element with atomic number", "2") in ps
    assert ("paraphrase", "The atomic number of Helium is", "2") in ps
    assert ("cloze", "Helium was discovered by Pierre Janssen in", "1868") in ps  # bare participle
    assert ("cloze", "Helium was discovered by William Ramsay in", "1895") in ps
    assert ("paraphrase", "Helium was discovered in", "1895") not in ps  # the window gives 1868 and 1895
    assert not any(t == "Helium was discovered by" for _k, t, _a in ps)  # Janssen or Ramsay: ambiguous
    assert ("paraphrase", "Iron was discovered in", "1500") in {
        (p.kind, p.text, p.answer) for p in prompts_for("Iron was discovered by Ann Bee in 1500.", "Iron")
    }  # agent deleted
    for _kind, text, answer in ps:
        assert answer not in text and text == text.strip()


def _prepared(home: Path, corpus: Path, anchor_dir: Path) -> tuple[Registry, object]:
    ingest("d", [corpus], anchor=str(anchor_dir), embedder="hash", tree=(2, 2), home=home)
    reg = Registry.open("d", home)
    anchor = load_anchor(str(anchor_dir), home)
    report = prepare(reg, anchor)
    assert report.prompts_total > 0 and 0.0 <= report.route_differs_leaf <= 1.0
    return reg, anchor


def test_prompts_keep_provenance_and_leave_with_their_document(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg, _ = _prepared(home, corpus, tiny_anchor)
    rows = list(
        reg.db.query(
            "select p.doc_id, w.doc_id as wdoc, p.text, w.text as wtext, p.answer from prompts p "
            "join windows w on w.id = p.window_id"
        )
    )
    assert rows and all(r["doc_id"] == r["wdoc"] for r in rows)
    assert all(r["answer"] in r["wtext"] for r in rows)
    doc = rows[0]["doc_id"]
    reg.remove_documents([doc])
    assert reg.db.execute("select count(*) from prompts where doc_id = ?", [doc]).fetchone()[0] == 0
    assert reg.db.execute("select count(*) from windows where doc_id = ?", [doc]).fetchone()[0] == 0
    assert reg.db.execute("select count(*) from prompts").fetchone()[0] > 0


def test_cached_teacher_matches_a_fresh_open_book_pass(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg, anchor = _prepared(home, corpus, tiny_anchor)
    tok, model = anchor.tokenizer, anchor.model
    rows = list(
        reg.db.query(
            "select p.ids, p.n_prompt, p.topk_idx, p.topk_logp, w.text from prompts p "
            "join windows w on w.id = p.window_id order by p.id limit 5"
        )
    )
    for r in rows:
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        w = tok(r["text"] + TEACHER_SEPARATOR, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([w + ids])).logits[0].float(), -1)
        pos = torch.arange(len(w) + r["n_prompt"] - 1, len(w) + len(ids))  # answer tokens + the one after
        top = logp[pos].topk(TOPK, dim=-1)
        n = len(ids) - r["n_prompt"] + 1
        cached_idx = np.frombuffer(r["topk_idx"], dtype=np.int32).reshape(n, TOPK)
        cached_logp = np.frombuffer(r["topk_logp"], dtype=np.float32).reshape(n, TOPK)
        assert np.array_equal(cached_idx, top.indices.numpy())
        assert np.allclose(cached_logp, top.values.numpy(), atol=1e-4)


def test_kd_gradient_reaches_only_the_prompt_path(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg, anchor = _prepared(home, corpus, tiny_anchor)
    samples = [s for s in prompt_samples(reg, "0")][:3]
    assert samples
    touched, routed = level2_blocks_touched(anchor, samples)
    assert touched == routed


def test_train_with_distill_and_mix_objectives(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    ingest("m", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    res = train("m", {"epochs": 2, "objective": "distill"}, home=home)
    assert res.prepare is not None and res.prepare.prompts_total > 0
    assert res.units and all(u.steps > 0 for u in res.units)
    reg = Registry.open("m", home)
    assert reg.db.execute("select count(*) from prompts where topk_idx is null").fetchone()[0] == 0
    mix = train("m", {"epochs": 1, "objective": "mix"}, retrain=True, home=home)
    assert mix.units and mix.prepare is not None and mix.prepare.prompts_added == 0  # prompts are reused


def test_windows_without_prompts_are_still_learned_under_distill(home: Path, tiny_anchor: Path, tmp_path: Path) -> None:
    from memctl.train.batches import load_samples

    docs = tmp_path / "plain"
    docs.mkdir()
    (docs / "a.txt").write_text("Quiet rivers run slowly through green valleys and old forests.")  # nothing salient
    (docs / "b.txt").write_text("Iron was discovered by Ann Bee in 1500 near the northern hills.")
    ingest("p", [docs], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), home=home)
    reg = Registry.open("p", home)
    prepare(reg, load_anchor(str(tiny_anchor), home))
    anchor = load_anchor(str(tiny_anchor), home)
    every = [s for u in ("0", "1") for s in load_samples(reg, anchor, u, "distill")]
    kinds = {(s.doc_id, s.kind) for s in every}
    assert ("a.txt", "lm") in kinds and ("b.txt", "kd") in kinds and ("b.txt", "lm") not in kinds


def test_heldout_loss_is_the_training_loss_on_the_held_out_prompts(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg, anchor = _prepared(home, corpus, tiny_anchor)
    reg.db.execute("update prompts set held_out = 0 where l1 = 0")
    trained = prompt_samples(reg, "0")  # as training loads them, before they are held out
    # a tiny corpus: hold out all of unit 0 but the prompts that ride in a longer one, and their hosts (a held-out
    # prompt is scored alone; `merge_prefixes`)
    alone = [int(s.key[1:]) for s in trained if s.prompts == 1 and s.key.startswith("p")]
    reg.db.execute(f"update prompts set held_out = 1 where l1 = 0 and id in ({','.join(map(str, alone))})")
    held = heldout_prompts(reg, "0")
    assert held is not None and len(held.teacher) == len(held.prompts) >= 3
    own = {(s.key, s.path) for s in held.teacher}  # each held-out prompt on its own route
    samples = [s for s in trained if (s.key, s.path) in own]
    assert len(samples) == len(held.teacher)
    unit, params = unit_of(reg.config, "0"), UnitParams(reg.config, unit_of(reg.config, "0"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in params.flat():
            t.copy_(torch.randn(t.shape, generator=g) * 0.2)
    handle = attach(anchor.model, reg.config.memory.layers)
    try:
        # the training loss on the same prompts, loaded as training loads them, in one batch
        ids, mask, labels = collate(samples, anchor.tokenizer.pad_token_id)
        with torch.no_grad(), handle.using(params.fetched(unit.local_index([s.path for s in samples]))):
            want = float(batch_loss(anchor.model, samples, ids, mask, labels, None, 0, False))
        got = heldout_loss(anchor, handle, unit, params, held, batch=2)  # other batches, other padding
        assert got is not None and abs(got - want) < 1e-4
        with torch.no_grad():
            for t in params.flat():
                t.zero_()
        assert abs(heldout_loss(anchor, handle, unit, params, held) - want) > 1e-3  # the memories count
    finally:
        handle.detach()


def test_parse_questions_keeps_one_short_on_topic_question_per_line() -> None:
    from memctl.train.questions import parse_questions

    got = parse_questions(  # what SmolLM2-135M wrote for the Molybdenum window
        "1. When was the Eiffel Tower completed?\n2. How tall is the Eiffel Tower?\n"
        "4. What is the chemical element with atomic number 42?\n5. What is the trace amount of molybdenum?\n"
        "6. What is the chemical element called"
    )
    assert got == ["What is the chemical element with atomic number 42?", "What is the trace amount of molybdenum?"]
    assert parse_questions("Q: of the element of the element of the element?\n- Why?") == []


def test_anchor_questions_are_answered_open_book_routed_alone_and_leave_with_their_document(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memctl.train.distill as distill
    from memctl.build.embed import get_embedder
    from memctl.build.routing import route_prompts
    from memctl.train.questions import chat_prompt, write_questions

    reg, anchor = _prepared(home, corpus, tiny_anchor)
    tok = anchor.tokenizer
    texts = [r["text"] for r in reg.db.query("select text from windows order by id")]
    real = write_questions(anchor, texts[:3], 2, seed=0)
    assert real == write_questions(anchor, texts[:3], 2, seed=0) and all(len(q) <= 2 for q in real)  # seeded
    # a random tiny model writes no usable question and answers in blank lines (such answers are dropped):
    # fixed questions and a fixed answer stand in for the anchor's words; storage, routing and teacher are real
    asked = ["When was this discovered?", "Who named it after a planet?"]
    monkeypatch.setattr(distill, "write_questions", lambda a, ts, n, seed, progress=None: [asked[:n] for _ in ts])
    monkeypatch.setattr(distill, "answer_questions", lambda a, w, qs, sep: ["in 1868" for _ in qs])
    in_0 = reg.db.execute("select count(*) from windows where l1 = 0").fetchone()[0]
    assert 0 < in_0 < reg.count("windows")
    assert prepare(reg, anchor, questions=2, units=["0"]).prompts_added == 2 * in_0  # the trained units' windows only
    assert prepare(reg, anchor, questions=2).prompts_added == 2 * (reg.count("windows") - in_0)  # then the rest
    rows = list(
        reg.db.query(
            "select p.*, w.text as wtext from prompts p join windows w on w.id = p.window_id where kind = 'question'"
        )
    )
    assert all(r["held_out"] == 0 and r["answer"] == "in 1868" for r in rows)
    emb = get_embedder(reg.config.embedder)
    for r in rows[:4]:
        q = next(q for q in asked if chat_prompt(tok, q) == r["text"])
        assert r["path"] == ",".join(map(str, route_prompts(reg, emb.encode([q]), [r["doc_id"]])[0]))  # on the question
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        assert (
            ids
            == tok(r["text"], add_special_tokens=False)["input_ids"]
            + tok("in 1868", add_special_tokens=False)["input_ids"]
        )
        w = tok(r["wtext"] + TEACHER_SEPARATOR, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = F.log_softmax(anchor.model(torch.tensor([w + ids])).logits[0].float(), -1)
        top = logp[torch.arange(len(w) + r["n_prompt"] - 1, len(w) + len(ids))].topk(TOPK, dim=-1)
        n = len(ids) - r["n_prompt"] + 1
        assert np.array_equal(np.frombuffer(r["topk_idx"], dtype=np.int32).reshape(n, TOPK), top.indices.numpy())
    assert prepare(reg, anchor, questions=2).prompts_added == 0  # asked once per window
    with_q = {s.key for u in ("0", "1") for s in prompt_samples(reg, u, questions=True)}
    without = {s.key for u in ("0", "1") for s in prompt_samples(reg, u)}
    assert without < with_q and all(f"p{r['id']}" not in without for r in rows)
    doc = rows[0]["doc_id"]
    reg.remove_documents([doc])
    assert reg.db.execute("select count(*) from prompts where doc_id = ?", [doc]).fetchone()[0] == 0


def test_a_prompt_that_begins_a_longer_one_rides_in_it_for_the_same_loss(tiny_anchor: Path, home: Path) -> None:
    from memctl.train.batches import Sample, merge_prefixes

    anchor = load_anchor(str(tiny_anchor), home)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (12,), generator=gen).tolist()

    def prompt(key: str, n_ids: int, n_prompt: int, doc: str = "d", path: tuple[int, ...] = (0, 1)) -> Sample:
        a = n_ids - n_prompt + 1  # each answer token and the one after
        logp = torch.log_softmax(torch.randn(a, TOPK, generator=gen), -1)
        idx = torch.randint(0, 200, (a, TOPK), generator=gen)
        return Sample(key, doc, ids[:n_ids], path, None, n_prompt, idx, logp)

    host, rider, touching = prompt("p1", 12, 9), prompt("p2", 7, 5), prompt("p3", 9, 8)  # p3's last = p1's first
    other_doc, other_path = prompt("p4", 7, 5, doc="e"), prompt("p5", 7, 5, path=(0, 0))
    merged = merge_prefixes([host, rider, touching, other_doc, other_path])
    assert [s.key for s in merged] == ["p1", "p4", "p5"]  # another document's or path's prompt stays alone
    assert merged[0].kd_pos is not None and sorted(merged[0].kd_pos) == list(range(4, 12))  # p3's 8 is p1's: once
    assert sum(len(s.ids) for s in merged) == 12 + 7 + 7  # 28 tokens fewer than the five prompts'
    assert [s.prompts for s in merged] == [3, 1, 1]
    # a batch holds as many prompts as before merging (16 by default), not as many samples
    from memctl.core.config import TrainConfig
    from memctl.train.batches import epoch_batches

    pool = merged + [prompt(f"q{i}", 7, 5, doc=f"x{i}") for i in range(14)]  # 3 + 1 + 1 + 14 = 19 prompts
    sizes = sorted(sum(pool[i].prompts for i in b) for b in epoch_batches(pool, "0", 2, TrainConfig(), 0))
    assert len(sizes) == 2 and sum(sizes) == 19 and 16 <= sizes[1] <= 18  # 16, or just past it with the 3

    def loss(batch: list[Sample]) -> float:
        ids_, mask, labels = collate(batch, anchor.tokenizer.pad_token_id)
        with torch.no_grad():
            return float(batch_loss(anchor.model, batch, ids_, mask, labels, None, 0, False))

    # the same targets at the same positions with the same context: the same loss
    assert loss([host, rider]) == pytest.approx(loss(merge_prefixes([host, rider])), abs=1e-5)
    assert loss(merge_prefixes([host, rider])) != pytest.approx(loss([host]), abs=1e-3)  # the rider counts
