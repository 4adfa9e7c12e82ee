"""Library API for building a bank: ingest documents, cluster, register; describe a bank."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any

from ..core.config import (
    BankConfig,
    MemoryConfig,
    TreeConfig,
    check_bank_size,
    check_seed,
    parse_layers,
    resolve_shape,
)
from ..core.errors import BankStateError, InputError
from ..model.anchor import Anchor, load_anchor, neuron_std, resolve_anchor
from ..registry import Registry, block_id, memctl_home, now
from ..registry.access import parse_tags
from ..registry.checkpoints import drop_checkpoints
from ..registry.lock import bank_lock
from .corpus import Document, hidden_below, iter_documents, read_documents
from .embed import get_embedder
from .lexical import DEFAULT_WEIGHT, check_weight
from .routing import DEFAULT_ROUTING, check_routing
from .stream import TokenCounter, stream_ingest

Progress = Callable[[str, int, int], None]
# from_pretrained is not thread-safe (transformers patches torch globally while it builds a model): ingests
# running in threads of one process, which load their models before taking the bank's lock, take turns
_LOADING = threading.Lock()


@dataclass
class IngestResult:
    bank: str
    created: bool
    docs_added: int
    docs_skipped: int
    windows_added: int
    tree: tuple[int, int]
    reclustered: bool
    stale_blocks: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    tagged: int = 0  # documents already present that received the given tags
    references_added: int = 0
    hidden_left_out: int = 0  # hidden files and folders below a directory input, not read (memctl.build.corpus)


def token_counter(anchor: Anchor) -> TokenCounter:
    """Anchor tokens per text; batch-primable (see `ingest_stream.TokenCounter`)."""
    return TokenCounter(anchor.tokenizer)


def _new_config(
    anchor: Anchor,
    anchor_spec: str,
    embedder: str,
    window: int,
    n_windows: int,
    tree: tuple[int, int] | None,
    ranks: tuple[int, ...] | None,
    memory_layers: str,
    seed: int,
) -> BankConfig:
    layers = parse_layers(memory_layers, anchor.n_layers)
    k, p, ranks = resolve_shape(n_windows, tree, ranks, len(layers), anchor.hidden, anchor.n_params)
    if len(ranks) != p:
        raise InputError(f"--ranks has {len(ranks)} values but the tree has {p} levels; give one rank per level")
    if any(r < 0 for r in ranks) or sum(ranks) == 0:
        raise InputError("--ranks must be non-negative with at least one positive rank")
    check_bank_size(k, tuple(ranks), len(layers), anchor.hidden)
    check_seed(seed)
    limit = int(getattr(anchor.model.config, "max_position_embeddings", 0) or 0)
    if window < 16 or (limit and window > limit):
        raise InputError(
            f"--window must be between 16 and the anchor's context, {limit or 'unknown'} tokens, got {window}"
        )
    return BankConfig(
        anchor=anchor_spec,
        embedder=embedder,
        window=window,
        tree=TreeConfig(k=k, p=p, seed=seed),
        memory=MemoryConfig(
            ranks=tuple(ranks), layers=layers, hidden=anchor.hidden, init_std=neuron_std(anchor.model, layers)
        ),
        seed=seed,
    )


def ingest(
    name: str,
    paths: Sequence[str | Path],
    *,
    text_field: str = "text",
    id_field: str | None = None,
    window: int | None = None,
    tree: tuple[int, int] | None = None,
    ranks: tuple[int, ...] | None = None,
    memory_layers: str | None = None,
    anchor: str | None = None,
    embedder: str | None = None,
    seed: int = 0,
    routing: str | None = None,
    lexical: float | None = None,
    tags: frozenset[str] = frozenset(),
    reference: bool = False,
    home: Path | None = None,
    progress: Progress | None = None,
    chunk: int | None = None,
) -> IngestResult:
    """Add documents to bank `name` (created on first use). Nothing is written unless all succeeds.

    `tags` label the documents (new ones, and given ones already present) for access rules.
    `reference=True` stores the documents as never-trained references instead: the 'unseen'
    baseline that forgetting proofs compare a forgotten document with.

    Documents stream through in chunks of `chunk` windows (default `ingest_stream.CHUNK_WINDOWS`):
    read, windowed, embedded and written chunk by chunk, then clustered over a memory-mapped
    embedding matrix (see memctl/build/stream.py). It holds the bank's writer lock (memctl.registry.lock),
    a new bank's name too (two ingests never both create it), from once the options and the first
    files are checked until the end: input that fails leaves nothing behind, not even a lock file."""
    home = home or memctl_home()
    tags = parse_tags(tags)
    if routing is not None:
        check_routing(routing)
    if lexical is not None:
        check_weight(lexical)
        if (routing or DEFAULT_ROUTING) != "nearest":
            raise InputError("--lexical weighs words in `nearest` routing; --routing tree reads the tree alone")
    t0 = time.perf_counter()
    if reference:
        docs = read_documents(paths, text_field=text_field, id_field=id_field)
        if not Registry.exists(name, home):
            raise BankStateError(f"bank {name!r} does not exist; ingest its documents before adding references")
        if tags:
            raise InputError("--tag does not apply to --reference documents (they are never trained or served)")
        with bank_lock(name, home):
            res = _add_references(Registry.open(name, home), docs)
        res.hidden_left_out = hidden_below(paths)
        return res
    stream = iter_documents(paths, text_field=text_field, id_field=id_field)
    head = list(islice(stream, 256))  # a bad first file fails before any model is loaded
    docs_iter = chain(head, stream)
    options: dict[str, Any] = {
        "tree": tree,
        "ranks": ranks,
        "memory_layers": memory_layers,
        "anchor": anchor,
        "embedder": embedder,
        "window": window,
        "seed": seed,
        "routing": routing,
        "lexical": lexical,
    }
    reg, opts, new = _prepare(name, home, Registry.exists(name, home), **options)
    load_s = time.perf_counter() - t0
    with bank_lock(name, home):
        exists = Registry.exists(name, home)
        if exists != (reg is not None):  # another ingest created the bank while this one waited: check again
            if reg is not None:
                reg.close()
            reg, opts, new = _prepare(name, home, exists, **options)
        opts.update(tags=tags, progress=progress)
        if chunk is not None:
            opts["chunk"] = chunk
        if reg is not None:
            with reg.db.atomic():
                res = stream_ingest(reg, docs_iter, config=reg.config, **opts)
            created = False
            if res.reclustered:  # only once the new tree is committed
                drop_checkpoints(reg.checkpoint_dir())
            reg.close()
        else:
            assert new is not None
            provisional, config_for, anchor_row = new
            with Registry.create(name, provisional, anchor_row, home) as made, made.db.atomic():
                res = stream_ingest(made, docs_iter, finalize=config_for, **opts)
                _create_blocks(made, res.config)
            made.close()
            created = True
    return IngestResult(
        name,
        created,
        res.docs_added,
        res.docs_skipped,
        res.windows_added,
        (res.config.tree.k, res.config.tree.p),
        res.reclustered,
        res.stale_blocks,
        {"load": load_s, **res.seconds},
        res.tagged,
        hidden_left_out=hidden_below(paths),
    )


_NewBank = tuple[BankConfig, Callable[[int], BankConfig], dict[str, Any]]


def _prepare(
    name: str,
    home: Path,
    exists: bool,
    *,
    tree: tuple[int, int] | None,
    ranks: tuple[int, ...] | None,
    memory_layers: str | None,
    anchor: str | None,
    embedder: str | None,
    window: int | None,
    seed: int,
    routing: str | None,
    lexical: float | None,
) -> tuple[Registry | None, dict[str, Any], _NewBank | None]:
    """`ingest`'s checks of its options, and its models; writes nothing, takes no lock. Returns the open
    bank (None: it is to be created), `stream_ingest`'s model options, and for a new bank its
    provisional configuration, the function that makes the final one, and its anchor row."""
    reg = Registry.open(name, home) if exists else None
    if reg is not None:
        cfg = reg.config
        fixed = {
            "--tree": tree,
            "--ranks": ranks,
            "--memory-layers": memory_layers,
            "--anchor": anchor,
            "--embedder": embedder,
            "--window": window,
            "--routing": routing,
            "--lexical": lexical,
        }
        given = [k for k, v in fixed.items() if v is not None]
        if given:
            reg.close()
            raise InputError(f"bank {name!r} exists; {', '.join(given)} only apply when a bank is created")
        anchor_spec, embedder_name, win = cfg.anchor, cfg.embedder, cfg.window
    else:
        anchor_spec = str(resolve_anchor(anchor)) if anchor and anchor != "default" else "default"
        embedder_name, win = embedder or "minilm", 512 if window is None else window
        if win < 16:
            raise InputError("--window must be at least 16 tokens")
    with _LOADING:
        emb = get_embedder(embedder_name)
        the_anchor = load_anchor(anchor_spec, home)
    opts: dict[str, Any] = {"embedder": emb, "count": token_counter(the_anchor), "window": win}
    if reg is not None:
        return reg, opts, None
    layers = memory_layers or "all"

    rule = check_routing(routing or DEFAULT_ROUTING)
    weight = (DEFAULT_WEIGHT if lexical is None else lexical) if rule == "nearest" else 0.0

    def config_for(n_windows: int) -> BankConfig:
        cfg = _new_config(the_anchor, anchor_spec, embedder_name, win, n_windows, tree, ranks, layers, seed)
        return dataclasses.replace(cfg, routing=rule, lexical=weight)

    # checks the options now; the tree shape is final once the corpus size is known
    provisional = _new_config(
        the_anchor, anchor_spec, embedder_name, win, 0, tree or (2, 1), ranks if tree else None, layers, seed
    )
    provisional = dataclasses.replace(provisional, routing=rule, lexical=weight)
    anchor_row = {
        "path": str(the_anchor.path),
        "sha256": the_anchor.digest,
        "params": the_anchor.n_params,
        "layers": the_anchor.n_layers,
    }
    return None, opts, (provisional, config_for, anchor_row)


def _add_references(reg: Registry, docs: list[Document]) -> IngestResult:
    """Store documents as references: kept apart from the corpus, never windowed, trained or served."""
    known = {r[0]: r[1] for r in reg.db.execute("select id, sha256 from reference_docs")}
    corpus = set(reg.doc_hashes().values())
    rows = []
    for d in docs:
        if d.sha256 in corpus:
            raise InputError(
                f"{d.id!r} is a document of bank {reg.name!r}; a reference must be a document it never saw"
            )
        if d.id in known:
            if known[d.id] != d.sha256:
                raise InputError(f"reference {d.id!r} is already stored with different text")
            continue
        rows.append(
            {"id": d.id, "source": d.source, "title": d.title, "sha256": d.sha256, "text": d.text, "added": now()}
        )
    with reg.db.atomic():
        reg.db["reference_docs"].insert_all(rows)
    tree = reg.config.tree
    reg.close()
    return IngestResult(
        reg.name, False, 0, len(docs) - len(rows), 0, (tree.k, tree.p), False, references_added=len(rows)
    )


def _create_blocks(r: Registry, config: BankConfig) -> None:
    mem, k = config.memory, config.tree.k
    rows = []
    for lvl in range(1, config.tree.p + 1):
        for i in range(k**lvl):
            rows.append(
                {
                    "id": block_id(lvl, i),
                    "level": lvl,
                    "idx": i,
                    "rank": mem.ranks[lvl - 1],
                    "file": None,
                    "sha256": None,
                    "dtype": "float32",
                    "n_params": mem.block_params(lvl),
                    "trained_tokens": 0,
                    "state": "init",
                    "updated": now(),
                }
            )
    rows.append(
        {
            "id": "generic",
            "level": 0,
            "idx": 0,
            "rank": mem.fetched_rank,
            "file": None,
            "sha256": None,
            "dtype": "float32",
            "n_params": mem.fetched_params,
            "trained_tokens": 0,
            "state": "init",
            "updated": now(),
        }
    )
    r.db["blocks"].insert_all(rows, batch_size=1000)


def require_bank(name: str, home: Path | None = None) -> Registry:
    reg = Registry.open(name, home)
    if reg.count("windows") == 0:
        raise BankStateError(f"bank {name!r} has no documents")
    return reg
