"""Block store: reads block files lazily (memory-mapped, checksum verified), caches them in an LRU
whose budget is counted in bytes, and never serves a block that is blocked or out of reach.

* Only blocks on a requested path are ever read; untrained blocks (no file: down is zero, so they
  change nothing) are reported as absent rather than loaded.
* The byte budget counts every loaded block. Blocks of the shallow levels (`pin_levels`, and the
  generic memory) are pinned, never evicted: consecutive questions in the same subtree re-read only
  deeper blocks. Unpinned blocks are evicted least recently used first while the cache is over budget,
  except the block just read (so pins that fill the budget still let a follow-up question reuse it).
* A blocked block, or one that the session's `allow` tags cannot reach, is withheld *before* any
  file is touched. The store re-reads the registry's block table whenever the database changed
  (another process blocked a block, a retrain switched files), so neither a blocked nor a replaced
  block is ever served from cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..core.errors import IntegrityError
from ..core.placement import CPU, Placement
from ..model.memory import PARTS, Fetched, LevelFetch, Packed, pack_int8, packed_bytes
from ..registry import Registry, block_id
from ..registry.access import reachable_blocks

DEFAULT_CACHE_MB = 512
MAX_CACHE_MB = 1 << 20  # 1 TB: a larger --cache-mb is a typo
PATH_PACKS = 4  # int8 serving: packs of the most recently fetched paths kept
READERS = 2  # block files read at once on a cold fetch (sha256 and the copy release the GIL)
Key = tuple[int, int]  # (level, node); level 0 is the generic memory


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0  # blocks read from disk
    bytes_read: int = 0
    evictions: int = 0
    withheld: int = 0  # requests for blocked or unreachable blocks (never read)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def block_bytes(block: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in block.values())


class BlockStore:
    def __init__(
        self,
        reg: Registry,
        cache_bytes: int = DEFAULT_CACHE_MB * 2**20,
        pin_levels: int = 1,
        allow: frozenset[str] | None = None,
        serve_blocked: bool = False,
        int8: bool = False,
    ) -> None:
        """`serve_blocked` is for proofs about the parameters themselves (forgetting), never for answers.
        `int8`: forward passes use each fetched path's blocks packed as int8 weights (memory.pack_int8),
        kept for the last PATH_PACKS paths while all their blocks stay cached; the budget counts them."""
        self.reg = reg
        self.int8 = int8
        self._packs: OrderedDict[tuple[tuple[Key, str], ...], tuple[Packed, int]] = OrderedDict()
        self.serve_blocked = serve_blocked
        self.cache_bytes = cache_bytes
        self.pin_levels = pin_levels
        self.depth = reg.config.tree.p
        self.allow = allow
        self.stats = StoreStats()
        self.place = CPU  # where served blocks live, in the model's dtype (Memories.attach sets it)
        self._cache: OrderedDict[Key, tuple[str, dict[str, torch.Tensor], int]] = OrderedDict()
        self._rows: dict[Key, dict] = {}
        self._withheld: set[Key] = set()
        self._version: tuple[int, int] | None = None
        self.refresh()

    def set_place(self, place: Placement) -> None:
        """Serve blocks on this device in this dtype (the model's): converted once when read, so a
        GPU model's forward passes find them there. Float32 on the CPU keeps the memory-mapped files.
        A change of place empties the cache."""
        if place != self.place:
            self._cache.clear()
            self._packs.clear()
            self.place = place

    # ---- registry view -------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Re-read which blocks exist and may be served, if the registry changed since the last look.
        Cached blocks that were blocked, put out of reach, replaced or dropped leave the cache."""
        version = self.reg.version()
        if version == self._version and not force:
            return
        rows = {(r["level"], r["idx"]): r for r in self.reg.blocks("file is not null")}
        reach = reachable_blocks(self.reg, self.allow) if self.allow is not None else None
        self._withheld = {
            key
            for key, r in rows.items()
            if (r["blocked"] and not self.serve_blocked) or (reach is not None and r["id"] not in reach)
        }
        self._rows = {key: r for key, r in rows.items() if key not in self._withheld}
        for key in list(self._cache):
            row = self._rows.get(key)
            if row is None or row["sha256"] != self._cache[key][0]:
                del self._cache[key]
        self._drop_packs()
        self._version = version  # read before the rows: a commit made meanwhile is seen by the next look

    def has(self, level: int, idx: int) -> bool:
        """Whether a trained block may be served (no read, no stats)."""
        self.refresh()
        return (level, idx) in self._rows

    def withheld(self, level: int, idx: int) -> bool:
        """Whether a trained block exists but is blocked or out of reach."""
        self.refresh()
        return (level, idx) in self._withheld

    # ---- the cache --------------------------------------------------------------------------------
    def pinned(self, key: Key) -> bool:
        """The generic memory and the shallow levels; never the leaves (a flat bank pins nothing)."""
        return key[0] <= min(self.pin_levels, self.depth - 1)

    @property
    def cached_bytes(self) -> int:
        return sum(n for _sha, _b, n in self._cache.values()) + sum(n for _p, n in self._packs.values())

    def _drop_packs(self) -> int:
        """Forget the int8 packs of paths with a block that left the cache (or was replaced); returns
        the bytes freed."""
        freed = 0
        for path in list(self._packs):
            if not self._still_cached(path):
                freed += self._packs.pop(path)[1]
        return freed

    def _still_cached(self, path: tuple[tuple[Key, str], ...]) -> bool:
        """Whether every block of a pack's path is cached under the file (sha256) it was packed from."""
        return all(key in self._cache and self._cache[key][0] == sha for key, sha in path)

    def cached(self) -> list[str]:
        return [block_id(*key) for key in self._cache]

    def _evict(self, keep: Collection[Key]) -> None:
        """Drop unpinned blocks, least recently used first, while over budget; `keep` (the block just
        read, or the blocks of the path just packed) stays even then, so pins that fill the budget
        never turn every fetch into a read."""
        total = self.cached_bytes
        for key in list(self._cache):  # least recently used first
            if total <= self.cache_bytes:
                break
            if self.pinned(key) or key in keep:
                continue
            total -= self._cache.pop(key)[2]
            total -= self._drop_packs()
            self.stats.evictions += 1

    def get(
        self, level: int, idx: int, read: dict[Key, tuple[str, dict[str, torch.Tensor]]] | None = None
    ) -> dict[str, torch.Tensor] | None:
        """A block from the cache or its file; `read` holds blocks `read_ahead` already read for this fetch."""
        self.refresh()
        key = (level, idx)
        if key in self._withheld:
            self.stats.withheld += 1
            return None
        if key in self._cache:
            self.stats.hits += 1
            self._cache.move_to_end(key)
            return self._cache[key][1]
        row = self._rows.get(key)
        if row is None:
            return None
        ahead = read.pop(key, None) if read else None  # read before a refresh: only if the file is still this row's
        if ahead and ahead[0] == row["sha256"]:
            raw = ahead[1]
        else:
            got = self._read(key, row)
            if got is None:
                return None
            row, raw = got
        block = raw
        if self.place != CPU:
            block = {p: t.to(device=self.place.device, dtype=self.place.dtype) for p, t in raw.items()}
        n = block_bytes(block)  # what the cache holds; the file's bytes were read
        self.stats.misses += 1
        self.stats.bytes_read += block_bytes(raw)
        self._cache[key] = (row["sha256"], block, n)
        self._evict(keep={key})
        return block

    def _read(self, key: Key, row: dict) -> tuple[dict, dict[str, torch.Tensor]] | None:
        """(row, tensors) of a block's file. A writer may have replaced the block, and swept its old
        file, since the last look at the registry: then the new row is read (or None, when the block
        was dropped or withheld meanwhile). A file that fails its checksum for the row that still
        names it is damage, and raises."""
        try:
            return row, self.reg.read_block(row)
        except IntegrityError:
            self.refresh(force=True)
            fresh = self._rows.get(key)
            if fresh is not None and fresh["sha256"] == row["sha256"]:
                raise
        if fresh is None:
            return None
        return fresh, self.reg.read_block(fresh)

    # ---- what a forward pass uses ----------------------------------------------------------------
    def fetch_paths(self, paths: np.ndarray) -> Fetched:
        """paths (B, p) node indices -> the blocks of each level each row fetches."""
        return self.fetch_union(np.asarray(paths)[:, None, :])

    def fetch_union(self, paths: np.ndarray) -> Fetched:
        """paths (B, n, p): each row fetches the blocks of its n paths (a beam's leaves with their
        ancestors), a node of -1 nothing; a node already on an earlier path of the row must be -1
        (api.unique_paths), so each block is fetched once. With int8, each row's blocks, all its
        paths together, are packed once (memory.pack_int8)."""
        got: dict[Key, dict[str, torch.Tensor]] = {}
        shas: dict[Key, str] = {}  # the file each block was served from (the registry may move on mid-fetch)
        flat = paths.reshape(-1, paths.shape[2]).tolist()
        read = self.read_ahead((lvl + 1, n) for path in flat for lvl, n in enumerate(path) if n >= 0)

        def lookup(level: int, node: int) -> dict[str, torch.Tensor] | None:
            block = self.get(level, node, read)
            if block is not None:
                got[(level, node)] = block
                shas[(level, node)] = self._cache[(level, node)][0]  # get() leaves the block it served cached
            return block

        levels = [lv for j in range(paths.shape[1]) for lv in assemble(paths[:, j], lookup).levels]
        fetched = Fetched(levels=levels, batch=int(paths.shape[0]))
        if not self.int8:
            return fetched
        rows: dict[tuple[Key, ...], list[int]] = {}
        for i, row in enumerate(paths.tolist()):
            keys = tuple(
                (lvl + 1, n) for path in row for lvl, n in enumerate(path) if _has_neurons(got.get((lvl + 1, n)))
            )
            rows.setdefault(keys, []).append(i)
        fetched.packed = [(torch.tensor(r), self._pack(keys, got, shas)) for keys, r in rows.items() if keys]
        return fetched

    def read_ahead(self, keys: Iterable[Key]) -> dict[Key, tuple[str, dict[str, torch.Tensor]]]:
        """Read the files of the blocks among `keys` that are neither cached nor withheld, READERS at a
        time (a cold fetch reads a path's blocks together: each read is mostly its sha256 check), each
        with the sha256 it was read under. The cache takes them as `get` asks for them, in path order,
        so eviction order is unchanged; `get` reads again a block whose file changed in between."""
        self.refresh()
        todo = [k for k in dict.fromkeys(keys) if k not in self._cache and k in self._rows]
        if len(todo) < 2:
            return {}
        with ThreadPoolExecutor(min(len(todo), READERS)) as pool:
            rows = [self._rows[k] for k in todo]
            blocks = pool.map(self._try_read, rows)
            return {k: (r["sha256"], b) for k, r, b in zip(todo, rows, blocks, strict=True) if b is not None}

    def _try_read(self, row: dict) -> dict[str, torch.Tensor] | None:
        """A block read ahead, or None when its file failed (`get` reads it again, after a refresh)."""
        try:
            return self.reg.read_block(row)
        except IntegrityError:
            return None

    def fetch_generic(self, batch: int, off: Sequence[bool] | np.ndarray | None = None) -> Fetched:
        """The generic block for every row of a batch but those marked in `off` (nothing for them)."""
        rows = [i for i in range(batch) if off is None or not off[i]]
        block = self.get(0, 0) if rows else None
        if block is None:
            return Fetched(levels=[], batch=batch)
        index = [0 if off is None or not off[i] else -1 for i in range(batch)]
        fetched = Fetched(levels=[_level([block], index)], batch=batch)
        if self.int8 and _has_neurons(block):
            key = (0, 0)
            fetched.packed = [(torch.tensor(rows), self._pack((key,), {key: block}, {key: self._cache[key][0]}))]
        return fetched

    def _pack(self, keys: tuple[Key, ...], blocks: dict[Key, dict[str, torch.Tensor]], shas: dict[Key, str]) -> Packed:
        """The int8 pack of one path's blocks, each under the sha256 of the file it was served from
        (not the registry's latest: another process may have committed mid-fetch). Kept only while
        all of them stay cached under those files; the budget counts it."""
        path = tuple((key, shas[key]) for key in keys)
        if path in self._packs:
            self._packs.move_to_end(path)
            return self._packs[path][0]
        packed = pack_int8([blocks[key] for key in keys])
        if self._still_cached(path):
            self._packs[path] = (packed, packed_bytes(packed))
            while len(self._packs) > PATH_PACKS:
                self._packs.popitem(last=False)
            self._evict(keep=set(keys))  # the pack's bytes count: over budget, older blocks make room
        return packed


def _has_neurons(block: dict[str, torch.Tensor] | None) -> bool:
    return block is not None and block["gate"].shape[1] > 0


def assemble(paths: np.ndarray, lookup: Callable[[int, int], dict[str, torch.Tensor] | None]) -> Fetched:
    """paths (B, p) -> Fetched, with `lookup(level, node)` giving each block (None: absent).
    A node of -1 fetches nothing at that level for that row."""
    levels = []
    for lvl in range(paths.shape[1]):
        uniq: list[int] = []
        blocks: list[dict[str, torch.Tensor]] = []
        index = []
        for node in paths[:, lvl].tolist():
            block = lookup(lvl + 1, node) if node >= 0 else None
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


def _level(blocks: list[dict[str, torch.Tensor]], index: list[int]) -> LevelFetch:
    if len(blocks) == 1:  # a view, no copy
        stacked = {p: blocks[0][p].unsqueeze(0) for p in PARTS}
    else:
        stacked = {p: torch.stack([b[p] for b in blocks]) for p in PARTS}  # (U, L, r, d)
    return LevelFetch(stacked["gate"], stacked["up"], stacked["down"], torch.tensor(index, dtype=torch.long))
