"""The registry round-trips; block files are atomic and checksummed; migrations are numbered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from memctl.build.ingest import ingest
from memctl.core.config import BankConfig, MemoryConfig, TreeConfig
from memctl.core.errors import BankNotFound, IntegrityError
from memctl.core.tree import build_tree
from memctl.registry import Registry
from memctl.registry.migrations import MIGRATIONS


def test_config_json_round_trip() -> None:
    cfg = BankConfig(
        anchor="a.gguf",
        embedder="minilm",
        window=256,
        tree=TreeConfig(k=4, p=2, seed=3),
        memory=MemoryConfig(ranks=(16, 8), layers=(20, 21, 22), hidden=576),
        seed=3,
    )
    assert BankConfig.from_json(cfg.to_json()) == cfg


def test_bank_round_trips_documents_windows_tree_and_blocks(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    res = ingest("r", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    reg = Registry.open("r", home)
    assert reg.bank["name"] == "r" and reg.bank["anchor_sha256"] and res.created
    versions = [r["version"] for r in reg.db["schema_migrations"].rows]
    assert versions == list(range(1, len(MIGRATIONS) + 1))
    assert reg.count("documents") == 12 and reg.count("windows") == res.windows_added
    w = reg.db.execute("select doc_id, char_start, char_end, sha256, text from windows limit 1").fetchone()
    doc = (corpus / w[0]).read_text()
    assert doc[w[1] : w[2]] == w[4]
    # the stored tree routes the stored embeddings to the stored paths
    tree = reg.load_tree()
    ids, emb = reg.embeddings()
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    rebuilt = build_tree(emb, 2, 2, seed=reg.config.tree.seed)
    for a, b in zip(tree.centroids, rebuilt.centroids, strict=True):
        assert np.array_equal(a, b)
    # blocks: atomic write, checksum on read, corruption detected
    blk = {p: torch.randn(3, 2, 4) for p in ("gate", "up", "down")}
    file, sha = reg.write_block(1, 0, blk)
    row = {"file": file, "sha256": sha}
    got = reg.read_block(row)
    assert all(torch.equal(got[p], blk[p]) for p in blk)
    assert not list((reg.path / "blocks").glob(".*tmp*"))
    path = reg.path / file
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="checksum"):
        reg.read_block(row)
    path.unlink()
    with pytest.raises(IntegrityError, match="missing"):
        reg.read_block(row)


def test_unknown_bank(home: Path) -> None:
    with pytest.raises(BankNotFound):
        Registry.open("nope", home)
