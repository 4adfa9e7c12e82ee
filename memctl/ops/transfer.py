"""Moving banks between owners: one archive out, every byte checked on the way in.

An archive is a plain tar of exactly `manifest.json`, `registry.db` (a consistent SQLite snapshot) and
`blocks/<file>` per exported block. With access tags, only the blocks they reach leave, with only the
documents carrying one of them, and the snapshot is rebuilt so the rest leaves no bytes behind.
Import checks members and manifest (memctl/ops/archive.py), then registry, blocks (checksums, headers) and
the anchor's identity in a staging directory that becomes the bank in one rename; no tensor is loaded
while checking. Both hold the bank's writer lock (memctl.registry.lock); import takes it under the new bank's name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import sqlite3
import tarfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..core.config import BankConfig, MemoryConfig
from ..core.errors import AnchorError, BankStateError, InputError, IntegrityError, check_path
from ..model.anchor import fingerprint, resolve_anchor
from ..model.memory import PARTS
from ..registry import Registry, check_name, memctl_home, now
from ..registry.access import check_allow, doc_tags, reachable_blocks
from ..registry.blockfile import read_header
from ..registry.lock import bank_lock, writer
from ..registry.migrations import MIGRATIONS
from ..registry.private import create_private, private_dir
from .archive import BLOCK_KEYS, BLOCKS, FORMAT, MANIFEST, REGISTRY, VERSION, check_members, check_sizes, read_manifest
from .leftovers import archive_file, name_unnamed, sweep_export_leftovers


@dataclass
class ExportResult:
    bank: str
    file: Path
    blocks: int  # block files in the archive
    documents: int  # documents in the archive's registry
    bytes: int  # size of the archive
    allow: list[str] | None  # the access tags the export was restricted to, or None (everything)


@dataclass
class ImportResult:
    bank: str
    path: Path  # the new bank's directory
    blocks: int
    documents: int
    anchor: Path  # the local anchor the bank was checked against


# ---- export ---------------------------------------------------------------------------------------
@writer  # it logs the export, and no sweep may remove a block file it is copying (memctl.registry.lock)
def export_bank(
    name: str,
    out: Path,
    allow: frozenset[str] | None = None,
    home: Path | None = None,
    overwrite: bool = False,
) -> ExportResult:
    """Write bank `name` to the archive `out` (all of it, or what the `allow` tags can reach).
    The archive appears complete or not at all; the export is recorded in the bank's privacy log."""
    out = Path(out).expanduser().absolute()
    if out.is_dir():
        raise InputError(f"{out} is a directory; give the archive's file name, e.g. {out / (name + '.memctl')}")
    if out.exists() and not overwrite:
        raise InputError(f"{out} already exists; choose another file name or pass --overwrite")
    if not out.parent.is_dir():
        raise InputError(f"directory {out.parent} does not exist; create it first")
    check_allow(allow)
    check_path(out, "the archive")  # it goes to the privacy log, after the archive is written
    reg = Registry.open(name, home)
    sweep_export_leftovers(reg.path, out)
    part = out.with_name(f".{out.name}.part{os.getpid()}")
    try:
        try:
            fd, named = archive_file(out.parent, part)
        except OSError as e:
            raise InputError(f"cannot write in {out.parent}: {e.strerror or type(e).__name__}") from None
        try:
            manifest, documents = _snapshot(reg, allow, fd)
            if not named:  # give the unnamed file a name only now that it is whole
                name_unnamed(fd, part)
            os.replace(part, out)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        n = len(manifest["blocks"])
        reg.log("export", str(out), "", {"allow": manifest["allow"], "blocks": n})
    finally:
        reg.close()
    return ExportResult(name, out, n, documents, out.stat().st_size, manifest["allow"])


