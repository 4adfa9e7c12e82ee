"""Where banks live and what a bank may be called (no SQL, no files opened)."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

from ..core.errors import InputError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def memctl_home() -> Path:
    return Path(os.environ.get("MEMCTL_HOME") or Path.home() / ".memctl").expanduser()


def check_name(name: str) -> str:
    """A bank name is one plain path component: no separator, no '..', no leading '.', not empty."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise InputError(
            f"bad bank name {name!r}: use letters, digits, '_', '-' or '.', starting with a letter or digit, "
            "without '..' (max 64)"
        )
    return name
