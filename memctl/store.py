"""Block store: reads block files on demand through the registry, verifies them, caches them.

Only blocks on a requested path are ever read. Untrained blocks (no file: down is zero, so they
change nothing) are reported as absent rather than loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .memory import PARTS, Fetched, LevelFetch
from .registry import Registry


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0


class BlockStore:
    def __init__(self, reg: Registry) -> None:
        self.reg = reg
        self.stats = StoreStats()
        self._cache: dict[tuple[int, int], dict[str, torch.Tensor] | None] = {}
        self._rows = {(r["level"], r["idx"]): r for r in reg.blocks("file is not null")}

    def has(self, level: int, idx: int) -> bool:
        """Whether a trained block exists (no read, no stats)."""
        return (level, idx) in self._rows

    def get(self, level: int, idx: int) -> dict[str, torch.Tensor] | None:
        key = (level, idx)
        if key in self._cache:
            self.stats.hits += 1
            return self._cache[key]
        row = self._rows.get(key)
        block = None
        if row is not None:
            block = self.reg.read_block(row)
            self.stats.misses += 1
            self.stats.bytes_read += sum(t.numel() * t.element_size() for t in block.values())
        self._cache[key] = block
        return block

    def fetch_paths(self, paths: np.ndarray) -> Fetched:
        """paths (B, p) node indices -> the blocks of each level each row fetches."""
        levels = []
        for lvl in range(paths.shape[1]):
            uniq: list[int] = []
            blocks: list[dict[str, torch.Tensor]] = []
            index = []
            for node in paths[:, lvl].tolist():
                block = self.get(lvl + 1, node)
                if block is None:
                    index.append(-1)
                    continue
                if node not in uniq:
                    uniq.append(node)
                    blocks.append(block)
                index.append(uniq.index(node))
            if blocks and blocks[0]["gate"].shape[1] > 0:
                levels.append(_level(blocks, index))
        return Fetched(levels=levels, batch=int(paths.shape[0]))

    def fetch_generic(self, batch: int) -> Fetched:
        block = self.get(0, 0)
        if block is None:
            return Fetched(levels=[], batch=batch)
        return Fetched(levels=[_level([block], [0] * batch)], batch=batch)


def _level(blocks: list[dict[str, torch.Tensor]], index: list[int]) -> LevelFetch:
    stacked = {p: torch.stack([b[p] for b in blocks]) for p in PARTS}  # (U, L, r, d)
    return LevelFetch(stacked["gate"], stacked["up"], stacked["down"], torch.tensor(index, dtype=torch.long))
