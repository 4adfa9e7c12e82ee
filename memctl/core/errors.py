"""Errors the library raises on bad input or state. Each message says what to fix.

The CLI turns any MemctlError into one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import os


class MemctlError(Exception):
    """Base class: a problem the user can fix; `str(err)` is the one line to show."""

    exit_code = 1


class InputError(MemctlError):
    """Bad command-line input or bad input files."""

    exit_code = 2


class BankNotFound(MemctlError):
    """The named bank does not exist under MEMCTL_HOME."""


class BankStateError(MemctlError):
    """The bank is not in a state that allows the requested operation."""


class AnchorError(MemctlError):
    """The anchor model cannot be found, loaded or fitted with memories."""


class IntegrityError(MemctlError):
    """A block file is missing or its checksum does not match the registry."""


def check_text(text: str, what: str) -> str:
    """`text` as given, or InputError when it is not valid UTF-8: bytes the terminal, a pipe or a file
    system could not decode reach Python as lone surrogates, which no tokenizer or SQLite column takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = text[e.start]
        bad = f"byte 0x{ord(ch) - 0xDC00:02X}" if "\udc80" <= ch <= "\udcff" else f"U+{ord(ch):04X}"
        before = text[: e.start][-20:]
        raise InputError(f"{what} is not valid UTF-8 text ({bad} after {before!r}); give it in UTF-8") from None
    return text


def check_path(path: str | os.PathLike[str], what: str) -> str:
    """`path` as text, or InputError naming the whole path when it is not valid UTF-8: a name the file system
    could not decode reaches Python as lone surrogates, which no SQLite column (a source, a log entry) takes.
    The message shows each such byte as \\xNN, so the file can be found and renamed."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = text.encode("utf-8", "surrogateescape" if _escaped_only(text) else "backslashreplace")
        named = shown.decode("utf-8", "backslashreplace")
        raise InputError(f"{what} {named} is not valid UTF-8 (the bytes shown as \\xNN); rename it") from None
    return text


def _escaped_only(text: str) -> bool:
    """Are the string's surrogates all the escapes of undecodable bytes (U+DC80..U+DCFF)?"""
    return all("\udc80" <= ch <= "\udcff" for ch in text if "\ud800" <= ch <= "\udfff")
