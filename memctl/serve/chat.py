"""Conversations with a bank: each turn routes, fetches only its path's blocks, and streams the reply.

A turn routes on the user's message alone, or on the conversation so far (a setting), fetches the
blocks of that path (or the generic memory, or none), optionally retrieves the nearest window of the
routed leaf into the message (RAG), and streams greedy tokens in the anchor's chat template. Each
turn reports its path with a short label per node (the titles of the node's most central
documents), the blocks served and withheld, what was retrieved, and how long each stage took.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import TextStreamer

from ..build.labels import LABEL_TITLES, node_label
from ..core.errors import InputError, check_text
from ..model.anchor import generate, has_chat_template
from ..registry import block_id
from .api import MODES
from .rag import with_context
from .session import BankSession, check_new_tokens

ROUTE_ON = ("message", "conversation")


@dataclass(frozen=True)
class ChatSettings:
    mode: str = "fetched"  # fetched | generic | none
    rag: bool = False
    route_on: str = "message"  # message | conversation
    max_new_tokens: int = 96

    def check(self) -> ChatSettings:
        if self.mode not in MODES:
            raise InputError(f"unknown memory mode {self.mode!r}; use one of {', '.join(MODES)}")
        if self.route_on not in ROUTE_ON:
            raise InputError(f"route on 'message' or 'conversation', not {self.route_on!r}")
        check_new_tokens(self.max_new_tokens)
        return self


@dataclass
class Turn:
    user: str
    reply: str
    settings: ChatSettings
    path: list[int] | None
    labels: list[str]  # per level of the path: a short label of the node
    blocks: list[str]
    withheld: list[str]
    retrieved: dict[str, Any] | None
    timings: dict[str, float] = field(default_factory=dict)  # route_s, retrieve_s, fetch_s, generate_s, first_token_s
    tokens: int = 0
    store: dict[str, int] = field(default_factory=dict)  # this turn's block-store hits, misses, bytes read
    unrelated: bool = False  # the relevance gate found the routed text unrelated: nothing fetched or retrieved
    anchor_mix: float = 0.0  # the anchor's share of each next-token distribution (memctl.model.mix); 0: none


class _Stream(TextStreamer):
    """Hands each finished piece of text to a callback instead of printing it."""

    def __init__(self, tokenizer: Any, on_text: Callable[[str], None]) -> None:
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.on_text = on_text
        self.first: float | None = None
        self.tokens = 0

    def put(self, value: torch.Tensor) -> None:
        if not self.next_tokens_are_prompt:
            self.tokens += int(value.numel())
            if self.first is None:
                self.first = time.perf_counter()
        super().put(value)

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if text:
            self.on_text(text)


class Chat:
    """One conversation over a bank session; `history` holds the finished turns."""

    def __init__(self, session: BankSession, settings: ChatSettings | None = None) -> None:
        self.session = session
        self.settings = (settings or ChatSettings()).check()
        self.history: list[Turn] = []
        self._labels: dict[tuple[int, int], str] = {}
        tok = session.anchor.tokenizer
        if not has_chat_template(tok):
            raise InputError("this anchor's tokenizer has no chat template; use `memctl ask` instead")

    # ---- labels -------------------------------------------------------------------------------------
    def label(self, level: int, node: int) -> str:
        """Titles of the documents whose windows sit nearest the node's centroid."""
        key = (level, node)
        if key not in self._labels:
            self._labels[key] = node_label(self.session.reg, self.session.tree, level, node, LABEL_TITLES)
        return self._labels[key]

    # ---- turns ----------------------------------------------------------------------------------------
    @staticmethod
    def _messages(history: list[Turn], text: str) -> list[dict[str, str]]:
        msgs: list[dict[str, str]] = []
        for t in history:
            msgs += [{"role": "user", "content": t.user}, {"role": "assistant", "content": t.reply}]
        return msgs + [{"role": "user", "content": text}]

    def _fit(self, history: list[Turn], text: str, max_new: int) -> str:
        """The chat-template prompt; the oldest turns are left out until it fits the context."""
        tok = self.session.anchor.tokenizer
        limit = int(getattr(self.session.anchor.model.config, "max_position_embeddings", 2048) or 2048)
        while True:
            prompt = tok.apply_chat_template(self._messages(history, text), tokenize=False, add_generation_prompt=True)
            if not history or len(tok(prompt, add_special_tokens=False)["input_ids"]) + max_new <= limit:
                return prompt
            history = history[1:]

    @torch.no_grad()
    def turn(
        self, message: str, on_text: Callable[[str], None] | None = None, settings: ChatSettings | None = None,
        history: list[Turn] | None = None,
    ) -> Turn:  # fmt: skip
        """Answer `message` after `history` (default: this chat's), streaming text pieces to `on_text`.
        The turn joins this chat's history unless another history was given (comparisons)."""
        if not check_text(message, "the message").strip():
            raise InputError("the message is empty")
        st = (settings or self.settings).check()
        remember = history is None
        history = self.history if history is None else history
        s = self.session
        t0 = time.perf_counter()
        routed = message
        if st.route_on == "conversation":
            routed = "\n".join([t.user for t in history] + [message])
        r = s.route_gated([routed], judge=st.mode != "none" or st.rag)  # unjudged: nothing marked off
        x, paths, off = r.x, r.paths, r.off
        t_route = time.perf_counter() - t0
        t1 = time.perf_counter()
        retrieved = None
        text = message
        if st.rag:
            q = s.embedder.encode([message]) if routed != message else x
            found = s.retriever.retrieve(q, r.gated, [message])[0]  # a turn the gate left alone retrieves nothing
            if found is not None:
                retrieved = found.to_dict()
                text = with_context(found.text, message, s.anchor.tokenizer, s.rag_budget(message, st.max_new_tokens))
        t_retrieve = time.perf_counter() - t1
        t2 = time.perf_counter()
        stats0 = s.store.stats.to_dict()
        fetched = s.fetch(st.mode, paths, 1, off)
        t_fetch = time.perf_counter() - t2
        store = {k: v - stats0[k] for k, v in s.store.stats.to_dict().items()}
        tok = s.anchor.tokenizer
        enc = tok(self._fit(history, text, st.max_new_tokens), return_tensors="pt", add_special_tokens=False)
        enc = enc.to(s.anchor.device)
        pieces: list[str] = []

        def emit(piece: str) -> None:
            pieces.append(piece)
            if on_text:
                on_text(piece)

        stream = _Stream(tok, emit)
        t3 = time.perf_counter()
        share = float(r.share[0])  # the anchor's share, where memories are fetched (without them: none)
        generate(s.anchor, s.handle, enc, fetched, st.max_new_tokens, share, stream)
        t_gen = time.perf_counter() - t3
        path = [int(v) for v in paths[0]]
        gated = bool(off is not None and off[0])
        used, withheld = s.blocks_used(st.mode, path if st.mode == "fetched" else None) if not gated else ([], [])
        turn = Turn(
            message,
            "".join(pieces).strip(),
            st,
            path,
            [self.label(lvl + 1, n) for lvl, n in enumerate(path)],
            used,
            withheld,
            retrieved,
            {
                "route_s": t_route,
                "retrieve_s": t_retrieve,
                "fetch_s": t_fetch,
                "generate_s": t_gen,
                "first_token_s": (stream.first - t3) if stream.first else t_gen,
            },
            stream.tokens,
            store,
            gated,
            share if used else 0.0,
        )
        if remember:
            self.history.append(turn)
        return turn

    def compare(self, modes: tuple[str, ...] = MODES) -> list[Turn]:
        """The last message answered again in each memory mode, after the same earlier turns
        (none of the answers is remembered)."""
        if not self.history:
            raise InputError("nothing to compare yet: ask something first")
        last, before = self.history[-1], self.history[:-1]
        return [self.turn(last.user, settings=replace(self.settings, mode=m), history=before) for m in modes]


