"""Answering: route the prompt, fetch only the blocks on its path, attach, generate."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from .anchor import Anchor, MemoryHandle, attach, load_anchor
from .embed import Embedder, get_embedder
from .errors import BankStateError, InputError
from .memory import Fetched
from .registry import Registry, block_id, memctl_home
from .store import DEFAULT_CACHE_MB, BlockStore
from .tree import Tree, route

Mode = Literal["fetched", "generic", "none"]
MODES: tuple[str, ...] = ("fetched", "generic", "none")


@dataclass
class Answer:
    prompt: str
    text: str
    mode: str
    path: list[int] | None
    blocks: list[str] = field(default_factory=list)
    withheld: list[str] = field(default_factory=list)  # blocks on the path that are blocked or out of reach
    timings: dict[str, float] = field(default_factory=dict)


@torch.no_grad()
def greedy(
    anchor: Anchor, handle: MemoryHandle, texts: Sequence[str], fetched: Fetched | None, max_new_tokens: int
) -> list[str]:
    """Greedy continuations of a left-padded batch; row i uses the blocks `fetched` gives row i."""
    tok = anchor.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    try:
        enc = tok(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tok.padding_side = side
    with handle.using(fetched):
        out = anchor.model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


class BankSession:
    """A bank attached to its loaded anchor: the Python API behind ask, eval and chat."""

    def __init__(
        self,
        name: str,
        home: Path | None = None,
        anchor: Anchor | None = None,
        *,
        allow: frozenset[str] | None = None,
        cache_mb: float = DEFAULT_CACHE_MB,
        pin_levels: int = 1,
        serve_blocked: bool = False,
    ) -> None:
        """Open bank `name` on its anchor. `allow`: access tags (None = the owner: every block that is
        not blocked); `cache_mb`: byte budget of loaded blocks; `pin_levels`: levels kept loaded."""
        if cache_mb < 0:
            raise InputError("--cache-mb must be non-negative")
        self.reg = Registry.open(name, home or memctl_home())
        self.cfg = self.reg.config
        if self.reg.count("windows") == 0:
            raise BankStateError(f"bank {name!r} has no documents")
        self.anchor = anchor or load_anchor(self.cfg.anchor, home or memctl_home())
        if self.anchor.digest != self.reg.bank["anchor_sha256"]:
            raise BankStateError(f"the anchor at {self.anchor.path} is not the one bank {name!r} was built on")
        self.embedder: Embedder = get_embedder(self.cfg.embedder)
        self.tree: Tree = self.reg.load_tree()
        self.store = BlockStore(self.reg, int(cache_mb * 2**20), pin_levels, allow, serve_blocked)
        self.handle: MemoryHandle = attach(self.anchor.model, self.cfg.memory.layers)

    def close(self) -> None:
        self.handle.detach()
        self.reg.close()

    def __enter__(self) -> BankSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def route(self, texts: Sequence[str]) -> np.ndarray:
        """(B,) texts -> (B, p) node index per level."""
        return route(self.tree, self.embedder.encode(list(texts)))

    def fetch(self, mode: str, paths: np.ndarray | None, batch: int) -> Fetched | None:
        if mode == "none":
            return None
        if mode == "generic":
            return self.store.fetch_generic(batch)
        if mode == "fetched":
            assert paths is not None
            return self.store.fetch_paths(paths)
        raise InputError(f"unknown memory mode {mode!r}; use one of {', '.join(MODES)}")

    def encode_prompts(self, prompts: Sequence[str], chat: bool) -> list[str]:
        tok = self.anchor.tokenizer
        if not chat:
            return list(prompts)
        if not getattr(tok, "chat_template", None):
            raise InputError("this anchor's tokenizer has no chat template; drop --chat")
        return [
            tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        mode: str = "fetched",
        max_new_tokens: int = 32,
        chat: bool = False,
        paths: np.ndarray | None = None,
    ) -> list[Answer]:
        """Greedy answers for a batch; every row fetches the blocks of its own route."""
        if not prompts:
            return []
        t0 = time.perf_counter()
        if mode == "fetched" and paths is None:
            paths = self.route(prompts)
        t_route = time.perf_counter() - t0
        t1 = time.perf_counter()
        fetched = self.fetch(mode, paths, len(prompts))
        t_fetch = time.perf_counter() - t1
        t2 = time.perf_counter()
        texts = greedy(self.anchor, self.handle, self.encode_prompts(prompts, chat), fetched, max_new_tokens)
        t_gen = time.perf_counter() - t2
        answers = []
        for i, (p, t) in enumerate(zip(prompts, texts, strict=True)):
            path = [int(v) for v in paths[i]] if paths is not None and mode == "fetched" else None
            blocks, withheld = self._blocks_used(mode, path)
            answers.append(
                Answer(
                    p, t, mode, path, blocks, withheld, {"route_s": t_route, "fetch_s": t_fetch, "generate_s": t_gen}
                )
            )
        return answers

    def _blocks_used(self, mode: str, path: list[int] | None) -> tuple[list[str], list[str]]:
        """(blocks served, blocks withheld: blocked or out of reach) for one answer."""
        if mode == "generic":
            keys = [(0, 0)]
        elif mode == "fetched" and path is not None:
            keys = [(lvl + 1, n) for lvl, n in enumerate(path)]
        else:
            return [], []
        used = [block_id(*k) for k in keys if self.store.has(*k)]
        withheld = [block_id(*k) for k in keys if self.store.withheld(*k)]
        return used, withheld


def ask(
    name: str,
    prompt: str,
    mode: str = "fetched",
    max_new_tokens: int = 32,
    chat: bool = False,
    home: Path | None = None,
    allow: frozenset[str] | None = None,
    cache_mb: float = DEFAULT_CACHE_MB,
) -> dict[str, Any]:
    if not prompt.strip():
        raise InputError("the prompt is empty")
    with BankSession(name, home, allow=allow, cache_mb=cache_mb) as s:
        ans = s.generate([prompt], mode=mode, max_new_tokens=max_new_tokens, chat=chat)[0]
        return {
            "bank": name,
            "prompt": prompt,
            "answer": ans.text,
            "mode": mode,
            "path": ans.path,
            "blocks": ans.blocks,
            "withheld": ans.withheld,
            "allow": sorted(allow) if allow is not None else None,
            "timings": ans.timings,
            "store": s.store.stats.to_dict(),
        }
