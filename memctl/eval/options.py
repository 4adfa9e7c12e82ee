"""What an evaluation is asked to do (setups, beam, block fractions, answer length) and the plan of
jobs it runs: plain data shared by memctl.eval.evaluate (which plans and runs) and memctl.eval.results
(which aggregates)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.errors import InputError, MemctlError
from ..core.probes import PROBE_TOKENS, Probe

SETUPS = ("anchor", "generic", "fetched", "rag", "rag+fetched", "oracle-rag", "fetched-corrupted")
PPL_SETUPS = {"anchor": "none", "generic": "generic", "fetched": "fetched"}  # setups perplexity applies to
BLOCKING = ("reroute", "withhold")
MAX_ANSWER_TOKENS = 256
MAX_BEAM = 1024  # leaves fetched per probe: past this a beam is the whole bank of any tree memctl sizes
PPL_CHUNK = 512  # tokens per perplexity chunk at most (also capped by the bank's window)


class EvalInterrupted(MemctlError):
    exit_code = 130


@dataclass(frozen=True)
class EvalOptions:
    setups: tuple[str, ...] = SETUPS
    beam: int = 1
    fractions: tuple[float, ...] = ()
    blocking: str = "reroute"  # reroute: route around blocked nodes (the paper); withhold: drop them
    batch_size: int = 16
    explicit: bool = False  # setups were named by the user: one that cannot run is an error
    answer_tokens: int = PROBE_TOKENS  # greedy new tokens per probe answer (question-form probes want a sentence)
    chat: bool = False  # each probe asked in the anchor's chat template, as `memctl chat` asks (questions)

    def check(self) -> EvalOptions:
        unknown = [s for s in self.setups if s not in SETUPS]
        if unknown:
            raise InputError(f"unknown setup {unknown[0]!r}; use {', '.join(SETUPS)}")
        if not self.setups:
            raise InputError("no setups to evaluate")
        if not 1 <= self.beam <= MAX_BEAM:
            raise InputError(f"--beam must be between 1 and {MAX_BEAM:,} leaves, got {self.beam}")
        if self.batch_size < 1:
            raise InputError("--batch-size must be at least 1")
        if not 1 <= self.answer_tokens <= MAX_ANSWER_TOKENS:
            raise InputError(f"--answer-tokens must be between 1 and {MAX_ANSWER_TOKENS}")
        if self.blocking not in BLOCKING:
            raise InputError(f"--blocking must be {' or '.join(BLOCKING)}")
        for f in self.fractions:
            if not 0 <= f <= 1:
                raise InputError(f"block fractions must be in [0, 1], got {f}")
        if (self.fractions or self.beam > 1) and "fetched" not in self.setups:
            raise InputError("--block-fraction and --beam vary the fetched setup: include 'fetched' in --setups")
        return self


@dataclass
class Job:
    item: str  # unique key within a run
    group: str  # variant: jobs batch only within their group
    index: int  # probe index (or perplexity document index)
    doc: str
    prompt: str = ""
    mode: str = "none"  # none | generic | fetched
    paths: np.ndarray | None = None  # (n, p) for fetched; -1 = nothing at that level
    seqs: list[int] = field(default_factory=list)  # perplexity: the chunk's token ids
    off: bool = False  # the relevance gate left this context to the anchor alone (generic mode)
    relevance: float | None = None  # perplexity: the gate's reading of the document (None: no leaf to read)
    mix: float = 0.0  # the anchor's share of each next-token distribution where memories are fetched (the gate's ramp)


@dataclass
class Plan:
    probes: list[Probe]
    jobs: list[Job]
    routes: np.ndarray  # (N, p) route of each probe (the bank's routing rule)
    agree: np.ndarray  # (N, p) bool: routed into a node of its document at each level
    known: np.ndarray  # (N,) bool: the probe's document is in the bank
    blocked: dict[float, list[list[tuple[int, int]]]]  # fraction -> per probe, the nodes blocked
    retrieved: list[dict[str, Any] | None]
    notes: list[str]
    ppl_docs: int = 0
    answer_tokens: int = PROBE_TOKENS
    relevance: list[float | None] = field(default_factory=list)  # per probe: the gate's reading (Router.similarity)
    unrelated: list[bool] = field(default_factory=list)  # per probe: below the floor, left to the anchor alone
