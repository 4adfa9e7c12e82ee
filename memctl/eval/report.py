"""`eval --report DIR`: a Markdown report and PNG plots (accuracy by setup; accuracy against the
blocked fraction) of one evaluation's results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.errors import InputError

DESCRIBE = {
    "anchor": "the anchor alone, no memory",
    "generic": "the generic memory (same fetched size, no routing)",
    "fetched": "the memory blocks the probe routes to",
    "rag": "the nearest stored window of the routed leaf in the prompt, no memory",
    "rag+fetched": "that window and the routed memory blocks",
    "oracle-rag": "the probe's own document in the prompt: the open-book ceiling",
    "fetched-corrupted": "the routed leaf replaced by each of its siblings (one trial per probe and sibling)",
}


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def ci(r: dict[str, Any]) -> str:
    return f"{100 * r['ci95'][0]:.1f}–{100 * r['ci95'][1]:.1f}%"


def markdown(res: dict[str, Any], command: str = "") -> str:
    lines = [f"# memctl eval: bank `{res['bank']}`", ""]
    params = res.get("params", {})
    lines.append(
        f"{res['n']} probes from `{res.get('probes') or params.get('probes', '')}`"
        + (f" (a sample: --limit {params['limit']} --seed {params['seed']})" if params.get("limit") else "")
        + f"; answers are {params.get('probe_tokens', 8)} greedy tokens, "
        "correct when an answer appears as a whole word."
    )
    if command:
        lines += ["", "```", command, "```"]
    kinds = sorted({k for r in res["setups"] for k in r["per_kind"]})
    lines += ["", "## Accuracy by setup", "", "![accuracy by setup](accuracy_by_setup.png)", ""]
    lines.append(
        "| setup | accuracy | 95% CI | " + " | ".join(kinds) + " | routed right | routed wrong | what the model sees |"
    )
    lines.append("|---|---:|---:|" + "---:|" * len(kinds) + "---:|---:|---|")
    for r in res["setups"]:
        cells = [pct(r["per_kind"][k]["accuracy"]) if k in r["per_kind"] else "-" for k in kinds]
        split = [f"{pct(x['accuracy'])} ({x['n']})" if x["n"] else "-" for x in (r["routed_right"], r["routed_wrong"])]
        row = [r["setup"], pct(r["accuracy"]), ci(r), *cells, *split, DESCRIBE.get(r["setup"], "")]
        lines.append("| " + " | ".join(row) + " |")
    rt = res["routing"]
    lines += ["", "## Routing agreement", ""]
    lines.append(f"Probes whose document is in the bank: {rt['n']} (unknown document: {rt['unknown_doc']}).")
    lines += ["", "| level | routed into a node of its document |", "|---:|---:|"]
    lines += [f"| {lv['level']} | {pct(lv['share'])} ({lv['agree']}/{lv['n']}) |" for lv in rt["levels"]]
    if "beam" in res:
        lines += ["", "## Beam: the N best leaves and their ancestors", ""]
        lines += ["| beam | accuracy | 95% CI | blocks per probe | parameters fetched per probe | seconds per probe |",
                  "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for b in res["beam"]:
            lines.append(
                f"| {b['beam']} | {pct(b['accuracy'])} | {ci(b)} | {b['blocks_per_probe']:.2f} | "
                f"{b['params_per_probe'] / 1e6:.2f}M | {b['seconds_per_probe']:.3f} |"
            )
    if "blocking" in res:
        blk = res["blocking"]
        how = (
            "routing goes around blocked nodes, as in the paper"
            if blk["mode"] == "reroute"
            else "blocked blocks are withheld"
        )
        lines += [
            "",
            "## Full vs blocked banks",
            "",
            "![accuracy against blocked fraction](accuracy_vs_blocked.png)",
            "",
        ]
        lines.append(f"For each probe, the best-matching fraction of the bank is blocked ({how}).")
        head = [
            "blocked fraction",
            "nodes blocked per level",
            "share of bank parameters",
            "accuracy",
            "95% CI",
            "change",
        ]
        lines += ["", "| " + " | ".join(head) + " |", "|---:|---|---:|---:|---:|---:|"]
        for r in blk["rows"]:
            lines.append(
                f"| {r['fraction']:g} | {', '.join(map(str, r['nodes_per_level']))} | {pct(r['bank_share'])} | "
                f"{pct(r['accuracy'])} | {ci(r)} | {100 * r['change']:+.1f} pts |"
            )
    if "perplexity" in res:
        pp = res["perplexity"]
        lines += ["", "## Perplexity", ""]
        lines.append(
            f"{pp['docs']} documents from `{params.get('perplexity', '')}`; memories routed on the whole document. "
            f"Memories must not make unrelated text worse by more than {100 * pp['limit']:.0f}%."
        )
        lines += ["", "| setup | perplexity | vs anchor | tokens |", "|---|---:|---:|---:|"]
        for r in pp["rows"]:
            ratio = r["ratio_to_anchor"]
            flag = " (worse than the limit)" if r["worse_than_limit"] else ""
            lines.append(
                f"| {r['setup']} | {r['perplexity']:.2f} | {100 * (ratio - 1):+.1f}%{flag} | {r['tokens']:,} |"
                if ratio is not None
                else f"| {r['setup']} | {r['perplexity']:.2f} | - | {r['tokens']:,} |"
            )
        if line := gate_line(pp):
            lines += ["", line[0].upper() + line[1:] + "."]
    cov = res.get("coverage")
    if cov and "mean" in cov:
        lines += ["", "## Coverage", ""]
        kinds = ", ".join(f"{k} {pct(v)}" for k, v in sorted(cov.get("by_kind", {}).items()))
        lines.append(
            f"{pct(cov['mean'])} of the windows' content words appear in an answer the memories were trained on"
            + (f" ({kinds})." if kinds else ".")
        )
        if cov.get("uncovered"):
            listed = cov.get("uncovered_windows", [])
            lines.append(
                f"**{cov['uncovered']} of {cov['windows']} windows have no coverage**: no training prompt asks "
                "about them, so what they say can only be recited, not answered"
                + (f" (the first {len(listed)} below)." if len(listed) < cov["uncovered"] else ".")
            )
            lines += ["", "| window | document |", "|---:|---|"]
            lines += [f"| {w['window']} | {w['doc']} |" for w in listed]
    lines += missed_section(res.get("answers", []))
    if res.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in res["notes"]]
    lines += ["", f"Run {res.get('run', '-')} took {res.get('seconds', 0):.0f} s."]
    return "\n".join(lines) + "\n"


MISSED_ROWS = 50  # report.md lists this many; answers.jsonl has every probe


def missed(answers: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int] | None:
    """The probes open book answers and the fetched memories do not (the facts training did not reach),
    and how many the memories answer that open book does not. None unless both setups ran."""
    both = [a for a in answers if "fetched" in a["answers"] and "oracle-rag" in a["answers"]]
    if not both:
        return None
    lost = [a for a in both if a["answers"]["oracle-rag"]["correct"] and not a["answers"]["fetched"]["correct"]]
    gained = sum(1 for a in both if a["answers"]["fetched"]["correct"] and not a["answers"]["oracle-rag"]["correct"])
    return lost, gained


def _cell(text: str, width: int = 60) -> str:
    """One Markdown table cell: one line, pipes escaped, cut to `width` characters."""
    flat = " ".join(text.split())
    flat = flat if len(flat) <= width else flat[: width - 1] + "…"
    return flat.replace("|", "\\|") or "(nothing)"


def missed_section(answers: list[dict[str, Any]]) -> list[str]:
    found = missed(answers)
    if found is None:
        return []
    lost, gained = found
    lines = ["", "## What the memories missed", ""]
    lines.append(
        f"Open book answers {len(lost)} probes that the fetched memories do not; the memories answer {gained} "
        "that open book does not. A missed probe that routed wrong is a routing miss; one that routed right is a "
        "fact training did not reach (`memctl info` shows coverage). Every probe's answers: `answers.jsonl`."
    )
    if lost:
        lines += [
            "",
            "| probe | expected | fetched answered | open book answered | routed right |",
            "|---|---|---|---|---|",
        ]
        for a in lost[:MISSED_ROWS]:
            right = {True: "yes", False: "no", None: "-"}[a["routed_right"]]
            cells = [a["prompt"], " / ".join(a.get("expected", [])), a["answers"]["fetched"]["text"],
                     a["answers"]["oracle-rag"]["text"]]  # fmt: skip
            lines.append("| " + " | ".join(_cell(c) for c in cells) + f" | {right} |")
        if len(lost) > MISSED_ROWS:
            lines.append(f"\n… and {len(lost) - MISSED_ROWS} more in `answers.jsonl`.")
    return lines


def plot_setups(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["setups"]
    names = [r["setup"] for r in rows]
    acc = [100 * r["accuracy"] for r in rows]
    err = [[100 * (r["accuracy"] - r["ci95"][0]) for r in rows], [100 * (r["ci95"][1] - r["accuracy"]) for r in rows]]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows) + 1), 3.6))
    ax.bar(names, acc, yerr=err, capsize=4, color="#4c72b0")
    for i, a in enumerate(acc):
        ax.text(i, a + 1, f"{a:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{res['bank']}: {res['n']} probes (95% Wilson intervals)")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_blocking(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["blocking"]["rows"]
    x = [r["fraction"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    ax.plot(x, [100 * r["accuracy"] for r in rows], marker="o", label="fetched, best-matching fraction blocked")
    ax.fill_between(x, [100 * r["ci95"][0] for r in rows], [100 * r["ci95"][1] for r in rows], alpha=0.2)
    for r in res["setups"]:
        if r["setup"] in ("anchor", "generic"):
            ax.axhline(100 * r["accuracy"], ls="--", lw=1, color="gray" if r["setup"] == "anchor" else "orange",
                       label=r["setup"])  # fmt: skip
    ax.set_xlabel("fraction of the bank blocked per probe")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(res: dict[str, Any], directory: str | Path, command: str = "") -> list[Path]:
    """report.md, accuracy_by_setup.png, (with block fractions) accuracy_vs_blocked.png and (with probes)
    answers.jsonl: every probe with its expected answers, route and each setup's answer."""
    d = Path(directory).expanduser()
    if d.exists() and not d.is_dir():
        raise InputError(f"--report {directory}: exists and is not a directory")
    d.mkdir(parents=True, exist_ok=True)
    written = [d / "report.md", d / "accuracy_by_setup.png"]
    plot_setups(res, written[1])
    if "blocking" in res:
        written.append(d / "accuracy_vs_blocked.png")
        plot_blocking(res, written[-1])
    if res.get("answers"):
        written.append(d / "answers.jsonl")
        written[-1].write_text("".join(json.dumps(a) + "\n" for a in res["answers"]), encoding="utf-8")
    written[0].write_text(markdown(res, command), encoding="utf-8")
    return written


def gate_line(pp: dict[str, Any]) -> str | None:
    """One sentence on what the relevance gate did to a perplexity set: how many documents it left to
    the anchor (they score exactly as the anchor does, so the whole-set ratio averages them in), and
    what the memories did to the others. None when it gated nothing (the table says it all)."""
    rows = [r for r in pp.get("rows", []) if r["setup"] != "anchor" and "fetched_docs" in r]
    if not rows or not pp.get("gated"):
        return None
    n = rows[0]["fetched_docs"]
    line = f"the relevance gate left {pp['gated']} of {pp['docs']} documents to the anchor alone"
    parts = [f"{r['setup']} {100 * (r['ratio_on_fetched'] - 1):+.1f}%" for r in rows if r["ratio_on_fetched"]]
    return line + (f"; on the other {n}: {', '.join(parts)}" if n and parts else "")
