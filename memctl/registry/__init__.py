"""The bank registry: SQLite (sqlite-utils, numbered migrations) plus one safetensors file per block.

A bank is a directory under MEMCTL_HOME/banks/NAME holding registry.db, blocks/ and
checkpoints/. The registry is the single source of truth between commands.

Owns: the bank's directory and every file in it (the database, block files, checkpoint file names,
private modes), its writer lock, and access tags.
May import: memctl.core.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import sqlite_utils
import torch

from ..core.config import BankConfig
from ..core.errors import BankNotFound, BankStateError, IntegrityError
from ..core.tree import Tree
from .blockfile import read_block, write_block
from .lock import bank_lock, pid_alive
from .migrations import migrate
from .paths import check_name, memctl_home, now
from .private import private_dir, touch_private

opened: ContextVar[str | None] = ContextVar("memctl_opened_bank", default=None)  # for the CLI's error hints
TMP_FILE = re.compile(r"^\..+\.tmp(\d+)$")  # write_private's temp file: `.NAME.tmp<pid>`


def doctor_hint(name: str) -> str:
    return f"`memctl doctor --bank {name}` checks it (`--repair` fixes what it safely can)"


def block_id(level: int, idx: int) -> str:
    return "generic" if level == 0 else f"{level}:{idx}"


class Registry:
    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self.db = _connect(path / "registry.db")
        migrate(self.db)
        opened.set(name)

    # ---- opening and creating -------------------------------------------------------------
    @staticmethod
    def bank_dir(name: str, home: Path | None = None) -> Path:
        return (home or memctl_home()) / "banks" / check_name(name)

    @classmethod
    def open(cls, name: str, home: Path | None = None) -> Registry:
        path = cls.bank_dir(name, home)
        if not (path / "registry.db").is_file():
            raise BankNotFound(
                f"no bank named {name!r} under {path.parent}; create it with `memctl ingest PATH --bank {name}`"
            )
        db = path / "registry.db"
        if db.stat().st_size == 0:
            raise IntegrityError(f"the registry of bank {name!r} ({db}) is empty; {doctor_hint(name)}")
        reg = None
        try:
            reg = cls(path, name)
            reg.bank  # noqa: B018 (checks that the bank's row is there)
        except BaseException as e:
            if reg is not None:
                reg.close()
            if not isinstance(e, sqlite3.DatabaseError):
                raise

            raise IntegrityError(
                f"the registry of bank {name!r} ({db}) is unreadable ({e}); {doctor_hint(name)}"
            ) from None
        return reg

    @classmethod
    def exists(cls, name: str, home: Path | None = None) -> bool:
        return (cls.bank_dir(name, home) / "registry.db").is_file()

    @classmethod
    @contextmanager
    def create(
        cls, name: str, config: BankConfig, anchor: dict[str, Any], home: Path | None = None
    ) -> Iterator[Registry]:
        """Build a new bank in a staging directory; it appears under its name only if the block succeeds."""
        final = cls.bank_dir(name, home)
        if final.exists():
            raise BankStateError(f"bank {name!r} already exists at {final}")
        staging = final.with_name(f".{name}.staging{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        private_dir(staging)  # 0700, and banks/ too when this is the first bank
        try:
            reg = cls(staging, name)
            reg.db["banks"].insert(
                {
                    "name": name,
                    "created": now(),
                    "config": config.to_json(),
                    "anchor": anchor["path"],
                    "anchor_sha256": anchor["sha256"],
                    "anchor_params": anchor["params"],
                    "anchor_layers": anchor["layers"],
                }
            )
            yield reg
            reg.db.close()
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        reg.path = final
        reg.db = _connect(final / "registry.db")

    def close(self) -> None:
        self.db.close()

    def version(self) -> tuple[int, int]:
        """Changes anyone committed: (data_version: other connections, total_changes: this one).
        Equal values mean nothing changed since the last look."""
        conn = self.db.conn
        return int(conn.execute("PRAGMA data_version").fetchone()[0]), conn.total_changes

    @property
    def bank(self) -> dict[str, Any]:
        """The bank's row: name, created, config JSON, anchor path, sha256, parameters and layers."""
        row = next(iter(self.db.query("select * from banks")), None)
        if row is None:
            raise IntegrityError(f"the registry of bank {self.name!r} has no bank row; {doctor_hint(self.name)}")
        return dict(row)

    @property
    def config(self) -> BankConfig:
        return BankConfig.from_json(self.bank["config"])

    # ---- documents and windows -------------------------------------------------------------
    def doc_hashes(self) -> dict[str, str]:
        return {r["id"]: r["sha256"] for r in self.db.query("select id, sha256 from documents")}

    def count(self, table: str) -> int:
        return self.db[table].count

    def windows(self, where: str = "", params: list[Any] | None = None) -> list[dict[str, Any]]:
        sql = "select id, doc_id, idx, text, n_tokens, path, l1 from windows"
        if where:
            sql += " where " + where
        return [dict(r) for r in self.db.query(sql + " order by id", params or [])]

    def embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids (N,), embeddings (N, dim))."""
        rows = list(self.db.query("select id, embedding from windows order by id"))
        if not rows:
            return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
        ids = np.array([r["id"] for r in rows], dtype=np.int64)
        return ids, np.stack([np.frombuffer(r["embedding"], dtype=np.float32) for r in rows])

    def remove_documents(self, doc_ids: list[str]) -> None:
        """Delete documents with their windows, embeddings, prompts, provenance rows and the stored
        answers of unfinished evaluation runs about them (one transaction). Their influence on
        trained blocks is the caller's to remove."""
        marks = ",".join("?" for _ in doc_ids)
        with self.db.atomic():
            self.db.execute(f"delete from eval_items where doc in ({marks})", doc_ids)
            self.db.execute(f"delete from prompts where doc_id in ({marks})", doc_ids)
            self.db.execute(f"delete from block_docs where doc_id in ({marks})", doc_ids)
            self.db.execute(f"delete from windows where doc_id in ({marks})", doc_ids)
            self.db.execute(f"delete from documents where id in ({marks})", doc_ids)

    # ---- tree -------------------------------------------------------------------------------
    def save_tree(self, tree: Tree) -> None:
        self.db["nodes"].delete_where()
        rows = []
        for lvl, (cent, sizes) in enumerate(zip(tree.centroids, tree.sizes, strict=True), start=1):
            for i in range(cent.shape[0]):
                rows.append(
                    {
                        "level": lvl,
                        "idx": i,
                        "centroid": cent[i].astype(np.float32).tobytes(),
                        "n_windows": int(sizes[i]),
                    }
                )
        self.db["nodes"].insert_all(rows, batch_size=1000)

    def load_tree(self) -> Tree:
        cfg = self.config.tree
        rows = list(self.db.query("select level, idx, centroid, n_windows from nodes order by level, idx"))
        if not rows:
            raise BankStateError(f"bank {self.name!r} has no tree yet; ingest documents first")
        cents, sizes = [], []
        for lvl in range(1, cfg.p + 1):
            lv = [r for r in rows if r["level"] == lvl]
            cents.append(np.stack([np.frombuffer(r["centroid"], dtype=np.float32) for r in lv]))
            sizes.append(np.array([r["n_windows"] for r in lv], dtype=np.int64))
        return Tree(k=cfg.k, p=cfg.p, centroids=cents, sizes=sizes)

    # ---- blocks -----------------------------------------------------------------------------
    def blocks(self, where: str = "", params: list[Any] | None = None) -> list[dict[str, Any]]:
        sql = "select * from blocks" + (" where " + where if where else "") + " order by level, idx"
        return [dict(r) for r in self.db.query(sql, params or [])]

    def block(self, level: int, idx: int) -> dict[str, Any] | None:
        rows = self.blocks("level = ? and idx = ?", [level, idx])
        return rows[0] if rows else None

    def write_block(self, level: int, idx: int, tensors: dict[str, torch.Tensor]) -> tuple[str, str]:
        """Write a new, content-named block file atomically; returns (relative file, sha256).
        The row is the caller's to update; the file it replaces is removed by `sweep_orphans`."""
        stem = "generic" if level == 0 else f"L{level}-{idx:06d}"
        path, sha = write_block(self.blocks_dir, stem, tensors, {"bank": self.name, "block": block_id(level, idx)})
        return str(path.relative_to(self.path)), sha

    def read_block(self, row: dict[str, Any]) -> dict[str, torch.Tensor]:
        return read_block(self.path / row["file"], row["sha256"])

    @property
    def blocks_dir(self) -> Path:
        return self.path / "blocks"

    def sweep_orphans(self) -> list[Path]:
        """Delete block files (and temp files of dead writers) that no registry row points to.
        Call it after a commit that replaced or dropped blocks, never before. It runs under the bank's
        writer lock (taken here unless the caller holds it), so it never sweeps the uncommitted files
        of another writer; a temp file of a live process is left alone all the same."""
        if not self.blocks_dir.is_dir():
            return []
        with self.lock():
            used = {self.path / r[0] for r in self.db.execute("select file from blocks where file is not null")}
            gone = []
            for p in self.blocks_dir.iterdir():
                tmp = TMP_FILE.match(p.name)
                if not p.is_file() or p in used or (tmp and pid_alive(int(tmp.group(1)))):
                    continue
                p.unlink(missing_ok=True)
                gone.append(p)
        return gone

    @property
    def is_bank_dir(self) -> bool:
        """Whether this registry is a bank's own (banks/NAME), not a staging copy or a work snapshot."""
        return self.path.name == self.name and self.path.parent.name == "banks"

    def lock(self, wait: bool | None = None) -> AbstractContextManager[bool]:
        """The bank's writer lock (memctl.registry.lock); nothing for a staging copy or a work snapshot."""
        if not self.is_bank_dir:
            return nullcontext(False)
        return bank_lock(self.name, self.path.parent.parent, wait=wait)

    def vacuum(self) -> None:
        """Rebuild the database file so deleted rows leave no bytes behind (secure_delete zeroes
        freed pages; VACUUM drops them), and empty the write-ahead log, whose old frames may hold them."""
        self.db.execute("VACUUM")
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def log(self, action: str, target: str, reason: str = "", detail: dict[str, Any] | None = None) -> None:
        """Record a privacy action (block, unblock, forget, export, import) with its time."""
        self.db["privacy_log"].insert(
            {"at": now(), "action": action, "target": target, "reason": reason, "detail": dumps(detail or {})}
        )

    def bytes_on_disk(self) -> int:
        d = self.blocks_dir
        return sum(p.stat().st_size for p in d.glob("*.safetensors")) if d.is_dir() else 0

    def checkpoint_dir(self) -> Path:
        return private_dir(self.path / "checkpoints")


BUSY_TIMEOUT_MS = 30_000  # how long a command waits for another one's write transaction


class _Database(sqlite_utils.Database):
    """sqlite-utils' Database whose transactions take the write lock when they begin (BEGIN
    IMMEDIATE): a transaction that read first and then wrote could not wait for another writer in
    WAL mode (its snapshot would be stale), it would fail at once with "database is locked"."""

    @contextmanager
    def atomic(self) -> Iterator[sqlite_utils.Database]:
        if self.conn.in_transaction:
            with super().atomic() as db:  # a savepoint inside the open transaction
                yield db
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            self.rollback()
            raise
        try:
            self.conn.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise


def _connect(path: Path) -> sqlite_utils.Database:
    """A connection in WAL mode (readers never wait for the writer) that waits up to 30 s for another
    writer, with foreign keys enforced and deleted content overwritten (secure_delete), that a worker
    thread may use too (the TUI runs library calls in one, serially). A new database file is 0600."""
    touch_private(path)
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    db = _Database(conn)
    db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA foreign_keys=ON")
    db.execute("PRAGMA secure_delete=ON")
    return db


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)
