"""Preservation: memories must leave the anchor's behaviour on unrelated text alone.

Distillation teaches a block to answer questions about its cluster; nothing in it says what the
block should do on text about something else, and a fetched memory is applied to whatever the
context routed to it. Left alone, memories made unrelated held-out text 7.6% less likely on the
elements example (`memctl eval --perplexity`, Python docstrings), against a 2% bar.

The fix is one more distillation target, from the anchor itself: a pool of text the anchor writes
on its own (with a fixed seed), with the anchor's own top-k next-token distributions at every
position. While a unit trains, a share of its tokens (`TrainConfig.preserve`) goes to pool
sequences, each on a random path of the unit, where the student (anchor + memories) must match the
anchor alone. This is on-policy: the text is what the anchor itself finds likely, so matching it
costs the anchor nothing, and it contains no corpus text (nothing to forget). The pool and its
teacher are computed once per bank and stored in the registry.

What the pool covers decides what is preserved (measured on the docstrings, fetched memories of the
two subtrees they route to): 256 sequences from beginning-of-sequence alone, where this anchor
writes prose, left +2.9% (and doubling the share did not help); opening each sequence on a random
vocabulary token, so the pool holds code, lists and names too, left +2.4%; 1,024 of those, +1.9%
(whole documents; `memctl eval`, which scores window-sized chunks, measured +3.0% and +1.99% on the
first and last bank).

It does not reach near-domain text (docs/history.md): with memories in every layer, the docstrings
that route into a trained subtree of a computing dictionary (foldoc) are +24% (256 sequences) and
+21% (1,024), the bank's own vocabulary read into them; a pool opened on the bank's own tokens did
worse (+8.4% against +6.6% over all 27, and fewer facts learned).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..model.anchor import Anchor
from ..registry import Registry
from .batches import CLOZE_KINDS, Sample, epoch_tokens, parse_path
from .distill import TOPK  # the same top-k as the prompts' teacher
from .units import GENERIC

POOL = 1024  # sequences
LENGTH = 64  # tokens each
TOP_P = 0.95
SEED = 0
Progress = Callable[[str, int, int], None]


@torch.no_grad()
def sample_pool(
    anchor: Anchor,
    n: int = POOL,
    length: int = LENGTH,
    seed: int = SEED,
    batch: int = 128,  # part of the seed: another batch size samples another pool
    start: str = "token",
    done: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """n sequences of `length` tokens the anchor writes (nucleus sampling at temperature 1: its own
    distribution without the far tail). start="token": each sequence opens with one token drawn
    uniformly from the vocabulary (special tokens aside) and the anchor writes the rest, so the pool
    covers code, lists, names and other languages; start="bos": from beginning-of-sequence alone,
    where this anchor writes mostly prose (measured: it left 2.9% damage on Python docstrings).
    `done(count)` is called after each batch."""
    if start not in ("token", "bos"):
        raise ValueError(f"start must be 'token' or 'bos', not {start!r}")
    tok, model = anchor.tokenizer, anchor.model
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    vocab = np.setdiff1d(np.arange(min(len(tok), model.config.vocab_size)), np.asarray(tok.all_special_ids))
    firsts = np.random.default_rng(seed).choice(vocab, size=n)
    marked = np.asarray(sorted(special_ids(tok)))  # also added tokens marked special (<file_sep>, ...)
    clean = np.setdiff1d(vocab, marked)
    for i in np.flatnonzero(np.isin(firsts, marked)):  # redrawn, each on its own seed
        firsts[i] = np.random.default_rng([seed, int(i)]).choice(clean)
    opening = [[int(bos), int(f)] if start == "token" else [int(bos)] for f in firsts]  # given, not written
    out: list[list[int]] = []
    gpu = [anchor.device.index or 0] if anchor.device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpu):  # on a GPU, sampling draws from its own generator
        torch.manual_seed(seed)
        for s in range(0, n, batch):
            ids = torch.tensor(opening[s : s + batch], device=anchor.device)
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_p=TOP_P,
                top_k=0,
                max_new_tokens=length + 1 - ids.shape[1],
                min_new_tokens=length + 1 - ids.shape[1],
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else int(bos),
            )
            out.extend(row[1 : 1 + length].tolist() for row in gen)
            if done:
                done(len(out))
    return out


def special_ids(tok: Any) -> set[int]:
    """Every special token: the special-tokens map and added tokens marked special."""
    added = getattr(tok, "added_tokens_decoder", {}) or {}
    return set(tok.all_special_ids) | {int(i) for i, t in added.items() if getattr(t, "special", False)}


@torch.no_grad()
def anchor_topk(
    anchor: Anchor, seqs: list[list[int]], k: int = TOPK, batch: int = 16
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The anchor's own top-k log-probabilities at every position of each sequence (equal lengths)."""
    out = []
    for s in range(0, len(seqs), batch):
        ids = torch.tensor(seqs[s : s + batch], dtype=torch.long, device=anchor.device)
        logp = F.log_softmax(anchor.model(input_ids=ids).logits.float(), -1)
        top = logp.topk(k, dim=-1)
        indices, values = top.indices.to(torch.int32).cpu().numpy(), top.values.cpu().numpy()
        for i in range(ids.shape[0]):
            out.append((indices[i], values[i].astype(np.float32)))
    return out


