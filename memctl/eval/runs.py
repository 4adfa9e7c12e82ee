"""Evaluation runs in the registry: parameters and results of every run (`eval --history`), and the
answers of a run in progress, committed batch by batch, so a stopped run resumes where it stopped.

A run is keyed by its parameters, the probe file's content and the bank's state (its blocks, their
checksums and blocked flags, and its windows): the same command on the same bank resumes; after a
retrain, a block or a forget, it starts a new run. A finished run keeps only its aggregate results;
its answers are deleted. Forgetting a document deletes the stored answers about it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..registry import Registry, dumps, now


@dataclass(frozen=True)
class ItemResult:
    item: str
    doc: str
    answer: str = ""
    correct: int = 0
    nll: float = 0.0
    tokens: int = 0
    seconds: float = 0.0


def bank_state(reg: Registry) -> str:
    """What the answers depend on: every block (file checksum, blocked flag), the tree's windows."""
    h = hashlib.sha256()
    for r in reg.db.execute("select level, idx, coalesce(sha256, ''), blocked from blocks order by level, idx"):
        h.update(repr(tuple(r)).encode())
    h.update(repr(reg.db.execute("select count(*), coalesce(max(id), 0) from windows").fetchone()).encode())
    h.update(
        repr(reg.db.execute("select count(*), coalesce(group_concat(tags), '') from documents").fetchone()).encode()
    )
    return h.hexdigest()


def run_key(params: dict[str, Any], state: str) -> str:
    return hashlib.sha256((dumps(params) + state).encode()).hexdigest()


@dataclass
class OpenRun:
    id: int
    done: dict[str, ItemResult]
    resumed: bool


class EvalRuns:
    def __init__(self, reg: Registry) -> None:
        self.reg = reg

    def open(self, probes: str, params: dict[str, Any], fresh: bool = False) -> OpenRun:
        """Resume the unfinished run with the same key, or start one (`fresh`: always start one)."""
        state = bank_state(self.reg)
        key = run_key(params, state)
        row = self.reg.db.execute(
            "select id from eval_runs where key = ? and status = 'running' order by id desc limit 1", [key]
        ).fetchone()
        if row and not fresh:
            done = {
                r["item"]: ItemResult(
                    r["item"], r["doc"], r["answer"], r["correct"], r["nll"], r["tokens"], r["seconds"]
                )
                for r in self.reg.db.query("select * from eval_items where run_id = ?", [row[0]])
            }
            return OpenRun(int(row[0]), done, True)
        with self.reg.db.atomic():
            run_id = (
                self.reg.db["eval_runs"]
                .insert(
                    {
                        "key": key,
                        "started": now(),
                        "status": "running",
                        "probes": probes,
                        "bank_state": state,
                        "params": dumps(params),
                        "seconds": 0.0,
                    }
                )
                .last_pk
            )
        return OpenRun(int(run_id), {}, False)

    def save(self, run_id: int, items: Sequence[ItemResult]) -> None:
        """One batch of answers, in one transaction."""
        with self.reg.db.atomic():
            self.reg.db["eval_items"].insert_all(
                ({"run_id": run_id, **vars(i)} for i in items), pk=("run_id", "item"), replace=True
            )

    def finish(self, run_id: int, results: dict[str, Any], seconds: float) -> None:
        with self.reg.db.atomic():
            self.reg.db["eval_runs"].update(
                run_id, {"status": "done", "finished": now(), "results": dumps(results), "seconds": seconds}
            )
            self.reg.db.execute("delete from eval_items where run_id = ?", [run_id])

    def history(self, limit: int = 20) -> list[dict[str, Any]]:
        """The latest runs, newest first: parameters, results (finished runs) and progress."""
        rows = []
        for r in self.reg.db.query("select * from eval_runs order by id desc limit ?", [limit]):
            done = self.reg.db.execute("select count(*) from eval_items where run_id = ?", [r["id"]]).fetchone()[0]
            rows.append(
                {
                    "id": r["id"],
                    "started": r["started"],
                    "finished": r["finished"],
                    "status": r["status"],
                    "probes": r["probes"],
                    "params": json.loads(r["params"]),
                    "results": json.loads(r["results"]) if r["results"] else None,
                    "answers_stored": done,
                    "seconds": r["seconds"],
                }
            )
        return rows
