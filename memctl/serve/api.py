"""A bank's memories for a model you loaded yourself.

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from memctl import Memories

    model = AutoModelForCausalLM.from_pretrained(anchor_dir)      # the bank's anchor
    tok = AutoTokenizer.from_pretrained(anchor_dir, padding_side="left")
    prompts = ["The atomic number of Neon is", "Fermium was discovered in"]
    with Memories("elements").attach(model) as mem:
        mem.use(prompts)                     # routes each row; its blocks serve the next forward passes
        out = model.generate(**tok(prompts, return_tensors="pt", padding=True), max_new_tokens=8)
    # detached: the model is bit-identical to what it was

Blocks are read lazily through the block store (byte-budgeted cache, blocked blocks never read,
access tags obeyed), exactly as `memctl ask` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from ..build.embed import Embedder, get_embedder
from ..build.lexical import check_weight
from ..build.routing import Router
from ..core.config import train_config_from_json
from ..core.errors import AnchorError, BankStateError, InputError
from ..core.placement import Placement
from ..core.relevance import RELEVANCE_RAMP, anchor_share, below_floor, check_ramp, gate, sample_ids
from ..core.tree import Tree
from ..model.anchor import MemoryHandle, attach, decoder_layers
from ..model.memory import Fetched
from ..model.mix import DEFAULT_ANCHOR_MIX, check_mix
from ..registry import Registry, memctl_home
from ..registry.access import check_allow
from .rag import Retriever
from .store import DEFAULT_CACHE_MB, MAX_CACHE_MB, BlockStore

Mode = Literal["fetched", "generic", "none"]
MODES: tuple[str, ...] = ("fetched", "generic", "none")


def unique_paths(paths: np.ndarray) -> np.ndarray:
    """(B, n, p) -> a copy where a node already on an earlier path of the same row is -1, so that
    fetching every path adds each block once."""
    own = np.array(paths, dtype=np.int64, copy=True)
    for j in range(1, own.shape[1]):
        for lvl in range(own.shape[2]):
            seen = (paths[:, :j, lvl] == paths[:, j, lvl][:, None]).any(1)
            own[seen, j, lvl] = -1
    return own


@dataclass(frozen=True)
class Routed:
    """Contexts routed through a bank, with the relevance gate's verdict on each."""

    x: np.ndarray  # (B, dim) embeddings
    paths: np.ndarray  # (B, p) the path each row routed to (every row gets one, gated or not)
    relevance: np.ndarray  # (B,) the gate's reading of each row (Router.similarity)
    off: np.ndarray  # (B,) bool: rows the gate leaves to the anchor alone
    share: np.ndarray  # (B,) the anchor's share of each row's next-token distribution (Memories.shares)

    @property
    def gated(self) -> np.ndarray:
        """The paths with the gated rows at -1 (they fetch nothing)."""
        return gate(self.paths, self.off)


