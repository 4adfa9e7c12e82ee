"""`memctl doctor`: check a bank's registry, block files, runs, checkpoints and leftovers; repair
what can be repaired safely, and say the exact command for the rest.

Checks, in order: leftovers of killed commands (ingest and import staging directories, export work
directories, temp files of dead processes, `/tmp/memctl-ingest-*`), the registry (empty, SQLite's
integrity check, schema version, the bank's row, foreign keys), every block file against its
checksum and header, files no row points to and rows pointing to no file, the documents behind each
block (a block still shaped by a document the bank no longer holds keeps its influence), node sizes,
runs left 'running' by a killed `train`, and checkpoints (interrupted training, damaged or legacy
ones). Stale blocks and resumable checkpoints are notices: the bank is consistent, `memctl train`
finishes the work.

`--repair` takes the bank's writer lock (memctl.registry.lock) and then: removes leftovers of dead processes
and orphan files, re-queues damaged blocks (missing or corrupt file, or holding a forgotten
document's influence: the block is withdrawn at once and `memctl train` retrains its unit), marks
dead runs interrupted, drops damaged and legacy checkpoints, fixes node sizes and deletes rows that
break a foreign key. Without `--repair` doctor changes nothing; when another command is writing,
the checks that need a quiet bank (orphans, runs) are skipped and said so.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import BankNotFound, MemctlError
from ..core.tree import subtree_of
from ..registry import TMP_FILE, Registry, check_name, memctl_home, now
from ..registry.blockfile import SUFFIX
from ..registry.checkpoints import GLOB, LEGACY_GLOB
from ..registry.lock import bank_lock, holder, lock_path, pid_alive, try_lock
from ..registry.migrations import MIGRATIONS, lost_schema
from ..registry.runs import interrupt_dead_runs
from ..train.checkpoint import checkpoint_settings
from ..train.units import GENERIC

Progress = Callable[[str, int, int], None]
STAGING = re.compile(r"^\.(?P<name>.+)\.(?P<kind>staging|import)(?P<pid>\d+)$")
EXPORT = re.compile(r"^\.export(?P<pid>\d+)$")
TMP_AGE_S = 60  # a temp directory no process uses is a leftover only once it is this old
TMP_PREFIXES = ("memctl-ingest-", "memctl-ds-")  # temp directories of ingest (tempfile, under TMPDIR)


@dataclass
class Finding:
    check: (
        str  # leftovers | registry | schema | foreign_keys | blocks | files | provenance | nodes | runs | checkpoints
    )
    problem: bool  # True: unhealthy until fixed; False: a notice (work `memctl train` finishes)
    message: str
    fix: str | None = None  # the command that fixes it, when --repair does not
    repaired: bool = False


@dataclass
class DoctorReport:
    bank: str
    path: str
    exists: bool
    repair: bool
    busy: str | None = None  # who is writing to the bank, when another command holds its lock
    checked: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not any(f.problem and not f.repaired for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"healthy": self.healthy}


class _Doctor:
    def __init__(self, report: DoctorReport, repair: bool, quiet: bool, progress: Progress | None) -> None:
        self.report, self.repair, self.quiet, self.progress = report, repair, quiet, progress

    def add(self, check: str, message: str, problem: bool = True, fix: str | None = None) -> Finding:
        f = Finding(check, problem, message, fix)
        self.report.findings.append(f)
        return f

    def fixed(self, finding: Finding, action: Callable[[], Any]) -> None:
        """Run a repair when asked to; the finding records that it was repaired."""
        if self.repair:
            action()
            finding.repaired = True

    def count(self, key: str, n: int = 1) -> None:
        self.report.checked[key] = self.report.checked.get(key, 0) + n


def doctor(
    name: str, home: Path | None = None, *, repair: bool = False, progress: Progress | None = None
) -> DoctorReport:
    """Check bank `name` (and repair it with `repair`); see the module doc. Raises BankNotFound when
    there is neither a bank nor anything a killed command left behind under its name."""
    home = home or memctl_home()
    check_name(name)
    bank_dir = Registry.bank_dir(name, home)
    report = DoctorReport(name, str(bank_dir), (bank_dir / "registry.db").is_file(), repair)
    if repair:
        with bank_lock(name, home, what="memctl doctor --repair"):
            _examine(_Doctor(report, True, True, progress), bank_dir, home)
    else:
        with try_lock(name, home) as quiet:
            if not quiet:
                report.busy = holder(lock_path(name, home)) or "another memctl command"
            _examine(_Doctor(report, False, quiet, progress), bank_dir, home)
    if not report.exists and not report.findings:
        raise BankNotFound(f"no bank named {name!r} under {bank_dir.parent}, and nothing left behind under its name")
    return report


def _examine(doc: _Doctor, bank_dir: Path, home: Path) -> None:
    _leftovers(doc, bank_dir)
    if not doc.report.exists:
        if bank_dir.is_dir():
            f = doc.add("registry", f"{bank_dir} has no registry.db: it is not a usable bank")
            f.fix = f"mv '{bank_dir}' '{bank_dir}.broken'"
        return
    if not _registry_ok(doc, bank_dir):
        return
    reg = Registry(bank_dir, doc.report.bank)  # applies pending migrations (counted as repaired above)
    try:
        _blocks(doc, reg)
        _provenance(doc, reg)
        _nodes(doc, reg)
        _runs(doc, reg)
        _checkpoints(doc, reg)
        _pending(doc, reg)
        if doc.repair:
            reg.sweep_orphans()  # the files of re-queued blocks
    finally:
        reg.close()


# ---- leftovers of killed commands ---------------------------------------------------------------------
def _leftovers(doc: _Doctor, bank_dir: Path) -> None:
    name = doc.report.bank
    banks = bank_dir.parent
    if banks.is_dir():
        for p in sorted(banks.iterdir()):
            m = STAGING.match(p.name)
            if m and m["name"] == name and p.is_dir():
                _dead_dir(doc, p, int(m["pid"]), f"a killed {'ingest' if m['kind'] == 'staging' else 'import'}")
    if bank_dir.is_dir():
        for p in sorted(bank_dir.iterdir()):
            m = EXPORT.match(p.name)
            if m and p.is_dir():
                _dead_dir(doc, p, int(m["pid"]), "a killed export (a copy of the registry, with its text)")
        for sub in (bank_dir, bank_dir / "blocks", bank_dir / "checkpoints"):
            for p in sorted(sub.glob(".*.tmp*")) if sub.is_dir() else []:
                m = TMP_FILE.match(p.name)
                if m and p.is_file() and not pid_alive(int(m.group(1))):
                    f = doc.add("leftovers", f"{p}: a temp file of a killed command (pid {m.group(1)})")
                    doc.fixed(f, lambda p=p: p.unlink(missing_ok=True))
    for p in _tmp_dirs():
        pid = _tmp_pid(p.name)
        alive = pid_alive(pid) if pid is not None else _young(p) or _in_use(p)
        if not alive:
            f = doc.add("leftovers", f"{p}: a temp directory of a killed ingest (embeddings, or a data set's cache)")
            doc.fixed(f, lambda p=p: shutil.rmtree(p, ignore_errors=True))


def _dead_dir(doc: _Doctor, path: Path, pid: int, what: str) -> None:
    if pid_alive(pid):
        doc.add("leftovers", f"{path}: {what.replace('a killed', 'a running')} (pid {pid}) is using it", problem=False)
        return
    f = doc.add("leftovers", f"{path}: left by {what} (pid {pid})")
    doc.fixed(f, lambda: shutil.rmtree(path, ignore_errors=True))


def _tmp_dirs() -> list[Path]:
    root = Path(tempfile.gettempdir())
    try:
        return sorted(p for p in root.iterdir() if p.name.startswith(TMP_PREFIXES) and p.is_dir())
    except OSError:
        return []


def _tmp_pid(name: str) -> int | None:
    """`memctl-ingest-<pid>-xxxx` names its process; older names do not."""
    m = re.match(r"^memctl-[a-z]+-(\d+)-", name)
    return int(m.group(1)) if m else None


def _young(path: Path) -> bool:
    """Made (or written) in the last TMP_AGE_S seconds: an ingest may be about to open a file in it."""
    try:
        return time.time() - path.stat().st_mtime < TMP_AGE_S
    except OSError:
        return False


def _in_use(path: Path) -> bool:
    """Whether a live process has a file under `path` open or mapped (Linux /proc); True when unknown."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    target = str(path)
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (pid_dir / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd).startswith(target):
                        return True
            if target in (pid_dir / "maps").read_text(errors="replace"):
                return True
    return False


