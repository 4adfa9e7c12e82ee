"""Shared pieces of the command line: the typer app, consoles, error handling, progress, formatting.

Library errors become one line on stderr and a non-zero exit, never a traceback
(set MEMCTL_DEBUG=1 to see one for an unexpected error). Under --json a failing command also prints
one JSON object on stdout, {"error": LINE, "type": CLASS, "exit_code": N}, and JSON output never
holds a bare NaN (`print_json` writes null).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer._click.exceptions import ClickException
from typer.core import TyperGroup

from ..core.errors import InputError, MemctlError, check_path
from ..train.diverge import KIND_NAMES

if TYPE_CHECKING:
    from ..train.loop import TrainEvent


class UsageError(MemctlError):
    """An error the argument parser found, as the JSON error object names it."""


class _Group(TyperGroup):
    """The app's command group. Under --json, an error the argument parser finds (an unknown option,
    a value it cannot convert) prints the JSON error object on stdout too, as the commands' own
    errors do: the parser's message stays on stderr."""

    _parse_error: Exception | None = None

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except ClickException as e:
            _Group._parse_error = e
            raise

    def invoke(self, ctx: Any) -> Any:  # a command's own options are parsed here
        try:
            return super().invoke(ctx)
        except ClickException as e:
            _Group._parse_error = e
            raise

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        argv = sys.argv[1:] if args is None else list(args)
        _Group._parse_error = None
        try:
            return super().main(args, *rest, **kwargs)
        except SystemExit as x:
            e = _Group._parse_error
            if e is not None and "--json" in argv and x.code:
                _json_error(UsageError(e.format_message()), int(x.code))
            raise


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Hierarchical parametric memories for a frozen small language model.",
)
LOG_WIDTH = 160  # columns when the output is a file or a pipe: rich's 80 cut tables' numbers ("152,9…")


