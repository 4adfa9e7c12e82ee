"""A bank archive's format, and the checks an import makes of it before writing a byte.

An archive (see memctl/ops/transfer.py) is a plain tar of exactly `manifest.json`, `registry.db` and
`blocks/<file>` per exported block. `check_members` admits only those names, as regular files, each
once; `read_manifest` reads and type-checks the manifest; `check_sizes` holds every member to the
size the manifest gives it and the whole to the size of the archive, so nothing expands on the way in.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path
from typing import Any

from ..core.errors import InputError, IntegrityError

FORMAT = "memctl-bank"
VERSION = 1
MANIFEST, REGISTRY, BLOCKS = "manifest.json", "registry.db", "blocks/"
BLOCK_FILE = re.compile(r"^(L\d{1,2}-\d{6,12}|generic)\.[0-9a-f]{16}\.safetensors$")
MAX_MANIFEST = 64 * 2**20
KEYS = ("format", "version", "bank", "created", "schema_version", "anchor_sha256", "config", "allow")
KEYS += ("registry_sha256", "blocks")
BLOCK_KEYS = {"id": str, "level": int, "idx": int, "file": str, "sha256": str, "bytes": int}


def check_members(tar: tarfile.TarFile, archive: Path) -> dict[str, tarfile.TarInfo]:
    """Only regular files with the names an export writes, each once; manifest and registry present."""
    try:
        infos = tar.getmembers()
    except (tarfile.TarError, OSError) as e:
        raise InputError(f"{archive} is truncated or corrupted: {e}") from None
    members: dict[str, tarfile.TarInfo] = {}
    for m in infos:
        if not m.isreg():
            kind = "link" if m.issym() or m.islnk() else "directory" if m.isdir() else "special file"
            raise InputError(f"{archive}: member {m.name!r} is a {kind}; a bank archive holds only regular files")
        ok = m.name in (MANIFEST, REGISTRY) or (m.name.startswith(BLOCKS) and BLOCK_FILE.match(m.name[len(BLOCKS) :]))
        if not ok:
            raise InputError(
                f"{archive}: unexpected member {m.name!r}; a bank archive holds only {MANIFEST}, {REGISTRY} and "
                f"{BLOCKS}*.safetensors"
            )
        if m.issparse():  # its stored data expands to `size` bytes: an archive bomb, and export never writes one
            raise InputError(f"{archive}: member {m.name!r} is a sparse file; a bank archive holds only plain files")
        if m.name in members:
            raise InputError(f"{archive}: member {m.name!r} appears twice")
        members[m.name] = m
    for need in (MANIFEST, REGISTRY):
        if need not in members:
            raise InputError(f"{archive} has no {need}; it is not a bank archive from `memctl export`")
    return members


def read_manifest(tar: tarfile.TarFile, info: tarfile.TarInfo, archive: Path) -> dict[str, Any]:
    if info.size > MAX_MANIFEST:
        raise InputError(f"{archive}: {MANIFEST} is {info.size} bytes, too big for a bank manifest")
    try:
        src = tar.extractfile(info)
        assert src is not None  # a regular file
        manifest = json.loads(src.read())
    except (tarfile.TarError, OSError, ValueError) as e:
        raise InputError(f"{archive}: {MANIFEST} is not readable JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError(f"{archive}: {MANIFEST} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise InputError(
            f"{archive}: archive format version {manifest.get('version')!r} is not {VERSION}; upgrade memctl"
        )
    missing = [k for k in KEYS if k not in manifest]
    if missing:
        raise InputError(f"{archive}: {MANIFEST} lacks {', '.join(missing)}")
    blocks = manifest["blocks"]
    good = isinstance(blocks, list) and all(
        isinstance(b, dict) and all(isinstance(b.get(k), t) for k, t in BLOCK_KEYS.items()) for b in blocks
    )
    good = good and all(isinstance(manifest[k], str) for k in ("bank", "anchor_sha256", "config", "registry_sha256"))
    if not good or not (manifest["allow"] is None or isinstance(manifest["allow"], list)):
        raise InputError(f"{archive}: {MANIFEST} is malformed (a field has the wrong type)")
    return manifest


def check_sizes(members: dict[str, tarfile.TarInfo], manifest: dict[str, Any], archive: Path) -> None:
    """Before a byte is written: every block member has the size the manifest gives it, and no member
    is larger than the archive could hold (so nothing expands beyond the file it came in)."""
    listed = {b["file"]: b["bytes"] for b in manifest["blocks"]}
    try:
        room = archive.stat().st_size
    except OSError:
        room = 0
    total = 0
    for arc, info in members.items():
        total += info.size
        if arc.startswith(BLOCKS):
            if arc not in listed:
                raise IntegrityError(f"{archive}: the archive has extra block file {arc} (not in the manifest)")
            if info.size != listed[arc]:
                raise IntegrityError(
                    f"{archive}: member {arc!r} is {info.size} bytes but the manifest says {listed[arc]}; "
                    "the archive was altered"
                )
        elif (
            arc == REGISTRY
            and isinstance(manifest.get("registry_bytes"), int)
            and info.size != manifest["registry_bytes"]
        ):
            raise IntegrityError(
                f"{archive}: {REGISTRY} is {info.size} bytes but the manifest says {manifest['registry_bytes']}"
            )
    if room and total > room:
        raise InputError(
            f"{archive}: its members claim {total:,} bytes, more than the archive's {room:,}; it is corrupted"
        )
