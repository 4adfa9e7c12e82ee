"""What `memctl info` shows of a bank, as plain data: its configuration, sizes, training state,
access, tags and coverage, each read from the registry (no model is loaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import IntegrityError
from ..registry import Registry, doctor_hint
from ..registry.access import check_allow, parse_tags, reach_by_level
from ..registry.checkpoints import LEGACY_GLOB, pending_checkpoints
from ..train.coverage import coverage_report
from ..train.reprompt import outdated_note, rules_state


def info(name: str, home: Path | None = None, allow: frozenset[str] | None = None) -> dict[str, Any]:
    """Everything `memctl info` shows, as plain data. With `allow` tags, also how many blocks per
    level a session with those tags can reach."""
    check_allow(allow)
    reg = Registry.open(name, home)
    check = reg.db.execute("PRAGMA quick_check").fetchone()  # reads every page: a damaged one shows here
    if not check or check[0] != "ok":
        why = check[0] if check else "?"
        raise IntegrityError(f"the registry of bank {name!r} is damaged ({why}); {doctor_hint(name)}")
    cfg = reg.config
    row = reg.bank
    anchor_params = row["anchor_params"]
    levels = []
    for lvl in range(1, cfg.tree.p + 1):
        sizes = [r["n_windows"] for r in reg.db.query("select n_windows from nodes where level = ?", [lvl])]
        states = {
            r["state"]: r["n"]
            for r in reg.db.query("select state, count(*) as n from blocks where level = ? group by state", [lvl])
        }
        levels.append(
            {
                "level": lvl,
                "rank": cfg.memory.ranks[lvl - 1],
                "blocks": cfg.tree.k**lvl,
                "block_params": cfg.memory.block_params(lvl),
                "nonempty_nodes": sum(1 for s in sizes if s > 0),
                "windows_per_nonempty_node": (sum(sizes) / max(1, sum(1 for s in sizes if s > 0))),
                "states": states,
            }
        )
    generic = reg.block(0, 0)
    runs = [dict(r) for r in reg.db.query("select * from runs order by id")]
    fetched = cfg.memory.fetched_params
    return {
        "bank": name,
        "path": str(reg.path),
        "anchor": {
            "spec": cfg.anchor,
            "path": row["anchor"],
            "sha256": row["anchor_sha256"],
            "params": anchor_params,
            "layers": row["anchor_layers"],
        },
        "embedder": cfg.embedder,
        "window": cfg.window,
        "tree": {"k": cfg.tree.k, "p": cfg.tree.p, "seed": cfg.tree.seed},
        "routing": cfg.routing,
        "lexical": cfg.lexical,
        "memory": {
            "ranks": list(cfg.memory.ranks),
            "layers": len(cfg.memory.layers),
            "first_layer": cfg.memory.layers[0],
            "hidden": cfg.memory.hidden,
        },
        "documents": reg.count("documents"),
        "windows": reg.count("windows"),
        "tokens": reg.db.execute("select coalesce(sum(n_tokens), 0) from windows").fetchone()[0],
        "fetched_params": fetched,
        "fetched_ratio": fetched / anchor_params if anchor_params else None,
        "bank_params": cfg.memory.bank_params(cfg.tree.k),
        "bank_bytes_full": 4 * cfg.memory.bank_params(cfg.tree.k),
        "bytes_on_disk": reg.bytes_on_disk(),
        "levels": levels,
        "generic": {"state": generic["state"] if generic else None, "params": fetched},
        "training": training_state(reg),
        "runs": runs,
        "access": {"allow": sorted(allow) if allow is not None else None, "levels": reach_by_level(reg, allow)},
        "tags": _tag_counts(reg),
        "references": reg.count("reference_docs"),
        "forget_reports": reg.count("forget_reports"),
        "coverage": coverage_report(reg, runs),
        "prompt_rules": {**rules_state(reg).to_dict(), "note": outdated_note(reg)},
    }


def _tag_counts(reg: Registry) -> dict[str, int]:
    counts: dict[str, int] = {}
    for (tags,) in reg.db.execute("select tags from documents"):
        for t in parse_tags(tags or "") or {"(untagged)"}:
            counts[t] = counts.get(t, 0) + 1
    return dict(sorted(counts.items()))


def missing_files(reg: Registry) -> list[str]:
    """Ids of blocks whose row names a file that is not there (a stat each, no read): `doctor` says more."""
    rows = reg.db.execute("select id, file from blocks where file is not null")
    return [r[0] for r in rows if not (reg.path / r[1]).is_file()]


def bank_missing_files(name: str) -> list[str]:
    """`missing_files` of bank `name`."""
    reg = Registry.open(name)
    try:
        return missing_files(reg)
    finally:
        reg.close()


def training_state(reg: Registry) -> str:
    missing = missing_files(reg)
    if missing:
        return (
            f"damaged: {len(missing)} block file(s) missing ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); {doctor_hint(reg.name)}, then `memctl train --bank {reg.name}`"
        )
    states = {
        r["state"]: r["n"]
        for r in reg.db.query("select state, count(*) as n from blocks where state != 'init' group by state")
    }
    if list(reg.checkpoint_dir().glob(LEGACY_GLOB)):
        return "interrupted by an older memctl; run `memctl train --restart` (its checkpoints are not loaded)"
    ckpts = pending_checkpoints(reg.checkpoint_dir())
    if ckpts:
        return f"interrupted ({len(ckpts)} unit checkpoint(s)); run `memctl train` to resume"
    if not states:
        return "untrained"
    notes = []
    if states.get("stale"):
        notes.append(f"{states['stale']} stale block(s) after new documents")
    if states.get("dropped"):
        notes.append(f"{states['dropped']} block(s) dropped by forget")
    if states.get("damaged"):
        notes.append(f"{states['damaged']} damaged block(s) re-queued by doctor")
    if states.get("withheld"):
        notes.append(f"{states['withheld']} block(s) withheld by the export this bank came from")
    if not notes:
        return "trained"
    return "trained, " + "; ".join(notes) + " (`memctl train` retrains their units on the documents held here)"
