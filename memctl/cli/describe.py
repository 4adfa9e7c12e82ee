"""Commands that describe banks: info, list."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .common import BankOpt, JsonOpt, app, coverage_line, err, human_bytes, human_params, out, print_json, run


@app.command()
def info(
    bank: BankOpt,
    allow: Annotated[
        str | None, typer.Option(help="TAG,...: also show how many blocks per level these tags can reach.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Tree, fetched and bank sizes, blocks per level, access, anchor and training state."""
    from ..ops.info import info as do_info
    from ..registry.access import allow_tags

    d = run(lambda: do_info(bank, allow=allow_tags(allow)))
    if as_json:
        print_json(d)
        return
    a = d["anchor"]
    out.print(f"[bold]{d['bank']}[/bold]  {d['path']}")
    out.print(
        f"anchor    {a['path']}  ({human_params(a['params'])} params, {a['layers']} layers, sha256 {a['sha256'][:12]})"
    )
    out.print(
        f"corpus    {d['documents']} documents, {d['windows']} windows, {d['tokens']:,} tokens "
        f"(window ≤ {d['window']} tokens, embedder {d['embedder']})"
    )
    m = d["memory"]
    out.print(
        f"tree      k={d['tree']['k']}, p={d['tree']['p']}  ({d['tree']['k'] ** d['tree']['p']} leaves), "
        f"routing: {d['routing']}" + (f" (words weigh {d['lexical']:g})" if d.get("lexical") else "")
    )
    ratio = f" = {100 * d['fetched_ratio']:.1f}% of the anchor" if d["fetched_ratio"] else ""
    out.print(
        f"memory    ranks {tuple(m['ranks'])} on {m['layers']} layers (from layer {m['first_layer']}); "
        f"fetched {human_params(d['fetched_params'])}{ratio}"
    )
    out.print(
        f"bank      {human_params(d['bank_params'])} params ({human_bytes(d['bank_bytes_full'])} fp32 when all "
        f"blocks are trained); {human_bytes(d['bytes_on_disk'])} on disk now"
    )
    table = Table()
    reach = {r["level"]: r for r in d["access"]["levels"]}
    allowed = d["access"]["allow"]
    cols = ["level", "rank", "blocks", "params/block", "nodes with data", "windows/node", "trained", "stale", "blocked"]
    if allowed is not None:
        cols.append(f"reachable by {','.join(allowed) or '(no tags)'}")
    for col in cols:
        table.add_column(col, justify="right")
    for lv in d["levels"]:
        st = lv["states"]
        extra = [str(reach[lv["level"]]["reachable"])] if allowed is not None else []
        table.add_row(
            str(lv["level"]),
            str(lv["rank"]),
            str(lv["blocks"]),
            human_params(lv["block_params"]),
            str(lv["nonempty_nodes"]),
            f"{lv['windows_per_nonempty_node']:.1f}",
            str(st.get("trained", 0)),
            str(st.get("stale", 0)),
            str(reach[lv["level"]]["blocked"]),
            *extra,
        )
    table.add_row(
        "generic",
        str(sum(m["ranks"])),
        "1",
        human_params(d["generic"]["params"]),
        "-",
        "-",
        "1" if d["generic"]["state"] == "trained" else "0",
        "1" if d["generic"]["state"] == "stale" else "0",
        str(reach[0]["blocked"]),
        *([str(reach[0]["reachable"])] if allowed is not None else []),
    )
    out.print(table)
    out.print(f"training  {d['training']}")
    if d.get("coverage"):
        out.print(coverage_line(d["coverage"]), highlight=False)
    if d["prompt_rules"]["note"]:
        err.print(f"[yellow]note:[/yellow] {d['prompt_rules']['note']}", highlight=False, soft_wrap=True)
    tags = ", ".join(f"{t} {n}" for t, n in d["tags"].items()) or "none"
    out.print(
        f"privacy   documents by tag: {tags}; {d['references']} reference document(s); "
        f"{d['forget_reports']} forget report(s)"
    )


@app.command("list")
def list_banks(as_json: JsonOpt = False) -> None:
    """Banks under MEMCTL_HOME."""
    from ..registry import memctl_home

    root = memctl_home() / "banks"
    # a name starting with '.' is a staging directory (ingest, import) or a lock file, never a bank
    names = (
        sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and (p / "registry.db").is_file())
        if root.is_dir()
        else []
    )
    if as_json:
        print_json(names)
    else:
        for n in names:
            out.print(n)
        if not names:
            err.print(f"no banks under {root}")
