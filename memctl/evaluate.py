"""Probe evaluation: whole-word scoring of greedy answers, Wilson intervals, setups compared."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError
from .serve import BankSession

PROBE_TOKENS = 8  # a probe is correct when an answer appears in this many greedy new tokens
Progress = Callable[[str, int, int], None]
# setup name -> memory mode of BankSession.generate
SETUPS: dict[str, str] = {"anchor": "none", "generic": "generic", "fetched": "fetched", "oracle-rag": "none"}
DEFAULT_SETUPS = ("anchor", "generic", "fetched")
OPEN_BOOK_SEPARATOR = "\n\n"  # the same layout the distillation teacher sees


@dataclass(frozen=True)
class Probe:
    doc: str
    kind: str
    prompt: str
    answers: tuple[str, ...]


def load_probes(path: str | Path) -> list[Probe]:
    """Read probe JSONL; a bad line is an InputError naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path}: no such probe file")
    probes = []
    for n, line in enumerate(p.read_text(encoding="utf-8", errors="strict").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            answers = d["answers"]
            if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a for a in answers):
                raise ValueError("'answers' must be a non-empty list of strings")
            if not isinstance(d["prompt"], str) or not d["prompt"].strip():
                raise ValueError("'prompt' must be a non-empty string")
            probes.append(Probe(str(d.get("doc", "")), str(d.get("kind", "probe")), d["prompt"], tuple(answers)))
        except KeyError as e:
            raise InputError(f"{path}:{n}: missing key {e.args[0]!r}") from None
        except ValueError as e:
            raise InputError(f"{path}:{n}: {str(e).splitlines()[0]}") from None
    if not probes:
        raise InputError(f"{path}: no probes")
    return probes


def is_correct(generated: str, answers: Sequence[str]) -> bool:
    """An answer must appear as a whole word. Short alphabetic answers (<= 3 letters, e.g. a symbol
    like 'Fe') must match case exactly; everything else ignores case."""
    for a in answers:
        flags = 0 if (len(a) <= 3 and a.isalpha()) else re.IGNORECASE
        if re.search(r"(?<!\w)" + re.escape(a) + r"(?!\w)", generated, flags):
            return True
    return False


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for k successes in n trials."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass
class SetupResult:
    setup: str
    correct: int
    n: int
    per_kind: dict[str, tuple[int, int]]
    seconds: float
    answers: list[str] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    def to_dict(self) -> dict[str, Any]:
        lo, hi = wilson(self.correct, self.n)
        return {
            "setup": self.setup,
            "accuracy": self.accuracy,
            "ci95": [lo, hi],
            "correct": self.correct,
            "n": self.n,
            "seconds": self.seconds,
            "per_kind": {
                k: {"accuracy": c / t if t else 0.0, "correct": c, "n": t, "ci95": list(wilson(c, t))}
                for k, (c, t) in sorted(self.per_kind.items())
            },
        }


def sample_probes(probes: list[Probe], limit: int | None, seed: int) -> list[Probe]:
    if limit is None or limit >= len(probes):
        return probes
    idx = np.sort(np.random.default_rng(seed).choice(len(probes), size=limit, replace=False))
    return [probes[i] for i in idx]


def open_book(session: BankSession, probe: Probe) -> str:
    """The probe's own document (its windows, in order) followed by the probe."""
    rows = session.reg.windows("doc_id = ?", [probe.doc])
    if not rows:
        raise InputError(f"probe document {probe.doc!r} is not in bank {session.reg.name!r}; oracle-rag needs it")
    return "\n\n".join(r["text"] for r in rows) + OPEN_BOOK_SEPARATOR + probe.prompt


def evaluate(
    session: BankSession,
    probes: list[Probe],
    setups: Sequence[str] = DEFAULT_SETUPS,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> list[SetupResult]:
    """Accuracy of each setup on the probes: 'anchor' (no memory), 'generic', 'fetched' (routed
    blocks), 'oracle-rag' (no memory, the probe's own document in the prompt: the open-book ceiling)."""
    for s in setups:
        if s not in SETUPS:
            raise InputError(f"unknown setup {s!r}; use {', '.join(SETUPS)}")
    paths = session.route([p.prompt for p in probes])
    results = []
    for setup in setups:
        t0 = time.perf_counter()
        texts: list[str] = []
        for s in range(0, len(probes), batch_size):
            chunk = probes[s : s + batch_size]
            answers = session.generate(
                [open_book(session, p) if setup == "oracle-rag" else p.prompt for p in chunk],
                mode=SETUPS[setup],
                max_new_tokens=PROBE_TOKENS,
                paths=paths[s : s + batch_size],
            )
            texts.extend(a.text for a in answers)
            if progress:
                progress(setup, min(s + batch_size, len(probes)), len(probes))
        per_kind: dict[str, tuple[int, int]] = {}
        correct = 0
        for p, t in zip(probes, texts, strict=True):
            ok = is_correct(t, p.answers)
            correct += ok
            c, n = per_kind.get(p.kind, (0, 0))
            per_kind[p.kind] = (c + ok, n + 1)
        results.append(SetupResult(setup, correct, len(probes), per_kind, time.perf_counter() - t0, texts))
    return results
