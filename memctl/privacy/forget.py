"""Forgetting: remove documents and their influence, then prove it.

A document's influence lives only in the blocks its samples trained (the anchor is frozen), and
every level-1 subtree trains as an isolated unit. So:

* `exact` (default): every unit the document touched (its level-1 subtree(s), because deeper blocks
  trained jointly with the shallow block, and the generic memory) is retrained from its seeded
  initial state on the remaining documents, with the configuration it was trained with. The result
  is bit-identical to a bank trained from scratch without the document (SISA-style).
* `drop`: those units' blocks are deleted now and left for `memctl train` to retrain.

Nothing is visible until one transaction removes the documents (windows, embeddings, prompts,
provenance) and switches the blocks; an interruption before it leaves the bank as it was. Then the
replaced block files and checkpoints are deleted and SQLite (secure_delete on) is vacuumed.

The proof (memctl.privacy.proof) compares each forgotten document's memorisation gains (text and facts)
before and after with those of reference documents the bank never saw (`memctl ingest --reference`).
With a probe file, its probes' accuracy and that of retained documents are measured before and
after too.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.config import TrainConfig
from ..core.errors import InputError, MemctlError
from ..core.probes import Probe, is_correct
from ..core.tree import subtree_of
from ..eval.evaluate import evaluate
from ..registry import Registry, dumps, memctl_home, now
from ..registry.access import parse_tags
from ..registry.checkpoints import drop_checkpoint, has_checkpoint
from ..registry.lock import bank_lock
from ..serve.session import BankSession
from ..train.loop import TrainEvent, head_split_ok, sigint_flag, train_unit
from ..train.preserve import prepare_pool
from ..train.records import TrainedUnit, record_unit, write_unit
from ..train.units import GENERIC, unit_of
from .controls import check_docs, doc_blocks
from .proof import MIN_REFERENCES, DocText, baseline, gains, judge, measure, zscores
from .retrain import last_training, trainers

MODES = ("exact", "drop")
Progress = Callable[[str, int, int], None]
NEEDLE_CHARS = 20  # text fragments at least this long are searched for in the bank's files
MAX_NEEDLES = 16


class ForgetInterrupted(MemctlError):
    exit_code = 130


@dataclass
class ForgetPlan:
    bank: str
    mode: str
    docs: list[str]
    windows: int
    prompts: int
    shaped_blocks: list[str]  # blocks the documents' samples trained
    units: list[str]  # units to retrain (exact) or whose blocks are dropped (drop)
    unit_blocks: int  # trained blocks in those units (replaced or deleted)
    tokens: int  # tokens per epoch the retraining runs over (exact)
    est_seconds: float | None  # what training those units took last time


@dataclass
class DocProof:
    doc: str
    loss_anchor: float  # mean token loss of the document's windows, anchor alone
    loss_before: float  # ... with the bank before forgetting
    loss_after: float
    gain_before: float  # anchor loss - bank loss: what the memories could recite of the text
    gain_after: float
    fact_gain_before: float  # the same on the answers of the document's cloze prompts: what they knew
    fact_gain_after: float
    z_before: float  # text gain in reference standard deviations above the references' mean
    z_after: float
    fact_z_before: float
    fact_z_after: float
    verdict: str  # after forgetting: unseen | SEEN | unverified (fewer than 3 references)
    probes_before: list[int] | None = None  # [correct, n]
    probes_after: list[int] | None = None


@dataclass
class ForgetReport:
    bank: str
    mode: str
    docs: list[str]
    units: list[str]
    blocks_replaced: int
    blocks_dropped: int
    files_deleted: int
    seconds: float
    proofs: list[DocProof] = field(default_factory=list)
    reference: dict[str, Any] = field(default_factory=dict)  # gains of unseen documents (proof.Baseline)
    retained_probes: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    report_id: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- planning ----------------------------------------------------------------------------------------
def select_docs(reg: Registry, docs: Sequence[str], sources: Sequence[str], tags: Sequence[str]) -> list[str]:
    """Document ids given directly, by source path (a file, or a directory holding them) or by tag."""
    ids = check_docs(reg, docs) if docs else []
    for src in sources:
        want = Path(src).expanduser()
        hits = []
        for doc_id, source in reg.db.execute("select id, source from documents"):
            p = Path(source)
            if source == src or p == want or want.resolve() in (p.resolve(), *p.resolve().parents):
                hits.append(doc_id)
        if not hits:
            raise InputError(f"no document of bank {reg.name!r} comes from {src!r}")
        ids.extend(hits)
    for tag in parse_tags(list(tags)):
        hits = [d for d, t in reg.db.execute("select id, tags from documents") if tag in parse_tags(t or "")]
        if not hits:
            raise InputError(f"no document of bank {reg.name!r} has tag {tag!r}")
        ids.extend(hits)
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise InputError("say what to forget: --doc ID, --source PATH or --tag NAME")
    return ids


def _units_with_data(reg: Registry, names: Sequence[str]) -> list[str]:
    """Those units that hold a trained block or an interrupted checkpoint."""
    cfg = reg.config
    out = []
    for name in names:
        unit = unit_of(cfg, name)
        trained = any(
            reg.db.execute(
                "select count(*) from blocks where level = ? and idx >= ? and idx < ? and file is not null",
                [level, first, first + n],
            ).fetchone()[0]
            for level, first, n in unit.levels
        )
        if trained or has_checkpoint(reg.checkpoint_dir(), name):
            out.append(name)
    return out


def affected_units(reg: Registry, doc_ids: Sequence[str]) -> list[str]:
    """Units the documents can have influenced: the level-1 subtrees of every block they shaped or
    whose windows or prompts they own (held-out prompts steer early stopping), and the generic memory
    (its sample order depends on the whole corpus)."""
    k = reg.config.tree.k
    l1s = {subtree_of(level, idx, k) for level, idx in doc_blocks(reg, doc_ids) if level > 0}
    marks = ",".join("?" for _ in doc_ids)
    l1s |= {r[0] for r in reg.db.execute(f"select distinct l1 from prompts where doc_id in ({marks})", list(doc_ids))}
    return _units_with_data(reg, [str(u) for u in sorted(l1s)] + [GENERIC])


def plan_forget(
    name: str,
    docs: Sequence[str] = (),
    sources: Sequence[str] = (),
    tags: Sequence[str] = (),
    mode: str = "exact",
    home: Path | None = None,
) -> ForgetPlan:
    """What forgetting would remove and retrain, and about how long it takes; changes nothing."""
    if mode not in MODES:
        raise InputError(f"--mode must be exact or drop, got {mode!r}")
    reg = Registry.open(name, home)
    try:
        ids = select_docs(reg, docs, sources, tags)
        marks = ",".join("?" for _ in ids)
        shaped = sorted(
            {r[0] for r in reg.db.execute(f"select block_id from block_docs where doc_id in ({marks})", ids)}
        )
        units = affected_units(reg, ids)
        cfg = reg.config
        unit_blocks = 0
        for u in units:
            for level, first, n in unit_of(cfg, u).levels:
                unit_blocks += reg.db.execute(
                    "select count(*) from blocks where level = ? and idx >= ? and idx < ? and file is not null",
                    [level, first, first + n],
                ).fetchone()[0]
        tokens = 0
        for u in units:
            where = "" if u == GENERIC else f" and l1 = {int(u)}"
            tokens += reg.db.execute(
                f"select coalesce(sum(n_tokens), 0) from windows where doc_id not in ({marks}){where}", ids
            ).fetchone()[0]
            tokens += reg.db.execute(
                f"select coalesce(sum(length(ids)) / 4, 0) from prompts where held_out = 0 "
                f"and doc_id not in ({marks}){where}",
                ids,
            ).fetchone()[0]
        seconds = [
            reg.db.execute(
                "select seconds from runs where unit = ? and status = 'done' order by id desc limit 1", [u]
            ).fetchone()
            for u in units
        ]
        est = sum(s[0] or 0.0 for s in seconds if s) if any(seconds) else None
        return ForgetPlan(
            name,
            mode,
            ids,
            reg.db.execute(f"select count(*) from windows where doc_id in ({marks})", ids).fetchone()[0],
            reg.db.execute(f"select count(*) from prompts where doc_id in ({marks})", ids).fetchone()[0],
            shaped,
            units,
            unit_blocks,
            tokens if mode == "exact" else 0,
            est if mode == "exact" else 0.0,
        )
    finally:
        reg.close()


# ---- forgetting --------------------------------------------------------------------------------------
def _remove(reg: Registry, doc_ids: list[str]) -> None:
    """Documents with windows, embeddings, prompts and provenance; node sizes follow."""
    marks = ",".join("?" for _ in doc_ids)
    for (path,) in reg.db.execute(f"select path from windows where doc_id in ({marks})", doc_ids).fetchall():
        for lvl, n in enumerate(path.split(",")):
            reg.db.execute("update nodes set n_windows = n_windows - 1 where level = ? and idx = ?", [lvl + 1, int(n)])
    reg.remove_documents(doc_ids)


def _drop_units(reg: Registry, units: list[str]) -> int:
    """Delete every block of the units (files go with the sweep after commit); returns how many."""
    dropped = 0
    for u in units:
        for level, first, n in unit_of(reg.config, u).levels:
            ids = [
                r[0]
                for r in reg.db.execute(
                    "select id from blocks where level = ? and idx >= ? and idx < ? and file is not null",
                    [level, first, first + n],
                )
            ]
            for bid in ids:
                reg.db["blocks"].update(
                    bid, {"file": None, "sha256": None, "state": "dropped", "trained_tokens": 0, "updated": now()}
                )
                reg.db.execute("delete from block_docs where block_id = ?", [bid])
            dropped += len(ids)
    return dropped


def forget(
    plan: ForgetPlan,
    *,
    probes: Sequence[Probe] | None = None,
    home: Path | None = None,
    progress: Progress | None = None,
    train_progress: Callable[[TrainEvent], None] | None = None,
) -> ForgetReport:
    """Carry out a plan (see the module doc). Raises ForgetInterrupted, with nothing changed, on Ctrl-C.

    It holds the bank's writer lock (memctl.registry.lock) and plans again under it: another writer (a second
    forget, say) may have committed since `plan` was made, and retraining must start from what the
    bank holds now, or that writer's removal would be undone."""
    home = home or memctl_home()
    with bank_lock(plan.bank, home):
        fresh, gone = replan(plan, home)
        report = _forget(fresh, probes=probes, home=home, progress=progress, train_progress=train_progress)
    if gone:
        report.notes.append(f"{len(gone)} document(s) were forgotten meanwhile by another command: {', '.join(gone)}")
    return report


