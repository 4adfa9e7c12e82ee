"""The kinds of training prompt in the prompts table, and which of them a run trains on.

Cloze and paraphrase prompts (memctl.train.prompts) are always trained on; anchor-written questions
(memctl.train.questions, `train --questions`) and self-study continuations (memctl.train.study, `train
--study`) only when the run asks for them. No model code: coverage reads this too.
"""

from __future__ import annotations

RULE_KINDS = ("cloze", "paraphrase")  # written by the rules of memctl.train.prompts (versioned: its RULES)
QUESTION = "question"  # an anchor-written question (memctl.train.questions)
STUDY = "study"  # a self-study continuation (memctl.train.study)
ECHO = "echo"  # a cloze statement asked as a question in the chat template (memctl.train.echo)


def untrained_kinds(questions: bool, study: bool) -> list[str]:
    """Prompt kinds a run does not train on: anchor-written questions without `questions`, self-study
    continuations without `study` (what training loads and what coverage counts)."""
    return ([] if questions else [QUESTION]) + ([] if study else [STUDY])