class Memories:
    """Bank `name`: its tree, embedder and block store; attach it to a model to use its blocks.

    `allow`: access tags (None = the owner: every block that is not blocked); `cache_mb`: byte budget
    of loaded blocks; `pin_levels`: shallow levels kept loaded; `serve_blocked` is for proofs about
    the parameters themselves (forgetting), never for answers; `int8`: forward passes use the fetched
    blocks as int8 weights (a float32 model on the CPU; see memory.pack_int8); `min_relevance`: the
    relevance gate's floor (memctl.core.relevance; None: calibrated on the bank's windows, 0: off), below
    which a routed context fetches nothing and the anchor answers alone; `anchor_mix`: the anchor's share
    of each next-token distribution where memories are fetched (memctl.model.mix; None: the share the
    bank was trained for, 0 unless `train --anchor-mix`), in memctl's own generation and scoring
    (BankSession); `relevance_ramp`: above the floor the anchor's share ramps down to `anchor_mix` at
    this multiple of the floor (memctl.core.relevance.anchor_share; None: RELEVANCE_RAMP, 1: a hard gate).
    A model you generate with yourself gets the memories alone, unmixed."""

    def __init__(
        self,
        name: str,
        home: Path | None = None,
        *,
        allow: frozenset[str] | None = None,
        cache_mb: float = DEFAULT_CACHE_MB,
        pin_levels: int = 1,
        serve_blocked: bool = False,
        int8: bool = False,
        min_relevance: float | None = None,
        anchor_mix: float | None = None,
        relevance_ramp: float | None = None,
        lexical: float | None = None,
    ) -> None:
        if not 0 <= cache_mb <= MAX_CACHE_MB:  # NaN fails too
            raise InputError(f"--cache-mb is the block cache's size in MB, 0 to {MAX_CACHE_MB:,}; got {cache_mb}")
        if min_relevance is not None and not 0 <= min_relevance <= 1:
            raise InputError(f"--min-relevance is a cosine similarity floor in [0, 1] (0: off), got {min_relevance}")
        if anchor_mix is not None:
            check_mix(anchor_mix)
        if lexical is not None:
            check_weight(lexical)
        check_allow(allow)
        self.relevance_ramp = check_ramp(RELEVANCE_RAMP if relevance_ramp is None else relevance_ramp)
        self.home = home or memctl_home()
        self.reg = Registry.open(name, self.home)
        self.cfg = self.reg.config
        self.anchor_mix = check_mix(self.trained_mix() if anchor_mix is None else anchor_mix)
        # the words' weight in `nearest` routing (memctl.build.lexical): the bank's, or this session's
        own = self.cfg.lexical if lexical is None else lexical
        self.lexical = own if self.cfg.routing == "nearest" else 0.0  # a `tree` bank reads no words
        if self.reg.count("windows") == 0:
            raise BankStateError(f"bank {name!r} has no documents")
        self.embedder: Embedder = get_embedder(self.cfg.embedder)
        self.tree: Tree = self.reg.load_tree()
        self.allow = allow
        self.store = BlockStore(self.reg, int(cache_mb * 2**20), pin_levels, allow, serve_blocked, int8)
        self._retriever: Retriever | None = None
        self._router: Router | None = None
        self._router_version: tuple[int, int] | None = None
        self._handle: MemoryHandle | None = None
        self._floor = min_relevance

    def trained_mix(self) -> float:
        """The anchor's share the bank's memories were trained to be served with (`train --anchor-mix`;
        memctl's default for a bank never trained)."""
        row = self.reg.db.execute("select config from runs where status = 'done' order by id desc limit 1").fetchone()
        return train_config_from_json(row[0]).anchor_mix if row else DEFAULT_ANCHOR_MIX

    # ---- attaching ------------------------------------------------------------------------------
    def attach(self, model: nn.Module) -> Memories:
        """Wrap the model's memory-layer MLPs (checked against the bank's anchor shape)."""
        if self._handle is not None:
            raise AnchorError("this bank is already attached to a model; detach it first")
        layers = len(decoder_layers(model))
        hidden = int(getattr(getattr(model, "config", None), "hidden_size", -1))
        want = (self.reg.bank["anchor_layers"], self.cfg.memory.hidden)
        if (layers, hidden) != want:
            raise AnchorError(
                f"bank {self.reg.name!r} was built on an anchor with {want[0]} layers of width {want[1]}; "
                f"this model has {layers} of width {hidden}"
            )
        p = next(model.parameters())
        if self.store.int8:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise AnchorError(f"int8 memories serve a float32 model on the CPU, not {p.dtype} on {p.device}")
            if torch.backends.quantized.engine == "none":
                raise AnchorError("this torch build has no quantized CPU engine for int8 memories")
        else:  # blocks are served where the model runs, in its dtype (a GPU model, a bf16 model)
            self.store.set_place(Placement(p.device, p.dtype))
        self._handle = attach(model, self.cfg.memory.layers)
        return self

    @property
    def handle(self) -> MemoryHandle:
        if self._handle is None:
            raise AnchorError("attach the memories to a model first")
        return self._handle

    def detach(self) -> None:
        """Put the model's own modules back: it is bit-identical to what it was before attach."""
        if self._handle is not None:
            self._handle.detach()
            self._handle = None

    def close(self) -> None:
        self.detach()
        self.reg.close()

    def __enter__(self) -> Memories:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- routing and fetching ---------------------------------------------------------------------
    @property
    def router(self) -> Router:
        """The bank's routing rule (memctl.build.routing), its window index reloaded when the registry changes."""
        version = self.reg.version()
        if self._router is None or version != self._router_version:
            self._router = Router.for_bank(self.reg, self.tree, self.lexical, self.allow)
            self._router_version = version
        return self._router

    def route(self, texts: Sequence[str]) -> np.ndarray:
        """(B,) texts -> (B, p) node index per level (no gate: every row gets a path)."""
        texts = list(texts)
        return self.router.route(self.embedder.encode(texts), texts)

    def route_gated(self, texts: Sequence[str], *, judge: bool = True) -> Routed:
        """Embed and route `texts`, and ask the relevance gate about each row (`judge=False`: no
        verdict, nothing is marked off, the floor is not calibrated: for the memory mode 'none')."""
        texts = list(texts)
        if texts:
            x = self.embedder.encode(texts)
            paths = self.router.route(x, texts)
        else:
            x, paths = np.zeros((0, self.tree.dim), np.float32), np.zeros((0, self.tree.p), np.int64)
        sims = self.router.similarity(x, paths)
        if not judge:
            return Routed(x, paths, sims, np.zeros(len(texts), dtype=bool), np.full(len(texts), self.anchor_mix))
        off = below_floor(sims, self.relevance_floor)
        return Routed(x, paths, sims, off, self.shares(sims))

    def shares(self, sims: np.ndarray) -> np.ndarray:
        """(B,) gate readings -> (B,) the anchor's share of each row's next-token distribution where the
        row fetches memories: `anchor_mix`, or more just above the gate's floor, where the ramp hands a
        context back to the anchor by degrees (memctl.core.relevance.anchor_share). Rows below the floor
        fetch nothing: their share is `anchor_mix`, which changes nothing there."""
        floor = self.relevance_floor
        ramp = anchor_share(sims, floor, self.relevance_ramp)
        return np.where(below_floor(sims, floor), self.anchor_mix, np.maximum(self.anchor_mix, ramp))

    @property
    def relevance_floor(self) -> float:
        """The gate's floor: `min_relevance`, or calibrated on a sample of the bank's windows."""
        if self._floor is None:
            db = self.reg.db
            lo, hi = db.execute("select min(id), max(id) from windows").fetchone()
            # up to CALIBRATION_WINDOWS windows spread evenly over the ids, each found through the rowid
            # (a bank whose ids have gaps, after forgetting, gets the next window after each target)
            found: dict[int, bytes] = {}
            for t in sample_ids(lo, hi):
                row = db.execute("select id, embedding from windows where id >= ? order by id limit 1", [t]).fetchone()
                found[row[0]] = row[1]
            x = np.stack([np.frombuffer(e, dtype=np.float32) for e in found.values()])
            self._floor = self.router.calibrate(x)
        return self._floor

    def unrelated(self, x: np.ndarray, paths: np.ndarray) -> np.ndarray:
        """(B,) bool: contexts (embedded as x, routed to paths) the relevance gate leaves to the
        anchor alone."""
        floor = self.relevance_floor
        if floor <= 0:
            return np.zeros(len(paths), dtype=bool)
        return below_floor(self.router.similarity(x, paths), floor)

    def fetch(self, mode: str, paths: np.ndarray | None, batch: int, off: np.ndarray | None = None) -> Fetched | None:
        """The blocks for a batch: `mode` fetched (each row its path), generic or none. Rows marked
        in `off` (the relevance gate's `unrelated`) fetch nothing in either memory mode."""
        if mode == "none":
            return None
        if mode == "generic":
            return self.store.fetch_generic(batch, off)
        if mode == "fetched":
            if paths is None:
                raise InputError("fetched memories need routes (paths)")
            return self.store.fetch_paths(gate(paths, off) if off is not None else paths)
        raise InputError(f"unknown memory mode {mode!r}; use one of {', '.join(MODES)}")

    def fetch_union(self, paths: np.ndarray) -> Fetched:
        """paths (B, n, p), -1 = nothing at that level: each row fetches the union of the blocks on
        its n paths (a beam's leaves with their ancestors); a block on several paths is fetched once."""
        paths = np.asarray(paths, dtype=np.int64)
        if paths.ndim != 3:
            raise InputError("fetch_union takes paths of shape (batch, n, levels)")
        return self.store.fetch_union(unique_paths(paths))

    def use(
        self, prompts: Sequence[str] | None = None, *, mode: str = "fetched", paths: np.ndarray | None = None
    ) -> np.ndarray | None:
        """Choose the blocks of the next forward passes, row by row: route `prompts` (or take `paths`,
        (B, p)) and fetch their blocks; mode 'generic' or 'none' needs only the batch size.
        Returns the paths; a prompt the relevance gate finds unrelated to the bank fetches nothing
        in either memory mode, and its row is -1 at every level. Given `paths` are used as they are.
        Rows of an expanded batch (beams, several samples per prompt) inherit the blocks of their
        prompt."""
        off = None
        if paths is None and prompts is not None and mode != "none":
            r = self.route_gated(prompts)
            off = r.off
            paths = r.gated if mode == "fetched" else None
        batch = len(prompts) if prompts is not None else (len(paths) if paths is not None else 0)
        if batch == 0:
            raise InputError("give the prompts (or their paths) the next forward passes are about")
        self.handle.set(self.fetch(mode, paths, batch, off))
        return paths

    @property
    def retriever(self) -> Retriever:
        """Loaded on first use: RAG needs every window's embedding in memory."""
        if self._retriever is None:
            self._retriever = Retriever(self.reg, self.allow, lexical=self.lexical)
        return self._retriever
