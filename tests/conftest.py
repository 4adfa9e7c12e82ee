from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
from tiny import build_tiny_llama

from memctl.core.tree import subtree_of

TOPICS = {
    "metals": [
        "Iron is a strong metal used in steel and bridges.",
        "Copper is a metal that conducts electricity well.",
        "Gold is a soft yellow metal prized for jewellery.",
        "Aluminium is a light metal used in aircraft.",
    ],
    "gases": [
        "Helium is a light gas used in balloons.",
        "Neon is a noble gas that glows red in signs.",
        "Argon is an inert gas used in light bulbs.",
        "Hydrogen is the lightest gas in the universe.",
    ],
    "animals": [
        "The fox is a quick animal of the forest.",
        "The dog is a loyal animal kept as a pet.",
        "The owl is a bird that hunts at night.",
        "The whale is the largest animal in the sea.",
    ],
}


@pytest.fixture(autouse=True)
def _small_preservation_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training here makes a 64-sequence preservation pool, not the default 1,024: sampling that
    many on the tiny model costs ~10 s per bank, and only test_preserve is about the pool."""
    from memctl.core.config import TrainConfig

    names = [f.name for f in dataclasses.fields(TrainConfig)]
    defaults = list(TrainConfig.__init__.__defaults__ or ())
    defaults[len(defaults) - len(names) + names.index("preserve_pool")] = 64
    monkeypatch.setattr(TrainConfig.__init__, "__defaults__", tuple(defaults))


@pytest.fixture(scope="session")
def tiny_anchor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("MEMCTL_HOME", str(h))
    return h


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    d = tmp_path / "docs"
    for topic, sents in TOPICS.items():
        (d / topic).mkdir(parents=True)
        for i, s in enumerate(sents):
            (d / topic / f"{i}.txt").write_text(f"{s}\n\nMore about {topic}: note {i} of the {topic} notes.\n")
    return d


@pytest.fixture()
def mixing_bank(home: Path, corpus: Path, tiny_anchor: Path) -> str:
    """Bank "s" on the tiny anchor, trained so that its memories change the greedy answers: for the anchor
    mixture's tests (test_mix, test_ramp)."""
    from memctl.build.ingest import ingest
    from memctl.train.run import train

    ingest("s", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    # lr 5e-2 (5x train's default): on this tiny random Llama the memories then change the greedy answers;
    # fp32 on any CPU (auto would train in bf16 where the CPU multiplies it in hardware); no echo questions, so
    # that the weights the tests measured are this bank's
    train("s", {"epochs": 2, "batch_size": 2, "objective": "mix", "lr": 5e-2, "echo": 0}, home=home, dtype="fp32")
    return "s"


def tree_digest(path: Path) -> str:
    """Hash of every file (name and bytes) under a directory: 'unchanged' means equal digests."""
    h = hashlib.sha256()
    if not path.exists():
        return "absent"
    for p in sorted(path.rglob("*")):
        # SQLite's WAL index, and an empty log, come and go with open connections: they hold no data
        if p.is_file() and not p.name.endswith("-shm") and not (p.name.endswith("-wal") and not p.stat().st_size):
            h.update(str(p.relative_to(path)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def grep_files(root: Path, needle: bytes) -> list[str]:
    """Files under a directory whose bytes hold `needle` (a forgotten text must be in none)."""
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def in_units(row: dict, units: list[str], k: int) -> bool:
    """Whether a block row belongs to one of the training units named (level-1 subtrees and 'generic')."""
    if row["level"] == 0:
        return "generic" in units
    return str(subtree_of(row["level"], row["idx"], k)) in units
