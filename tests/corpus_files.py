"""Helpers for the tests of the example corpora's generators (examples/*/build.py): run one, read its
JSONL, and the checks their probes share."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def run_build(build: Path, out: Path, *args: str) -> str:
    """Run a generator into `out`; its stdout (the summary it prints)."""
    done = subprocess.run(
        [sys.executable, str(build), "--out", str(out), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def whole_word(answer: str, text: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text) is not None


def ngrams(text: str, n: int = 4) -> set[tuple[str, ...]]:
    """The text's n-word sequences, lowercased, punctuation dropped: what a probe may not share with a document."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def check_deterministic(build: Path, out: Path, stdout: str, tmp: Path, files: tuple[str, ...], *other: str) -> None:
    """Built again into another folder, the generator writes the same files and summary; with another seed
    (and the options `other`, a smaller corpus) it writes another corpus (`files[0]`)."""
    again = tmp / "again"
    assert run_build(build, again).replace(str(again), str(out)) == stdout
    for name in files:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name
    run_build(build, tmp / "other", "--seed", "1", *other)
    assert (tmp / "other" / files[0]).read_bytes() != (out / files[0]).read_bytes()