def pool_cache_file(anchor: Anchor, seed: int, n: int) -> Path | None:
    """Where the pool of (anchor, seed, n) is kept for every bank on that anchor under one memctl
    home: it depends on nothing else, and it holds no corpus text (nothing a forget must reach)."""
    if anchor.cache is None:
        return None
    # the device type too: a GPU samples another pool from the same seed; v1: how sample_pool draws
    where = f"{anchor.device.type}-{str(anchor.dtype).removeprefix('torch.')}"
    key = f"preserve-v1-s{seed}-n{n}-len{LENGTH}-top{TOPK}-p{TOP_P}-{where}-token.npz"
    return anchor.cache.with_name(f"{anchor.cache.name}-{key}")


POOL_ARRAYS = {"ids": np.int32, "topk_idx": np.int32, "topk_logp": np.float32}


def _load_cached(path: Path | None, n: int) -> dict[str, np.ndarray] | None:
    """The cached pool, or None when there is none or it is not exactly a pool of n (a damaged or
    foreign file is made again, never trusted: truncated zips, wrong shapes or dtypes)."""
    if path is None or not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            pool = {k: z[k] for k in POOL_ARRAYS}
    except Exception:  # numpy raises OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError...
        return None
    shapes = {"ids": (n, LENGTH), "topk_idx": (n, LENGTH, TOPK), "topk_logp": (n, LENGTH, TOPK)}
    if any(pool[k].shape != shape or pool[k].dtype != POOL_ARRAYS[k] for k, shape in shapes.items()):
        return None
    return pool


def _save_cached(path: Path | None, pool: dict[str, np.ndarray]) -> None:
    """Write the pool whole (temp file, fsync, rename) or not at all: it is only a cache, so a full
    disk or a read-only home costs the next bank the sampling, not this one its training."""
    if path is None:
        return
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}.npz")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **pool)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError:
        with contextlib.suppress(OSError):  # nothing may be there to remove, or no directory at all
            tmp.unlink()


def prepare_pool(reg: Registry, anchor: Anchor, progress: Progress | None = None, n: int = POOL) -> float:
    """Write the pool and its teacher to the registry unless it is there. Returns seconds spent.

    The pool is made once per anchor, seed and size under the memctl home (about 12 minutes for the
    default pool on a 2-core CPU); every later bank on the same anchor copies it."""
    have = reg.count("preserve")
    if have >= n:
        return 0.0
    t0 = time.perf_counter()
    if progress:
        progress("preserve", 0, n)
    seed = reg.config.seed + SEED
    cache = pool_cache_file(anchor, seed, n)
    pool = _load_cached(cache, n)
    if pool is None:
        seqs = sample_pool(  # the teacher pass after it takes about a tenth of the time
            anchor, n, seed=seed, done=(lambda k: progress("preserve", k, n)) if progress else None
        )
        tops = anchor_topk(anchor, seqs)
        pool = {
            "ids": np.asarray(seqs, np.int32),
            "topk_idx": np.stack([ti for ti, _ in tops]).astype(np.int32),
            "topk_logp": np.stack([tl for _, tl in tops]).astype(np.float32),
        }
        _save_cached(cache, pool)
    rows = [
        {"id": i, **{k: np.ascontiguousarray(pool[k][i]).tobytes() for k in ("ids", "topk_idx", "topk_logp")}}
        for i in range(n)
    ]
    with reg.db.atomic():
        reg.db.execute("delete from preserve")
        reg.db["preserve"].insert_all(rows, batch_size=256)
    if progress:
        progress("preserve", n, n)
    return time.perf_counter() - t0


