"""Units trained as separate jobs (on other machines), then merged into the bank.

`train_out` trains one unit (a level-1 subtree or the generic memory) of a bank into a directory:
the unit's block files and a manifest (anchor sha256, tree and data fingerprints, bank and training
configuration, block checksums and provenance, run statistics). The bank is only read: preparation
(prompts, teacher cache) and checkpoints live in a snapshot of the registry under DIR/work, removed
when the unit is done; rerunning the command after an interruption resumes from its checkpoint.

`merge` checks every directory against the bank and against each other, then records all their
units in one transaction, with the very functions `memctl train` uses: the merged blocks are
bit-identical to those one `memctl train` process makes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.errors import BankStateError, InputError, MemctlError
from ..core.placement import AUTO, DTYPES, dtype_name, placement
from ..model.anchor import attach
from ..model.memory import PARTS
from ..registry import Registry, block_id, dumps, memctl_home, now
from ..registry.blockfile import read_block
from ..registry.checkpoints import drop_checkpoint
from ..registry.lock import bank_lock
from ..registry.private import private_dir, touch_private, write_private
from .distill import PrepareReport
from .events import TrainEvent, TrainingInterrupted
from .loop import (
    load_bank_anchor,
    prepare_training,
    sigint_flag,
    train_unit,
)
from .plan import default_dtype, plan_training
from .records import TrainedUnit, UnitResult, record_unit, run_row, write_unit
from .units import GENERIC, UnitParams, unit_of

MANIFEST = "manifest.json"
FORMAT = "memctl-unit/1"
WORK = "work"  # the registry snapshot and checkpoints of an unfinished job


def tree_fingerprint(reg: Registry) -> str:
    """sha256 of the tree's centroids (level, index, float32 bytes)."""
    h = hashlib.sha256()
    for r in reg.db.execute("select level, idx, centroid from nodes order by level, idx"):
        h.update(f"{r[0]}:{r[1]}:".encode())
        h.update(r[2])
    return h.hexdigest()


def data_fingerprint(reg: Registry) -> str:
    """sha256 of what training reads besides the tree: every window (text, route) and every prompt
    (text, answer, route, held-out flag). The teacher cache follows from these and the anchor."""
    h = hashlib.sha256()
    for sql in (
        "select id, doc_id, idx, n_tokens, path, l1, text from windows order by id",
        "select id, window_id, doc_id, kind, path, l1, held_out, text, answer from prompts order by id",
    ):
        for r in reg.db.execute(sql):
            h.update(json.dumps(list(r)).encode())
        h.update(b"|")
    return h.hexdigest()


@dataclass
class OutResult:
    bank: str
    unit: str
    out: str
    blocks: int
    result: UnitResult | None  # None when stopped before the end (max_steps)
    prepare: PrepareReport | None = None


def _unit_name(reg: Registry, subtree: int | None, generic: bool) -> str:
    if generic == (subtree is not None):
        raise InputError("--out trains one unit: give --subtree I or --generic (not both)")
    if generic:
        return GENERIC
    k = reg.config.tree.k
    if subtree is None or not 0 <= subtree < k:
        raise InputError(f"--subtree must be in 0..{k - 1}")
    if not reg.db.execute("select count(*) from windows where l1 = ?", [subtree]).fetchone()[0]:
        raise InputError(f"subtree {subtree} has no documents")
    return str(subtree)


def _snapshot(reg: Registry, work: Path) -> None:
    """A consistent copy of the registry (SQLite backup API) and its data fingerprint."""
    private_dir(work)  # 0700 (and DIR with it, when new): the snapshot holds the bank's text
    tmp = work / "registry.db.tmp"
    touch_private(tmp)
    dst = sqlite3.connect(str(tmp))
    with dst:
        reg.db.conn.backup(dst)
    dst.close()
    os.replace(tmp, work / "registry.db")
    (work / "snapshot.json").write_text(json.dumps({"data_sha256": data_fingerprint(reg), "taken": now()}))


def _claim_out(reg: Registry, out: Path, subtree: int | None, generic: bool, restart: bool) -> tuple[str, Path, Path]:
    """Check the request; (unit, output directory, its work directory holding the registry snapshot)."""
    unit = _unit_name(reg, subtree, generic)
    out = out.expanduser().resolve()
    if out.is_relative_to(reg.path):
        raise InputError(f"--out {out} is inside the bank; choose a directory outside it")
    if (out / MANIFEST).exists():
        raise InputError(f"{out} already holds a trained unit ({MANIFEST}); choose an empty directory")
    if out.exists() and (not out.is_dir() or any(p.name != WORK for p in out.iterdir())):
        raise InputError(f"{out} is not an empty directory; choose an empty one")
    work = out / WORK
    if restart:
        shutil.rmtree(work, ignore_errors=True)
    if not (work / "registry.db").is_file():
        shutil.rmtree(work, ignore_errors=True)
        _snapshot(reg, work)
    return unit, out, work


