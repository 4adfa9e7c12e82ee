"""One writer at a time per bank: an advisory lock (flock) on `banks/.NAME.lock`.

Every command that changes a bank (ingest, train, forget, block, unblock, merge, import, doctor
--repair) holds the bank's writer lock from before it reads what it will change until after its
last write and sweep, so two writers never interleave: a second one waits (saying who it waits
for), or fails at once under `--no-wait`. Readers (ask, chat, eval, browse) never take it: SQLite's
WAL gives them a consistent snapshot and block files are content-named and replaced whole.

The lock file sits beside the bank's directory, not in it, so a bank being created (ingest, import)
is locked by name before its directory exists. A writer that ends with no such bank (it failed, or
the bank was never there) removes the lock file, and the directories it made for it, before it lets
go: a waiter that then gets the flock of the removed file locks the new one instead. The kernel
releases a flock when its holder dies, so a killed command never leaves the bank locked. The lock
is re-entrant within a thread (a library call that takes it may call another that does); two
threads, like two processes, exclude each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..core.errors import BankStateError
from .paths import check_name, memctl_home
from .private import FILE_MODE, private_dir

POLL_S = 0.2  # how often a waiting writer tries again
F = TypeVar("F", bound=Callable[..., Any])


class BankBusy(BankStateError):
    """Another command is writing to the bank and the caller asked not to wait."""

    exit_code = 75  # EX_TEMPFAIL: try again later


@dataclass(frozen=True)
class Policy:
    """What a writer does when the bank is busy: wait (telling `notify` once) or fail at once."""

    wait: bool = True
    notify: Callable[[str], None] | None = None
    timeout: float | None = None  # seconds; None waits for as long as it takes


_policy: ContextVar[Policy | None] = ContextVar("memctl_lock_policy", default=None)
_held = threading.local()  # lock path -> (file descriptor, depth) held by this thread


@contextmanager
def policy(
    wait: bool = True, notify: Callable[[str], None] | None = None, timeout: float | None = None
) -> Iterator[None]:
    """Set how writers started inside this block (in this thread) treat a busy bank (the CLI's `--no-wait`)."""
    token = _policy.set(Policy(wait, notify, timeout))
    try:
        yield
    finally:
        _policy.reset(token)


def lock_path(name: str, home: Path | None = None) -> Path:
    return (home or memctl_home()) / "banks" / f".{check_name(name)}.lock"


def holder(path: Path) -> str:
    """Who holds (or last held) the lock, as its holder wrote it: 'memctl train (pid 123)'."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return text.splitlines()[0][:200] if text else ""


def _command() -> str:
    args = [os.path.basename(sys.argv[0] or "python")] + sys.argv[1:3]
    if args[0] in ("__main__.py", "-m", "-c"):
        args[0] = "memctl"
    return " ".join(a for a in args if not a.startswith("-")) or "memctl"


def _held_map() -> dict[str, tuple[int, int]]:
    if not hasattr(_held, "locks"):
        _held.locks = {}
    return _held.locks


def is_held(name: str, home: Path | None = None) -> bool:
    """Whether this thread holds the bank's writer lock."""
    return os.path.abspath(lock_path(name, home)) in _held_map()


@contextmanager
def bank_lock(
    name: str, home: Path | None = None, *, wait: bool | None = None, what: str | None = None
) -> Iterator[bool]:
    """Hold bank `name`'s writer lock for the block; yields whether it had to wait for another writer.
    `wait` overrides the ambient policy (see `policy`); a busy bank raises BankBusy when not waiting."""
    path = lock_path(name, home)
    key = os.path.abspath(path)  # one key per file, however `home` was spelt
    held = _held_map()
    if key in held:  # re-entrant within this thread
        fd, depth = held[key]
        held[key] = (fd, depth + 1)
        try:
            yield False
        finally:
            fd, depth = held[key]
            held[key] = (fd, depth - 1)
        return
    pol = _policy.get() or Policy()
    if wait is None:
        wait = pol.wait
    made = _missing_dirs(path.parent)  # made for this lock: removed with it when no bank comes of it
    fd, waited = _open_locked(path, name, wait, pol)
    try:
        me = f"{what or _command()} (pid {os.getpid()})"
        with contextlib.suppress(OSError):  # the note is for people; the flock is the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{me}\n".encode(), 0)
        held[key] = (fd, 1)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield waited
    finally:
        del held[key]
        try:
            if not (path.parent / name).exists():  # no bank: leave nothing behind (still holding the flock)
                _remove(path, made)
        finally:
            os.close(fd)  # closing the descriptor releases the flock


def _missing_dirs(path: Path) -> list[Path]:
    """`path` and its parents that do not exist, deepest first."""
    missing = []
    while not path.exists() and path.parent != path:
        missing.append(path)
        path = path.parent
    return missing


def _open_locked(path: Path, name: str, wait: bool, pol: Policy) -> tuple[int, bool]:
    """A descriptor of the lock file now at `path`, flocked; and whether it waited for another writer."""
    waited = False
    while True:
        private_dir(path.parent)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except FileNotFoundError:  # its directory was removed meanwhile by a writer of no bank
            continue
        try:
            waited = _acquire(fd, path, name, wait, pol) or waited
            if _same_file(fd, path):
                return fd, waited
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it while we waited: lock the file at `path` now


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fs = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fs.st_dev, fs.st_ino)


def _remove(path: Path, made: list[Path]) -> None:
    """Remove the lock file of a bank that is not there, and the empty directories made for it."""
    with contextlib.suppress(OSError):
        path.unlink()
    for d in made:  # deepest first; one that holds something now (another writer's lock) stays
        try:
            d.rmdir()
        except OSError:
            break


def _acquire(fd: int, path: Path, name: str, wait: bool, pol: Policy) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        pass
    who = holder(path) or "another memctl command"
    if not wait:
        raise BankBusy(
            f"bank {name!r} is being written by {who}; try again when it finishes, or drop --no-wait to wait for it"
        )
    if pol.notify is not None:
        pol.notify(f"bank {name!r} is being written by {who}; waiting for it to finish (--no-wait fails at once)")
    start = time.monotonic()
    while True:
        time.sleep(POLL_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if pol.timeout is not None and time.monotonic() - start > pol.timeout:
                raise BankBusy(f"bank {name!r} is still being written by {who} after {pol.timeout:.0f} s") from None


@contextmanager
def try_lock(name: str, home: Path | None = None, what: str = "memctl doctor") -> Iterator[bool]:
    """Hold the lock if it is free (yields True), else do nothing (yields False). For `doctor`: a free
    lock means no writer is alive, so 'running' runs and uncommitted files are a dead writer's."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(bank_lock(name, home, wait=False, what=what))
            got = True
        except BankBusy:
            got = False
        yield got


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (a reused id reads as alive: leftovers are then kept)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer(fn: F) -> F:
    """Decorate a library function whose first argument is a bank's name (and which takes `home=`):
    it runs holding that bank's writer lock."""

    @functools.wraps(fn)
    def locked(name: str, *args: Any, **kwargs: Any) -> Any:
        with bank_lock(name, kwargs.get("home")):
            return fn(name, *args, **kwargs)

    return locked  # type: ignore[return-value]