def answer_spans(text: str, answers: Iterable[str], title: str) -> list[tuple[int, int]]:
    """Character spans of `text` that are facts: every occurrence of one of its window's cloze answers (as
    the bank stored them: memctl.train.prompts), and of its title."""
    spans = []
    for needle in {a for a in answers if a.strip()} | ({title.strip()} if title.strip() else set()):
        spans += [(m.start(), m.end()) for m in re.finditer(re.escape(needle), text)]
    return spans


def own_window_samples(
    reg: Registry,
    anchor: Anchor,
    unit: str,
    share: float,
    samples: list[Sample],
    seed: int,
    exclude: frozenset[str] = frozenset(),
    per_epoch: int = 0,
) -> list[Sample]:
    """Preservation on the unit's own windows (`train --preserve-own`): window sequences worth `share` of the unit's
    training tokens in an epoch (`per_epoch`: memctl.train.batches.epoch_tokens), each on its own window's path,
    where the student must match the anchor alone at every position except those that predict a fact (a stored
    cloze answer or the title: `answer_spans`). The memories learn their facts from the prompts and learn to
    leave the rest of their documents' kind of text as the anchor reads it: the near-domain text the pool does
    not reach. A window's samples are its document's (provenance; forgetting the document retrains without
    them). Call with the anchor alone (no memory fetched)."""
    if share <= 0 or not samples or unit == GENERIC:
        return []
    sql = (
        "select w.id, w.doc_id, w.text, w.path, d.title from windows w join documents d on d.id = w.doc_id "
        "where w.l1 = ? order by w.id"
    )
    rows = [r for r in reg.db.query(sql, [int(unit)]) if r["doc_id"] not in exclude]
    answers: dict[int, list[str]] = {}
    kinds = ",".join("?" * len(CLOZE_KINDS))
    sql = (
        "select p.window_id, p.answer from prompts p join windows w on w.id = p.window_id "
        f"where w.l1 = ? and p.kind in ({kinds})"
    )
    for a in reg.db.query(sql, [int(unit), *CLOZE_KINDS]):
        answers.setdefault(a["window_id"], []).append(a["answer"])
    tok = anchor.tokenizer
    own = []
    for r in rows:
        enc = tok(r["text"], add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        facts = answer_spans(r["text"], answers.get(r["id"], []), r["title"] or "")
        # position t predicts token t+1: left out where that token overlaps a fact
        keep = [
            t for t in range(len(ids) - 1) if not any(s < offsets[t + 1][1] and offsets[t + 1][0] < e for s, e in facts)
        ]
        if not keep:
            continue
        idx, logp = anchor_topk(anchor, [ids])[0]
        path = parse_path(r["path"])
        own.append(
            Sample(
                f"o{r['id']}",
                r["doc_id"],
                ids,
                path,
                None,
                1,
                torch.from_numpy(idx[keep].astype(np.int64)),
                torch.from_numpy(logp[keep]),
                keep=True,
                kd_pos=keep,
            )  # fmt: skip
        )
    if not own:
        return []
    tokens = epoch_tokens(samples, per_epoch)
    mean = sum(len(s.ids) for s in own) / len(own)
    n = max(1, math.ceil(share * tokens / mean))
    rng = np.random.default_rng([seed, int(unit), 11])
    return [own[i] for i in rng.choice(len(own), size=n, replace=n > len(own)).tolist()]
