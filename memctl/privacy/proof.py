"""Proof that a document is forgotten: it looks like a document the bank never saw.

Two measures per document, each a *gain* = loss with the anchor alone − loss with the bank:

* text gain: mean next-token loss over the document's windows (memories routed on each window):
  what the memories can recite (what `--objective lm` learns);
* fact gain: loss of the answers of the document's own cloze prompts (memctl.train.prompts; memories
  routed on each prompt, as a question is): what the memories know (what `distill` learns).

Reference documents (`memctl ingest --reference`) were never trained: their gains are what 'unseen'
looks like under this bank. Each gain becomes a z-score against the references' gains; a document
looks unseen unless one of its z-scores passes Z_SEEN (3 standard deviations: about 1 unseen
document in 700 would pass it by chance under a normal spread). A document whose facts other
documents also teach keeps some fact gain after forgetting: that knowledge is not its alone.
`verify_forgotten` also looks for the text itself: the registry holds no
document with its id or text, and no file of the bank contains a fragment of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..build.corpus import Document, read_documents, split_windows
from ..build.ingest import token_counter
from ..core.errors import BankStateError
from ..eval.perplexity import TextLoss, answer_losses, combine, summary, text_losses
from ..serve.session import BankSession
from ..train.leads import document_lead
from ..train.prompts import prompts_for
from ..train.sections import openings

Progress = Callable[[str, int, int], None]
Z_SEEN = 3.0  # a gain this many reference standard deviations above the reference mean looks seen
MIN_REFERENCES = 3  # fewer give no usable spread
NEEDLE_CHARS = 20  # text fragments at least this long are searched for in the bank's files
MAX_NEEDLES = 16


@dataclass(frozen=True)
class DocText:
    title: str
    windows: list[str]


@dataclass(frozen=True)
class Losses:
    text: float  # mean token loss over the windows
    facts: float  # mean token loss of cloze answers (nan: the text has nothing to ask about)


def measure(
    session: BankSession, docs: dict[str, DocText], mode: str, stage: str, progress: Progress | None = None
) -> dict[str, Losses]:
    """Text and fact losses of each document under `mode` ('fetched' or 'none')."""
    flat = [(doc, w) for doc, d in docs.items() for w in d.windows]
    per_text: dict[str, list[TextLoss]] = {d: [] for d in docs}
    for (doc, _w), loss in zip(flat, text_losses(session, [w for _d, w in flat], mode, stage=stage,
                                                 progress=progress), strict=True):  # fmt: skip
        per_text[doc].append(loss)
    pairs = [
        (doc, p.text, p.answer)
        for doc, d in docs.items()
        for starts, lead in [(openings(d.windows, d.title), document_lead(d.title, d.windows))]
        for i, w in enumerate(d.windows)
        for p in prompts_for(w, d.title, sections=starts is not None, start=starts[i] if starts else "", lead=lead)
    ]
    per_fact: dict[str, list[TextLoss]] = {d: [] for d in docs}
    losses = answer_losses(session, [(p, a) for _d, p, a in pairs], mode, stage=stage, progress=progress)
    for (doc, _p, _a), loss in zip(pairs, losses, strict=True):
        per_fact[doc].append(loss)
    return {d: Losses(combine(per_text[d]).mean, combine(per_fact[d]).mean if per_fact[d] else math.nan) for d in docs}


def gains(alone: dict[str, Losses], bank: dict[str, Losses]) -> dict[str, Losses]:
    return {d: Losses(alone[d].text - bank[d].text, alone[d].facts - bank[d].facts) for d in alone}


def reference_docs(session: BankSession) -> dict[str, DocText]:
    """The bank's reference documents, cut into windows as ingest would cut them."""
    rows = session.reg.db.query("select id, source, title, text from reference_docs order by id")
    return windowed(session, [Document(r["id"], r["text"], r["source"], r["title"]) for r in rows])


def windowed(session: BankSession, docs: Sequence[Document]) -> dict[str, DocText]:
    """Documents cut into windows as ingest cuts them."""
    count = token_counter(session.anchor)
    return {d.id: DocText(d.title, [w.text for w in split_windows(d, session.cfg.window, count)]) for d in docs}


@dataclass
class Baseline:
    """What unseen looks like: the reference documents' gains under this bank."""

    text: list[float]
    facts: list[float]

    def to_dict(self) -> dict[str, Any]:
        return {"documents": len(self.text), "gain": summary(self.text), "fact_gain": summary(self.facts)}


