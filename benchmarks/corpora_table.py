"""The results table of benchmarks/corpora.py."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def pct(r: dict[str, Any] | None) -> str:
    return f"{100 * r['accuracy']:.1f}%" if r else "-"


def share(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    return f"{100 * a['accuracy'] / b['accuracy']:.0f}%" if a and b and b["accuracy"] else "-"


def table(rows: dict[str, dict[str, Any]]) -> Table:
    t = Table(title="memories on corpora in distinct styles (accuracy; 'of OB' = share of the open-book ceiling)")
    cols = ["corpus", "variant", "probes", "anchor", "open book", "fetched", "of OB", "rag", "rag+fetched",
            "questions: anchor", "open book", "fetched", "of OB", "in chat: OB", "fetched (of OB)", "coverage",
            "tokens trained",
            "per corpus token", "train s", "unit s x base", "ppl vs anchor", "ppl where trained"]  # fmt: skip
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows.values():
        m, q, chat = r["main"], r["questions"], r.get("questions_chat")
        cov = r.get("coverage") or {}
        ppl = r.get("perplexity_vs_anchor")
        t.add_row(
            r["corpus"] + (f" (subtree {r['subtree']})" if r.get("subtree") is not None else ""),
            " ".join([r["variant"], *r.get("eval_options", [])]),
            str(m["fetched"]["n"]),
            pct(m.get("anchor")),
            pct(m.get("oracle-rag")),
            pct(m.get("fetched")),
            share(m.get("fetched"), m.get("oracle-rag")),
            pct(m.get("rag")),
            pct(m.get("rag+fetched")),
            pct(q.get("anchor")),
            pct(q.get("oracle-rag")),
            pct(q.get("fetched")),
            share(q.get("fetched"), q.get("oracle-rag")),
            pct(chat.get("oracle-rag")) if chat else "-",
            f"{pct(chat.get('fetched'))} ({share(chat.get('fetched'), chat.get('oracle-rag'))})" if chat else "-",
            f"{100 * cov['mean']:.0f}%" if "mean" in cov else "-",
            f"{r['tokens_trained']:,}",
            f"{r['tokens_trained'] / max(1, r['corpus_tokens']):.1f}",
            f"{r['seconds']['train']:.0f}",
            f"{r['time_vs_baseline']:.2f}x" if r.get("time_vs_baseline") else "-",
            f"{100 * (ppl - 1):+.1f}%" if ppl is not None else "-",
            trained_cell(r.get("perplexity_trained")),
        )
    return t


def trained_cell(t: dict[str, Any] | None) -> str:
    """'+31.0% (7 of 27)': fetched memories on the unrelated documents that met trained blocks."""
    if not t or t.get("ratio") is None:
        return "-" if not t else f"none of {t.get('of')}"
    return f"{100 * (t['ratio'] - 1):+.1f}% ({t['docs']} of {t['of']})"