def _console(stderr: bool = False) -> Console:
    """A rich console; into a log or a pipe (not a terminal, no COLUMNS set) it is LOG_WIDTH wide."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = LOG_WIDTH
    return console


out = _console()
err = _console(stderr=True)
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
        help="Relevance gate: a context whose cosine to its nearest window (routing 'tree': to its leaf) is below this "
        "(0 to 1) fetches no memory and retrieves nothing (default: calibrated on the bank's windows; 0: off).",
    ),
]
LexicalOpt = Annotated[
    float | None,
    typer.Option(
        help="Weight of the words a context shares with a window beside the embeddings' cosine, in `nearest` "
        "routing and RAG's choice of window (default: the bank's, 0.3 in banks made since it exists; 0: cosine "
        "alone).",
    ),
]
RelevanceRampOpt = Annotated[
    float | None,
    typer.Option(
        help="The relevance gate's ramp: just above the floor the anchor keeps a share of each next-token "
        "distribution, falling from all of it at the floor to none at this multiple of the floor; 1: a hard "
        "gate (memories alone above the floor). Default 2.",
    ),
]
AnchorMixOpt = Annotated[
    float | None,
    typer.Option(
        help="The anchor's share (0 to 1) of each next-token distribution where memories are fetched: "
        "(1-w) p(memories) + w p(anchor). Keeps memories from rewriting near-domain text they do not cover, "
        "at a cost in recalled facts (docs/history.md); default: the share the bank was trained for "
        "(`train --anchor-mix`), else 0, the memories alone. Doubles the batch.",
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

NoWaitOpt = Annotated[
    bool,
    typer.Option(
        "--no-wait", help="Fail at once (exit 75) if another command is writing to the bank, instead of waiting for it."
    ),
]

DeviceOpt = Annotated[
    str | None, typer.Option(help="cpu, cuda or cuda:N: where the anchor runs; blocks are served there (default cpu).")
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        help="fp32, bf16 or auto (bf16 on a CPU that multiplies bf16 in hardware, else fp32): the anchor's "
        "dtype; blocks are served in it (default fp32)."
    ),
]


def _waiting(line: str) -> None:
    err.print(f"[yellow]{line}[/yellow]", highlight=False, soft_wrap=True)


def json_mode() -> bool:
    """Whether the running command was given --json (read from the command's click context: typer
    0.29 and later carry their own copy of click)."""
    for module in ("typer._click.globals", "click.globals"):
        try:
            ctx = importlib.import_module(module).get_current_context(silent=True)
        except ImportError:
            continue
        if ctx is not None:
            return bool(ctx.params.get("as_json"))
    return False


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def json_text(data: Any, default: Callable[[Any], Any] | None = None) -> str:
    """`data` as one line of JSON in which NaN and infinities are null (bare NaN is not JSON)."""
    plain = json.loads(json.dumps(data, default=default))
    return json.dumps(_finite(plain), allow_nan=False)


def print_json(data: Any, default: Callable[[Any], Any] | None = None) -> None:
    """Print `data` as JSON on stdout: NaN and infinities become null (bare NaN is not JSON)."""
    out.print_json(json_text(data, default))


def _json_error(e: BaseException | None, code: int) -> None:
    """Under --json, a failing command prints one JSON object on stdout (its one error line stays on stderr)."""
    if e is None or isinstance(e, KeyboardInterrupt):
        message, kind = "interrupted" if code == 130 else f"exit {code}", "Exit"
    else:
        first = (str(e).strip().splitlines() or [""])[0]
        message, kind = first if isinstance(e, MemctlError) else f"{type(e).__name__}: {first}", type(e).__name__
    doc = {"error": message, "type": kind, "exit_code": code}
    print(json.dumps(doc), file=sys.stdout, flush=True)


def readable(path: Path, what: str) -> Path:
    """`path` if it is a file this process can read, else an InputError naming it (probe files and the like)."""
    check_path(path, what)  # its name goes to the registry (an eval run's parameters)
    if not path.is_file():
        raise InputError(f"{what} {path}: no such file")
    try:
        with path.open("rb"):
            pass
    except OSError as e:
        raise InputError(f"{what} {path}: cannot read it ({e.strerror or type(e).__name__})") from None
    return path


def fail(message: str, code: int) -> NoReturn:
    """One error line on stderr (and the JSON error object under --json), then exit `code`."""
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    if json_mode():
        _json_error(MemctlError(message), code)
    raise typer.Exit(code)


def run(fn: Callable[[], T], no_wait: bool = False) -> T:
    """`_run`; under --json a failure also prints a JSON error object on stdout:
    {"error": the line, "type": the error's class, "exit_code": N}."""
    if not json_mode():
        return _run(fn, no_wait)
    seen: list[BaseException] = []

    def watched() -> T:
        try:
            return fn()
        except BaseException as e:
            seen.append(e)
            raise

    try:
        return _run(watched, no_wait)
    except typer.Exit as x:
        if x.exit_code:
            _json_error(seen[-1] if seen else None, x.exit_code)
        raise


def _run(fn: Callable[[], T], no_wait: bool = False) -> T:
    """Call into the library; turn errors into one clear line and an exit code. A writer that finds
    the bank busy says so and waits, or fails at once with `no_wait` (memctl.registry.lock)."""
    from ..registry import doctor_hint, opened
    from ..registry.lock import policy

    try:
        with policy(wait=not no_wait, notify=_waiting):
            return fn()
    except MemctlError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130) from None
    except sqlite3.DatabaseError as e:  # a damaged registry (or one locked far too long): say what to run
        if os.environ.get("MEMCTL_DEBUG"):
            raise
        bank = opened.get()
        if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
            err.print(
                f"[red]error:[/red] the registry stayed locked by another command: {e}; try again",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(75) from None
        hint = doctor_hint(bank) if bank else "`memctl doctor --bank NAME` checks a bank"
        err.print(
            f"[red]error:[/red] the bank's registry is damaged or unreadable ({e}); {hint}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
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
    " (R/s, ETA Ns)" for a log line (no ETA before a second report). A counter that goes back (a unit
    that starts over, or rolls back to an earlier epoch) is measured again from there."""

    def __init__(self) -> None:
        self._start: dict[str, tuple[float, int]] = {}
        self._last: dict[str, int] = {}

    def __call__(self, key: str, done: int, total: int) -> str:
        if done < self._last.get(key, done):
            del self._start[key]
        self._last[key] = done
        now = time.monotonic()
        t0, n0 = self._start.setdefault(key, (now, done))
        rate = (done - n0) / max(now - t0, 1e-9)
        eta = f", ETA {(total - done) / rate:.0f}s" if rate > 0 else ""
        return f" ({rate:.2f}/s{eta})"


def coverage_line(cov: dict[str, Any]) -> str:
    """One line on memctl.train.coverage: the share of the windows' content words trained prompts ask for."""
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


def epoch_line(ev: TrainEvent) -> str:
    """A unit's epoch that just ended (an event with epoch_losses): each batch kind's mean loss,
    held-out accuracy, and why the unit starts over (or rolls back to an earlier epoch's end) at half the
    learning rate, if it does."""
    means = ", ".join(f"{KIND_NAMES.get(k, k)} {v:.3f}" for k, v in sorted((ev.epoch_losses or {}).items()))
    held = f", held-out {100 * ev.heldout:.0f}%" if ev.heldout is not None else ""
    back = f"going back to the end of epoch {ev.kept}" if ev.kept else "starting over"
    again = f"; {ev.restart}: {back} at half the learning rate" if ev.restart else ""
    out = f", {ev.sitting:,} learned prompts sit the next epoch out" if ev.sitting else ""
    return f"epoch {ev.epoch + 1} done: mean loss {means}{held}{out}{again}"
