"""What the bank browser shows: the cluster tree with each node's block, the documents that shaped a
block, the blocks a document shaped. Reads the registry only (no model, no block file), except
`toggle_block`, which blocks or unblocks a node's block the way `memctl block` does."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .labels import node_label
from .privacy import audit_doc, audit_node, set_blocked
from .registry import Registry, block_id, memctl_home
from .tree import Tree

PREVIEW_CHARS = 600


@dataclass
class NodeInfo:
    level: int  # 0: the generic memory
    idx: int
    windows: int
    label: str
    state: str  # init | trained | stale | dropped | none
    blocked: bool
    n_params: int

    @property
    def id(self) -> str:
        return block_id(self.level, self.idx)


class BankView:
    def __init__(self, name: str, home: Path | None = None) -> None:
        self.name = name
        self.home = home or memctl_home()
        self.reg = Registry.open(name, self.home)
        self.tree: Tree = self.reg.load_tree()
        self._labels: dict[tuple[int, int], str] = {}

    def close(self) -> None:
        self.reg.close()

    def summary(self) -> str:
        cfg = self.reg.config
        docs, windows = self.reg.count("documents"), self.reg.count("windows")
        blocked = self.reg.db.execute("select count(*) from blocks where blocked = 1").fetchone()[0]
        return (
            f"{self.name}: {docs} documents, {windows} windows; tree k={cfg.tree.k}, p={cfg.tree.p}; "
            f"ranks {cfg.memory.ranks}; {blocked} block(s) blocked"
        )

    def label(self, level: int, idx: int) -> str:
        if level == 0:
            return "generic memory"
        if (level, idx) not in self._labels:
            self._labels[(level, idx)] = node_label(self.reg, self.tree, level, idx)
        return self._labels[(level, idx)]

    def node(self, level: int, idx: int) -> NodeInfo:
        row = self.reg.block(level, idx)
        n = (
            self.reg.db.execute("select n_windows from nodes where level = ? and idx = ?", [level, idx]).fetchone()
            if level
            else (self.reg.count("windows"),)  # the generic memory trains on every window
        )
        return NodeInfo(
            level,
            idx,
            int(n[0]) if n else 0,
            self.label(level, idx),
            _state(row),
            bool(row["blocked"]) if row else False,
            int(row["n_params"]) if row else 0,
        )

    def children(self, level: int, idx: int) -> list[NodeInfo]:
        """Children of a node (level 0, idx 0: the root, whose children are level 1)."""
        if level >= self.tree.p:
            return []
        first = idx * self.tree.k if level else 0
        return [self.node(level + 1, first + j) for j in range(self.tree.k)]

    def block_detail(self, level: int, idx: int) -> dict[str, Any]:
        """audit_node plus the node's label and size."""
        d = audit_node(self.name, block_id(level, idx), self.home)
        info = self.node(level, idx)
        d.update(label=info.label, windows=info.windows, state=info.state)
        return d

    def doc_detail(self, doc_id: str) -> dict[str, Any]:
        """audit_doc plus the start of the document's text."""
        d = audit_doc(self.name, doc_id, self.home)
        rows = self.reg.windows("doc_id = ?", [doc_id])
        text = "\n\n".join(r["text"] for r in rows)
        d["preview"] = text[:PREVIEW_CHARS] + ("…" if len(text) > PREVIEW_CHARS else "")
        return d

    def toggle_block(self, level: int, idx: int, reason: str = "browse") -> bool:
        """Block the node's block, or unblock it if blocked; returns the new state."""
        info = self.node(level, idx)
        set_blocked(self.name, not info.blocked, nodes=[info.id], reason=reason, home=self.home)
        return not info.blocked


def _state(row: dict[str, Any] | None) -> str:
    if row is None:
        return "none"
    if row["file"]:
        return str(row["state"])
    return "dropped" if row["state"] == "dropped" else "untrained"
