"""Render every command of the typer app as markdown: docs/cli.md is this module's output.

    python -m memctl.cli.docs_gen            # rewrite docs/cli.md
    python -m memctl.cli.docs_gen --check    # exit 1 if docs/cli.md is stale

The page is built from the command objects themselves (name, help, arguments, options with their
types and defaults), not from `--help`'s rich rendering, so it depends on no terminal width and
holds no ANSI codes: the same app always gives the same bytes.
"""

from __future__ import annotations

import enum
import inspect
import sys
import types
import typing
from pathlib import Path, PurePath
from typing import Any

REGENERATE = "python -m memctl.cli.docs_gen"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

_TYPE_NAMES: dict[Any, str] = {int: "INTEGER", float: "FLOAT", str: "TEXT", bool: "BOOLEAN"}


def _paragraphs(text: str | None) -> str:
    """A docstring as markdown: common indentation removed, each paragraph joined onto one line."""
    if not text:
        return ""
    paras = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines() if line.strip()) for p in paras).strip()


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the value type, repeatable) of an annotation: `X | None` -> X, `list[X]` -> (X, True)."""
    repeat = False
    for _ in range(4):
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin in (typing.Union, types.UnionType) and len(args) == 1:
            annotation = args[0]
        elif origin in (list, tuple, set, frozenset) and args:
            annotation, repeat = args[0], True
        else:
            break
    return annotation, repeat


def _type_label(param: Any) -> tuple[str, bool]:
    """('INTEGER', repeatable), or ('a|b|c', ...) for choices; '' for a flag."""
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    if annotation is None:  # a plain click parameter
        t = getattr(param, "type", None)
        choices = getattr(t, "choices", None)
        name = "|".join(map(str, choices)) if choices else str(getattr(t, "name", "value")).upper()
        return name, bool(getattr(param, "multiple", False) or getattr(param, "nargs", 1) == -1)
    value, repeat = _unwrap(annotation)
    if getattr(param, "is_flag", False) or value is bool:
        return "", repeat
    if isinstance(value, type) and issubclass(value, enum.Enum):
        return "|".join(str(m.value) for m in value), repeat
    if typing.get_origin(value) is typing.Literal:
        return "|".join(map(str, typing.get_args(value))), repeat
    if isinstance(value, type) and issubclass(value, PurePath):
        return "PATH", repeat
    return _TYPE_NAMES.get(value, getattr(value, "__name__", str(value)).upper()), repeat


def _default(param: Any) -> str | None:
    """The default as the help would show it, or None when there is none to show."""
    show = getattr(param, "show_default", True)
    if show is False:
        return None
    if isinstance(show, str):
        return show
    value = param.default
    if value is None or callable(value) or value == ():
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, list | tuple):
        value = ", ".join(map(str, value))
    return str(value) if str(value) else '""'


def _md(text: str) -> str:
    """Help text on one markdown list item's line."""
    return text.replace("\n", " ")


def _argument(param: Any) -> str:
    label, repeat = _type_label(param)
    name = (param.name or "arg").upper() + ("..." if repeat or getattr(param, "nargs", 1) == -1 else "")
    facts = [label] if label else []
    facts.append("required" if param.required else "optional")
    default = _default(param)
    if default is not None:
        facts.append(f"default: `{default}`")
    line = f"- `{name}` ({', '.join(facts)})"
    help_text = _paragraphs(getattr(param, "help", None))
    return line + (f": {_md(help_text)}" if help_text else "")


def _option(param: Any) -> str:
    label, repeat = _type_label(param)
    names = " / ".join(", ".join(f"`{o}`" for o in group) for group in (param.opts, param.secondary_opts) if group)
    facts = [label] if label else ["flag"]
    if repeat:
        facts.append("repeatable")
    if param.required:
        facts.append("required")
    default = _default(param)
    if default is not None and not param.required:
        facts.append(f"default: `{default}`")
    line = f"- {names} ({', '.join(facts)})"
    help_text = _paragraphs(getattr(param, "help", None))
    return line + (f": {_md(help_text)}" if help_text else "")


def _usage(path: str, command: Any) -> str:
    pieces = [path]
    params = [p for p in command.params if not getattr(p, "hidden", False)]
    if any(p.param_type_name == "option" for p in params):
        pieces.append("[OPTIONS]")
    for p in params:
        if p.param_type_name != "argument":
            continue
        _, repeat = _type_label(p)
        name = (p.name or "arg").upper() + ("..." if repeat or getattr(p, "nargs", 1) == -1 else "")
        pieces.append(name if p.required else f"[{name}]")
    if hasattr(command, "commands"):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _walk(group: Any, prefix: str) -> list[tuple[str, Any]]:
    """(full name, command) for every visible command, in the order the app lists them."""
    found = []
    for name, command in group.commands.items():
        if getattr(command, "hidden", False):
            continue
        path = f"{prefix} {name}"
        found.append((path, command))
        if hasattr(command, "commands"):
            found.extend(_walk(command, path))
    return found


def commands(app: Any = None) -> list[str]:
    """Full names of every visible command of the app ('memctl ingest', ...)."""
    return [path for path, _ in _walk(_root(app), "memctl")]


def _root(app: Any = None) -> Any:
    import typer

    if app is None:
        from . import app
    return typer.main.get_command(app)


def render(app: Any = None) -> str:
    """docs/cli.md for the app (default: memctl's)."""
    root = _root(app)
    found = _walk(root, "memctl")
    lines = [
        "# Command reference",
        "",
        f"<!-- Generated from the typer app by `{REGENERATE}`; do not edit by hand. -->",
        "",
        _paragraphs(root.help),
        "",
        "Every command takes `--help`. Banks live under `MEMCTL_HOME` (default `~/.memctl`). A library error "
        "is one line on stderr and a non-zero exit (`MEMCTL_DEBUG=1` shows the traceback of an unexpected one).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for path, command in found:
        first = _paragraphs(command.short_help or command.help).split("\n\n")[0].split(". ")[0].rstrip(".")
        anchor = path.replace(" ", "-")
        lines.append(f"| [`{path}`](#{anchor}) | {first.replace('|', '&#124;')}. |")
    for path, command in found:
        lines += ["", f"## {path}", ""]
        text = _paragraphs(command.help)
        if text:
            lines += [text, ""]
        lines += ["```", _usage(path, command), "```"]
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        args = [p for p in params if p.param_type_name == "argument"]
        opts = [p for p in params if p.param_type_name == "option"]
        if args:
            lines += ["", "Arguments:", ""] + [_argument(p) for p in args]
        if opts:
            lines += ["", "Options:", ""] + [_option(p) for p in opts]
        epilog = _paragraphs(getattr(command, "epilog", None))
        if epilog:
            lines += ["", epilog]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    rest = [a for a in argv if a != "--check"]
    out = Path(rest[0]) if rest else DEFAULT_OUT
    text = render()
    if check:
        if not out.is_file() or out.read_text(encoding="utf-8") != text:
            print(f"{out} is stale: run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out} ({len(commands())} commands)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
