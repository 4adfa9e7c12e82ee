"""Cloze statements asked as questions (experiment): "The Group 4 protocol was published by what?" in the
chat template, answered with the cloze's answer; the teacher reads the window before the question.
Up to PER_WINDOW per window, from distinct sentences."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..build.embed import get_embedder
from ..build.routing import route_prompts
from ..registry import Registry
from .kinds import ECHO
from .study import _chat

PER_WINDOW = 4


def echo_question(prompt: str) -> str:
    return prompt.rstrip(" ,;:(") + " what?"


def add_echo(reg: Registry, tok: Any, l1s: Sequence[int] | None = None) -> int:
    only = f" and w.l1 in ({','.join(str(int(x)) for x in l1s)})" if l1s is not None else ""
    rows = list(
        reg.db.query(
            "select p.window_id, p.doc_id, p.text, p.answer from prompts p join windows w on w.id = p.window_id "
            "where p.kind = 'cloze' and p.held_out = 0 and not exists (select 1 from prompts e where "
            f"e.window_id = p.window_id and e.kind = '{ECHO}'){only} order by p.window_id, p.id"
        )
    )
    made: list[dict[str, Any]] = []
    bare: list[str] = []
    kept: dict[int, list[str]] = {}
    for r in rows:
        mine = kept.setdefault(r["window_id"], [])
        full = r["text"] + " " + r["answer"]
        if len(mine) >= PER_WINDOW or any(full.startswith(k) or k.startswith(r["text"]) for k in mine):
            continue
        mine.append(full)
        q = echo_question(r["text"])
        made.append({"window_id": r["window_id"], "doc_id": r["doc_id"], "kind": ECHO, "text": _chat(tok, q),
                     "answer": r["answer"], "held_out": 0})
        bare.append(q)
    if not made:
        return 0
    routes = route_prompts(reg, get_embedder(reg.config.embedder).encode(bare), [m["doc_id"] for m in made])
    for m, path in zip(made, routes, strict=True):
        m["path"] = ",".join(map(str, path))
        m["l1"] = int(path[0])
    with reg.db.atomic():
        reg.db["prompts"].insert_all(made, batch_size=1000)
    return len(made)