# ---- the registry ---------------------------------------------------------------------------------------
def _registry_ok(doc: _Doctor, bank_dir: Path) -> bool:
    """SQLite-level checks on a plain connection (no migration, nothing written); False: stop here."""
    db = bank_dir / "registry.db"
    name = doc.report.bank
    rebuild = (
        f"mv '{bank_dir}' '{bank_dir}.broken' && memctl import ARCHIVE --bank {name}  (or ingest its documents again)"
    )
    if db.stat().st_size == 0:
        doc.add("registry", f"{db} is empty (0 bytes): the bank's metadata is gone", fix=rebuild)
        return False
    try:
        conn = sqlite3.connect(str(db), timeout=30)
    except sqlite3.Error as e:
        doc.add("registry", f"{db} cannot be opened: {e}", fix=rebuild)
        return False
    try:
        try:
            rows = [r[0] for r in conn.execute("PRAGMA integrity_check(20)")]
        except sqlite3.DatabaseError as e:
            doc.add("registry", f"{db} is not a readable SQLite database: {e}", fix=rebuild)
            return False
        if rows != ["ok"]:
            recover = (
                f"cp -a '{bank_dir}' '{bank_dir}.bak' && sqlite3 '{db}' .recover | sqlite3 '{db}.recovered' && "
                f"mv '{db}.recovered' '{db}' && rm -f '{db}-wal' '{db}-shm' && memctl doctor --bank {name} --repair"
            )
            doc.add("registry", f"{db} fails SQLite's integrity check: {'; '.join(rows[:3])}", fix=recover)
            return False
        doc.count("registry checked")
        try:
            version = conn.execute("select max(version) from schema_migrations").fetchone()[0]
        except sqlite3.DatabaseError as e:
            doc.add("schema", f"{db} is not a memctl registry ({e})", fix=rebuild)
            return False
        if not isinstance(version, int) or version > len(MIGRATIONS):
            doc.add(
                "schema",
                f"schema version {version} is not one this memctl knows (1..{len(MIGRATIONS)})",
                fix="pip install -U memctl  (a newer memctl wrote this bank)",
            )
            return False
        lost = lost_schema(conn, version)
        if lost:
            doc.add("schema", f"{db} has lost {lost} of its schema (version {version})", fix=rebuild)
            return False
        banks = conn.execute("select count(*) from banks").fetchone()[0]
        if version < len(MIGRATIONS):
            f = doc.add("schema", f"schema version {version}, this memctl's is {len(MIGRATIONS)}", problem=False)
            f.message += ": the next command that opens the bank migrates it"
        if banks != 1:
            doc.add("registry", f"the registry holds {banks} bank rows, not one", fix=rebuild)
            return False
        _foreign_keys(doc, conn)
    finally:
        conn.close()
    return True


