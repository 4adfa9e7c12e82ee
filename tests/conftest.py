from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
from tiny import build_tiny_llama

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
