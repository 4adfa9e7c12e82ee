"""Access tags: which documents carry which tags, and which blocks a set of `allow` tags may reach
(a block whose *every* training document carries one of them). Registry queries only: the block
store, retrieval, ingest and export read them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..core.errors import InputError
from . import Registry

_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def parse_tags(text: str | Iterable[str] | None) -> frozenset[str]:
    """'a,b' or ['a', 'b,c'] -> {'a', 'b', 'c'}; raises InputError on a malformed tag."""
    if text is None:
        return frozenset()
    parts = [text] if isinstance(text, str) else list(text)
    tags = {t.strip() for p in parts for t in p.split(",") if t.strip()}
    bad = sorted(t for t in tags if not _TAG.match(t))
    if bad:
        raise InputError(f"bad tag {bad[0]!r}: use letters, digits, '_', '-' or '.' (max 64)")
    return frozenset(tags)


def check_allow(allow: frozenset[str] | None) -> frozenset[str] | None:
    """Access tags as given (None: the owner, every block). An empty set is refused: it reaches no block at
    all, which is almost always an empty shell variable, not a wish."""
    if allow is not None and not allow:
        raise InputError("--allow needs at least one tag (leave it out to allow everything)")
    return allow


def allow_tags(text: str | None) -> frozenset[str] | None:
    """An --allow option: None when not given, else its tags (`check_allow`)."""
    return None if text is None else check_allow(parse_tags(text))


def join_tags(tags: Iterable[str]) -> str:
    return ",".join(sorted(set(tags)))


def doc_tags(reg: Registry) -> dict[str, frozenset[str]]:
    return {r["id"]: parse_tags(r["tags"] or "") for r in reg.db.query("select id, tags from documents")}


def reachable_blocks(reg: Registry, allow: frozenset[str]) -> set[str]:
    """Ids of trained blocks whose every training document carries one of the `allow` tags."""
    tags = doc_tags(reg)
    denied: set[str] = set()
    trained: set[str] = set()
    for r in reg.db.query("select block_id, doc_id from block_docs"):
        trained.add(r["block_id"])
        if not (tags.get(r["doc_id"], frozenset()) & allow):
            denied.add(r["block_id"])
    return trained - denied


def reach_by_level(reg: Registry, allow: frozenset[str] | None) -> list[dict[str, Any]]:
    """Per level (0 = generic): trained blocks, blocked ones, and those the tags can reach."""
    reach = reachable_blocks(reg, allow) if allow is not None else None
    out = []
    for level in range(0, reg.config.tree.p + 1):
        rows = reg.blocks("level = ? and file is not null", [level])
        servable = [r for r in rows if not r["blocked"]]
        out.append(
            {
                "level": level,
                "trained": len(rows),
                "blocked": len(rows) - len(servable),
                "reachable": len([r for r in servable if reach is None or r["id"] in reach]),
            }
        )
    return out