def _foreign_keys(doc: _Doctor, conn: sqlite3.Connection) -> None:
    bad = conn.execute("PRAGMA foreign_key_check").fetchall()  # (table, rowid, parent, fk index)
    if not bad:
        return
    by_table = Counter(r[0] for r in bad)
    what = ", ".join(f"{n} in {t}" for t, n in by_table.items())
    f = doc.add("foreign_keys", f"rows pointing to rows that do not exist: {what}")

    def delete() -> None:
        conn.execute("BEGIN IMMEDIATE")
        for table, rowid, _parent, _fk in bad:
            conn.execute(f'delete from "{table}" where rowid = ?', [rowid])  # names from SQLite itself
        conn.execute("COMMIT")

    doc.fixed(f, delete)


# ---- blocks and their files ---------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _block_fault(reg: Registry, row: dict[str, Any]) -> str | None:
    """Why a block row's file is not usable, or None."""
    from .transfer import check_block_header

    path = reg.path / row["file"]
    if path.parent != reg.blocks_dir or not path.name.endswith(SUFFIX):
        return f"its file {row['file']!r} is not in blocks/"
    if not path.is_file():
        return f"its file {row['file']} is missing"
    if _sha256(path) != row["sha256"]:
        return f"its file {row['file']} does not match its checksum"
    cfg = reg.config.memory
    try:
        check_block_header(path, cfg, row["rank"])
    except MemctlError as e:
        return f"its file {row['file']} is malformed: {e}"
    return None


