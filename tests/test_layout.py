"""The package layout shows the one-way flow (core -> registry, model -> build -> train -> serve ->
eval -> privacy -> ops -> cli, tui): every import of memctl's own code, lazy ones inside functions
included, goes down that flow, no module imports itself back through others, and each package's
docstring says what it owns and may import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import memctl

ROOT = Path(memctl.__file__).parent
LIBRARY = ("core", "registry", "model", "build", "train", "serve", "eval", "privacy", "ops")
# package -> the packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "registry": {"core"},
    "model": {"core"},
    "build": {"core", "registry", "model"},
    "train": {"core", "registry", "model", "build"},
    "serve": {"core", "registry", "model", "build"},
    "eval": {"core", "registry", "model", "build", "train", "serve"},
    "privacy": {"core", "registry", "model", "build", "train", "serve", "eval"},
    "ops": {"core", "registry", "model", "build", "train", "serve", "eval", "privacy"},
    "cli": {*LIBRARY, "tui"},  # the two front ends: cli starts the console, the console shares cli's helpers
    "tui": {*LIBRARY, "cli"},
}
TOP_LEVEL = {"memctl": {"serve"}, "memctl.__main__": {"cli"}}  # memctl.Memories; python -m memctl


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The memctl modules `name` imports anywhere in its file, lazy imports included (a name imported
    from a package that is one of its modules counts as that module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                mod = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                full = f"{mod}.{alias.name}"
                out.add(full if full in known else mod)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def package_of(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def test_every_import_goes_down_the_flow() -> None:
    g = graph()
    wrong = []
    for name, targets in g.items():
        pkg = package_of(name)
        if name in TOP_LEVEL:
            pkg, allowed = name, TOP_LEVEL[name]
        else:
            assert pkg in ALLOWED, f"{name}: package memctl.{pkg} is not in the layout (add it to ALLOWED)"
            allowed = ALLOWED[pkg]
        for t in targets:
            if package_of(t) != pkg and package_of(t) not in allowed:
                wrong.append(f"{name} imports {t} (memctl.{pkg} may import {sorted(allowed) or 'nothing'})")
    assert sum(map(len, g.values())) > 300, "the walk found too few imports: it resolves them wrongly"
    assert not wrong, "\n".join(wrong)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check sees one
    assert not cycles(graph()), f"import cycles: {cycles(graph())}"


def test_each_package_says_what_it_owns_and_may_import() -> None:
    for pkg in LIBRARY:
        doc = ast.get_docstring(ast.parse((ROOT / pkg / "__init__.py").read_text())) or ""
        assert "Owns:" in doc, f"memctl.{pkg} has no 'Owns:' in its docstring"
        m = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.S)
        assert m, f"memctl.{pkg}'s docstring does not say what it may import"
        said = set(re.findall(r"memctl\.(\w+)", m.group(1))) - {"cli", "tui"}
        if "every library package" in m.group(1):
            said = set(LIBRARY) - {pkg}
        assert said == ALLOWED[pkg], f"memctl.{pkg}: docstring {sorted(said)}, layout {sorted(ALLOWED[pkg])}"


def test_the_walk_sees_a_lazy_relative_import_against_the_flow(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from ..model.memory import PARTS\n    return PARTS\n")
    known = {"memctl.registry.x": src, "memctl.model.memory": tmp_path / "m.py"}
    assert imports("memctl.registry.x", src, known) == {"memctl.model.memory"}
    assert package_of("memctl.model.memory") not in ALLOWED["registry"]
