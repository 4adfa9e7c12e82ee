"""Answering: route the prompt, fetch only the blocks on its path, attach, generate."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import BankStateError, InputError, check_text
from ..core.placement import CPU, Placement, placement
from ..core.relevance import gate
from ..model.anchor import Anchor, greedy, has_chat_template, load_anchor
from ..registry import block_id
from .api import Memories
from .rag import Retrieved, with_context
from .store import DEFAULT_CACHE_MB

MAX_NEW_TOKENS = 4096  # a longer answer outruns a small anchor's context: a larger --max-new-tokens is a typo


def check_new_tokens(n: int) -> int:
    """`--max-new-tokens` of ask and chat: 1 to MAX_NEW_TOKENS."""
    if not 1 <= n <= MAX_NEW_TOKENS:
        raise InputError(f"--max-new-tokens must be between 1 and {MAX_NEW_TOKENS:,}, got {n}")
    return n


@dataclass
class Answer:
    prompt: str
    text: str
    mode: str
    path: list[int] | None
    blocks: list[str] = field(default_factory=list)
    withheld: list[str] = field(default_factory=list)  # blocks on the path that are blocked or out of reach
    timings: dict[str, float] = field(default_factory=dict)
    retrieved: dict[str, Any] | None = None  # RAG: the window put in the prompt (id, document, title, score)
    relevance: float | None = None  # the gate's reading of the prompt (memctl.build.routing.Router.similarity)
    unrelated: bool = False  # below the bank's relevance floor: nothing fetched or retrieved, the anchor answered
    anchor_mix: float = 0.0  # the anchor's share of each next-token distribution (memctl.model.mix); 0: none


class BankSession(Memories):
    """A bank attached to its own anchor, loaded here: the Python API behind ask, eval and chat."""

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
        int8: bool = False,
        place: Placement = CPU,
        min_relevance: float | None = None,
        anchor_mix: float | None = None,
        relevance_ramp: float | None = None,
        lexical: float | None = None,
    ) -> None:
        """`place`: the device and dtype the anchor is loaded to (memctl.core.placement); its blocks are
        served there too."""
        super().__init__(
            name,
            home,
            allow=allow,
            cache_mb=cache_mb,
            pin_levels=pin_levels,
            serve_blocked=serve_blocked,
            int8=int8,
            min_relevance=min_relevance,
            anchor_mix=anchor_mix,
            relevance_ramp=relevance_ramp,
            lexical=lexical,
        )
        try:
            self.anchor = anchor or load_anchor(self.cfg.anchor, self.home, place)
            if self.anchor.digest != self.reg.bank["anchor_sha256"]:
                raise BankStateError(f"the anchor at {self.anchor.path} is not the one bank {name!r} was built on")
            self.attach(self.anchor.model)
        except BaseException:
            self.reg.close()
            raise

    def __enter__(self) -> BankSession:
        return self

    def encode_prompts(self, prompts: Sequence[str], chat: bool) -> list[str]:
        tok = self.anchor.tokenizer
        if not chat:
            return list(prompts)
        if not has_chat_template(tok):
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
        rag: bool = False,
    ) -> list[Answer]:
        """Greedy answers for a batch; every row fetches the blocks of its own route. With `rag`, each
        row also gets the nearest window of its routed leaf in its prompt (any memory mode). A row the
        relevance gate finds unrelated to the bank gets neither: the anchor answers its bare prompt; one
        just above its floor is answered on a mixture with the anchor (the gate's ramp, `shares`).
        Routes given by the caller (`paths`) are used as they are, without the gate."""
        if not prompts:
            return []
        t0 = time.perf_counter()
        x, off, sims = None, None, None
        share = np.full(len(prompts), self.anchor_mix)
        if (mode != "none" or rag) and paths is None:
            r = self.route_gated(prompts)
            x, paths, sims, off, share = r.x, r.paths, r.relevance, r.off, r.share
        t_route = time.perf_counter() - t0
        t1 = time.perf_counter()
        found: list[Retrieved | None] = [None] * len(prompts)
        texts = list(prompts)
        if rag:
            assert paths is not None
            if x is None:
                x = self.embedder.encode(list(prompts))
            found = self.retriever.retrieve(x, gate(paths, off) if off is not None else paths, prompts)  # gated: none
            texts = [with_context(r.text, p, self.anchor.tokenizer, self.rag_budget(p, max_new_tokens)) if r else p
                     for p, r in zip(prompts, found, strict=True)]  # fmt: skip
        t_retrieve = time.perf_counter() - t1
        t2 = time.perf_counter()
        fetched = self.fetch(mode, paths if mode == "fetched" else None, len(prompts), off)
        t_fetch = time.perf_counter() - t2
        t3 = time.perf_counter()
        mix = [float(v) for v in share]  # mixed only where memories are fetched
        outs = greedy(self.anchor, self.handle, self.encode_prompts(texts, chat), fetched, max_new_tokens, mix)
        t_gen = time.perf_counter() - t3
        timings = {"route_s": t_route, "retrieve_s": t_retrieve, "fetch_s": t_fetch, "generate_s": t_gen}
        answers = []
        for i, (p, t) in enumerate(zip(prompts, outs, strict=True)):
            path = [int(v) for v in paths[i]] if paths is not None and mode == "fetched" else None
            gated = bool(off is not None and off[i])
            blocks, withheld = self.blocks_used(mode, path) if not gated else ([], [])
            r = found[i]
            rel = float(sims[i]) if sims is not None else None
            w = float(share[i]) if blocks else 0.0
            answers.append(
                Answer(p, t, mode, path, blocks, withheld, timings, r.to_dict() if r else None, rel, gated, w)
            )
        return answers

    def context_room(self, prompt: str, reserve: int) -> int:
        """Tokens of the anchor's context left before `prompt`, keeping `reserve` tokens free."""
        limit = int(getattr(self.anchor.model.config, "max_position_embeddings", 2048) or 2048)
        used = len(self.anchor.tokenizer(prompt, add_special_tokens=False)["input_ids"]) + reserve
        return max(0, limit - used)

    def rag_budget(self, prompt: str, max_new_tokens: int) -> int:
        """Tokens the retrieved window may take: a bank window, within the anchor's context."""
        return min(self.cfg.window, self.context_room(prompt, max_new_tokens + 64))

    def blocks_used(self, mode: str, path: list[int] | None) -> tuple[list[str], list[str]]:
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
    rag: bool = False,
    int8: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    min_relevance: float | None = None,
    anchor_mix: float | None = None,
    relevance_ramp: float | None = None,
    lexical: float | None = None,
) -> dict[str, Any]:
    if not check_text(prompt, "the prompt").strip():
        raise InputError("the prompt is empty")
    check_new_tokens(max_new_tokens)
    place = placement(device, dtype)
    with BankSession(
        name,
        home,
        allow=allow,
        cache_mb=cache_mb,
        int8=int8,
        place=place,
        min_relevance=min_relevance,
        anchor_mix=anchor_mix,
        relevance_ramp=relevance_ramp,
        lexical=lexical,
    ) as s:
        ans = s.generate([prompt], mode=mode, max_new_tokens=max_new_tokens, chat=chat, rag=rag)[0]
        return {
            "bank": name,
            "prompt": prompt,
            "answer": ans.text,
            "mode": mode,
            "path": ans.path,
            "blocks": ans.blocks,
            "withheld": ans.withheld,
            "retrieved": ans.retrieved,
            "relevance": ans.relevance,
            "relevance_floor": s.relevance_floor,
            "unrelated": ans.unrelated,
            "anchor_mix": ans.anchor_mix,
            "relevance_ramp": s.relevance_ramp,
            "lexical": s.lexical,
            "allow": sorted(allow) if allow is not None else None,
            "timings": ans.timings,
            "int8": int8,
            "device": place.label,
            "store": s.store.stats.to_dict(),
        }
