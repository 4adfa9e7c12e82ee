"""Shared pieces of the command line: the typer app, consoles, error handling, progress, formatting.

Library errors become one line on stderr and a non-zero exit, never a traceback
(set MEMCTL_DEBUG=1 to see one for an unexpected error).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import MemctlError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Hierarchical parametric memories for a frozen small language model.",
)
out = Console()
err = Console(stderr=True)
T = TypeVar("T")

BankOpt = Annotated[str, typer.Option("--bank", "-b", help="Bank name (under MEMCTL_HOME, default ~/.memctl).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
AllowOpt = Annotated[
    str | None, typer.Option(help="TAG,...: fetch only blocks whose every training document has one of these tags.")
]
CacheMbOpt = Annotated[float, typer.Option(help="Byte budget of loaded blocks (MiB).")]
MinRelevanceOpt = Annotated[
    float | None,
    typer.Option(
        help="Relevance gate: a context whose cosine to its routed leaf is below this (0 to 1) fetches no "
        "memory and retrieves nothing (default: calibrated per bank, 0.3 x its windows' median; 0 turns the gate off).",
    ),
]
Int8Opt = Annotated[
    bool,
    typer.Option(
        "--int8",
        help="Serve the fetched memories as int8 weights (CPU): a quarter of the bytes per token; "
        "answers differ only by rounding.",
    ),
]

DeviceOpt = Annotated[
    str | None, typer.Option(help="cpu, cuda or cuda:N: where the anchor runs; blocks are served there (default cpu).")
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(help="fp32 or bf16: the anchor's dtype; blocks are served in it (default fp32; bf16 is for GPUs)."),
]


def run(fn: Callable[[], T]) -> T:
    """Call into the library; turn errors into one clear line and an exit code."""
    try:
        return fn()
    except MemctlError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130) from None
    except Exception as e:  # an unexpected bug: still one line, unless debugging
        if os.environ.get("MEMCTL_DEBUG"):
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        err.print(
            f"[red]internal error:[/red] {type(e).__name__}: {first} (MEMCTL_DEBUG=1 shows the traceback)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(3) from None


@contextmanager
def stage_progress(enabled: bool = True) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar per stage name, driven by the library's (stage, done, total) callback."""
    if not enabled or not err.is_terminal:
        yield lambda *_: None
        return
    with Progress(
        TextColumn("{task.description:>10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield update


class Rates:
    """Rate and ETA of progress counters, each from its first report: `rates(key, done, total)` is
    " (R/s, ETA Ns)" for a log line (no ETA before a second report)."""

    def __init__(self) -> None:
        self._start: dict[str, tuple[float, int]] = {}

    def __call__(self, key: str, done: int, total: int) -> str:
        t0, n0 = self._start.setdefault(key, (time.monotonic(), done))
        rate = (done - n0) / max(time.monotonic() - t0, 1e-9)
        eta = f", ETA {(total - done) / rate:.0f}s" if rate > 0 else ""
        return f" ({rate:.2f}/s{eta})"


def coverage_line(cov: dict[str, Any]) -> str:
    """One line on memctl.coverage: the share of the windows' content words trained prompts ask for."""
    if cov.get("objective") == "lm":
        return "coverage  n/a: objective lm learns every window next-token"
    kinds = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(cov.get("by_kind", {}).items()))
    which = f"a sample of {cov['windows']:,} windows'" if cov.get("sampled") else "the windows'"
    line = f"coverage  {100 * cov['mean']:.0f}% of {which} content words are in a trained answer" + (
        f" ({kinds})" if kinds else ""
    )
    if cov.get("uncovered"):
        hint = "" if "study" in cov.get("by_kind", {}) else ": `memctl train --study N` covers them"
        line += f"; {cov['uncovered']} of {cov['windows']} window(s) have none (learned next-token only{hint})"
    return line


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def human_params(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(int(n))
