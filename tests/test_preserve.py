"""Preservation: memories trained to leave the anchor alone on text it writes itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from memctl.build.ingest import ingest
from memctl.core.config import TrainConfig
from memctl.model.anchor import load_anchor
from memctl.registry import Registry
from memctl.train.batches import epoch_batches, load_samples, preserve_samples
from memctl.train.distill import prepare
from memctl.train.preserve import LENGTH, TOPK, prepare_pool, special_ids
from memctl.train.run import train

POOL = 256  # pools made here directly (the default, memctl.train.preserve.POOL, is larger: slow on the tiny model)

UNRELATED = [
    "The committee will meet on Thursday to review the budget for the new library wing.",
    "Bake the bread for forty minutes, then let it cool on a rack before slicing it.",
    "Trains leave the central station every quarter hour during the morning rush.",
    "She tuned the violin carefully before the concert began in the old hall.",
]


def _bank(name: str, home: Path, corpus: Path, anchor_dir: Path) -> Registry:
    ingest(name, [corpus], anchor=str(anchor_dir), embedder="hash", tree=(2, 2), home=home)
    return Registry.open(name, home)


def test_pool_is_the_anchors_own_text_with_its_own_distributions(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg = _bank("a", home, corpus, tiny_anchor)
    anchor = load_anchor(str(tiny_anchor), home)
    assert prepare_pool(reg, anchor, n=POOL) > 0
    assert prepare_pool(reg, anchor, n=POOL) == 0.0  # computed once per bank
    rows = list(reg.db.query("select ids, topk_idx, topk_logp from preserve order by id"))
    assert len(rows) == POOL
    seqs = [np.frombuffer(r["ids"], dtype=np.int32).tolist() for r in rows]
    assert all(len(s) == LENGTH for s in seqs)
    assert len({tuple(s) for s in seqs}) == POOL  # sampled, not one greedy string
    special = special_ids(anchor.tokenizer)
    assert not {s[0] for s in seqs} & special  # each opens on an ordinary vocabulary token...
    assert len({s[0] for s in seqs}) > POOL // 2  # ...drawn across the vocabulary, not one start
    corpus_text = " ".join(w["text"] for w in reg.windows())
    assert not any(anchor.tokenizer.decode(s) in corpus_text for s in seqs)  # no corpus text
    for r, s in list(zip(rows, seqs, strict=True))[:4]:  # the stored teacher is the anchor alone
        with torch.no_grad():
            top = F.log_softmax(anchor.model(torch.tensor([s])).logits[0].float(), -1).topk(TOPK, dim=-1)
        assert np.array_equal(np.frombuffer(r["topk_idx"], dtype=np.int32).reshape(LENGTH, TOPK), top.indices.numpy())
        stored = np.frombuffer(r["topk_logp"], dtype=np.float32).reshape(LENGTH, TOPK)
        assert np.allclose(stored, top.values.numpy(), atol=1e-4)
    elsewhere = home.parent / "elsewhere"  # same seed, same pool: separate jobs (no shared home) agree
    other = _bank("b", elsewhere, corpus, tiny_anchor)
    assert prepare_pool(other, load_anchor(str(tiny_anchor), elsewhere), n=POOL) > 0
    assert [r["ids"] for r in other.db.query("select ids from preserve order by id")] == [r["ids"] for r in rows]


def test_pool_is_made_once_per_anchor_seed_and_size_under_a_home(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memctl.train.preserve as preserve

    def stored(reg: Registry) -> list[tuple[bytes, bytes, bytes]]:
        return [tuple(r.values()) for r in reg.db.query("select ids, topk_idx, topk_logp from preserve order by id")]

    anchor = load_anchor(str(tiny_anchor), home)
    first = _bank("a", home, corpus, tiny_anchor)
    prepare_pool(first, anchor, n=POOL)
    cache = preserve.pool_cache_file(anchor, first.config.seed + preserve.SEED, POOL)
    assert cache is not None and cache.is_file() and cache.parent == home / "anchors"

    def no_sampling(*args: object, **kwargs: object) -> None:
        raise AssertionError("the pool was sampled again")

    monkeypatch.setattr(preserve, "sample_pool", no_sampling)
    second = _bank("b", home, corpus, tiny_anchor)  # a later bank on the same anchor copies it
    prepare_pool(second, anchor, n=POOL)
    assert stored(second) == stored(first)
    with pytest.raises(AssertionError, match="sampled again"):  # another size is another pool
        prepare_pool(_bank("c", home, corpus, tiny_anchor), anchor, n=POOL // 2)
    monkeypatch.undo()
    whole = cache.read_bytes()
    for i, damaged in enumerate([b"", b"not a pool", whole[: len(whole) // 2], whole[:-9] + bytes(9)]):
        cache.write_bytes(damaged)  # empty, foreign, truncated, corrupted: made again, not trusted
        assert preserve._load_cached(cache, POOL) is None
        again = _bank(f"d{i}", home, corpus, tiny_anchor)
        prepare_pool(again, anchor, n=POOL)
        assert stored(again) == stored(first)
        assert preserve._load_cached(cache, POOL) is not None
    np.savez(cache, ids=np.zeros((POOL, LENGTH), np.int64), topk_idx=np.zeros((POOL, LENGTH, TOPK), np.int32),
             topk_logp=np.zeros((POOL, LENGTH, TOPK), np.float32))  # fmt: skip
    assert preserve._load_cached(cache, POOL) is None  # the right shapes in another dtype: not a pool


def test_pool_openings_are_seeded_and_bos_pools_are_the_anchors_start(tiny_anchor: Path, home: Path) -> None:
    from memctl.train.preserve import sample_pool

    anchor = load_anchor(str(tiny_anchor), home)
    a = sample_pool(anchor, 8, length=12, seed=5)
    assert a == sample_pool(anchor, 8, length=12, seed=5)  # seeded
    assert [s[0] for s in a] != [s[0] for s in sample_pool(anchor, 8, length=12, seed=6)]
    bos = sample_pool(anchor, 8, length=12, seed=5, start="bos")
    assert all(len(s) == 12 for s in bos) and bos != a
    # pools are sampled in batches: a larger pool starts with the smaller one when whole batches agree
    assert sample_pool(anchor, 8, length=12, seed=5, batch=4)[:4] == sample_pool(anchor, 4, length=12, seed=5, batch=4)
    with pytest.raises(ValueError, match="start"):
        sample_pool(anchor, 1, start="middle")


def test_preservation_samples_take_their_share_on_the_units_own_paths(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    reg = _bank("s", home, corpus, tiny_anchor)
    anchor = load_anchor(str(tiny_anchor), home)
    prepare(reg, anchor)
    prepare_pool(reg, anchor, n=POOL)
    samples = load_samples(reg, anchor, "0", "distill")
    tokens = sum(len(s.ids) for s in samples)
    keep = preserve_samples(reg, "0", 0.5, samples, 0, POOL)
    got = sum(len(s.ids) for s in keep)
    assert 0.5 * tokens <= got < 0.5 * tokens + LENGTH
    assert {s.kind for s in keep} == {"keep"} and all(s.n_prompt == 1 and s.doc_id == "" for s in keep)
    assert {s.path for s in keep} <= {s.path for s in samples}
    assert all(s.topk_idx is not None and s.topk_idx.shape == (LENGTH, TOPK) for s in keep)
    small = preserve_samples(reg, "0", 0.5, samples, 0, 16)  # --preserve-pool 16: the pool's first 16
    assert {s.key for s in small} <= {f"k{i}" for i in range(16)} and len(small) == len(keep)
    assert preserve_samples(reg, "0", 0.0, samples, 0, POOL) == []
    assert [s.key for s in preserve_samples(reg, "0", 0.5, samples, 0, POOL)] == [s.key for s in keep]  # seeded
    everything = samples + keep
    for batch in epoch_batches(everything, "0", 2, TrainConfig(), 0):  # one kind per batch
        assert len({everything[i].kind for i in batch}) == 1


def test_tail_loss_is_flat_where_the_student_is_the_teacher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preservation matches the whole distribution (top-k plus the rest); renormalising the top-k
    would keep pulling mass onto the top-k even from a student that already equals the teacher."""
    import memctl.train.batches as batches

    torch.manual_seed(0)
    logits = torch.randn(5, 50) * 2
    student = torch.nn.Linear(1, 1)  # stands for the model; its "logits" at position t are w[t]
    student.w = torch.nn.Parameter(logits.clone())
    monkeypatch.setattr(batches, "logits_at", lambda model, ids, mask, rows, cols, *rest: model.w[cols])
    top = F.log_softmax(logits, -1).topk(8, dim=-1)
    pos = torch.stack([torch.zeros(5, dtype=torch.long), torch.arange(5)], 1)
    for tail, flat in ((True, True), (False, False)):
        student.w.grad = None
        loss = batches.kd_loss(student, torch.zeros(1, 5), torch.ones(1, 5), pos, top.indices, top.values, tail=tail)
        loss.backward()
        assert bool(student.w.grad.abs().max() < 1e-6) is flat