def _blocks(doc: _Doctor, reg: Registry) -> None:
    rows = reg.blocks("file is not null")
    damaged: dict[str, str] = {}
    for i, row in enumerate(rows):
        if doc.progress:
            doc.progress("blocks", i, len(rows))
        why = _block_fault(reg, row)
        if why is not None and not doc.quiet:  # a writer may have just replaced it: look again
            again = reg.block(row["level"], row["idx"])
            if again is None or again["sha256"] != row["sha256"]:
                continue
        if why is not None:
            damaged[row["id"]] = why
        doc.count("block files verified")
    for bid, why in damaged.items():
        f = doc.add("blocks", f"block {bid}: {why}")
        f.message += "; --repair withdraws it and `memctl train` retrains its unit"
        doc.fixed(f, lambda bid=bid: _requeue(reg, [bid]))
    ghosts = [r["id"] for r in reg.blocks("file is null and state in ('trained', 'stale')")]
    if ghosts:
        f = doc.add("blocks", f"{len(ghosts)} block(s) marked trained with no file: {', '.join(ghosts[:5])}")
        doc.fixed(f, lambda: _requeue(reg, ghosts))
    if not doc.quiet:
        doc.add("files", f"skipped the orphan-file check: {doc.report.busy} is writing", problem=False)
        return
    used = {reg.path / r["file"] for r in rows}
    orphans = [
        p
        for p in (sorted(reg.blocks_dir.iterdir()) if reg.blocks_dir.is_dir() else [])
        if p not in used and not TMP_FILE.match(p.name)  # temp files: leftovers, above
    ]
    doc.count("files in blocks/", len(orphans) + len(used))
    if orphans:
        f = doc.add("files", f"{len(orphans)} file(s) in blocks/ that no block points to: {orphans[0].name}, ...")
        doc.fixed(f, lambda: [p.unlink() if p.is_file() else shutil.rmtree(p) for p in orphans])


def _requeue(reg: Registry, block_ids: list[str]) -> None:
    """Withdraw blocks (no file, so never served; no provenance) and mark them for `memctl train`."""
    with reg.db.atomic():
        for bid in block_ids:
            reg.db.execute(
                "update blocks set file = null, sha256 = null, state = 'damaged', trained_tokens = 0, updated = ? "
                "where id = ?",
                [now(), bid],
            )
            reg.db.execute("delete from block_docs where block_id = ?", [bid])


def _provenance(doc: _Doctor, reg: Registry) -> None:
    """A block trained on a document the bank no longer holds keeps its influence: its whole unit must
    be retrained (a unit's blocks train together). Provenance of blocks with no file is just stale."""
    ghosts = reg.db.execute(
        "select distinct bd.block_id from block_docs bd left join documents d on d.id = bd.doc_id where d.id is null"
    ).fetchall()
    if ghosts:
        k = reg.config.tree.k
        units = sorted({_unit(b[0], k) for b in ghosts})
        unit_blocks = [r["id"] for r in reg.blocks("file is not null") if _unit(r["id"], k) in units]
        f = doc.add(
            "provenance",
            f"{len(ghosts)} block(s) still shaped by documents the bank no longer holds (an interrupted or lost "
            f"forget): unit(s) {', '.join(units)}; --repair withdraws them and `memctl train` retrains them",
        )
        doc.fixed(f, lambda: _requeue(reg, unit_blocks))
    loose = reg.db.execute(
        "select count(*) from block_docs bd left join blocks b on b.id = bd.block_id "
        "where b.id is null or b.file is null"
    ).fetchone()[0]
    if loose:
        f = doc.add("provenance", f"{loose} provenance row(s) of blocks that have no file")
        doc.fixed(
            f,
            lambda: reg.db.execute(
                "delete from block_docs where block_id not in (select id from blocks where file is not null)"
            ),
        )


