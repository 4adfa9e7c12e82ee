"""Files and directories that hold a bank's private data: the owner's alone, whatever the umask.

Directories are created 0700 and files 0600 (set explicitly after creation, so a lax umask cannot
widen them and a strict one cannot lock the owner out). Files are written whole: a temp file,
fsync, then one rename, so a reader sees the old file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create `path` and its missing parents 0700 (directories that exist are left as they are)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:  # made meanwhile by another process: theirs to set
            continue
        os.chmod(d, DIR_MODE)
    return path


def create_private(path: Path) -> int:
    """Create `path` (it must not exist) 0600 and open it for writing; returns the descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def touch_private(path: Path) -> None:
    """Create an empty file 0600 unless one exists (for SQLite to open: it would create it 0644)."""
    if path.exists():
        return
    with contextlib.suppress(FileExistsError):
        os.close(create_private(path))


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (temp file, fsync, rename), 0600."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)  # left by a killed process that had our pid
    fd = create_private(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (not every platform lets a directory be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
