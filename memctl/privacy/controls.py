"""Privacy controls short of forgetting: provenance audit, blocking, access tags.

* **Provenance**: `block_docs` records the tokens each document contributed to each block it
  trained (its windows, and prompts about its windows, on every path they were trained on).
* **Blocking** masks blocks at routing time: a blocked block is never read from disk (the block
  store enforces it) and answers use the remaining levels of the path. Every block/unblock is
  recorded on the block row (reason, time) and in the privacy log.
* **Access tags** (memctl.registry.access): documents carry tags (`ingest --tag`); a session opened
  with `allow` tags fetches only blocks whose *every* training document has one of them. Untagged
  documents are reachable only by sessions without access rules (the bank's owner).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import InputError, check_text
from ..core.tree import best_matching
from ..registry import Registry, block_id, now
from ..registry.lock import writer


# ---- selecting blocks -------------------------------------------------------------------------------
def parse_node(spec: str, reg: Registry) -> tuple[int, int]:
    """'L:I' (level 1..p, node 0..k**L-1) or 'generic' -> (level, node)."""
    if spec.strip().lower() == "generic":
        return (0, 0)
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", spec)
    cfg = reg.config.tree
    if not m:
        raise InputError(f"bad node {spec!r}: write LEVEL:INDEX, e.g. 1:3, or 'generic'")
    level, idx = int(m.group(1)), int(m.group(2))
    if not 1 <= level <= cfg.p:
        raise InputError(f"node {spec!r}: level must be in 1..{cfg.p}")
    if not 0 <= idx < cfg.k**level:
        raise InputError(f"node {spec!r}: level {level} has nodes 0..{cfg.k**level - 1}")
    return (level, idx)


def check_docs(reg: Registry, doc_ids: Sequence[str]) -> list[str]:
    """The ids, deduplicated in order; InputError naming any the bank does not hold."""
    ids = list(dict.fromkeys(doc_ids))
    if not ids:
        raise InputError("no documents given")
    known = {r[0] for r in reg.db.execute("select id from documents")}
    unknown = [d for d in ids if d not in known]
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise InputError(
            f"unknown document id {unknown[0]!r}{more} in bank {reg.name!r}; `memctl audit --bank {reg.name} "
            "--doc ID` takes ids as ingest stored them"
        )
    return ids


def doc_blocks(reg: Registry, doc_ids: Sequence[str]) -> set[tuple[int, int]]:
    """Every block a document can have shaped: the blocks on its windows' paths, and every block its
    samples trained (prompts routed elsewhere, the generic memory)."""
    marks = ",".join("?" for _ in doc_ids)
    keys: set[tuple[int, int]] = set()
    for (path,) in reg.db.execute(f"select path from windows where doc_id in ({marks})", list(doc_ids)):
        keys.update((lvl + 1, int(n)) for lvl, n in enumerate(path.split(",")))
    for level, idx in reg.db.execute(
        f"select b.level, b.idx from block_docs bd join blocks b on b.id = bd.block_id where bd.doc_id in ({marks})",
        list(doc_ids),
    ):
        keys.add((level, idx))
    return keys


def query_blocks(reg: Registry, query: str, fraction: float) -> list[tuple[int, int]]:
    """The `fraction` of the bank that best matches `query` (nearest centroids at every level)."""
    from ..build.embed import get_embedder

    if not query.strip():
        raise InputError("--query is empty")
    if not 0 < fraction <= 1:
        raise InputError(f"--fraction must be in (0, 1], got {fraction}")
    x = get_embedder(reg.config.embedder).encode([query])[0]
    return best_matching(reg.load_tree(), x, fraction)


def select_blocks(
    reg: Registry,
    nodes: Sequence[str] = (),
    docs: Sequence[str] = (),
    query: str | None = None,
    fraction: float | None = None,
) -> list[tuple[int, int]]:
    """Exactly one selector: node specs, document ids, or a query with a fraction."""
    given = [bool(nodes), bool(docs), query is not None]
    if sum(given) != 1:
        raise InputError("give exactly one of --node, --doc, or --query with --fraction")
    if query is not None:
        if fraction is None:
            raise InputError("--query needs --fraction (the share of the bank to block, e.g. 0.0625)")
        return query_blocks(reg, query, fraction)
    if fraction is not None:
        raise InputError("--fraction only goes with --query")
    if nodes:
        return list(dict.fromkeys(parse_node(n, reg) for n in nodes))
    return sorted(doc_blocks(reg, check_docs(reg, docs)))


# ---- blocking -----------------------------------------------------------------------------------------
@dataclass
class BlockChange:
    bank: str
    action: str  # block | unblock
    changed: list[str] = field(default_factory=list)  # blocks whose state changed
    unchanged: list[str] = field(default_factory=list)  # already in the requested state
    blocked_total: int = 0  # blocked blocks in the bank afterwards
    blocked_param_share: float = 0.0  # share of the bank's parameters that is blocked afterwards


def _param_share(reg: Registry) -> float:
    """Blocked share of the hierarchical bank's parameters (the generic memory is not part of it)."""
    row = reg.db.execute(
        "select coalesce(sum(case when blocked then n_params else 0 end), 0), coalesce(sum(n_params), 0) "
        "from blocks where level > 0"
    ).fetchone()
    return row[0] / row[1] if row[1] else 0.0


