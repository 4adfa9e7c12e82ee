"""Retrieval-augmented answers: the nearest stored window inside the routed leaf cluster.

The question is routed as usual; among the windows whose own path shares the question's leaf, the
one whose embedding is nearest the question's (in a bank that routes by words as well, the best by the
same score: memctl.build.lexical) is put in the prompt (the layout the distillation
teacher sees: window, blank line, question). A leaf holding fewer than `min_windows` candidates is
widened to its parent, and so on up to level 1. Retrieval obeys the same rules as memories: with
access tags, only windows of allowed documents; never a window whose own leaf block is blocked.
Ties go to the lowest window id, so retrieval is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..build.lexical import LexicalIndex, relative
from ..registry import Registry, block_id
from ..registry.access import doc_tags

MIN_WINDOWS = 4  # a routed node with fewer candidate windows is widened to its parent
SEPARATOR = "\n\n"  # window, blank line, question: what the distillation teacher sees


@dataclass(frozen=True)
class Retrieved:
    window_id: int
    doc_id: str
    title: str
    text: str
    score: float  # cosine similarity with the question (without the words' share)
    node: str  # the node searched: the leaf, or the ancestor it was widened to
    widened: int  # levels climbed above the leaf

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("text")
        return d


class Retriever:
    """Window embeddings and paths in memory, reloaded whenever the registry changes."""

    def __init__(
        self,
        reg: Registry,
        allow: frozenset[str] | None = None,
        min_windows: int = MIN_WINDOWS,
        lexical: float | None = None,
    ) -> None:
        """`lexical`: the words' weight in choosing a window (None: the bank's, where it routes `nearest`)."""
        self.reg = reg
        self.lexical_weight = lexical
        self.allow = allow
        self.min_windows = max(1, min_windows)
        self._version: tuple[int, int] | None = None
        self.refresh()

    def refresh(self) -> None:
        version = self.reg.version()
        if version == self._version:
            return
        cfg = self.reg.config
        own = cfg.lexical if self.lexical_weight is None else self.lexical_weight
        self.weight = own if cfg.routing == "nearest" else 0.0
        text = ", w.text" if self.weight > 0 else ""
        rows = list(
            self.reg.db.query(f"select w.id, w.doc_id, w.path, w.embedding, d.title{text} from windows w "
                              "join documents d on d.id = w.doc_id order by w.id")
        )  # fmt: skip
        blocked_leaves = {r["idx"] for r in self.reg.blocks("level = ? and blocked = 1", [self.reg.config.tree.p])}
        tags = doc_tags(self.reg) if self.allow is not None else {}
        keep = []
        for r in rows:
            path = [int(v) for v in r["path"].split(",")]
            if path[-1] in blocked_leaves:
                continue
            if self.allow is not None and not (tags.get(r["doc_id"], frozenset()) & self.allow):
                continue
            keep.append((r, path))
        self.ids = np.array([r["id"] for r, _ in keep], dtype=np.int64)
        self.docs = [r["doc_id"] for r, _ in keep]
        self.titles = [r["title"] or "" for r, _ in keep]
        self.paths = np.array([p for _, p in keep], dtype=np.int64).reshape(len(keep), self.reg.config.tree.p)
        self.vecs = (
            np.stack([np.frombuffer(r["embedding"], dtype=np.float32) for r, _ in keep])
            if keep
            else np.zeros((0, 1), np.float32)
        )
        self.lexical = LexicalIndex.build([r["text"] for r, _ in keep]) if self.weight > 0 else None
        self._version = self.reg.version()

    def retrieve(self, x: np.ndarray, paths: np.ndarray, texts: Sequence[str] | None = None) -> list[Retrieved | None]:
        """x (B, dim) question embeddings, paths (B, p) their routes, the B questions (for a bank that
        routes by words as well) -> the window for each (or None)."""
        self.refresh()
        out: list[Retrieved | None] = []
        p = paths.shape[1]
        for i, (q, path) in enumerate(zip(x, paths, strict=True)):
            found = None
            for depth in range(p, 0, -1):  # the leaf first, then its ancestors
                cand = np.flatnonzero((self.paths[:, :depth] == path[:depth]).all(1)) if len(self.ids) else []
                if len(cand) >= self.min_windows or (depth == 1 and len(cand)):
                    cosine = self.vecs[cand] @ q
                    scores = cosine
                    if self.lexical is not None and texts is not None:
                        # relative to the best window it may serve, as the route is to the bank's best
                        scores = cosine + self.weight * relative(self.lexical.scores(texts[i]))[cand]
                    j = int(np.flatnonzero(scores == scores.max())[0])  # lowest id among ties
                    found = (int(cand[j]), float(cosine[j]), block_id(depth, int(path[depth - 1])), p - depth)
                    break
            if found is None:
                out.append(None)
                continue
            i, score, node, widened = found
            text = self.reg.db.execute("select text from windows where id = ?", [int(self.ids[i])]).fetchone()[0]
            out.append(Retrieved(int(self.ids[i]), self.docs[i], self.titles[i], text, score, node, widened))
        return out


def with_context(window: str, prompt: str, tokenizer: Any, budget: int) -> str:
    """The window (cut to `budget` tokens, keeping its start) then the question."""
    ids = tokenizer(window, add_special_tokens=False)["input_ids"]
    if len(ids) > budget:
        window = tokenizer.decode(ids[: max(0, budget)])
    return window + SEPARATOR + prompt
