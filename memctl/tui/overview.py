"""The browser's first screen: what the bank is and what it knows, from `BankView.overview`."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from .widgets import StackedBar, fit

STATE_STYLES = (("trained", "green"), ("stale", "yellow"), ("untrained", "grey42"), ("blocked", "red"))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def human_count(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(int(n))


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def share_bar(share: float, style: str) -> StackedBar:
    return StackedBar([(round(1000 * share), style), (round(1000 * (1 - share)), "grey30")])


def bank_table(d: dict[str, Any]) -> Table:
    a, c = d["anchor"], d["config"]
    t = Table.grid(padding=(0, 1), expand=True)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(ratio=1, overflow="fold")
    mem = c["memory"]
    t.add_row("anchor", f"{escape(a['name'])} · {human_count(a['params'])} parameters · {a['layers']} layers")
    t.add_row(
        "config",
        f"tree k={c['tree']['k']} p={c['tree']['p']} · ranks {', '.join(map(str, mem['ranks']))} · "
        f"{mem['layers']} memory layers · embedder {escape(c['embedder'])} · window {c['window']}",
    )
    t.add_row("corpus", f"{d['documents']:,} documents · {d['windows']:,} windows · {d['tokens']:,} tokens")
    t.add_row(
        "size",
        f"{human_bytes(d['bytes_on_disk'])} on disk ({human_count(d['bank_params'])} parameters when fully trained)",
    )
    t.add_row(
        "fetched",
        f"{human_bytes(d['fetched_bytes'])} per query ({human_count(d['fetched_params'])} parameters, "
        f"{pct(d['fetched_ratio'])} of the anchor)",
    )
    t.add_row("training", escape(d["training"]))
    return t


def coverage_renderable(cov: dict[str, Any] | None, note: str | None = None) -> Table | Text | Group:
    if note:  # prompts written by older rules: said above the figures they shape
        return Group(Text(note, style="yellow"), coverage_renderable(cov))
    if cov is None:
        return Text("no prompts yet: coverage comes with distillation training (`memctl train`)", style="dim")
    if cov.get("objective") == "lm":
        return Text("n/a: objective lm learns every window next-token", style="dim")
    t = Table.grid(padding=(0, 1), expand=True)
    t.add_column(no_wrap=True)
    t.add_column(ratio=1)
    t.add_column(justify="right", no_wrap=True)
    t.add_row("content words", share_bar(cov["mean"], "green"), pct(cov["mean"]))
    for kind, share in sorted(cov.get("by_kind", {}).items()):
        t.add_row(f"  {escape(kind)}", share_bar(share, "cyan"), pct(share))
    which = f"a sample of {cov['windows']:,} windows" if cov.get("sampled") else f"{cov['windows']:,} windows"
    t.add_row("", Text(f"{which}; {cov.get('uncovered', 0)} with no trained answer", style="dim"), "")
    return t


def levels_table(levels: list[dict[str, Any]]) -> Table:
    t = Table(box=None, padding=(0, 1), expand=True, show_edge=False)
    t.add_column("level", no_wrap=True)
    t.add_column("blocks", ratio=1, min_width=6)
    for name, style in STATE_STYLES:
        t.add_column(Text(name, style=style), justify="right", no_wrap=True)
    for lv in levels:
        t.add_row(
            "generic" if lv["level"] == 0 else f"L{lv['level']} ({lv['blocks']})",
            StackedBar([(lv[name], style) for name, style in STATE_STYLES]),
            *(f"{lv[name]:,}" for name, _ in STATE_STYLES),
        )
    return t


def eval_renderable(ev: dict[str, Any] | None) -> Table | Text:
    if ev is None:
        return Text("no evaluation run yet: `memctl eval --probes FILE`", style="dim")
    t = Table.grid(padding=(0, 1), expand=True)
    t.add_column(no_wrap=True)
    t.add_column(ratio=1)
    t.add_column(justify="right", no_wrap=True)
    status = "" if ev["status"] == "done" else f", stopped with {ev['answers_stored']} answers stored"
    t.add_row(Text(f"run {ev['id']} · {fit(ev['probes'], 40)} · {ev['n']} probes{status}", style="dim"), "", "")
    for s in ev["setups"]:
        t.add_row(escape(s["setup"]), share_bar(s["accuracy"], "blue"), pct(s["accuracy"]))
    return t


def log_renderable(entries: list[dict[str, Any]], total: int) -> Table | Text:
    if not entries:
        return Text("no block, unblock, forget, export or import yet", style="dim")
    t = Table(box=None, padding=(0, 1), expand=True, show_edge=False)
    t.add_column("time", no_wrap=True)
    t.add_column("action", no_wrap=True)
    t.add_column("target", ratio=1, no_wrap=True, overflow="ellipsis")
    t.add_column("reason", ratio=1, no_wrap=True, overflow="ellipsis")
    for e in reversed(entries):  # newest first
        t.add_row((e["at"] or "")[:16].replace("T", " "), e["action"], escape(e["target"] or "-"),
                  escape(e["reason"] or ""))  # fmt: skip
    if total > len(entries):
        t.caption = f"{len(entries)} newest of {total}; `memctl audit --log` lists them all"
    return t


class Overview(VerticalScroll):
    """Sections: the bank, coverage, blocks per level, the last evaluation, the privacy log."""

    SECTIONS = (("ov-bank", "bank"), ("ov-levels", "blocks per level"), ("ov-coverage", "coverage"),
                ("ov-eval", "last evaluation"), ("ov-log", "privacy log"))  # fmt: skip

    def compose(self) -> ComposeResult:
        for wid, title in self.SECTIONS:
            s = Static("", id=wid, classes="section")
            s.border_title = title
            yield s

    def show(self, d: dict[str, Any]) -> None:
        self.data = d
        self.query_one("#ov-bank", Static).update(bank_table(d))
        self.query_one("#ov-bank", Static).border_title = f"bank {d['bank']}"
        self.query_one("#ov-levels", Static).update(levels_table(d["levels"]))
        self.query_one("#ov-coverage", Static).update(coverage_renderable(d["coverage"], d.get("prompt_rules_note")))
        self.query_one("#ov-eval", Static).update(eval_renderable(d["last_eval"]))
        self.query_one("#ov-log", Static).update(log_renderable(d["privacy_log"], d["privacy_log_total"]))