@writer
def set_blocked(
    name: str,
    blocked: bool,
    *,
    nodes: Sequence[str] = (),
    docs: Sequence[str] = (),
    query: str | None = None,
    fraction: float | None = None,
    everything: bool = False,
    reason: str = "",
    home: Path | None = None,
) -> BlockChange:
    """Block (or unblock) the selected blocks, in one transaction, with reason and time; holding the
    bank's writer lock (memctl.registry.lock), re-entered when the caller already holds it (the CLI does)."""
    check_text(reason, "--reason")
    if query is not None:
        check_text(query, "--query")
    reg = Registry.open(name, home)
    try:
        if everything:
            if blocked or nodes or docs or query is not None:
                raise InputError("--all only goes with unblock, alone")
            keys = [(r["level"], r["idx"]) for r in reg.blocks("blocked = 1")]
        else:
            keys = select_blocks(reg, nodes, docs, query, fraction)
        action = "block" if blocked else "unblock"
        change = BlockChange(name, action)
        stamp = now()
        with reg.db.atomic():
            for level, idx in keys:
                bid = block_id(level, idx)
                row = reg.block(level, idx)
                if row is None:
                    raise InputError(f"bank {name!r} has no block {bid}")
                if bool(row["blocked"]) == blocked:
                    change.unchanged.append(bid)
                    continue
                reg.db["blocks"].update(
                    bid,
                    {
                        "blocked": int(blocked),
                        "blocked_reason": reason if blocked else None,
                        "blocked_at": stamp if blocked else None,
                    },
                )
                change.changed.append(bid)
            selector = {"nodes": list(nodes), "docs": list(docs), "query": query, "fraction": fraction}
            reg.log(action, ",".join(change.changed), reason, {"selector": selector, "blocks": change.changed})
        change.blocked_total = reg.db.execute("select count(*) from blocks where blocked = 1").fetchone()[0]
        change.blocked_param_share = _param_share(reg)
        return change
    finally:
        reg.close()


# ---- audit ------------------------------------------------------------------------------------------
def _block_totals(reg: Registry) -> dict[str, int]:
    return {r[0]: r[1] for r in reg.db.execute("select block_id, sum(tokens) from block_docs group by block_id")}


def audit_doc(name: str, doc_id: str, home: Path | None = None) -> dict[str, Any]:
    """The blocks a document's samples trained: level, node, tokens and share of the block's tokens;
    plus the blocks on its windows' paths that are not trained yet."""
    reg = Registry.open(name, home)
    try:
        check_docs(reg, [doc_id])
        doc = next(
            iter(reg.db.query("select id, title, source, tags, n_chars, added from documents where id = ?", [doc_id]))
        )
        paths = [r[0] for r in reg.db.execute("select path from windows where doc_id = ? order by idx", [doc_id])]
        on_path = {(lvl + 1, int(n)) for p in paths for lvl, n in enumerate(p.split(","))}
        totals = _block_totals(reg)
        rows = []
        trained = {}
        for r in reg.db.query(
            "select b.id, b.level, b.idx, b.state, b.blocked, bd.tokens from block_docs bd "
            "join blocks b on b.id = bd.block_id where bd.doc_id = ? order by b.level, b.idx",
            [doc_id],
        ):
            trained[(r["level"], r["idx"])] = r
        for key in sorted(set(trained) | on_path):
            r = trained.get(key) or reg.block(*key)
            assert r is not None
            tokens = r.get("tokens", 0) if key in trained else 0
            rows.append(
                {
                    "block": r["id"],
                    "level": key[0],
                    "node": key[1],
                    "tokens": tokens,
                    "share": tokens / totals[r["id"]] if totals.get(r["id"]) else 0.0,
                    "on_window_path": key in on_path,
                    "state": r["state"],
                    "blocked": bool(r["blocked"]),
                }
            )
        return {"bank": name, "document": doc, "windows": len(paths), "paths": paths, "blocks": rows}
    finally:
        reg.close()


def audit_node(name: str, node: str, home: Path | None = None) -> dict[str, Any]:
    """The documents that shaped a block, most tokens first."""
    reg = Registry.open(name, home)
    try:
        level, idx = parse_node(node, reg)
        row = reg.block(level, idx)
        assert row is not None
        docs = [
            dict(r)
            for r in reg.db.query(
                "select bd.doc_id as id, d.title, d.tags, bd.tokens from block_docs bd "
                "join documents d on d.id = bd.doc_id where bd.block_id = ? order by bd.tokens desc, bd.doc_id",
                [row["id"]],
            )
        ]
        total = sum(d["tokens"] for d in docs)
        for d in docs:
            d["share"] = d["tokens"] / total if total else 0.0
        return {
            "bank": name,
            "block": row["id"],
            "level": level,
            "node": idx,
            "state": row["state"],
            "blocked": bool(row["blocked"]),
            "blocked_reason": row["blocked_reason"],
            "blocked_at": row["blocked_at"],
            "tokens": total,
            "n_params": row["n_params"],
            "documents": docs,
        }
    finally:
        reg.close()


def privacy_log(name: str, home: Path | None = None) -> list[dict[str, Any]]:
    """Every block, unblock, forget, export and import of the bank, oldest first."""
    reg = Registry.open(name, home)
    try:
        return [dict(r) for r in reg.db.query("select at, action, target, reason, detail from privacy_log order by id")]
    finally:
        reg.close()