def _unit(block: str, k: int) -> str:
    if block == "generic":
        return GENERIC
    level, idx = (int(x) for x in block.split(":"))
    return str(subtree_of(level, idx, k))


def _nodes(doc: _Doctor, reg: Registry) -> None:
    counts: Counter[tuple[int, int]] = Counter()
    for (path,) in reg.db.execute("select path from windows"):
        if path:
            counts.update((lvl, int(n)) for lvl, n in enumerate(path.split(","), start=1))
    wrong = [
        (lvl, idx, n)
        for lvl, idx, n in reg.db.execute("select level, idx, n_windows from nodes")
        if n != counts[(lvl, idx)]
    ]
    doc.count("tree nodes checked", reg.count("nodes"))
    if wrong:
        f = doc.add("nodes", f"{len(wrong)} tree node(s) with a wrong window count (e.g. {wrong[0][0]}:{wrong[0][1]})")

        def fix() -> None:
            with reg.db.atomic():
                for lvl, idx, _n in wrong:
                    reg.db.execute(
                        "update nodes set n_windows = ? where level = ? and idx = ?", [counts[(lvl, idx)], lvl, idx]
                    )

        doc.fixed(f, fix)


# ---- runs, checkpoints and pending work -----------------------------------------------------------------------
def _runs(doc: _Doctor, reg: Registry) -> None:
    running = reg.db.execute("select id, unit from runs where status = 'running'").fetchall()
    if not running:
        return
    units = ", ".join(str(r[1]) for r in running)
    if not doc.quiet:
        doc.add("runs", f"{len(running)} run(s) in progress (unit {units}) by {doc.report.busy}", problem=False)
        return
    f = doc.add("runs", f"{len(running)} run(s) left 'running' by a killed `memctl train` (unit {units})")
    doc.fixed(f, lambda: interrupt_dead_runs(reg))


def _checkpoints(doc: _Doctor, reg: Registry) -> None:
    d = reg.path / "checkpoints"
    if not d.is_dir():
        return
    name = reg.name
    for p in sorted(d.glob(LEGACY_GLOB)):
        f = doc.add("checkpoints", f"{p.name}: a checkpoint of an older memctl (a pickle, never loaded)")
        doc.fixed(f, lambda p=p: p.unlink(missing_ok=True))
    for p in sorted(d.glob(GLOB)):
        doc.count("checkpoints")
        unit = p.name[len("unit-") : -len(SUFFIX)]
        try:
            checkpoint_settings(p)
            bad = None if unit == GENERIC or unit.isdigit() else "it names no unit"
        except MemctlError as e:
            bad = str(e).split("; pass --restart")[0]
        if bad is None:
            doc.add(
                "checkpoints",
                f"training of unit {unit} was interrupted: `memctl train --bank {name}` resumes it "
                f"(`--restart` starts over)",
                problem=False,
            )
            continue
        f = doc.add("checkpoints", f"{p.name}: {bad}; --repair drops it (the unit's training starts over)")
        doc.fixed(f, lambda p=p: p.unlink(missing_ok=True))


def _pending(doc: _Doctor, reg: Registry) -> None:
    states = dict(
        reg.db.execute(
            "select state, count(*) from blocks where state in ('stale', 'dropped', 'damaged') group by state"
        ).fetchall()
    )
    if states:
        what = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        doc.add("blocks", f"blocks to retrain ({what}): `memctl train --bank {reg.name}`", problem=False)


def iter_problems(report: DoctorReport) -> Iterator[Finding]:
    yield from (f for f in report.findings if f.problem and not f.repaired)
