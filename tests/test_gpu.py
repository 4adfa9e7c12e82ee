"""The GPU path on a real GPU: training, serving and evaluating with `--device cuda` follow the CPU.
Skipped where torch sees no CUDA GPU (CI, this project's CPU machines); run on a lent GPU with
`python -m pytest tests/test_gpu.py` (docs/scaling.md, "GPUs")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_cli import invoke, make_bank
from test_eval import PROBES
from test_placement import SETTINGS, _learned, _trained

import memctl.train.run as train_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cosines(a: dict[str, dict[str, torch.Tensor]], b: dict[str, dict[str, torch.Tensor]]) -> list[float]:
    assert a.keys() == b.keys()
    return [
        float(torch.nn.functional.cosine_similarity(t.flatten(), b[k][p].flatten(), dim=0))
        for k, parts in a.items()
        for p, t in parts.items()
    ]


@pytest.mark.parametrize("dtype, floor", [("fp32", 0.99), ("bf16", 0.85)])
def test_cuda_training_follows_the_cpu(
    corpus: Path, tiny_anchor: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, floor: float
) -> None:
    seen: list[tuple[torch.dtype, str]] = []
    real = train_module.train_unit

    def spy(reg: Any, anchor: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((anchor.dtype, anchor.device.type))
        return real(reg, anchor, *args, **kwargs)

    cpu = _trained(corpus, tiny_anchor, tmp_path / "cpu")
    monkeypatch.setattr(train_module, "train_unit", spy)
    gpu = _trained(corpus, tiny_anchor, tmp_path / "gpu", device="cuda", dtype=dtype)
    want = torch.float32 if dtype == "fp32" else torch.bfloat16
    assert seen and set(seen) == {(want, "cuda")}  # every unit ran on the GPU
    for parts in gpu.values():
        assert {t.dtype for t in parts.values()} == {torch.float32} and all(
            t.device.type == "cpu" for t in parts.values()
        )
    # what training changed in every block points the way the CPU's training did
    cos = _cosines(_learned(tmp_path / "gpu", gpu), _learned(tmp_path / "cpu", cpu))
    assert min(cos) > floor, cos


def test_cuda_ask_and_eval_answer_as_the_cpu_does(home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path) -> None:
    make_bank(corpus, tiny_anchor)
    assert invoke("train", "--bank", "b", "--epochs", "2", "--preserve", "0").exit_code == 0
    replies = {}
    for device in ("cpu", "cuda"):
        res = invoke("ask", "--bank", "b", "Iron is a metal", "--max-new-tokens", "6", "--device", device, "--json")
        assert res.exit_code == 0, res.output
        d = json.loads(res.stdout)
        assert d["device"] == ("cpu fp32" if device == "cpu" else "cuda:0 fp32")
        replies[device] = d["answer"]
    assert replies["cuda"] == replies["cpu"]  # greedy decoding, fp32: the same tokens
    probes = tmp_path / "probes.jsonl"
    probes.write_text("".join(json.dumps(d) + "\n" for d in PROBES))
    scores = {}
    for device, dtype in (("cpu", "fp32"), ("cuda", "fp32"), ("cuda", "bf16")):
        args = ["--probes", str(probes), "--setups", "anchor,fetched", "--device", device, "--dtype", dtype]
        res = invoke("eval", "--bank", "b", *args, "--json", "--fresh")
        assert res.exit_code == 0, res.output
        scores[device, dtype] = {s["setup"]: s["correct"] for s in json.loads(res.stdout)["setups"]}
    assert scores["cuda", "fp32"] == scores["cpu", "fp32"]  # the same answers, scored the same


def test_cuda_resumes_an_interrupted_run_on_the_gpu(corpus: Path, tiny_anchor: Path, tmp_path: Path) -> None:
    from memctl.build.ingest import ingest
    from memctl.core.errors import InputError
    from memctl.registry import Registry
    from memctl.train.run import train

    home = tmp_path / "cut"
    ingest("b", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), memory_layers="last:1", home=home)
    first = train("b", SETTINGS, home=home, device="cuda", dtype="bf16", max_steps=2)
    assert first.interrupted and not first.units
    with pytest.raises(InputError, match="pending"):
        train("b", SETTINGS, home=home)  # the CPU does not take over a GPU run
    assert train("b", SETTINGS, home=home, device="cuda", dtype="bf16").units
    reg = Registry.open("b", home)
    assert all(reg.read_block(r) for r in reg.blocks("file is not null"))