def _snapshot(reg: Registry, allow: frozenset[str] | None, fd: int) -> tuple[dict[str, Any], int]:
    """Snapshot the registry, restrict it to `allow`, write the archive to file descriptor `fd`. Returns
    (manifest, documents).
    The unfiltered working copy holds private text: it stays on the bank's own disk, never next to the archive."""
    work = reg.path / f".export{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    private_dir(work)
    try:
        reg.db.execute("VACUUM INTO ?", [str(work / REGISTRY)])  # a consistent snapshot, even mid-train
        copy = Registry(work, reg.name)
        try:
            rows = copy.blocks("file is not null")
            if allow is not None:
                reach = reachable_blocks(copy, allow)  # on the untouched snapshot: every training document counts
                rows = [r for r in rows if r["id"] in reach and not r["blocked"]]
                _restrict(copy, allow, {r["id"] for r in rows})
            bank, documents = copy.bank, copy.count("documents")
            schema = max(r[0] for r in copy.db.execute("select version from schema_migrations"))
            copy.db.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no write-ahead log
        finally:
            copy.close()
        with (work / REGISTRY).open("rb") as f:
            registry_sha = hashlib.file_digest(f, "sha256").hexdigest()
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "bank": reg.name,
            "created": now(),
            "schema_version": schema,
            "anchor_sha256": bank["anchor_sha256"],
            "config": bank["config"],
            "allow": sorted(allow) if allow is not None else None,
            "registry_sha256": registry_sha,
            "registry_bytes": _size(work / REGISTRY),
            "blocks": [
                {k: r[k] for k in BLOCK_KEYS if k != "bytes"} | {"bytes": _size(reg.path / r["file"])} for r in rows
            ],
        }
        _write_archive(fd, manifest, work / REGISTRY, reg.path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest, documents


def _restrict(copy: Registry, allow: frozenset[str], keep: set[str]) -> None:
    """Reduce the snapshot to the documents carrying an `allow` tag and the blocks in `keep`;
    then rebuild the file so that nothing else leaves a byte in it."""
    drop = [d for d, tags in doc_tags(copy).items() if not tags & allow]
    if len(drop) == copy.count("documents"):
        raise InputError(f"no document of bank {copy.name!r} carries any of the tags {', '.join(sorted(allow))}")
    withheld = [r["id"] for r in copy.blocks("file is not null") if r["id"] not in keep]
    with copy.db.atomic():
        if drop:
            copy.remove_documents(drop)
        for table in ("reference_docs", "privacy_log", "forget_reports"):
            copy.db.execute(f"delete from {table}")
        for bid in withheld:  # the row stays (the tree is whole); its file, provenance and any reason go
            copy.db.execute("delete from block_docs where block_id = ?", [bid])
            copy.db.execute(
                "update blocks set file = null, sha256 = null, state = 'withheld', trained_tokens = 0, blocked = 0, "
                "blocked_reason = null, blocked_at = null, updated = ? where id = ?",
                [now(), bid],
            )
        counts: Counter[tuple[int, int]] = Counter()
        for (path,) in copy.db.execute("select path from windows"):
            counts.update((lvl, int(n)) for lvl, n in enumerate(path.split(","), start=1))
        for level, idx in list(copy.db.execute("select level, idx from nodes")):
            copy.db.execute(
                "update nodes set n_windows = ? where level = ? and idx = ?", [counts[(level, idx)], level, idx]
            )
    copy.db.execute("PRAGMA secure_delete=ON")
    copy.vacuum()


def _write_archive(fd: int, manifest: dict[str, Any], db_path: Path, bank_dir: Path) -> None:
    """manifest, registry, then each block (checksum verified while it streams in); fsynced."""
    with os.fdopen(fd, "wb", closefd=False) as f:  # 0600: the archive holds the bank's text
        with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
            data = json.dumps(manifest, indent=1, sort_keys=True).encode()
            _add(tar, MANIFEST, io.BytesIO(data), len(data))
            with db_path.open("rb") as src:
                _add(tar, REGISTRY, src, _size(db_path))
            for b in manifest["blocks"]:
                path = bank_dir / b["file"]
                try:
                    src = path.open("rb")
                except FileNotFoundError:
                    raise IntegrityError(
                        f"block file {path} vanished during the export (was the bank retrained?); export again"
                    ) from None
                with src:
                    reader = _Hashing(src)
                    _add(tar, b["file"], reader, b["bytes"])
                if reader.sha.hexdigest() != b["sha256"]:
                    raise IntegrityError(f"block file {path} does not match its checksum; it was changed or corrupted")
        f.flush()
        os.fsync(f.fileno())


def _add(tar: tarfile.TarFile, arcname: str, src: IO[bytes] | _Hashing, size: int) -> None:
    info = tarfile.TarInfo(arcname)  # owner 0, no user or group names: nothing about the exporter
    info.size, info.mode, info.mtime = size, 0o644, int(time.time())
    tar.addfile(info, src)


class _Hashing:
    """A reader that hashes what passes through it."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.sha = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        chunk = self.f.read(n)
        self.sha.update(chunk)
        return chunk


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise IntegrityError(f"block file {path} is missing; retrain the bank (memctl train --retrain)") from None


# ---- import ---------------------------------------------------------------------------------------
def import_bank(
    archive: Path, name: str | None = None, anchor: str | None = None, home: Path | None = None
) -> ImportResult:
    """Check the archive in full, then add it as bank `name` (default: the exported bank's name).
    `anchor` is the local copy of the anchor the bank was built on, when its stored path is not here."""
    archive = Path(archive).expanduser()
    check_path(archive, "the archive")  # it goes to the privacy log, after the bank is staged
    if anchor is not None:
        check_path(anchor, "--anchor")
    home = home or memctl_home()
    try:
        tar = tarfile.open(archive, mode="r:")
    except FileNotFoundError:
        raise InputError(f"no such file: {archive}") from None
    except (tarfile.TarError, OSError) as e:
        raise InputError(
            f"{archive} is not a memctl bank archive (an uncompressed tar from `memctl export`): {e}"
        ) from None
    with tar:
        members = check_members(tar, archive)
        manifest = read_manifest(tar, members[MANIFEST], archive)
        check_sizes(members, manifest, archive)
        name = check_name(name or manifest["bank"])
        final = Registry.bank_dir(name, home)
        with bank_lock(name, home):  # the new bank's name, locked before its directory exists (memctl.registry.lock)
            if final.exists():
                raise BankStateError(f"bank {name!r} already exists at {final}; import under another name (--bank)")
            staging = final.with_name(f".{name}.import{os.getpid()}")
            try:
                shutil.rmtree(staging, ignore_errors=True)
                private_dir(staging / "blocks")  # 0700, the bank's directory with it
                files = _extract(tar, members, staging, archive)
                result = _adopt(staging, name, manifest, files, anchor, archive)
                if final.exists():
                    raise BankStateError(
                        f"bank {name!r} appeared at {final} during the import; import under another name"
                    )
                os.rename(staging, final)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    result.path = final
    return result


def _extract(
    tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], staging: Path, archive: Path
) -> dict[str, tuple[str, int]]:
    """Copy registry and blocks into `staging`, member by member. Returns name -> (sha256, bytes)."""
    files: dict[str, tuple[str, int]] = {}
    for arc, info in members.items():
        if arc == MANIFEST:
            continue
        try:
            src = tar.extractfile(info)
            assert src is not None
            reader, n = _Hashing(src), 0
            with os.fdopen(create_private(staging / arc), "wb") as dst:
                while chunk := reader.read(1 << 20):
                    dst.write(chunk)
                    n += len(chunk)
        except tarfile.TarError as e:
            raise InputError(f"{archive} is truncated or corrupted at {arc!r}: {e}") from None
        files[arc] = (reader.sha.hexdigest(), n)
    return files


def _adopt(
    staging: Path,
    name: str,
    manifest: dict[str, Any],
    files: dict[str, tuple[str, int]],
    anchor: str | None,
    archive: Path,
) -> ImportResult:
    """Every check on the staged bank; then point it at the local anchor and log the import."""
    if files[REGISTRY][0] != manifest["registry_sha256"]:
        raise IntegrityError(f"{archive}: {REGISTRY} does not match its checksum; the archive is corrupted")
    _check_database(staging / REGISTRY, archive)
    reg: Registry | None = None
    try:
        reg = Registry(staging, name)  # applies pending migrations (an archive from an older memctl)
        banks = [dict(r) for r in reg.db.query("select * from banks")]
        if len(banks) != 1:
            raise InputError(f"{archive}: {REGISTRY} holds {len(banks)} banks, not one")
        bank = banks[0]
        cfg = _parse_config(bank["config"], archive)
        if bank["anchor_sha256"] != manifest["anchor_sha256"] or bank["config"] != manifest["config"]:
            raise IntegrityError(f"{archive}: manifest and registry disagree about the bank; the archive was altered")
        n_blocks = _check_blocks(reg, cfg, manifest, files, staging, archive)
        path = _check_anchor(cfg, bank["anchor_sha256"], anchor, name)
        spec = cfg.anchor if anchor is None else (str(path) if anchor != "default" else "default")
        config = dataclasses.replace(cfg, anchor=spec).to_json()
        detail = {"from_bank": manifest["bank"], "created": manifest["created"], "allow": manifest["allow"]}
        with reg.db.atomic():
            reg.db.execute("update banks set name = ?, anchor = ?, config = ?", [name, str(path), config])
            reg.log("import", str(archive), "", detail | {"blocks": n_blocks, "anchor": str(path)})
        documents = reg.count("documents")
    except sqlite3.Error as e:
        raise InputError(f"{archive}: {REGISTRY} is not a memctl registry: {e}") from None
    finally:
        if reg is not None:
            reg.close()
    return ImportResult(name, staging, n_blocks, documents, path)


def _parse_config(text: Any, archive: Path) -> BankConfig:
    try:
        return BankConfig.from_json(text)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise InputError(f"{archive}: the bank's configuration is malformed: {e!r}") from None


def _check_database(path: Path, archive: Path) -> None:
    """SQLite's own integrity check, no triggers or views (they would run on our writes), and a schema
    this memctl knows."""
    try:
        conn = sqlite3.connect(path.as_uri() + "?mode=ro", uri=True)
        try:
            check = conn.execute("PRAGMA integrity_check").fetchone()
            if not check or check[0] != "ok":
                raise IntegrityError(f"{archive}: {REGISTRY} fails SQLite's integrity check; the archive is corrupted")
            extra = conn.execute("select name from sqlite_master where type in ('trigger', 'view')").fetchone()
            if extra:
                raise InputError(f"{archive}: {REGISTRY} defines {extra[0]!r}, which no memctl registry has")
            version = conn.execute("select max(version) from schema_migrations").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise InputError(f"{archive}: {REGISTRY} is not a memctl registry: {e}") from None
    if not isinstance(version, int):
        raise InputError(f"{archive}: {REGISTRY} has no schema version; it is not a memctl registry")
    if version > len(MIGRATIONS):
        raise InputError(
            f"{archive} was made by a newer memctl (schema {version}, this one knows {len(MIGRATIONS)}); upgrade memctl"
        )


def _check_blocks(
    reg: Registry,
    cfg: BankConfig,
    manifest: dict[str, Any],
    files: dict[str, tuple[str, int]],
    staging: Path,
    archive: Path,
) -> int:
    """Registry rows with a file == manifest blocks == archived files; checksums, names, headers."""
    rows = {r["file"]: r for r in reg.blocks("file is not null")}
    listed = {b["file"]: b for b in manifest["blocks"]}
    stored = {f for f in files if f.startswith(BLOCKS)}
    for what, got in (("the manifest", set(listed)), ("the archive", stored)):
        if got != set(rows):
            diff = sorted((set(rows) - got) or (got - set(rows)))
            side = "lacks" if set(rows) - got else "has extra"
            raise IntegrityError(f"{archive}: {what} {side} block file {diff[0]} (registry and {what} disagree)")
    ranks = cfg.memory.ranks
    for file, row in rows.items():
        sha, size = files[file]
        entry = listed[file]
        if not (isinstance(row["level"], int) and isinstance(row["idx"], int) and 0 <= row["level"] <= len(ranks)):
            raise IntegrityError(f"{archive}: block {row['id']} has a bad level or index")
        stem = "generic" if row["level"] == 0 else f"L{row['level']}-{row['idx']:06d}"
        if file != f"{BLOCKS}{stem}.{str(row['sha256'])[:16]}.safetensors":
            raise IntegrityError(f"{archive}: block {row['id']} has file name {file}, which is not its own")
        if any(entry[k] != row[k] for k in ("id", "level", "idx", "sha256")):
            raise IntegrityError(f"{archive}: manifest and registry disagree about block {row['id']}")
        if sha != row["sha256"] or size != entry["bytes"]:
            raise IntegrityError(f"{archive}: block file {file} does not match its checksum; the archive is corrupted")
        want = ranks[row["level"] - 1] if row["level"] else cfg.memory.fetched_rank
        if row["rank"] != want:
            raise IntegrityError(f"{archive}: block {row['id']} has rank {row['rank']}, the configuration says {want}")
        check_block_header(staging / file, cfg.memory, row["rank"])
    return len(rows)


def check_block_header(path: Path, memory: MemoryConfig, rank: int) -> None:
    """A block file holds exactly gate/up/down, float32, of shape (memory layers, rank, hidden)."""
    header = read_header(path)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if set(tensors) != set(PARTS):
        raise IntegrityError(f"{path.name} holds tensors {sorted(tensors)}, expected {', '.join(PARTS)}")
    want = [len(memory.layers), rank, memory.hidden]
    for part in PARTS:
        spec = tensors[part]
        start, end = (int(v) for v in spec["data_offsets"])
        if spec["dtype"] != "F32" or list(spec["shape"]) != want or end - start != 4 * want[0] * want[1] * want[2]:
            raise IntegrityError(
                f"{path.name}: tensor {part!r} is {spec['dtype']} {list(spec['shape'])}, expected F32 {want}"
            )


def _check_anchor(cfg: BankConfig, digest: str, anchor: str | None, name: str) -> Path:
    """The local anchor (given, or the one the bank names) must be the very model the bank was built on."""
    try:
        path = resolve_anchor(anchor or cfg.anchor)
    except AnchorError:
        if anchor is not None:
            raise
        raise AnchorError(
            f"bank {name!r} was built on anchor {cfg.anchor} (sha256 {digest[:12]}), which is not on this machine; "
            "pass --anchor PATH to your copy of it"
        ) from None
    local = fingerprint(path)
    if local != digest:
        raise AnchorError(
            f"anchor {path} has sha256 {local[:12]} but bank {name!r} was built on {digest[:12]}; "
            "pass --anchor PATH to a copy of the anchor it was built on"
        )
    return path
