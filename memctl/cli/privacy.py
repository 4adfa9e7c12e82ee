"""Commands that control who and what a bank remembers: audit, block, unblock, forget,
verify-forgotten, export, import."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..core.errors import InputError
from .common import (
    BankOpt,
    JsonOpt,
    NoWaitOpt,
    app,
    err,
    fail,
    human_bytes,
    out,
    print_json,
    readable,
    run,
    stage_progress,
)

NodeOpt = Annotated[list[str] | None, typer.Option("--node", help="Block LEVEL:INDEX (e.g. 1:3) or 'generic'.")]
DocOpt = Annotated[list[str] | None, typer.Option("--doc", help="Document id as ingest stored it (repeatable).")]
QueryOpt = Annotated[str | None, typer.Option(help="Text: select the part of the bank that best matches it.")]
FractionOpt = Annotated[
    float | None, typer.Option(help="With --query: share of every level's nodes to select (e.g. 0.0625).")
]


def pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


@app.command()
def audit(
    bank: BankOpt,
    doc: Annotated[str | None, typer.Option(help="Which blocks this document shaped.")] = None,
    node: Annotated[
        str | None, typer.Option(help="Which documents shaped this block (LEVEL:INDEX or generic).")
    ] = None,
    log: Annotated[bool, typer.Option("--log", help="Every block, unblock, forget, export and import.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Provenance: the blocks a document trained, the documents behind a block, the privacy log."""
    from ..privacy.controls import audit_doc, audit_node, privacy_log

    def go() -> Any:
        if sum([doc is not None, node is not None, log]) != 1:
            raise InputError("give exactly one of --doc ID, --node LEVEL:INDEX or --log")
        if doc is not None:
            return audit_doc(bank, doc)
        if node is not None:
            return audit_node(bank, node)
        return privacy_log(bank)

    d = run(go)
    if as_json:
        print_json(d)
        return
    if log:
        table = Table(title=f"privacy log of {bank}")
        for col in ("time", "action", "target", "reason"):
            table.add_column(col)
        for r in d:
            table.add_row(r["at"], r["action"], r["target"] or "-", r["reason"] or "")
        out.print(table)
        return
    if doc is not None:
        m = d["document"]
        out.print(
            f"[bold]{m['id']}[/bold]  {m['title']}  (source {m['source']}; tags {m['tags'] or 'none'}; "
            f"{d['windows']} window(s) on path(s) {', '.join(d['paths'])})"
        )
        table = Table(title="blocks this document shaped")
        for col in ("block", "level", "node", "tokens", "share of block", "on window path", "state", "blocked"):
            table.add_column(col, justify="right")
        for r in d["blocks"]:
            table.add_row(
                r["block"],
                str(r["level"]),
                str(r["node"]),
                f"{r['tokens']:,}",
                pct(r["share"]),
                "yes" if r["on_window_path"] else "no",
                r["state"],
                "yes" if r["blocked"] else "",
            )
        out.print(table)
        return
    blocked = f"; blocked {d['blocked_at']} ({d['blocked_reason'] or 'no reason given'})" if d["blocked"] else ""
    out.print(f"[bold]block {d['block']}[/bold]: {d['state']}, {d['tokens']:,} training tokens{blocked}")
    table = Table(title="documents that shaped it")
    for col in ("document", "title", "tags", "tokens", "share"):
        table.add_column(col, justify="right" if col in ("tokens", "share") else "left")
    for r in d["documents"]:
        table.add_row(r["id"], r["title"] or "", r["tags"] or "", f"{r['tokens']:,}", pct(r["share"]))
    out.print(table)


