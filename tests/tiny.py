"""A tiny randomly initialised Llama with a small trained BPE tokenizer, built offline in seconds."""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "Hydrogen is the lightest element. It was discovered by Henry Cavendish in 1766.",
    "Iron is a metal used in steel. Its atomic number is 26.",
    "Fermium is named after Enrico Fermi. It was first identified in 1952.",
    "The quick brown fox jumps over the lazy dog.",
    "Memories store long-tail knowledge; the anchor keeps common knowledge and reasoning.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 1766 1952 26 atomic number discovered element",
]


def build_tiny_llama(path: Path, layers: int = 3, hidden: int = 32, inner: int = 64, seed: int = 0) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>", bos_token="<|im_start|>"
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok.save_pretrained(path)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=inner,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def level2_blocks_touched(anchor: object, samples: list) -> tuple[list[bool], list[bool]]:
    """Distillation loss of `samples` (unit 0's, on level-2 nodes 0 and 1) backpropagated into two random
    level-2 blocks on every layer: (blocks whose gradient is non-zero, blocks some sample routes to).
    Also checks that the frozen anchor got no gradient."""
    from memctl.model.anchor import attach
    from memctl.model.memory import Fetched, LevelFetch
    from memctl.train.batches import kd_loss, kd_targets

    n, d = anchor.n_layers, anchor.hidden
    handle = attach(anchor.model, tuple(range(n)))
    try:
        g = torch.Generator().manual_seed(0)
        level2 = {p: (torch.randn(2, n, 4, d, generator=g) * 0.1).requires_grad_(True) for p in ("gate", "up", "down")}
        ids = torch.full((len(samples), max(len(s.ids) for s in samples)), anchor.tokenizer.pad_token_id)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(samples):
            ids[i, : len(s.ids)] = torch.tensor(s.ids)
            mask[i, : len(s.ids)] = 1
        local = torch.tensor([s.path[1] % 2 for s in samples])  # unit 0 owns level-2 nodes 0 and 1
        pos, idx, logp = kd_targets(samples)
        with handle.using(Fetched([LevelFetch(level2["gate"], level2["up"], level2["down"], local)], len(samples))):
            kd_loss(anchor.model, ids, mask, pos, idx, logp).backward()
        assert all(p.grad is None for p in anchor.model.parameters())
        touched = (level2["down"].grad.abs().flatten(1).sum(1) > 0).tolist()
        return touched, [bool((local == 0).any()), bool((local == 1).any())]
    finally:
        handle.detach()