def replan(plan: ForgetPlan, home: Path) -> tuple[ForgetPlan, list[str]]:
    """The plan made again on the bank as it is now; (plan, documents no longer in the bank)."""
    reg = Registry.open(plan.bank, home)
    try:
        held = {r[0] for r in reg.db.execute("select id from documents")}
    finally:
        reg.close()
    gone = [d for d in plan.docs if d not in held]
    if len(gone) == len(plan.docs):
        raise InputError(
            f"bank {plan.bank!r} no longer holds {'any of these documents' if len(gone) > 1 else repr(gone[0])}: "
            "forgotten meanwhile by another command"
        )
    return plan_forget(plan.bank, [d for d in plan.docs if d in held], mode=plan.mode, home=home), gone


def _forget(
    plan: ForgetPlan,
    *,
    probes: Sequence[Probe] | None,
    home: Path,
    progress: Progress | None,
    train_progress: Callable[[TrainEvent], None] | None,
) -> ForgetReport:
    t0 = time.perf_counter()
    # the proof is about parameters, blocked or not, and about every text: no relevance gate
    session = BankSession(plan.bank, home, serve_blocked=True, min_relevance=0.0, anchor_mix=0.0)
    reg = session.reg
    try:
        ids = check_docs(reg, plan.docs)
        marks = ",".join("?" for _ in ids)
        titles = {
            r[0]: r[1] or "" for r in reg.db.execute(f"select id, title from documents where id in ({marks})", ids)
        }
        texts = {d: DocText(titles[d], []) for d in ids}  # held in memory only: the proof needs them after
        for r in reg.db.query(f"select doc_id, text from windows where doc_id in ({marks}) order by doc_id, idx", ids):
            texts[r["doc_id"]].windows.append(r["text"])
        alone = measure(session, texts, "none", "anchor", progress)
        before = measure(session, texts, "fetched", "before", progress)
        probes = list(probes or [])
        forgotten_probes = [p for p in probes if p.doc in set(ids)]
        retained_probes = [p for p in probes if p.doc not in set(ids)]
        p_before = _probe_scores(session, forgotten_probes, retained_probes, progress)

        trained: list[TrainedUnit] = []
        lasts: list[tuple[TrainConfig, str]] = []  # per retrained unit: its configuration and dtype
        if plan.mode == "exact":
            units = _units_with_data(reg, plan.units)
            lasts = [last_training(reg, u) for u in units]  # each unit retrains as it was last trained
            configs, dtypes = [c for c, _ in lasts], [d for _, d in lasts]
            with trainers(session, dtypes) as anchors:
                objective = configs[0].objective if configs else "lm"
                pool = max((c.preserve_pool for c in configs if c.preserve > 0), default=0)
                first = anchors[dtypes[0]][0] if dtypes else session.anchor
                if pool:  # a merged bank has no pool yet: make the one its jobs made (seeded, deterministic)
                    prepare_pool(reg, first, progress, pool)
                split_head = head_split_ok(reg, first, units, objective)
                with sigint_flag() as flag:
                    for i, (u, tcfg, dt) in enumerate(zip(units, configs, dtypes, strict=True)):
                        anchor, handle = anchors[dt]
                        tu = train_unit(
                            reg, anchor, handle, u, tcfg, i, len(units),
                            train_progress, flag, None, split_head, exclude=frozenset(ids), checkpoints=False,
                        )  # fmt: skip
                        if tu is None:
                            raise ForgetInterrupted("forget interrupted before it committed: nothing was changed")
                        trained.append(tu)
        try:
            files = [write_unit(reg, tu) for tu in trained]
            with reg.db.atomic():
                _remove(reg, ids)
                for tu, f, (tcfg, dt) in zip(trained, files, lasts, strict=True):
                    record_unit(reg, tu, f)
                    reg.db["runs"].insert(
                        {
                            "started": now(), "finished": now(), "status": "done", "unit": tu.result.unit,
                            "config": dumps(dataclasses.asdict(tcfg)), "dtype": dt,
                            "steps": tu.result.steps, "tokens": tu.result.tokens,
                            "loss_first": tu.result.loss_first, "loss_last": tu.result.loss_last,
                            "seconds": tu.result.seconds,
                        }
                    )  # fmt: skip
                dropped = _drop_units(reg, plan.units) if plan.mode == "drop" else 0
                report_id = (
                    reg.db["forget_reports"]
                    .insert({"at": now(), "mode": plan.mode, "docs": json.dumps(ids), "report": "{}"})
                    .last_pk
                )
                reg.log("forget", ",".join(ids), plan.mode, {"units": plan.units})
        except BaseException:
            reg.sweep_orphans()  # the new, uncommitted files; the old blocks stay in place
            raise
        for u in plan.units:
            drop_checkpoint(reg.checkpoint_dir(), u)
        deleted = len(reg.sweep_orphans())
        reg.vacuum()

        after = measure(session, texts, "fetched", "after", progress)
        base = baseline(session, progress)
        g_before, g_after = gains(alone, before), gains(alone, after)
        p_after = _probe_scores(session, forgotten_probes, retained_probes, progress)
        report = ForgetReport(
            plan.bank,
            plan.mode,
            ids,
            plan.units,
            sum(len(f) for f in files),
            dropped,
            deleted,
            0.0,
            reference=base.to_dict(),
            report_id=int(report_id or 0),
        )
        for d in ids:
            z_after, verdict = judge(g_after[d], base)
            z_before = zscores(g_before[d], base)
            report.proofs.append(
                DocProof(
                    d, alone[d].text, before[d].text, after[d].text, g_before[d].text, g_after[d].text,
                    g_before[d].facts, g_after[d].facts, z_before.text, z_after.text, z_before.facts,
                    z_after.facts, verdict, p_before["docs"].get(d), p_after["docs"].get(d),
                )
            )  # fmt: skip
        if retained_probes:
            b, a = p_before["retained"], p_after["retained"]
            report.retained_probes = {
                "n": len(retained_probes),
                "before": b / len(retained_probes),
                "after": a / len(retained_probes),
                "kept": a / b if b else 1.0,
            }
        if len(base.text) < MIN_REFERENCES:
            report.notes.append(
                f"{len(base.text)} reference document(s): add at least {MIN_REFERENCES} unseen ones with "
                f"`memctl ingest PATH --bank {plan.bank} --reference` to judge whether forgotten documents look unseen"
            )
        report.notes.append(
            "the tree's centroids are means over many windows and are kept (re-clustering would move every "
            "document); they hold no text and no block parameters"
        )
        report.seconds = time.perf_counter() - t0
        with reg.db.atomic():
            reg.db["forget_reports"].update(report.report_id, {"report": json.dumps(report.to_dict())})
        return report
    finally:
        session.close()


def _probe_scores(
    session: BankSession, forgotten: list[Probe], retained: list[Probe], progress: Progress | None
) -> dict[str, Any]:
    """Fetched-memory probe results: [correct, n] per forgotten document, and retained correct."""
    out: dict[str, Any] = {"docs": {}, "retained": 0}
    if forgotten:
        res = evaluate(session, forgotten, ["fetched"], progress=progress)[0]

        for p, text in zip(forgotten, res.answers, strict=True):
            c, n = out["docs"].get(p.doc, [0, 0])
            out["docs"][p.doc] = [c + is_correct(text, p.answers), n + 1]
    if retained:
        out["retained"] = evaluate(session, retained, ["fetched"], progress=progress)[0].correct
    return out


def reports(name: str, home: Path | None = None) -> list[dict[str, Any]]:
    """Stored forget reports, oldest first."""
    reg = Registry.open(name, home)
    try:
        return [
            {"id": r["id"], "at": r["at"], "mode": r["mode"], **json.loads(r["report"] or "{}")}
            for r in reg.db.query("select * from forget_reports order by id")
        ]
    finally:
        reg.close()
