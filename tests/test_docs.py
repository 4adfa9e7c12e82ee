"""The documentation stays true to the code: docs/cli.md is the generator's output for the current
typer app, every command is in it, every relative link in README.md and docs/ resolves (file and
anchor), the README stays short, and its Python snippet runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from memctl.cli import app, docs_gen

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CLI_MD = DOCS / "cli.md"
STALE = f"docs/cli.md is stale: regenerate it with `{docs_gen.REGENERATE}` (from the repository root)"

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans removed."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(CODE_SPAN.sub("", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not fenced:
            s = slug(m.group(1))
            n = counts.get(s, 0)
            counts[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
    return found


def test_cli_md_is_generated_from_the_current_app() -> None:
    assert CLI_MD.is_file(), f"docs/cli.md is missing: generate it with `{docs_gen.REGENERATE}`"
    assert CLI_MD.read_text(encoding="utf-8") == docs_gen.render(), STALE


def test_cli_md_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    first = docs_gen.render()
    monkeypatch.setenv("COLUMNS", "37")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert docs_gen.render() == first
    assert "\x1b" not in first


def test_every_command_is_documented_in_cli_md() -> None:
    text = CLI_MD.read_text(encoding="utf-8")
    root = typer.main.get_command(app)
    names = [n for n, c in root.commands.items() if not getattr(c, "hidden", False)]  # type: ignore[attr-defined]
    assert names, "the app registers no command"
    assert sorted(f"memctl {n}" for n in names) == sorted(c for c in docs_gen.commands() if c.count(" ") == 1)
    missing = [n for n in names if f"\n## memctl {n}\n" not in text]
    assert not missing, f"{STALE} (not documented: {', '.join(missing)})"
    for n in names:  # every option of every command, too
        for p in root.commands[n].params:  # type: ignore[attr-defined]
            if p.param_type_name == "option" and not getattr(p, "hidden", False):
                assert f"`{p.opts[0]}`" in text, f"{STALE} (`memctl {n} {p.opts[0]}` not documented)"


def test_every_relative_link_resolves() -> None:
    broken = []
    for md in markdown_files():
        for line in prose_lines(md.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (md.parent / file_part).resolve() if file_part else md
                where = f"{md.relative_to(ROOT)}: ({target})"
                if ROOT not in dest.parents and dest != ROOT:
                    broken.append(f"{where} points outside the repository")
                elif not dest.exists():
                    broken.append(f"{where} no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{where} no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_docs_pages_exist_and_are_linked_from_the_readme() -> None:
    readme = README.read_text(encoding="utf-8")
    for page in ("results", "history", "how-it-works", "privacy", "scaling", "benchmarks", "python-api", "cli"):
        assert (DOCS / f"{page}.md").is_file(), f"docs/{page}.md is missing"
        assert f"(docs/{page}.md" in readme, f"README.md does not link docs/{page}.md"


def test_readme_is_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 250, f"README.md has {n} lines (at most 250): move detail into docs/"


def test_readme_names_the_two_commands_the_makefile_has() -> None:
    readme = README.read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, re.M), f"the Makefile has no `{target}` target"


def test_readme_python_snippet_runs(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    """The README's Memories example, run as written on a tiny bank named as it says."""
    from memctl.build.ingest import ingest

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "README.md has no ```python block"
    code = blocks[0]
    bank = re.search(r'Memories\("([^"]+)"\)', code)
    assert bank, "the README's Python snippet does not open a bank with Memories(NAME)"
    ingest(bank.group(1), [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    scope: dict[str, object] = {"anchor_dir": str(tiny_anchor), "__name__": "readme"}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102  (our own README)
    assert scope["out"] is not None


def test_every_dotted_memctl_name_in_the_docs_exists() -> None:
    """`memctl.train.run.train`, `memctl.serve.session.BankSession`...: each resolves to a module or an
    attribute of one (a module that moved leaves no stale name behind)."""
    import importlib

    wrong = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text()
        names = set(re.findall(r"memctl(?:\.[A-Za-z_]\w*)+", text))
        for module, imported in re.findall(r"from (memctl[\w.]*) import ([\w, ]+)", text):  # code blocks
            names.update(f"{module}.{n.strip()}" for n in imported.split(",") if n.strip())
        for name in sorted(names):
            parts = name.split(".")
            for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                except ImportError:
                    continue
                try:
                    for attr in parts[i:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    wrong.append(f"{page.name}: {name}")
                break
    assert not wrong, "\n".join(wrong)