def train_out(
    name: str,
    out: Path,
    overrides: dict[str, Any] | None = None,
    *,
    subtree: int | None = None,
    generic: bool = False,
    restart: bool = False,
    home: Path | None = None,
    progress: Callable[[TrainEvent], None] | None = None,
    max_steps: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
) -> OutResult:
    """Train one unit into `out` (blocks + manifest) without modifying the bank; `device` and
    `dtype` as for `train`."""
    place = placement(device, dtype or AUTO)  # a bad --dtype fails before anything is claimed
    home = home or memctl_home()
    reg = Registry.open(name, home)
    try:
        unit, out, work = _claim_out(reg, out, subtree, generic, restart)
    finally:
        reg.close()  # a refused request leaves no connection (nor its write-ahead log) on the bank
    scratch = Registry(work, name)
    handle = None
    try:
        if dtype is None:  # as `train` does: the dtype of a checkpoint pending here, else of the bank's last run
            place = placement(device, default_dtype(scratch, checkpoint=not restart))
        snap = json.loads((work / "snapshot.json").read_text())
        all_units = [str(u) for u in sorted({r[0] for r in scratch.db.execute("select distinct l1 from windows")})]
        tcfg, _, _ = plan_training(scratch, overrides, None, True, False, place)
        anchor = load_bank_anchor(scratch, home, place)
        torch.manual_seed(tcfg.seed)
        handle = attach(anchor.model, scratch.config.memory.layers)
        # as a full `memctl train` would: split-head check on the first unit of the whole list
        prep, split_head = prepare_training(scratch, anchor, tcfg, [*all_units, GENERIC], progress)
        with sigint_flag() as flag:
            tu = train_unit(scratch, anchor, handle, unit, tcfg, 0, 1, progress, flag, max_steps, split_head)
        if tu is None:
            if flag["stop"]:
                raise TrainingInterrupted(f"training interrupted; checkpoint saved under {work}, rerun to resume")
            return OutResult(name, unit, str(out), 0, None, prep)
        files = write_unit(scratch, tu)
        blocks = []
        for (level, node), (file, sha) in sorted(files.items()):
            os.replace(work / file, out / Path(file).name)
            docs = tu.seen[(level, node)]
            blocks.append({"id": block_id(level, node), "level": level, "node": node, "file": Path(file).name})
            blocks[-1].update({"sha256": sha, "docs": docs})
        bank = scratch.bank
        manifest = {
            "format": FORMAT,
            "bank": name,
            "unit": unit,
            "anchor_sha256": bank["anchor_sha256"],
            "tree_sha256": tree_fingerprint(scratch),
            "data_sha256": snap["data_sha256"],
            "bank_config": json.loads(bank["config"]),
            "train_config": dataclasses.asdict(tcfg),
            "dtype": dtype_name(place.dtype),  # what `forget` retrains the unit in
            "blocks": blocks,
            "stats": dataclasses.asdict(tu.result),
            "finished": now(),
        }
        write_private(out / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    finally:
        if handle is not None:
            handle.detach()
        scratch.close()
    shutil.rmtree(work, ignore_errors=True)  # the snapshot holds the bank's text: do not leave it behind
    return OutResult(name, unit, str(out), len(blocks), tu.result, prep)


@dataclass
class MergeResult:
    bank: str
    units: list[str]
    blocks: int
    dirs: list[str]


def _read_manifest(d: Path) -> dict[str, Any]:
    path = d / MANIFEST
    if not path.is_file():
        raise InputError(f"{d}: no {MANIFEST}; not a directory written by `memctl train --out`")
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: unreadable manifest ({e})") from None
    keys = {"format", "unit", "anchor_sha256", "tree_sha256", "data_sha256", "bank_config", "train_config"}
    if not isinstance(m, dict) or m.get("format") != FORMAT or not keys | {"blocks", "stats"} <= set(m):
        raise InputError(f"{path}: not a {FORMAT} manifest")
    if m.get("dtype", "fp32") not in DTYPES:
        raise InputError(f"{path}: unknown compute dtype {m['dtype']!r} (fp32 or bf16)")
    return m


def _check_against_bank(reg: Registry, d: Path, m: dict[str, Any], tree: str, data: str) -> None:
    bank = reg.bank
    if m["anchor_sha256"] != bank["anchor_sha256"]:
        raise BankStateError(f"{d}: trained on another anchor than bank {reg.name!r} (sha256 differs)")
    if m["bank_config"] != json.loads(bank["config"]):
        raise BankStateError(f"{d}: trained with another bank configuration than {reg.name!r}")
    if m["tree_sha256"] != tree:
        raise BankStateError(f"{d}: trained on another tree than bank {reg.name!r} (re-clustered or another bank)")
    if m["data_sha256"] != data:
        raise BankStateError(
            f"{d}: the documents or prompts of bank {reg.name!r} changed since this unit was trained; train it again"
        )


def _load_unit(reg: Registry, d: Path, m: dict[str, Any]) -> TrainedUnit:
    """The unit a directory holds, as `train_unit` returned it, with every block file verified."""
    cfg = reg.config
    name = str(m["unit"])
    if name != GENERIC and not (name.isdigit() and int(name) < cfg.tree.k):
        raise InputError(f"{d}: unit {name!r} is not a unit of a tree with k={cfg.tree.k}")
    unit = unit_of(cfg, name)
    params = UnitParams(cfg, unit)
    seen: dict[tuple[int, int], dict[str, int]] = {}
    for b in m["blocks"]:
        try:
            level, node, file, sha, docs = int(b["level"]), int(b["node"]), str(b["file"]), str(b["sha256"]), b["docs"]
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{d}: malformed block entry in {MANIFEST}") from None
        pos = next((i for i, (lvl, first, n) in enumerate(unit.levels) if lvl == level and 0 <= node - first < n), None)
        if pos is None or (level, node) in seen or Path(file).name != file:
            raise InputError(f"{d}: block {level}:{node} ({file}) does not belong to unit {name} or is listed twice")
        path = d / file
        if not path.is_file():
            raise InputError(f"{d}: block file {file} is missing")
        if hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            raise InputError(f"{d}: block file {file} does not match its checksum; it was changed or corrupted")
        try:
            tensors = read_block(path, sha)
        except MemctlError as e:
            raise InputError(f"{d}: {e}") from None
        local = node - unit.levels[pos][1]
        with torch.no_grad():
            for p in PARTS:
                dst = params.tensors[pos][p][local]
                if p not in tensors or tensors[p].shape != dst.shape or tensors[p].dtype != dst.dtype:
                    raise InputError(f"{d}: block file {file} does not have the bank's block shape")
                dst.copy_(tensors[p])
        seen[(level, node)] = {str(k): int(v) for k, v in docs.items()}
    try:
        result = UnitResult(**m["stats"])
    except TypeError:
        raise InputError(f"{d}: malformed run statistics in {MANIFEST}") from None
    return TrainedUnit(result, unit, params, seen)


def merge(name: str, dirs: list[Path], *, home: Path | None = None) -> MergeResult:
    """Check every directory, then record all their units in one transaction (or nothing)."""
    if not dirs:
        raise InputError("give at least one directory written by `memctl train --out`")
    with bank_lock(name, home):  # one writer at a time (memctl.registry.lock)
        return _merge(name, dirs, home or memctl_home())


def _merge(name: str, dirs: list[Path], home: Path) -> MergeResult:
    reg = Registry.open(name, home)
    try:
        tree, data = tree_fingerprint(reg), data_fingerprint(reg)
        loaded: list[tuple[Path, dict[str, Any], TrainedUnit]] = []
        by_unit: dict[str, Path] = {}
        for d in (Path(x).expanduser().resolve() for x in dirs):
            m = _read_manifest(d)
            _check_against_bank(reg, d, m, tree, data)
            unit = str(m["unit"])
            if unit in by_unit:
                raise InputError(f"{by_unit[unit]} and {d} both hold unit {unit}; merge only one of them")
            if loaded and m["train_config"] != loaded[0][1]["train_config"]:
                raise InputError(f"{d} was trained with other settings than {loaded[0][0]}; retrain it alike")
            by_unit[unit] = d
            loaded.append((d, m, _load_unit(reg, d, m)))
        try:
            files = [write_unit(reg, tu) for _, _, tu in loaded]
            with reg.db.atomic():
                for (_, m, tu), f in zip(loaded, files, strict=True):
                    record_unit(reg, tu, f)
                    run = {"started": m.get("finished") or now(), "unit": tu.unit.name, "dtype": m.get("dtype", "fp32")}
                    reg.db["runs"].insert({**run, "config": dumps(m["train_config"]), **run_row(tu.result)})
        finally:
            reg.sweep_orphans()  # the replaced files, or ours when the transaction failed
        for unit in by_unit:
            drop_checkpoint(reg.checkpoint_dir(), unit)  # superseded
        n_blocks = sum(len(m["blocks"]) for _, m, _ in loaded)
        return MergeResult(name, list(by_unit), n_blocks, [str(d) for d, _, _ in loaded])
    finally:
        reg.close()
