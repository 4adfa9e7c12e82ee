"""Training units: a level-1 subtree (its level-1 block and every deeper block under it) or the
generic memory. Units share nothing, so each can be trained, retrained or resumed alone."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.config import BankConfig
from ..core.errors import InputError
from ..model.memory import PARTS, Fetched, LevelFetch, block_generator, init_block
from ..registry import Registry
from ..registry.checkpoints import checkpoint_path

GENERIC = "generic"


@dataclass
class Unit:
    name: str  # level-1 node index as text, or "generic"
    levels: list[tuple[int, int, int]]  # (level, first node index, n blocks) owned by this unit

    def local_index(self, paths: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """Per level of the unit, (B,) indices of each path's block among the unit's own blocks."""
        return [
            torch.tensor([0 if level == 0 else p[level - 1] - first for p in paths], dtype=torch.long)
            for level, first, _n in self.levels
        ]


def unit_of(cfg: BankConfig, name: str) -> Unit:
    if name == GENERIC:
        return Unit(GENERIC, [(0, 0, 1)])
    u, k = int(name), cfg.tree.k
    return Unit(name, [(lvl, u * k ** (lvl - 1), k ** (lvl - 1)) for lvl in range(1, cfg.tree.p + 1)])


def units_to_train(reg: Registry, subtree: int | None, retrain: bool) -> tuple[list[str], list[str]]:
    """(units needing training, units already trained). A unit needs training when one of its blocks
    that has data is not trained, or when a checkpoint of it exists."""
    cfg = reg.config
    l1s = sorted({r["l1"] for r in reg.db.query("select distinct l1 from windows")})
    if subtree is not None:
        if not 0 <= subtree < cfg.tree.k:
            raise InputError(f"--subtree must be in 0..{cfg.tree.k - 1}")
        if subtree not in l1s:
            raise InputError(f"subtree {subtree} has no documents")
        candidates = [str(subtree)]
    else:
        candidates = [str(u) for u in l1s] + [GENERIC]
    todo, done = [], []
    for name in candidates:
        if retrain or checkpoint_path(reg.checkpoint_dir(), name).exists():
            todo.append(name)
            continue
        if name == GENERIC:
            row = reg.block(0, 0)
            pending = row is not None and row["state"] != "trained"
        else:
            pending = _unit_pending(reg, cfg, int(name))
        (todo if pending else done).append(name)
    return todo, done


def _unit_pending(reg: Registry, cfg: BankConfig, u: int) -> bool:
    k = cfg.tree.k
    for lvl in range(1, cfg.tree.p + 1):
        lo, n = u * k ** (lvl - 1), k ** (lvl - 1)
        if reg.db.execute(
            "select count(*) from blocks b join nodes n on n.level = b.level and n.idx = b.idx "
            "where b.level = ? and b.idx >= ? and b.idx < ? and n.n_windows > 0 and b.state != 'trained'",
            [lvl, lo, lo + n],
        ).fetchone()[0]:
            return True
    return False


class UnitParams:
    """The unit's blocks, stacked per level: gate/up/down (n_blocks, L, r, d), trainable."""

    def __init__(self, cfg: BankConfig, unit: Unit, device: torch.device | None = None) -> None:
        """Each block starts from its seeded initial state (made on the CPU, so the same on any
        device), kept in float32 on `device` (the anchor's)."""
        mem = cfg.memory
        self.unit = unit
        self.device = device or torch.device("cpu")
        self.tensors: list[dict[str, torch.Tensor]] = []
        for level, first, n in unit.levels:
            rank = mem.fetched_rank if level == 0 else mem.ranks[level - 1]
            blocks = [
                init_block(len(mem.layers), rank, mem.hidden, mem.std, block_generator(cfg.seed, level, first + i))
                for i in range(n)
            ]
            self.tensors.append(
                {p: torch.stack([b[p] for b in blocks]).to(self.device).requires_grad_(True) for p in PARTS}
            )

    @classmethod
    def from_tensors(cls, unit: Unit, tensors: list[dict[str, torch.Tensor]]) -> UnitParams:
        """The unit's trained blocks as received (per level, gate/up/down), on their tensors' device."""
        params = cls.__new__(cls)
        params.unit = unit
        params.device = tensors[0]["gate"].device if tensors else torch.device("cpu")
        params.tensors = tensors
        return params

    def flat(self) -> list[torch.Tensor]:
        return [t[p] for t in self.tensors for p in PARTS]

    def touched(self, local_index: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per tensor of `flat()`, the distinct block rows that `local_index` (Unit.local_index) uses."""
        return [rows for level in local_index for rows in [level.unique().to(self.device)] * len(PARTS)]

    def fetched(self, local_index: list[torch.Tensor]) -> Fetched:
        levels = [
            LevelFetch(t["gate"], t["up"], t["down"], idx)
            for t, idx in zip(self.tensors, local_index, strict=True)
            if t["gate"].shape[2] > 0
        ]
        return Fetched(levels=levels, batch=int(local_index[0].shape[0]))

    def block(self, level_pos: int, local: int) -> dict[str, torch.Tensor]:
        """One block's tensors, copied to the CPU (what block files and checkpoints store)."""
        return {p: self.tensors[level_pos][p][local].detach().to("cpu", copy=True) for p in PARTS}
