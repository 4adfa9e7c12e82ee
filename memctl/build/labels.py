"""Short human labels for tree nodes: the titles of the documents whose windows sit nearest the
node's centroid (what chat shows per fetched node, and the bank browser per tree node)."""

from __future__ import annotations

import numpy as np

from ..core.tree import Tree
from ..registry import Registry

LABEL_TITLES = 2  # titles per node label


def path_prefix(tree: Tree, level: int, node: int) -> str:
    """SQL LIKE pattern of window paths through `node` at `level` (its ancestors follow from it)."""
    nodes = [node // tree.k ** (level - 1 - lv) for lv in range(level)]
    return ",".join(map(str, nodes)) + ("" if level == tree.p else ",%")


def node_label(reg: Registry, tree: Tree, level: int, node: int, n: int = LABEL_TITLES) -> str:
    """Titles of the `n` documents nearest the node's centroid, or '(empty)'."""
    rows = list(
        reg.db.query("select w.embedding, d.title from windows w join documents d on d.id = w.doc_id "
                     "where w.path like ? order by w.id", [path_prefix(tree, level, node)])
    )  # fmt: skip
    if not rows:
        return "(empty)"
    centre = tree.centroids[level - 1][node]
    vecs = np.stack([np.frombuffer(r["embedding"], dtype=np.float32) for r in rows])
    titles: list[str] = []
    for i in np.argsort(-(vecs @ centre), kind="stable"):
        t = rows[int(i)]["title"] or "?"
        if t not in titles:
            titles.append(t)
        if len(titles) == n:
            break
    return ", ".join(titles)
