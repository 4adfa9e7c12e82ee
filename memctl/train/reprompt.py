"""Prompts written by older rules: which windows have them, and rewriting them (`memctl reprompt`).

Each window records the version of the cloze rules (memctl.train.prompts.RULES) that wrote its prompts.
After an upgrade of memctl changes the rules, a bank keeps training on the prompts it has; `reprompt`
deletes the rule-written prompts (cloze and paraphrase, with their teacher cache) of the windows written
by older rules, so that the next `memctl train` writes them again, and marks every trained block stale,
since new prompts are routed anew and any unit may receive one. Self-study continuations and
anchor-written questions do not come from the rules and are kept. No model is loaded here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..registry import Registry, now
from ..registry.checkpoints import drop_checkpoints, pending_checkpoints
from ..registry.lock import bank_lock
from .kinds import RULE_KINDS
from .prompts import RULES


@dataclass
class RulesState:
    current: int  # the rules this memctl writes
    windows: int  # windows whose prompts are written
    outdated: int  # of them, written by older rules
    oldest: int | None  # the oldest version among them (0: before rules were versioned)

    def to_dict(self) -> dict[str, int | None]:
        return {"current": self.current, "windows": self.windows, "outdated": self.outdated, "oldest": self.oldest}


@dataclass
class RepromptReport:
    windows: int  # windows whose prompts will be written again
    prompts_deleted: int
    stale_blocks: list[str] = field(default_factory=list)
    checkpoints_dropped: int = 0


def rules_state(reg: Registry) -> RulesState:
    row = reg.db.execute(
        "select count(*), coalesce(sum(prompt_rules < ?), 0), min(case when prompt_rules < ? then prompt_rules end) "
        "from windows where prompted = 1",
        [RULES, RULES],
    ).fetchone()
    return RulesState(RULES, int(row[0]), int(row[1]), None if row[2] is None else int(row[2]))


def outdated_note(reg: Registry) -> str | None:
    """One line for `train` and `info` when some windows' prompts were written by older rules."""
    st = rules_state(reg)
    if not st.outdated:
        return None
    return (
        f"{st.outdated} of {st.windows} windows have cloze prompts written by older rules (v{st.oldest}; memctl now "
        f"writes v{st.current}); `memctl reprompt --bank {reg.name}` rewrites them, then `memctl train` retrains"
    )


def reprompt(reg: Registry, all_windows: bool = False) -> RepromptReport:
    """Delete the rule-written prompts of the windows written by older rules (every window with
    `all_windows`), mark them to be prompted again and every trained block stale, in one transaction;
    then drop interrupted checkpoints, which trained on the old prompts. The caller holds the bank lock."""
    where = "prompted = 1" + ("" if all_windows else f" and prompt_rules < {int(RULES)}")
    kinds = ", ".join(f"'{k}'" for k in RULE_KINDS)
    with reg.db.atomic():
        n_windows = reg.db.execute(f"select count(*) from windows where {where}").fetchone()[0]
        if not n_windows:
            return RepromptReport(0, 0)
        deleted = reg.db.execute(
            f"delete from prompts where kind in ({kinds}) and window_id in (select id from windows where {where})"
        ).rowcount
        reg.db.execute(f"update windows set prompted = 0 where {where}")
        stale = [r["id"] for r in reg.db.query("select id from blocks where state = 'trained' order by level, idx")]
        reg.db.execute("update blocks set state = 'stale', updated = ? where state = 'trained'", [now()])
    pending = pending_checkpoints(reg.checkpoint_dir())
    drop_checkpoints(reg.checkpoint_dir())
    return RepromptReport(int(n_windows), int(deleted), stale, len(pending))


def reprompt_bank(name: str, home: Path | None = None, all_windows: bool = False) -> RepromptReport:
    """`reprompt` on bank `name`, holding its writer lock."""
    with bank_lock(name, home):
        reg = Registry.open(name, home)
        try:
            return reprompt(reg, all_windows)
        finally:
            reg.close()


def bank_rules_note(name: str, home: Path | None = None) -> str | None:
    """`outdated_note` of bank `name` (read only)."""
    reg = Registry.open(name, home)
    try:
        return outdated_note(reg)
    finally:
        reg.close()
