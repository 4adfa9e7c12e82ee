"""What the cloze rules see, with no model: today's rules against those of another commit, measured in one run.

For each corpus, each document read as one window (`memctl.train.prompts.prompts_for(text, title)`):

* prompts: the cloze and paraphrase prompts the rules write (more prompts, more tokens to train);
* probes targeted: probes whose answer is a whole word of some prompt's answer in the probe's own document
  (a fact no prompt targets cannot be learned from the cloze prompts; the benchmark corpora only);
* naming the subject: for probes that say whom they ask about (incidents': the system), those targeted by a
  prompt that names it too (a fact learned under another name, an incident's id, is not found by a question
  that asks by the system);
* documents changed: documents whose prompts the two sets of rules write otherwise;
* coverage: the share of the documents' content words that some prompt's answer holds
  (`memctl.train.coverage.window_coverage`, weighted by content words).

Corpora: elements, fictional, foldoc and incidents as `benchmarks/corpora.py` builds them, and two sets of text no rule
was written against: foldoc entries past the 150 the benchmark takes ("foldoc-heldout", from Debian's
dict-foldoc) and the long descriptions of the installed Debian packages (/var/lib/dpkg/status). A corpus whose
source is missing here is left out.

    python benchmarks/rules.py [--against REV] [--heldout 300] [--out demo-out/rules]

--against (default HEAD~1) names the commit whose memctl/train/prompts.py, sections.py and leads.py (where it
has one) are the baseline, loaded from git into a temporary package.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from corpora import CORPORA, ROOT, build_data, commit
from rich.console import Console
from rich.table import Table

from memctl.train import prompts as current
from memctl.train.coverage import content_words, window_coverage

console = Console()
BENCHMARK_CORPORA = ("elements", "fictional", "foldoc", "incidents")
RULE_FILES = ("prompts", "sections", "leads")
SECONDS = ("fictional", "incidents")  # corpora that give some entities or events a second document, `<id>-2`
PACKAGES = Path("/var/lib/dpkg/status")


def rules_at(rev: str, into: Path) -> ModuleType:
    """memctl.train.prompts as it was at `rev`, imported from a temporary package of its rule files."""
    pkg = into / "rules_baseline"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    for name in RULE_FILES:
        got = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:memctl/train/{name}.py"], capture_output=True, text=True
        )
        if got.returncode and name != "prompts":
            continue  # a module the rules did not have yet at `rev`
        got.check_returncode()
        (pkg / f"{name}.py").write_text(got.stdout)
    sys.path.insert(0, str(into))
    try:
        return importlib.import_module("rules_baseline.prompts")
    finally:
        sys.path.pop(0)


def package_descriptions(limit: int) -> list[dict[str, str]]:
    """Installed Debian packages' descriptions of 40 words or more: the summary line, then the long text."""
    if not PACKAGES.is_file():
        return []
    docs = []
    for block in PACKAGES.read_text(errors="replace").split("\n\n"):
        name = re.search(r"^Package: (\S+)", block, re.M)
        desc = re.search(r"^Description: (.*(?:\n .*)*)", block, re.M)
        if not name or not desc:
            continue
        lines = desc.group(1).split("\n")
        body = " ".join(x.strip() for x in lines[1:] if x.strip() != ".")
        if len(body.split()) >= 40:
            docs.append({"id": name.group(1), "title": name.group(1), "text": f"{lines[0]}. {body}"})
    return docs[:limit]


def foldoc_heldout(limit: int) -> list[dict[str, str]]:
    """dict-foldoc entries the benchmark's selection rule takes after its first 150."""
    sys.path.insert(0, str(ROOT / "examples/foldoc"))
    try:
        import build as foldoc  # examples/foldoc/build.py
    finally:
        sys.path.pop(0)
    if not (foldoc.DICT_DIR / "foldoc.index").is_file():
        return []
    return foldoc.select(foldoc.read_entries(foldoc.DICT_DIR), 150 + limit)[150:]