@app.command()
def block(
    bank: BankOpt,
    node: NodeOpt = None,
    doc: DocOpt = None,
    query: QueryOpt = None,
    fraction: FractionOpt = None,
    reason: Annotated[str, typer.Option(help="Why (recorded with the time).")] = "",
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Withhold blocks from every answer: a node, every block a document shaped, or the part of the
    bank that best matches a query. Blocked blocks are never read from disk."""
    from ..privacy.controls import set_blocked
    from ..registry.lock import bank_lock

    def go() -> Any:
        with bank_lock(bank):
            return set_blocked(
                bank, True, nodes=node or [], docs=doc or [], query=query, fraction=fraction, reason=reason
            )

    _report_block(run(go, no_wait), True, bank, as_json)


@app.command()
def unblock(
    bank: BankOpt,
    node: NodeOpt = None,
    doc: DocOpt = None,
    query: QueryOpt = None,
    fraction: FractionOpt = None,
    everything: Annotated[bool, typer.Option("--all", help="Unblock every blocked block.")] = False,
    reason: Annotated[str, typer.Option(help="Why (recorded with the time).")] = "",
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Serve blocks again (same selectors as `block`, or --all)."""
    from ..privacy.controls import set_blocked
    from ..registry.lock import bank_lock

    def go() -> Any:
        with bank_lock(bank):
            return set_blocked(
                bank,
                False,
                nodes=node or [],
                docs=doc or [],
                query=query,
                fraction=fraction,
                everything=everything,
                reason=reason,
            )

    _report_block(run(go, no_wait), False, bank, as_json)


def _report_block(res: Any, blocked: bool, bank: str, as_json: bool) -> None:
    if as_json:
        print_json(res.__dict__)
        return
    verb = "blocked" if blocked else "unblocked"
    listed = ": " + ", ".join(res.changed) if res.changed else ""
    already = f" ({len(res.unchanged)} already {verb})" if res.unchanged else ""
    out.print(f"{verb} {len(res.changed)} block(s){listed}{already}")
    out.print(
        f"bank {bank} now has {res.blocked_total} blocked block(s), {pct(res.blocked_param_share)} of the "
        "hierarchical bank's parameters; blocked blocks are never read, answers use the other levels"
    )


@app.command()
def forget(
    bank: BankOpt,
    doc: DocOpt = None,
    source: Annotated[list[str] | None, typer.Option(help="Forget the documents read from this path.")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Forget the documents with this tag.")] = None,
    mode: Annotated[
        str, typer.Option(help="exact: retrain the affected units without them now; drop: delete those blocks now.")
    ] = "exact",
    probes: Annotated[
        Path | None, typer.Option(help="Probe JSONL: also measure forgotten and retained probes before and after.")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove documents and their influence (exact retraining by default), then prove it."""
    from ..core.probes import load_probes
    from ..privacy.forget import forget as do_forget
    from ..privacy.forget import plan_forget

    plan = run(lambda: plan_forget(bank, doc or [], source or [], tag or [], mode))
    ps = run(lambda: load_probes(readable(probes, "--probes"))) if probes else None
    if not as_json:
        cost = (
            f"retrain {len(plan.units)} unit(s) ({', '.join(plan.units)}) over {plan.tokens:,} tokens per epoch"
            + (f", about {plan.est_seconds:.0f} s as last time" if plan.est_seconds else "")
            if plan.mode == "exact"
            else f"delete {plan.unit_blocks} block(s) of unit(s) {', '.join(plan.units)}; `memctl train` retrains them"
        )
        err.print(
            f"forget {len(plan.docs)} document(s) ({plan.windows} window(s), {plan.prompts} prompt(s); they shaped "
            f"{len(plan.shaped_blocks)} block(s)): {cost if plan.units else 'no trained block to redo'}",
            highlight=False,
            soft_wrap=True,
        )
    if not yes:
        if not sys.stdin.isatty():
            fail("forgetting cannot be undone; pass --yes to confirm without a terminal", 2)
        if not typer.confirm("Forget them? This cannot be undone", default=False, err=True):
            err.print("nothing was forgotten")
            raise typer.Exit(1)

    def go() -> Any:
        with stage_progress(not as_json) as progress:
            return do_forget(plan, probes=ps, progress=progress)

    report = run(go, no_wait)
    if as_json:
        print_json(report.to_dict())
        return
    _print_report(report)


def _print_report(r: Any) -> None:
    out.print(
        f"forgot {len(r.docs)} document(s) in {r.seconds:.0f} s ({r.mode}): {r.blocks_replaced} block(s) retrained, "
        f"{r.blocks_dropped} dropped, {r.files_deleted} file(s) deleted; report #{r.report_id} stored in the registry"
    )
    ref = r.reference
    caption = None
    if ref["documents"]:
        t, f = ref["gain"], ref["fact_gain"]
        caption = (
            f"{ref['documents']} unseen reference documents: text gain {t['mean']:+.3f} ± {t['sd']:.3f} "
            f"(max {t['max']:+.3f}); fact gain {f['mean']:+.3f} ± {f['sd']:.3f} (max {f['max']:+.3f}). "
            "SEEN: a gain more than 3 of their standard deviations above their mean"
        )
    table = Table(
        title="proof of forgetting: gain = anchor-alone loss − bank loss (nats/token), on the text and on its facts",
        caption=caption,
    )
    for col in ("document", "anchor loss", "loss before → after", "text gain", "fact gain", "verdict after"):
        table.add_column(col, justify="right")
    has_probes = any(p.probes_before for p in r.proofs)
    if has_probes:
        table.add_column("probes before → after", justify="right")
    for p in r.proofs:
        row = [
            p.doc,
            f"{p.loss_anchor:.3f}",
            f"{p.loss_before:.3f} → {p.loss_after:.3f}",
            f"{p.gain_before:+.3f} → {p.gain_after:+.3f} (z {p.z_before:+.1f} → {p.z_after:+.1f})",
            f"{p.fact_gain_before:+.3f} → {p.fact_gain_after:+.3f} (z {p.fact_z_before:+.1f} → {p.fact_z_after:+.1f})",
            p.verdict,
        ]
        if has_probes:
            b, a = p.probes_before, p.probes_after
            row.append(f"{b[0]}/{b[1]} → {a[0]}/{a[1]}" if b and a else "-")
        table.add_row(*row)
    out.print(table)
    if r.retained_probes:
        rp = r.retained_probes
        flag = "" if rp["kept"] >= 0.95 else "  [red](below 95%)[/red]"
        out.print(
            f"retained probes ({rp['n']}): {pct(rp['before'])} → {pct(rp['after'])}, {pct(rp['kept'])} kept{flag}"
        )
    for note in r.notes:
        err.print(f"[dim]note: {note}[/dim]", highlight=False)


@app.command("verify-forgotten")
def verify_forgotten(
    paths: Annotated[list[str], typer.Argument(help="The forgotten documents, as files or tables (as for ingest).")],
    bank: BankOpt,
    text_field: Annotated[str, typer.Option(help="Text column of table files.")] = "text",
    id_field: Annotated[str | None, typer.Option(help="Id column of table files.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-check that the bank holds no trace of these documents: not in the registry, no fragment of
    their text in any file of the bank, and no more memorised than unseen reference documents."""
    from ..privacy.proof import verify_forgotten as do_verify

    def go() -> Any:
        with stage_progress(not as_json) as progress:
            return do_verify(bank, paths, text_field=text_field, id_field=id_field, progress=progress)

    results = run(go)
    ok = all(r.ok for r in results)
    if as_json:
        print_json({"ok": ok, "documents": [dict(r.__dict__, ok=r.ok) for r in results]})
    else:
        table = Table(title=f"verify-forgotten on {bank}")
        for col in (
            "document",
            "in registry",
            "files with its text",
            "text gain",
            "fact gain",
            "above refs",
            "verdict",
        ):
            table.add_column(col, justify="right")
        for r in results:
            table.add_row(
                r.doc,
                "YES" if r.in_registry else "no",
                ", ".join(r.traces) or f"none ({r.fragments} fragments searched)",
                f"{r.gain:+.3f} ({r.z:+.1f})",
                f"{r.fact_gain:+.3f} ({r.fact_z:+.1f})",
                r.verdict,
            )
        out.print(table)
        out.print("all forgotten" if ok else "[red]a trace remains[/red]")
    if not ok:
        raise typer.Exit(1)


@app.command("export")
def export_cmd(
    bank: BankOpt,
    file: Annotated[Path, typer.Argument(help="Archive to write (one file: registry and block files).")],
    allow: Annotated[
        str | None, typer.Option(help="TAG,...: export only documents with these tags and the blocks they can reach.")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace FILE if it exists.")] = False,
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a bank to one archive, whole or restricted to what some tags can reach."""
    from ..ops.transfer import export_bank
    from ..registry.access import allow_tags
    from ..registry.lock import bank_lock

    def go() -> Any:
        tags = allow_tags(allow)
        with bank_lock(bank):  # it logs the export, and no sweep may remove a file it is copying
            return export_bank(bank, file, allow=tags, overwrite=overwrite)

    res = run(go, no_wait)
    if as_json:
        print_json(res.__dict__, default=str)
        return
    scope = f" (tags {', '.join(res.allow)})" if res.allow else ""
    out.print(
        f"exported {bank}{scope}: {res.documents} document(s), {res.blocks} block(s), "
        f"{human_bytes(res.bytes)} -> {res.file}"
    )


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="Archive written by `memctl export`.")],
    bank: Annotated[str | None, typer.Option("--bank", "-b", help="Name for the bank (default: its own).")] = None,
    anchor: Annotated[
        str | None, typer.Option(help="This machine's copy of the bank's anchor (GGUF file or HF directory).")
    ] = None,
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Read a bank archive; everything is validated (schema, shapes, dtypes, checksums, anchor) first."""
    from contextlib import nullcontext

    from ..ops.transfer import import_bank
    from ..registry.lock import bank_lock

    def go() -> Any:
        with bank_lock(bank) if bank is not None else nullcontext():  # the new bank's name, when given
            return import_bank(file, bank, anchor)

    res = run(go, no_wait)
    if as_json:
        print_json(res.__dict__, default=str)
        return
    out.print(f"imported bank [bold]{res.bank}[/bold]: {res.documents} document(s), {res.blocks} block(s)")
