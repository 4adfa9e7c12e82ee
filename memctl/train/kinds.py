"""The kinds of training prompt in the prompts table, and which of them a run trains on.

Cloze and paraphrase prompts (memctl.train.prompts) are always trained on; anchor-written questions
(memctl.train.questions, `train --questions`), self-study continuations (memctl.train.study, `train
--study`) and echo questions (memctl.train.echo, `train --echo`) only when the run asks for them. No
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


def untrained_kinds(questions: bool, study: bool, echo: bool = False) -> list[str]:
    """Prompt kinds a run does not train on: anchor-written questions without `questions`, self-study
    continuations without `study`, echo questions without `echo` (what training loads and what coverage
    counts)."""
    return ([] if questions else [QUESTION]) + ([] if study else [STUDY]) + ([] if echo else [ECHO])


def replace_kind(
    reg: Registry, kind: str, windows: Sequence[int], counts: Mapping[str, int], rows: Sequence[dict[str, Any]]
) -> None:
    """In one transaction: the prompts of `kind` of `windows` become `rows`, and each window records each
    count of `counts` in its column (how many per window it was asked for: `questioned`, `echoed`,
    `echo_kinds`)."""
    with reg.db.atomic():
        for s in range(0, len(windows), 500):
            chunk = list(windows[s : s + 500])
            marks = ",".join("?" * len(chunk))
            reg.db.execute(f"delete from prompts where kind = ? and window_id in ({marks})", [kind, *chunk])
            sets = ", ".join(f"{column} = ?" for column in counts)
            reg.db.execute(f"update windows set {sets} where id in ({marks})", [*counts.values(), *chunk])
        if rows:
            reg.db["prompts"].insert_all(rows, batch_size=1000)