def baseline(session: BankSession, progress: Progress | None = None) -> Baseline:
    refs = reference_docs(session)
    if not refs:
        return Baseline([], [])
    g = gains(measure(session, refs, "none", "references", progress), measure(session, refs, "fetched", "references",
                                                                               progress))  # fmt: skip
    return Baseline([x.text for x in g.values()], [x.facts for x in g.values() if not math.isnan(x.facts)])


def zscores(gain: Losses, base: Baseline) -> Losses:
    """How many reference standard deviations each gain lies above the references' mean gain."""

    def z(x: float, ref: list[float]) -> float:
        if math.isnan(x) or len(ref) < MIN_REFERENCES:
            return math.nan
        sd = float(np.std(ref, ddof=1))
        return (x - float(np.mean(ref))) / max(sd, 1e-6)

    return Losses(z(gain.text, base.text), z(gain.facts, base.facts))


def judge(gain: Losses, base: Baseline) -> tuple[Losses, str]:
    """(z-scores, verdict): 'SEEN' when a z-score passes Z_SEEN, 'unseen' otherwise, 'unverified'
    with fewer than MIN_REFERENCES reference documents."""
    z = zscores(gain, base)
    if math.isnan(z.text):
        return z, "unverified"
    seen = z.text > Z_SEEN or (not math.isnan(z.facts) and z.facts > Z_SEEN)
    return z, "SEEN" if seen else "unseen"


# ---- verification ------------------------------------------------------------------------------------
@dataclass
class VerifyResult:
    doc: str
    in_registry: bool  # its id or its exact text is still a document of the bank
    traces: list[str]  # bank files that contain a fragment of its text
    fragments: int  # fragments searched for
    loss_anchor: float
    loss_bank: float
    gain: float
    fact_gain: float
    z: float  # text gain in reference standard deviations above their mean
    fact_z: float
    verdict: str

    @property
    def ok(self) -> bool:
        return not self.in_registry and not self.traces and self.verdict != "SEEN"


def needles(text: str, retained: Sequence[str]) -> list[bytes]:
    """Distinctive fragments of a text (its longest lines/sentences of >= NEEDLE_CHARS characters)
    that no retained window contains."""
    parts = {p.strip() for line in text.splitlines() for p in line.split(". ")}
    parts = {p for p in parts if len(p) >= NEEDLE_CHARS and not any(p in w for w in retained)}
    return [p.encode("utf-8") for p in sorted(parts, key=len, reverse=True)[:MAX_NEEDLES]]


def scan_files(root: Path, frags: dict[str, list[bytes]]) -> dict[str, list[str]]:
    """doc -> files under root (relative) containing any of its fragments. Every file is read once."""
    hits: dict[str, list[str]] = {d: [] for d in frags}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for doc, fs in frags.items():
            if any(f in data for f in fs):
                hits[doc].append(str(path.relative_to(root)))
    return hits


def verify_forgotten(
    name: str,
    paths: Sequence[str | Path],
    *,
    text_field: str = "text",
    id_field: str | None = None,
    home: Path | None = None,
    progress: Progress | None = None,
) -> list[VerifyResult]:
    """Re-check, for documents given again by the user, that the bank holds no trace of them: not in
    the registry, no fragment of their text in any file of the bank, and no more memorised than the
    bank's reference documents."""
    docs = read_documents(paths, text_field=text_field, id_field=id_field)
    # the parameters themselves: no relevance gate, no anchor mix
    with BankSession(name, home, serve_blocked=True, min_relevance=0.0, anchor_mix=0.0) as session:
        reg = session.reg
        if reg.count("windows") == 0:
            raise BankStateError(f"bank {name!r} has no documents")
        known = reg.doc_hashes()
        shas = set(known.values())
        retained = [r[0] for r in reg.db.execute("select text from windows")]
        texts = windowed(session, docs)
        frags = {d.id: needles(d.text, retained) for d in docs}
        traces = scan_files(reg.path, frags)
        alone = measure(session, texts, "none", "anchor", progress)
        bank = measure(session, texts, "fetched", "bank", progress)
        base = baseline(session, progress)
        g = gains(alone, bank)
        out = []
        for d in docs:
            z, verdict = judge(g[d.id], base)
            out.append(
                VerifyResult(
                    d.id, d.id in known or d.sha256 in shas, traces[d.id], len(frags[d.id]),
                    alone[d.id].text, bank[d.id].text, g[d.id].text, g[d.id].facts, z.text, z.facts, verdict,
                )
            )  # fmt: skip
        return out
