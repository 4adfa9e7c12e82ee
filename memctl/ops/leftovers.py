"""Temporary files of an export, and what a killed one leaves behind.

`export` cannot clean up after SIGKILL. Its archive is written to an unnamed file (O_TMPFILE, Linux)
that is named only once whole, so a kill leaves nothing of it; where the file system has no unnamed
files it is written to `.<archive name>.part<pid>` next to the archive. Its working snapshot of the
registry, which holds the bank's full text, is `banks/<bank>/.export<pid>/`. `export_leftovers` finds
those of dead processes, `sweep_export_leftovers` removes them; each export runs the sweep first, and
`memctl doctor` can.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..registry.private import create_private

EXPORT_WORK_GLOB = ".export*"  # directories in the bank's directory: .export<pid>
EXPORT_PART = re.compile(r"^\.(?P<name>.+)\.part(?P<pid>\d+)$")  # next to the archive: .<archive name>.part<pid>


def _dead(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, OverflowError):
        return False
    return False


def export_leftovers(bank_dir: Path, archive: Path | None = None) -> list[Path]:
    """Leftovers of killed exports: `.export<pid>` directories in `bank_dir` (and, given an archive
    path, `.<name>.part<pid>` files next to it) whose process is gone."""
    found = [
        p
        for p in Path(bank_dir).glob(EXPORT_WORK_GLOB)
        if p.name[len(".export") :].isdigit() and _dead(p.name[len(".export") :])
    ]
    if archive is not None and archive.parent.is_dir():
        for p in archive.parent.glob(f".{glob_escape(archive.name)}.part*"):
            m = EXPORT_PART.match(p.name)
            if m and m["name"] == archive.name and _dead(m["pid"]):
                found.append(p)
    return found


def sweep_export_leftovers(bank_dir: Path, archive: Path | None = None) -> list[Path]:
    """Remove what `export_leftovers` finds; returns the paths removed."""
    gone = export_leftovers(bank_dir, archive)
    for p in gone:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return gone


def archive_file(directory: Path, part: Path) -> tuple[int, bool]:
    """A 0600 file for the archive being written: an unnamed one (O_TMPFILE, Linux), which vanishes if the
    export is killed, else the named `part` (swept by the next export). Returns (descriptor, named)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if flag and Path("/proc/self/fd").is_dir():
        try:
            fd = os.open(directory, flag | os.O_WRONLY, 0o600)
            os.fchmod(fd, 0o600)
            return fd, False
        except OSError:  # a file system without unnamed files
            pass
    part.unlink(missing_ok=True)  # left by a killed process that had our pid
    return create_private(part), True


def name_unnamed(fd: int, path: Path) -> None:
    """Give the unnamed file open as `fd` the name `path` (linkat through /proc, following its link)."""
    path.unlink(missing_ok=True)  # left by a killed process that had our pid
    proc = os.open("/proc/self", os.O_RDONLY)
    try:
        os.link(f"fd/{fd}", path, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)