def describe(turn: Turn) -> str:
    """One line about a turn: what was fetched and retrieved, and how long each stage took."""
    st = turn.settings
    if turn.unrelated:
        what = "unrelated to the bank: anchor alone, no memory fetched" + (", nothing retrieved" if st.rag else "")
    elif st.mode == "fetched":
        nodes = " / ".join(
            f"{block_id(lvl + 1, n)} [{label}]"
            for lvl, (n, label) in enumerate(zip(turn.path or [], turn.labels, strict=True))
        )
        what = f"fetched {nodes}" + (f"; withheld {', '.join(turn.withheld)}" if turn.withheld else "")
    else:
        what = {"generic": "generic memory", "none": "anchor alone"}[st.mode]
    what += f"; anchor mix {turn.anchor_mix:.2g}" if turn.anchor_mix else ""
    if st.rag and not turn.unrelated:
        r = turn.retrieved
        what += f"; RAG: {r['doc_id']} ({r['title']})" if r else "; RAG: nothing in the routed subtree"
    t, io = turn.timings, turn.store
    speed = turn.tokens / t["generate_s"] if t["generate_s"] > 0 else 0.0
    if st.mode != "none" and not turn.unrelated:
        what += (
            f"; read {io.get('bytes_read', 0) / 2**20:.1f} MiB ({io.get('misses', 0)} read, {io.get('hits', 0)} cached)"
        )
    return (
        f"{what}; routed on the {st.route_on}; route {1e3 * t['route_s']:.0f} ms, fetch {1e3 * t['fetch_s']:.0f} ms"
        + (f", retrieve {1e3 * t['retrieve_s']:.0f} ms" if st.rag else "")
        + f", first token {1e3 * t['first_token_s']:.0f} ms, {speed:.1f} tok/s"
    )