def measure(
    rules: ModuleType, docs: list[dict[str, str]], probes: list[dict[str, Any]], seconds: bool = False
) -> dict[str, Any]:
    """Prompts, probes targeted and coverage of one set of rules on one corpus; `seconds`: a probe's facts are
    in its document's second one (`<id>-2`) too, as examples/fictional and incidents write them."""
    answers: dict[str, list[str]] = {}
    texts: dict[str, list[str]] = {}
    written: dict[str, list[tuple[str, str, str]]] = {}
    n = 0
    covered = words = 0.0
    for d in docs:
        got = rules.prompts_for(d["text"], d.get("title") or "")
        n += len(got)
        answers[d["id"]] = [p.answer.lower() for p in got]
        texts[d["id"]] = [p.text.lower() for p in got]
        written[d["id"]] = [(p.kind, p.text, p.answer) for p in got]
        w = len(content_words(d["text"]))
        covered += (window_coverage(d["text"], answers[d["id"]]) or 0.0) * w
        words += w

    def targeted(p: dict[str, Any], naming: bool = False) -> bool:
        pats = [re.compile(rf"(?<!\w){re.escape(a.lower())}(?!\w)") for a in p["answers"]]
        subject = str(p.get("subject") or "").lower()
        ids = [p["doc"], f"{p['doc']}-2"] if seconds else [p["doc"]]
        return any(
            x.search(a) and (not naming or subject in t)
            for d in ids
            for a, t in zip(answers.get(d, []), texts.get(d, []), strict=True)
            for x in pats
        )

    asked = [p for p in probes if p.get("subject")]
    return {
        "prompts": n,
        "targeted": sum(targeted(p) for p in probes) if probes else None,
        "probes": len(probes),
        "named": sum(targeted(p, naming=True) for p in asked) if asked else None,
        "asked": len(asked),
        "coverage": covered / max(1.0, words),
        "written": written,
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="HEAD~1", help="the commit whose rules are the baseline (default HEAD~1)")
    ap.add_argument("--heldout", type=int, default=300, help="documents of each held-out set (default 300)")
    ap.add_argument("--out", type=Path, default=ROOT / "demo-out/rules", help="where the corpora are built")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "build.log"
    sets: dict[str, tuple[list[dict[str, str]], list[dict[str, Any]]]] = {}
    for corpus in BENCHMARK_CORPORA:
        try:
            data = build_data(corpus, a.out, 300, log)
        except (subprocess.CalledProcessError, OSError) as e:
            console.print(f"[yellow]{corpus} left out: its example script failed ({e}); see {log}[/]")
            continue
        _, docs, main_probes, _ = CORPORA[corpus]
        sets[corpus] = (read_jsonl(data / docs), read_jsonl(data / main_probes))
    heldout = {"foldoc-heldout": foldoc_heldout(a.heldout), "debian-packages": package_descriptions(a.heldout)}
    for name, held in heldout.items():
        if held:
            sets[name] = (held, [])
        else:
            console.print(f"[yellow]{name} left out: its source is not installed here[/]")
    with tempfile.TemporaryDirectory() as tmp:
        base = rules_at(a.against, Path(tmp))
        rows = {
            name: (measure(base, d, p, name in SECONDS), measure(current, d, p, name in SECONDS))
            for name, (d, p) in sets.items()
        }
    t = Table(title=f"cloze rules v{getattr(base, 'RULES', '?')} ({a.against}) -> v{current.RULES} ({commit()})")
    cols = ("corpus", "docs", "changed", "prompts", "x baseline", "probes targeted", "naming the subject", "coverage")
    for col in cols:
        t.add_column(col, justify="left" if col == "corpus" else "right")
    for name, (old, new) in rows.items():
        hit = named = "-"
        if new["targeted"] is not None:
            hit = f"{100 * old['targeted'] / new['probes']:.1f}% -> {100 * new['targeted'] / new['probes']:.1f}%"
        if new["named"] is not None:
            named = f"{100 * old['named'] / new['asked']:.1f}% -> {100 * new['named'] / new['asked']:.1f}%"
        changed = sum(old["written"][d] != new["written"][d] for d in new["written"])
        t.add_row(
            name,
            str(len(sets[name][0])),
            str(changed),
            f"{old['prompts']:,} -> {new['prompts']:,}",
            f"{new['prompts'] / max(1, old['prompts']):.2f}",
            hit,
            named,
            f"{100 * old['coverage']:.1f}% -> {100 * new['coverage']:.1f}%",
        )
    console.print(t)
    summary = {
        name: {
            "changed": sum(old["written"][d] != new["written"][d] for d in new["written"]),
            "before": {k: v for k, v in old.items() if k != "written"},
            "after": {k: v for k, v in new.items() if k != "written"},
        }
        for name, (old, new) in rows.items()
    }
    (a.out / "rules.json").write_text(json.dumps({"against": a.against, "commit": commit(), "rows": summary}, indent=1))


if __name__ == "__main__":
    main()
