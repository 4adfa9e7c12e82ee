"""Probes and how they are scored: JSONL reading, whole-word answer matching, Wilson intervals,
reproducible samples. Pure functions; they know no model."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InputError, check_text

PROBE_TOKENS = 8  # a probe is correct when an answer appears in this many greedy new tokens


@dataclass(frozen=True)
class Probe:
    doc: str  # the document that holds the answer ('' when unknown)
    kind: str
    prompt: str
    answers: tuple[str, ...]


def load_probes(path: str | Path) -> list[Probe]:
    """Read probe JSONL ({doc, kind, prompt, answers}); a missing, unreadable or bad file, and a bad
    line, is a one-line InputError naming the file (and the line)."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{path}: is a directory, not a probe file (JSONL)")
    if not p.is_file():
        raise InputError(f"{path}: no such probe file")
    try:
        text = p.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:  # permission denied, an I/O error, or the file went away
        raise InputError(f"{path}: cannot read the probe file ({e.strerror or type(e).__name__})") from None
    probes = []
    for n, line in enumerate(text.splitlines(), start=1):
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
            for key in ("doc", "kind"):
                if key in d and not isinstance(d[key], str | int):
                    raise ValueError(f"'{key}' must be a string")
            for text in (d["prompt"], *answers, *(str(d.get(k, "")) for k in ("doc", "kind"))):
                try:  # a JSON escape like "\udce9" decodes to a lone surrogate, which no tokenizer takes
                    check_text(text, "the probe")
                except InputError as e:
                    raise ValueError(str(e)) from None
            probes.append(Probe(str(d.get("doc", "")), str(d.get("kind", "probe")), d["prompt"], tuple(answers)))
        except KeyError as e:
            raise InputError(f"{path}:{n}: missing key {e.args[0]!r}") from None
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise InputError(f"{path}:{n}: {str(e).splitlines()[0]}") from None
    if not probes:
        raise InputError(f"{path}: no probes")
    return probes


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


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


def sample_probes(probes: list[Probe], limit: int | None, seed: int) -> list[Probe]:
    """A reproducible sample of `limit` probes (in file order); all of them without a limit."""
    if limit is not None and limit < 1:
        raise InputError("--limit must be at least 1")
    if limit is None or limit >= len(probes):
        return probes
    idx = np.sort(np.random.default_rng(seed).choice(len(probes), size=limit, replace=False))
    return [probes[i] for i in idx]
