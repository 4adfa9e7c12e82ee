"""Self-study continuations: seeds, their cache and provenance, their routes, and coverage with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tiny import level2_blocks_touched

from memctl.build.embed import get_embedder
from memctl.build.ingest import ingest
from memctl.build.routing import route_prompts
from memctl.core.tree import route
from memctl.model.anchor import load_anchor
from memctl.registry import Registry
from memctl.train.batches import kd_targets, load_samples, prompt_samples
from memctl.train.coverage import bank_coverage
from memctl.train.distill import TEACHER_SEPARATOR, TOPK, prepare
from memctl.train.sections import window_openings
from memctl.train.study import (
    STUDY,
    STUDY_WINDOWS,
    pick_seeds,
    sample_continuations,
    seeds_for,
    study_chunks,
    subject_of,
    teacher_context,
    window_seeds,
)


def _studied(home: Path, corpus: Path, tiny_anchor: Path, per_window: int = 3) -> tuple[Registry, object]:
    ingest("s", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    reg = Registry.open("s", home)
    anchor = load_anchor(str(tiny_anchor), home)
    report = prepare(reg, anchor, study=per_window)
    assert report.study_added > 0
    return reg, anchor


def test_seeds_name_the_subject_in_raw_and_chat_form(tiny_anchor: Path, home: Path) -> None:
    anchor = load_anchor(str(tiny_anchor), home)
    assert subject_of("", "Quorvane Systems is a maker of tide gauges.") == "Quorvane Systems"
    assert subject_of("Neon", "Neon is a gas.") == "Neon"
    seeds = seeds_for(anchor.tokenizer, "Neon")
    assert all("Neon" in s.text and "Neon" in s.query and s.chat for s in seeds)
    picked = pick_seeds(seeds, 4)
    assert len(picked) == 4 and len({s.text for s in picked}) == 4


# SmolLM2-135M-Instruct's template: a default system prompt unless the first message is a system turn
DEFAULT_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_chat_seeds_leave_out_a_default_system_prompt_the_template_would_write(tiny_anchor: Path, home: Path) -> None:
    tok = load_anchor(str(tiny_anchor), home).tokenizer
    tok.chat_template = DEFAULT_SYSTEM_TEMPLATE
    (seed,) = pick_seeds(seeds_for(tok, "Neon"), 1)
    assert (
        seed.text == "<|im_start|>system\n<|im_end|>\n"
        "<|im_start|>user\nWhat are the key facts about Neon?<|im_end|>\n<|im_start|>assistant\n"
    )
    prefix, (suffix,) = teacher_context(tok, "Neon is a gas.", [seed], TEACHER_SEPARATOR)
    assert "helpful" not in prefix + suffix and prefix.endswith("user\nNeon is a gas.")
    tok.chat_template = NO_SYSTEM_TEMPLATE  # refuses a system turn: the user turn alone
    (seed,) = pick_seeds(seeds_for(tok, "Neon"), 1)
    assert seed.text == "<|im_start|>user\nWhat are the key facts about Neon?<|im_end|>\n<|im_start|>assistant\n"
    tok.chat_template = (  # writes no default: an empty system turn would only add tokens
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (seed,) = pick_seeds(seeds_for(tok, "Neon"), 1)
    assert seed.text == "<|im_start|>user\nWhat are the key facts about Neon?<|im_end|>\n<|im_start|>assistant\n"


def test_study_continuations_are_cached_with_provenance_and_leave_with_their_document(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    reg, anchor = _studied(home, corpus, tiny_anchor)
    tok = anchor.tokenizer
    rows = list(
        reg.db.query(
            "select p.*, w.text as wtext, w.doc_id as wdoc, w.studied from prompts p "
            "join windows w on w.id = p.window_id where p.kind = ?",
            [STUDY],
        )
    )
    assert rows and all(r["doc_id"] == r["wdoc"] and r["studied"] == 3 and r["held_out"] == 0 for r in rows)
    for r in rows[:6]:
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        assert ids[: r["n_prompt"]] == tok(r["text"], add_special_tokens=False)["input_ids"]
        # the cached top-k is the open-book teacher's (window and question in one turn), at every
        # continuation token and the one after
        title = reg.db.execute("select title from documents where id = ?", [r["doc_id"]]).fetchone()[0] or ""
        seed = {s.text: s for s in seeds_for(tok, subject_of(title, r["wtext"]))}[r["text"]]
        prefix, (suffix,) = teacher_context(tok, r["wtext"], [seed], TEACHER_SEPARATOR)
        assert r["wtext"] in prefix and seed.query in suffix and seed.chat
        w = tok(prefix, add_special_tokens=False)["input_ids"] + tok(suffix, add_special_tokens=False)["input_ids"]
        cont = ids[r["n_prompt"] :]
        with torch.no_grad():
            logp = F.log_softmax(anchor.model(torch.tensor([w + cont])).logits[0].float(), -1)
        top = logp[torch.arange(len(w) - 1, len(w) + len(cont))].topk(TOPK, dim=-1)
        n = len(ids) - r["n_prompt"] + 1
        assert np.array_equal(np.frombuffer(r["topk_idx"], dtype=np.int32).reshape(n, TOPK), top.indices.numpy())
        got = np.frombuffer(r["topk_logp"], dtype=np.float32).reshape(n, TOPK)
        assert np.allclose(got, top.values.numpy(), atol=1e-4)
        # under nearest routing, trained on its window's path
        assert r["path"] == reg.db.execute("select path from windows where id = ?", [r["window_id"]]).fetchone()[0]
    again = prepare(reg, anchor, study=3)
    assert again.study_added == 0  # sampled once per window
    # trained only when asked for
    with_study = {s.key for u in ("0", "1") for s in prompt_samples(reg, u, study=True)}
    without = {s.key for u in ("0", "1") for s in prompt_samples(reg, u)}
    assert without < with_study and all(f"p{r['id']}" not in without for r in rows)
    doc = rows[0]["doc_id"]
    reg.remove_documents([doc])  # what `forget` removes a document with
    assert reg.db.execute("select count(*) from prompts where doc_id = ?", [doc]).fetchone()[0] == 0
    assert reg.db.execute("select count(*) from prompts where kind = ?", [STUDY]).fetchone()[0] > 0


def test_under_greedy_routing_a_continuation_is_routed_from_its_seed(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    ingest("s", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home, routing="tree")
    reg = Registry.open("s", home)
    anchor = load_anchor(str(tiny_anchor), home)
    assert prepare(reg, anchor, study=2).study_added > 0
    emb = get_embedder(reg.config.embedder)
    seeds = {}
    for title, text in reg.db.execute("select d.title, w.text from windows w join documents d on d.id = w.doc_id"):
        seeds.update({s.text: s.query for s in seeds_for(anchor.tokenizer, subject_of(title or "", text))})
    rows = list(reg.db.query("select text, path from prompts where kind = ?", [STUDY]))
    assert rows
    for r in rows:  # as a user would type the seed (no chat markup)
        assert r["path"] == ",".join(map(str, route(reg.load_tree(), emb.encode([seeds[r["text"]]]))[0]))


def test_a_long_documents_continuations_train_on_their_own_windows_paths(
    home: Path, tmp_path: Path, tiny_anchor: Path
) -> None:
    names = ["Ada Wren", "Velma Orrick", "Tomas Vey", "Ann Bee", "Quorvane", "Brantholm", "Eskerfall", "Lemberg"]
    paras = [
        f"{n} entered the register in {1900 + 7 * i}. The entry lists a workshop on the {n} quay, two ledgers "
        f"kept in the cellar, a seal with a heron, and a letter from {names[(i + 3) % 8]} about the harbour dues."
        for i, n in enumerate(names)
    ]
    docs = tmp_path / "long"
    docs.mkdir()
    (docs / "register.txt").write_text("\n\n".join(paras))
    (docs / "note.txt").write_text("Ada Wren keeps the harbour ledger.\n")
    ingest("s", [docs], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), window=200, home=home)
    reg = Registry.open("s", home)
    anchor = load_anchor(str(tiny_anchor), home)
    assert prepare(reg, anchor, study=2).study_added > 0
    windows = list(reg.db.query("select w.id, w.path, w.text, d.id as doc, d.title from windows w join documents d "
                                "on d.id = w.doc_id where d.id like '%register%'"))  # fmt: skip
    assert len(windows) >= 4 and len({w["path"] for w in windows}) > 1
    emb = get_embedder(reg.config.embedder)
    elsewhere = 0
    starts = window_openings(reg, {w["doc"] for w in windows})  # a register: seeds name its sections
    assert all(starts[w["id"]] is not None for w in windows)
    for w in windows:
        rows = list(reg.db.query("select text, path from prompts where kind = ? and window_id = ?", [STUDY, w["id"]]))
        assert rows and all(r["path"] == w["path"] for r in rows)  # its window's path
        seeds = window_seeds(anchor.tokenizer, w["title"] or "", w["text"], 2, starts[w["id"]])
        queries = {s.text: s.query for s in seeds}
        seed_routes = route_prompts(reg, emb.encode([queries[r["text"]] for r in rows]), [w["doc"]] * len(rows))
        elsewhere += sum(",".join(map(str, x)) != w["path"] for x in seed_routes)
    assert elsewhere > 0  # where the seed alone would have routed some of them: the document's window nearest it


def test_dense_kl_on_a_continuation_reaches_only_the_blocks_on_its_route(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    reg, anchor = _studied(home, corpus, tiny_anchor)
    samples = [s for s in prompt_samples(reg, "0", study=True) if s.key in _study_keys(reg)][:3]
    assert samples and all(s.topk_idx.shape[0] == len(s.ids) - s.n_prompt + 1 for s in samples)  # every token
    assert kd_targets(samples)[0].shape[0] == sum(len(s.ids) - s.n_prompt + 1 for s in samples)
    touched, routed = level2_blocks_touched(anchor, samples)
    assert touched == routed


def _study_keys(reg: Registry) -> set[str]:
    return {f"p{r[0]}" for r in reg.db.execute("select id from prompts where kind = ?", [STUDY])}


def test_coverage_counts_study_only_when_it_is_trained(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg, anchor = _studied(home, corpus, tiny_anchor)
    cloze = bank_coverage(reg)
    both = bank_coverage(reg, study=True)
    assert cloze.windows == both.windows == reg.count("windows")
    assert 0.0 <= cloze.mean <= both.mean <= 1.0 and "study" in both.by_kind and "study" not in cloze.by_kind
    assert len(both.uncovered) <= len(cloze.uncovered)
    few = bank_coverage(reg, study=True, sample=3)  # an even sample of the windows
    assert few.windows == 3 and few.sampled and not both.sampled
    sub = bank_coverage(reg, study=True, l1=0)  # one level-1 subtree's windows
    assert sub.windows == reg.db.execute("select count(*) from windows where l1 = 0").fetchone()[0] < both.windows
    # a window whose document is learned next-token under distill has no prompt: it is uncovered by prompts
    samples = {s.key for u in ("0", "1") for s in load_samples(reg, anchor, u, "distill")}
    for wid, _doc in cloze.uncovered:
        if not reg.db.execute(
            "select count(*) from prompts where window_id = ? and kind != ?", [wid, STUDY]
        ).fetchone()[0]:
            assert f"w{wid}" in samples


def test_train_info_and_the_eval_report_show_coverage_and_flag_uncovered_windows(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path
) -> None:
    import json

    from typer.testing import CliRunner

    from memctl.cli import app

    (corpus / "plain").mkdir()
    (corpus / "plain" / "rivers.txt").write_text("Quiet rivers run slowly through green valleys and old forests.")
    ingest("c", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    runner = CliRunner()
    res = runner.invoke(app, ["train", "--bank", "c", "--epochs", "1", "--preserve", "0", "--study", "0", "--json"])
    assert res.exit_code == 0, res.output
    cov = json.loads(res.output)["prepare"]["coverage"]
    assert 0 < cov["mean"] < 1 and cov["uncovered"] >= 1
    assert {"doc": "plain/rivers.txt"} in [{"doc": w["doc"]} for w in cov["uncovered_windows"]]
    res = runner.invoke(app, ["info", "--bank", "c"])
    assert res.exit_code == 0 and "coverage" in res.output and "--study N" in res.output
    probes = tmp_path / "p.jsonl"
    probes.write_text(
        json.dumps({"doc": "gases/1.txt", "prompt": "Neon is a noble gas that glows", "answers": ["red"]})
    )
    report = tmp_path / "report"
    res = runner.invoke(
        app, ["eval", "--bank", "c", "--probes", str(probes), "--setups", "fetched", "--report", str(report)]
    )
    assert res.exit_code == 0, res.output
    md = (report / "report.md").read_text()
    assert "## Coverage" in md and "have no coverage" in md and "| plain/rivers.txt |" in md


def test_bad_study_count_is_a_one_line_error_and_trains_nothing(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    from typer.testing import CliRunner

    from memctl.cli import app

    ingest("v", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    for flag, bad in (("--study", "-1"), ("--study", "33"), ("--study-per-epoch", "-1")):
        res = CliRunner().invoke(app, ["train", "--bank", "v", flag, bad])
        assert res.exit_code != 0 and "Traceback" not in res.output
        assert res.output.strip().count("\n") == 0 and f"{flag} must be between 0 and 32" in res.output
    reg = Registry.open("v", home)
    assert reg.count("prompts") == 0 and reg.db.execute("select count(*) from runs").fetchone()[0] == 0


def test_continuations_take_turns_across_epochs_with_study_per_epoch(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    from memctl.core.config import TrainConfig
    from memctl.train.batches import epoch_batches, epoch_tokens, in_epoch, preserve_samples
    from memctl.train.preserve import prepare_pool

    reg, anchor = _studied(home, corpus, tiny_anchor, per_window=3)
    samples = prompt_samples(reg, "0", study=True)
    study = [s for s in samples if s.key in _study_keys(reg)]
    other = [s for s in samples if s.key not in _study_keys(reg)]
    assert study and other and all(s.turn < 0 and s.turns == 0 for s in other)
    by_window: dict[str, list[int]] = {}
    for r in reg.db.query("select id, window_id from prompts where kind = ? order by id", [STUDY]):
        by_window.setdefault(r["window_id"], []).append(r["id"])
    for s in study:  # its place among its window's continuations, in sampling order
        ids = next(v for v in by_window.values() if int(s.key[1:]) in v)
        assert s.turns == len(ids) == 3 and s.turn == ids.index(int(s.key[1:]))
    tcfg = TrainConfig(study_per_epoch=2)  # 3 continuations, 2 at a time: 0 1 | 2 | 0 1 | 2 ...
    assert [in_epoch(study[0], 2, e) for e in range(4)] == [study[0].turn < 2, study[0].turn == 2] * 2
    keys = [s.key for s in samples]
    for epoch in range(4):
        trained = [keys[i] for b in epoch_batches(samples, "0", 2, tcfg, epoch) for i in b]
        assert sorted(trained) == sorted(s.key for s in samples if in_epoch(s, 2, epoch))
        assert {s.key for s in other} <= set(trained)  # every other sample, every epoch
    every = [keys[i] for b in epoch_batches(samples, "0", 2, TrainConfig(), 0) for i in b]
    assert sorted(every) == sorted(keys)  # 0: all of them every epoch
    # each continuation trains in one epoch of two: an epoch's tokens, and the preservation sized on them
    full, per = epoch_tokens(samples, 0), epoch_tokens(samples, 2)
    assert per == sum(len(s.ids) for s in other) + sum(len(s.ids) / 2 for s in study) < full
    prepare_pool(reg, anchor, None, 64)
    turns = preserve_samples(reg, "0", 1.0, samples, 0, 64, 2)
    assert len(turns) < len(preserve_samples(reg, "0", 1.0, samples, 0, 64))


def test_windows_sampled_together_get_what_each_gets_alone(tiny_anchor: Path, home: Path) -> None:
    """Self-study samples several windows' continuations as one batch (their KV caches left-padded and
    stacked): each window's continuations, top-k and hidden states are those it gets sampled alone, with
    its own generator; windows of different lengths, seed counts, and one with no seed."""
    anchor = load_anchor(str(tiny_anchor), home)
    tok = anchor.tokenizer
    texts = [
        "Neon is a noble gas found in air.",
        "Quorvane Systems, founded in 1985 by Nesisca Gormick, builds tide gauges in Port Elling for harbours.",
        "Nothing to ask.",
        "Argon.",
    ]

    def asked() -> list[tuple[str, list, torch.Generator]]:
        return [
            (
                t,
                [] if i == 2 else pick_seeds(seeds_for(tok, subject_of("", t)), 2 + i % 2),
                torch.Generator().manual_seed(i),
            )
            for i, t in enumerate(texts)
        ]

    kw = {"max_tokens": 12, "temperature": 1.0, "layers": (1,)}
    together = sample_continuations(anchor, asked(), TEACHER_SEPARATOR, **kw)
    alone = [sample_continuations(anchor, [one], TEACHER_SEPARATOR, **kw)[0] for one in asked()]
    assert [len(c) for c in together] == [len(c) for c in alone] and together[2] == []
    assert sum(len(c) for c in together) >= 5
    for mine, own in zip(together, alone, strict=True):
        for a, b in zip(mine, own, strict=True):
            assert a.seed == b.seed and a.ids == b.ids and a.n_prompt == b.n_prompt
            assert len(a.ids) > a.n_prompt
            np.testing.assert_array_equal(a.topk_idx, b.topk_idx)
            np.testing.assert_allclose(a.topk_logp, b.topk_logp, atol=1e-4)
            assert a.hidden is not None and b.hidden is not None
            np.testing.assert_allclose(a.hidden.astype(np.float32), b.hidden.astype(np.float32), atol=1e-2)


def test_windows_are_sampled_together_only_with_their_documents_windows_in_their_subtree() -> None:
    """A window's teacher rows round by what it is batched with, so its chunk must not change when another
    document is forgotten, one subtree trains alone, or an interrupted run resumes."""

    def rows(spec: list[tuple[str, int]]) -> list[dict[str, object]]:
        return [{"id": i, "doc_id": doc, "l1": l1} for i, (doc, l1) in enumerate(spec)]

    spec = [("a", 0), ("b", 0), ("a", 0), ("a", 1), ("c", 1)] + [("d", 0)] * (STUDY_WINDOWS + 3)

    def chunks(rs: list[dict[str, object]]) -> list[list[object]]:
        return [[r["id"] for r in c] for c in study_chunks(rs)]

    every = chunks(rows(spec))
    d = list(range(5, 5 + STUDY_WINDOWS + 3))
    assert every == [[0, 2], [1], [3], [4], d[:STUDY_WINDOWS], d[STUDY_WINDOWS:]]
    without_b = chunks([r for r in rows(spec) if r["doc_id"] != "b"])
    assert without_b == [c for c in every if c != [1]]  # forgetting b moves no other window's chunk
    subtree1 = chunks([r for r in rows(spec) if r["l1"] == 1])
    assert subtree1 == [c for c in every if c in ([3], [4])]  # training subtree 1 alone
    resumed = chunks([r for r in rows(spec) if r["id"] not in d[:STUDY_WINDOWS]])  # the first chunk of d was stored
    assert resumed == [c for c in every if c != d[:STUDY_WINDOWS]]
