"""What `benchmarks/corpora.py` reads from a trained bank: a subtree's probes, coverage, prompts and corpus
tokens, and the unrelated-text perplexity of the documents that met trained memories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def subtree_probes(home: Path, bank: str, subtree: int, probes: Path, dest: Path) -> Path:
    """The probes of documents with a window in level-1 subtree `subtree`; a probe that names its `subject`
    (a section of a long document), those whose subject a window of its document in the subtree names."""
    from memctl.registry import Registry

    reg = Registry.open(bank, home)
    try:
        texts: dict[str, list[str]] = {}
        for doc, text in reg.db.execute("select doc_id, text from windows where l1 = ?", [subtree]):
            texts.setdefault(doc, []).append(text)
    finally:
        reg.close()

    def inside(p: dict[str, Any]) -> bool:
        found = texts.get(p["doc"])
        return bool(found) and ("subject" not in p or any(p["subject"] in t for t in found))

    lines = [ln for ln in probes.read_text().splitlines() if ln.strip() and inside(json.loads(ln))]
    dest.write_text("".join(ln + "\n" for ln in lines))
    return dest


def trained_perplexity(ppl: dict[str, Any], subtree: int | None) -> dict[str, Any]:
    """Fetched memories against the anchor on the unrelated documents that met trained memories: the
    ones the gate let through and, in a subtree run, that routed into the trained subtree. The
    whole-set ratio averages in the documents that fetched nothing or only untrained blocks, which
    score as the anchor does, so a subtree run's whole-set figure understates a whole bank's."""
    from memctl.eval.results import ratio_over

    docs = [d for d in ppl.get("documents", []) if not d["gated"] and (subtree is None or d["route"][0] == subtree)]
    docs = [d for d in docs if d["tokens"] and "fetched" in d["nll"]]
    return {"docs": len(docs), "of": ppl.get("docs"), "ratio": ratio_over(docs, "fetched")}


def subtree_coverage(home: Path, bank: str, subtree: int, opts: list[str]) -> dict[str, Any]:
    """Coverage (memctl.train.coverage) of the trained subtree's windows alone, for a run with train options
    `opts`."""
    from memctl.registry import Registry
    from memctl.train.coverage import bank_coverage

    reg = Registry.open(bank, home)
    try:

        def on(flag: str) -> bool:
            return flag in opts and opts[opts.index(flag) + 1] != "0"

        # naming prompts exist only where the run made them (`train --event-names`, on by default)
        return bank_coverage(
            reg, questions=on("--questions"), study=on("--study"), l1=subtree, echo=on("--echo"), named=True
        ).to_dict()
    finally:
        reg.close()


def prompts_by_kind(home: Path, bank: str) -> dict[str, int]:
    from memctl.registry import Registry

    reg = Registry.open(bank, home)
    try:
        return {k: n for k, n in reg.db.execute("select kind, count(*) from prompts group by kind")}
    finally:
        reg.close()


def corpus_tokens(home: Path, bank: str, subtree: int | None) -> int:
    from memctl.registry import Registry

    reg = Registry.open(bank, home)
    try:
        sql = "select coalesce(sum(n_tokens), 0) from windows" + (" where l1 = ?" if subtree is not None else "")
        return int(reg.db.execute(sql, [subtree] if subtree is not None else []).fetchone()[0])
    finally:
        reg.close()