def _kl_on(model: torch.nn.Module, handle, fetched, seqs: list[list[int]]) -> float:  # noqa: ANN001
    ids = torch.tensor(seqs)
    with torch.no_grad():
        with handle.using(None):
            base = F.log_softmax(model(ids).logits.float(), -1)
        with handle.using(fetched):
            mine = F.log_softmax(model(ids).logits.float(), -1)
    return float((base.exp() * (base - mine)).sum(-1).mean())


def test_preservation_undoes_damage_on_anchor_text_it_never_saw(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    from memctl.model.anchor import attach
    from memctl.model.memory import Fetched, LevelFetch
    from memctl.train.batches import batch_loss, collate
    from memctl.train.preserve import sample_pool

    reg = _bank("k", home, corpus, tiny_anchor)
    anchor = load_anchor(str(tiny_anchor), home)
    with torch.no_grad():  # a confident anchor, as real ones are: the random tiny one is nearly uniform
        anchor.model.model.norm.weight.mul_(12.0)
    prepare(reg, anchor)
    prepare_pool(reg, anchor, n=POOL)
    samples = load_samples(reg, anchor, "0", "distill")
    share = POOL * LENGTH / sum(len(s.ids) for s in samples)  # the whole pool, once each
    keep = preserve_samples(reg, "0", share, samples, 0, POOL)
    assert len({s.key for s in keep}) == POOL
    unseen = sample_pool(anchor, 16, seed=1234)  # anchor text that is not in the pool
    assert not {tuple(s) for s in unseen} & {tuple(s.ids) for s in keep}
    n, d = anchor.n_layers, anchor.hidden
    g = torch.Generator().manual_seed(0)
    block = {p: (torch.randn(1, n, 8, d, generator=g) * 0.15).requires_grad_(True) for p in ("gate", "up", "down")}
    handle = attach(anchor.model, tuple(range(n)))

    def fetched(b: int) -> Fetched:
        return Fetched([LevelFetch(block["gate"], block["up"], block["down"], torch.zeros(b, dtype=torch.long))], b)

    before = _kl_on(anchor.model, handle, fetched(len(unseen)), unseen)
    opt = torch.optim.Adam(block.values(), lr=1e-2)
    for step in range(60):
        batch = [keep[(8 * step + i) % len(keep)] for i in range(8)]
        ids, mask, labels = collate(batch, anchor.tokenizer.pad_token_id)
        with handle.using(fetched(len(batch))):
            loss = batch_loss(anchor.model, batch, ids, mask, labels, None, 0, False)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = _kl_on(anchor.model, handle, fetched(len(unseen)), unseen)
    handle.detach()
    assert before > 1.0 and after < 0.5 * before, (before, after)  # measured: 3.91 -> 1.44


def test_training_with_preservation_keeps_provenance_to_documents(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    _bank("on", home, corpus, tiny_anchor)
    res = train("on", {"epochs": 2, "objective": "distill", "preserve": 1.0}, home=home)
    assert all(u.steps > 0 for u in res.units)
    on = Registry.open("on", home)
    assert on.count("preserve") == TrainConfig().preserve_pool  # the configured pool (conftest: small)
    docs = {r["id"] for r in on.db.query("select id from documents")}
    assert {r["doc_id"] for r in on.db.query("select distinct doc_id from block_docs")} <= docs
    _bank("off", home, corpus, tiny_anchor)
    train("off", {"epochs": 1, "objective": "distill", "preserve": 0.0}, home=home)
    assert Registry.open("off", home).count("preserve") == 0  # off: no pool is made


def test_special_ids_include_added_tokens_marked_special() -> None:
    from tokenizers import AddedToken

    class Tok:  # SmolLM2 marks <file_sep>, <jupyter_*>, ... special outside its special-tokens map
        all_special_ids = [0]
        added_tokens_decoder = {0: AddedToken("<s>", special=True), 5: AddedToken("<x>", special=True),
                                6: AddedToken("word", special=False)}  # fmt: skip

    assert special_ids(Tok()) == {0, 5}


def test_a_pool_cache_that_cannot_be_written_costs_nothing(tmp_path: Path) -> None:
    import memctl.train.preserve as preserve

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    pool = {"ids": np.zeros((2, LENGTH), np.int32)}
    preserve._save_cached(blocker / "pool.npz", pool)  # the home cannot hold it: no error, nothing left
    assert blocker.read_text() == "not a directory" and sorted(tmp_path.iterdir()) == [blocker]


def test_own_window_preservation_matches_the_anchor_except_where_a_fact_is_predicted(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    from memctl.train.batches import prompt_samples
    from memctl.train.preserve import anchor_topk, answer_spans, own_window_samples

    reg = _bank("o", home, corpus, tiny_anchor)
    anchor = load_anchor(str(tiny_anchor), home)
    prepare(reg, anchor)
    trained = prompt_samples(reg, "0")
    own = own_window_samples(reg, anchor, "0", 1.0, trained, seed=0)
    assert own and all(s.keep and s.doc_id and s.kind == "keep" for s in own)
    assert abs(sum(len(s.ids) for s in own) - sum(len(s.ids) for s in trained)) <= max(len(s.ids) for s in own)
    windows = {
        f"o{r['id']}": r for r in reg.db.query("select w.*, d.title from windows w join documents d on d.id = w.doc_id")
    }
    smp = own[0]
    w = windows[smp.key]
    assert smp.path == tuple(int(v) for v in w["path"].split(",")) and smp.doc_id == w["doc_id"]
    offsets = anchor.tokenizer(w["text"], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    sql = "select answer from prompts where window_id = ? and kind in ('cloze', 'paraphrase')"
    answers = [r["answer"] for r in reg.db.query(sql, [w["id"]])]
    facts = answer_spans(w["text"], answers, w["title"] or "")
    assert facts  # the window has answers ("0" of "note 0", its title...)
    in_fact = {
        t for t in range(len(smp.ids) - 1) if any(s < offsets[t + 1][1] and offsets[t + 1][0] < e for s, e in facts)
    }
    assert in_fact and smp.kd_pos == [t for t in range(len(smp.ids) - 1) if t not in in_fact]  # facts left out
    idx, logp = anchor_topk(anchor, [smp.ids])[0]
    assert np.array_equal(smp.topk_idx.numpy(), idx[smp.kd_pos]) and np.allclose(
        smp.topk_logp.numpy(), logp[smp.kd_pos]
    )
    # a forgotten document's windows are left out; no share, no samples
    gone = own_window_samples(reg, anchor, "0", 1.0, trained, seed=0, exclude=frozenset({smp.doc_id}))
    assert gone and smp.doc_id not in {s.doc_id for s in gone}
    assert own_window_samples(reg, anchor, "0", 0.0, trained, seed=0) == []


def test_training_with_own_window_preservation_records_its_documents(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    from test_cli import invoke, one_error_line

    _bank("w", home, corpus, tiny_anchor)
    res = train("w", {"epochs": 1, "objective": "distill", "preserve": 0.0, "preserve_own": 1.0}, home=home)
    assert all(u.steps > 0 for u in res.units)
    reg = Registry.open("w", home)
    docs = {r["id"] for r in reg.db.query("select id from documents")}
    assert {r["doc_id"] for r in reg.db.query("select distinct doc_id from block_docs")} <= docs
    assert "--preserve-own must be between 0 and 4" in one_error_line(
        invoke("train", "--bank", "w", "--preserve-own", "5")
    )
