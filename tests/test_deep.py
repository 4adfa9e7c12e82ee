"""Deep context distillation (`train --match-hidden`): the open-book teacher's hidden states along
self-study continuations, cached with provenance and matched by the routed memories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.model.anchor import attach, load_anchor
from memctl.model.memory import Fetched, LevelFetch
from memctl.model.prefix import layer_outputs
from memctl.registry import Registry
from memctl.train.batches import batch_loss, collate, hidden_loss, prompt_samples
from memctl.train.distill import TEACHER_SEPARATOR, prepare
from memctl.train.study import STUDY, hidden_layers, seeds_for, subject_of, teacher_context


def _deep(home: Path, corpus: Path, tiny_anchor: Path) -> tuple[Registry, object]:
    ingest("d", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    reg = Registry.open("d", home)
    anchor = load_anchor(str(tiny_anchor), home)
    assert prepare(reg, anchor, study=2, study_hidden=True).study_added > 0
    return reg, anchor


def test_hidden_states_are_the_open_book_teachers_at_every_continuation_token(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    reg, anchor = _deep(home, corpus, tiny_anchor)
    tok, d = anchor.tokenizer, anchor.hidden
    layers = hidden_layers(reg.config.memory.layers)
    assert 1 <= len(layers) <= 3 and layers[-1] == max(reg.config.memory.layers)
    rows = list(
        reg.db.query(
            "select p.*, w.text as wtext from prompts p join windows w on w.id = p.window_id where p.kind = ?",
            [STUDY],
        )
    )
    assert rows and all(r["hidden"] is not None for r in rows)
    others = "select count(*) from prompts where kind != ? and hidden is not null"
    assert reg.db.execute(others, [STUDY]).fetchone()[0] == 0
    for r in rows[:4]:
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        n = len(ids) - r["n_prompt"] + 1
        got = np.frombuffer(r["hidden"], dtype=np.float16).reshape(n, len(layers), d)
        title = reg.db.execute("select title from documents where id = ?", [r["doc_id"]]).fetchone()[0] or ""
        seed = {s.text: s for s in seeds_for(tok, subject_of(title, r["wtext"]))}[r["text"]]
        prefix, (suffix,) = teacher_context(tok, r["wtext"], [seed], TEACHER_SEPARATOR)
        w = tok(prefix, add_special_tokens=False)["input_ids"] + tok(suffix, add_special_tokens=False)["input_ids"]
        with torch.no_grad(), layer_outputs(anchor.model, layers) as outs:  # the teacher reads it all at once
            anchor.model(torch.tensor([w + ids[r["n_prompt"] :]]))
        want = torch.stack([outs[i][0, len(w) - 1 : len(w) - 1 + n] for i in layers], 1).numpy()
        assert np.allclose(got.astype(np.float32), want, atol=2e-2, rtol=2e-2)


def test_the_hidden_term_is_zero_on_the_students_own_states_and_reaches_only_routed_blocks(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    reg, anchor = _deep(home, corpus, tiny_anchor)
    layers = hidden_layers(reg.config.memory.layers)
    samples = [s for s in prompt_samples(reg, "0", study=True, hidden=True) if s.hidden is not None][:3]
    assert samples and all(s.hidden.shape == (s.topk_idx.shape[0], len(layers), anchor.hidden) for s in samples)
    ids, mask, labels = collate(samples, anchor.tokenizer.pad_token_id)
    with torch.no_grad(), layer_outputs(anchor.model, layers) as outs:  # the anchor alone, no window
        anchor.model(input_ids=ids, attention_mask=mask)
        own = [outs[i] for i in layers]
    teacher = hidden_loss(samples, own)
    assert float(teacher) > 0  # the window in context moved the teacher's states
    for row, s in enumerate(samples):
        cols = torch.arange(s.n_prompt - 1, s.n_prompt - 1 + s.hidden.shape[0])
        s.hidden = torch.stack([o[row, cols] for o in own], 1).half()
    assert float(hidden_loss(samples, own)) < 1e-2  # fp16 rounding only
    # the batch loss with the term backpropagates into the blocks of the samples' own routes only
    samples = [s for s in prompt_samples(reg, "0", study=True, hidden=True) if s.hidden is not None][:3]
    n, d = anchor.n_layers, anchor.hidden
    handle = attach(anchor.model, tuple(range(n)))
    try:
        g = torch.Generator().manual_seed(0)
        blocks = {p: (torch.randn(2, n, 4, d, generator=g) * 0.1).requires_grad_(True) for p in ("gate", "up", "down")}
        local = torch.tensor([s.path[1] % 2 for s in samples])
        ids, mask, labels = collate(samples, anchor.tokenizer.pad_token_id)
        kd_only = _grad(anchor, handle, blocks, local, samples, ids, mask, labels, layers, 0.0)
        deep = _grad(anchor, handle, blocks, local, samples, ids, mask, labels, layers, 1.0)
        assert all(p.grad is None for p in anchor.model.parameters())
        routed = [bool((local == 0).any()), bool((local == 1).any())]
        assert (deep.abs().flatten(1).sum(1) > 0).tolist() == routed
        assert not torch.allclose(deep, kd_only)  # the hidden term adds its own gradient
    finally:
        handle.detach()


def _grad(
    anchor: Any,
    handle: Any,
    blocks: dict[str, torch.Tensor],
    local: torch.Tensor,
    samples: list[Any],
    ids: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor,
    layers: tuple[int, ...],
    weight: float,
) -> torch.Tensor:
    """The gradient of the level-2 blocks' down weights under the batch loss with the hidden term's `weight`."""
    for p in blocks.values():
        p.grad = None
    fetched = Fetched([LevelFetch(blocks["gate"], blocks["up"], blocks["down"], local)], len(samples))
    with handle.using(fetched):
        batch_loss(anchor.model, samples, ids, mask, labels, None, 0, True, layers, weight).backward()
    return blocks["down"].grad.clone()


def test_match_hidden_trains_restudies_without_states_and_forget_removes_them(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    ingest("m", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    runner = CliRunner()
    res = runner.invoke(app, ["train", "--bank", "m", "--study", "0", "--match-hidden", "1"])  # refused
    assert res.exit_code != 0 and "Traceback" not in res.output and res.output.strip().count("\n") == 0
    assert "--match-hidden needs --study" in res.output
    reg = Registry.open("m", home)
    assert reg.count("prompts") == 0
    reg.close()
    args = ["train", "--bank", "m", "--epochs", "1", "--preserve", "0", "--subtree", "0", "--json"]
    assert runner.invoke(app, [*args, "--study", "1"]).exit_code == 0
    reg = Registry.open("m", home)
    assert reg.db.execute("select count(*) from prompts where kind = ? and hidden is null", [STUDY]).fetchone()[0] > 0
    reg.close()
    res = runner.invoke(app, [*args, "--study", "1", "--match-hidden", "1", "--retrain"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["prepare"]["study_added"] > 0  # sampled again, with the teacher's states
    reg = Registry.open("m", home)
    rows = list(reg.db.query("select doc_id, hidden from prompts p where kind = ? and l1 = 0", [STUDY]))
    assert rows and all(r["hidden"] is not None for r in rows)
    doc = rows[0]["doc_id"]
    reg.close()
    assert runner.invoke(app, ["forget", "--bank", "m", "--doc", doc, "--yes"]).exit_code == 0
    reg = Registry.open("m", home)
    assert reg.db.execute("select count(*) from prompts where doc_id = ?", [doc]).fetchone()[0] == 0
