"""The kinds of training prompt in the prompts table, and which of them a run trains on.

Cloze and paraphrase prompts (memctl.train.prompts) are always trained on; anchor-written questions
(memctl.train.questions, `train --questions`), self-study continuations (memctl.train.study, `train
--study`), echo questions (memctl.train.echo, `train --echo`) and naming prompts (memctl.train.namings,
`train --event-names`) only when the run asks for them. No
model code: coverage reads this too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..registry import Registry

RULE_KINDS = ("cloze", "paraphrase")  # written by the rules of memctl.train.prompts (versioned: its RULES)
QUESTION = "question"  # an anchor-written question (memctl.train.questions)
STUDY = "study"  # a self-study continuation (memctl.train.study)
ECHO = "echo"  # a cloze statement asked back as a question (memctl.train.echo)
NAMING = "naming"  # a cloze prompt asked again under the name a reader gives its event (memctl.train.namings)


def untrained_kinds(questions: bool, study: bool, echo: bool = False, named: bool = False) -> list[str]:
    """Prompt kinds a run does not train on: anchor-written questions without `questions`, self-study
    continuations without `study`, echo questions without `echo`, naming prompts without `named` (what
    training loads and what coverage counts)."""
    return (
        ([] if questions else [QUESTION])
        + ([] if study else [STUDY])
        + ([] if echo else [ECHO])
        + ([] if named else [NAMING])
    )


def trained_rule_prompts(
    reg: Registry, windows: Sequence[int], kinds: Sequence[str] = ("cloze",)
) -> dict[int, list[dict[str, Any]]]:
    """Each window's trained (not held-out) prompts of `kinds` (its window, document, text and answer), in the
    order they were written: what echo questions and naming prompts are derived from."""
    out: dict[int, list[dict[str, Any]]] = {}
    for s in range(0, len(windows), 500):
        chunk = list(windows[s : s + 500])
        for r in reg.db.query(
            f"select window_id, doc_id, text, answer from prompts where kind in ({','.join('?' * len(kinds))}) "
            f"and held_out = 0 and window_id in ({','.join('?' * len(chunk))}) order by window_id, id",
            [*kinds, *chunk],
        ):
            out.setdefault(int(r["window_id"]), []).append(r)
    return out


def replace_kind(
    reg: Registry, kind: str, windows: Sequence[int], counts: Mapping[str, int], rows: Sequence[dict[str, Any]]
) -> None:
    """In one transaction: the prompts of `kind` of `windows` become `rows`, and each window records each
    count of `counts` in its column (how many per window it was asked for: `questioned`, `echoed`,
    `echo_kinds`, `echo_named`, `named`)."""
    with reg.db.atomic():
        for s in range(0, len(windows), 500):
            chunk = list(windows[s : s + 500])
            marks = ",".join("?" * len(chunk))
            reg.db.execute(f"delete from prompts where kind = ? and window_id in ({marks})", [kind, *chunk])
            sets = ", ".join(f"{column} = ?" for column in counts)
            reg.db.execute(f"update windows set {sets} where id in ({marks})", [*counts.values(), *chunk])
        if rows:
            reg.db["prompts"].insert_all(rows, batch_size=1000)
