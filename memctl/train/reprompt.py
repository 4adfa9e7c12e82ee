"""Prompts written by older rules: which windows have them, and rewriting them (`memctl reprompt`).

Each window records the version of the cloze rules (memctl.train.prompts.RULES) that wrote its prompts.
After an upgrade of memctl changes the rules, a bank keeps training on the prompts it has; `reprompt`
deletes the rule-written prompts (cloze and paraphrase, with their teacher cache) of the windows written
by older rules, so that the next `memctl train` writes them again, and marks every trained block stale,
since new prompts are routed anew and any unit may receive one (and a window whose self-study seeds
named its title alone is studied again: a document of sections written before v2, one titled by an id or a
date written before v5, memctl.train.leads). A window whose prompts the current rules
would write the same, prompt for prompt (these rules run again on its text: no model), is not outdated:
it is recorded as current (`settle`); one they write otherwise records that they did (`rules_checked`),
so that every `train` does not run them again on it. Echo questions
(memctl.train.echo) ask the cloze statements back and go with them. Self-study continuations and
anchor-written questions do not come from the rules and are kept. No model is loaded here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..registry import Registry, now
from ..registry.checkpoints import drop_checkpoints, pending_checkpoints
from ..registry.lock import bank_lock
from .kinds import ECHO, NAMING, RULE_KINDS
from .leads import window_leads
from .prompts import RULES, window_prompts
from .sections import window_openings


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


def _seeds_changed(start: str | None, lead: str, rules: int) -> bool:
    """Whether these rules name a window's self-study seeds otherwise than rules `rules` did: a document of
    sections before v2 (its seeds named its title), a document with a lead before v5 (its title alone)."""
    return (start is not None and rules < 2) or (bool(lead) and rules < 5)


def _reseeded(reg: Registry, where: str) -> list[int]:
    """The windows matching `where` whose self-study seeds these rules write otherwise (`_seeds_changed`)."""
    rows = list(reg.db.query(f"select id, doc_id, prompt_rules from windows where {where}"))
    docs = {r["doc_id"] for r in rows}
    starts, leads = window_openings(reg, docs), window_leads(reg, docs)
    return [int(r["id"]) for r in rows if _seeds_changed(starts[int(r["id"])], leads[int(r["id"])], r["prompt_rules"])]


def _compare(reg: Registry) -> tuple[list[int], list[int]]:
    """Windows written by older rules and not yet compared with these: (those whose cloze and paraphrase
    prompts the current rules write the same, those they write otherwise). A window whose self-study seeds
    these rules name otherwise is never the same (`_reseeded`)."""
    rows = list(
        reg.db.query(
            "select w.id, w.doc_id, w.text, w.prompt_rules, d.title from windows w join documents d on "
            "d.id = w.doc_id where w.prompted = 1 and w.prompt_rules < ? and w.rules_checked < ? order by w.id",
            [RULES, RULES],
        )
    )
    if not rows:
        return [], []
    docs = {r["doc_id"] for r in rows}
    starts, leads = window_openings(reg, docs), window_leads(reg, docs)
    kinds = ", ".join(f"'{k}'" for k in RULE_KINDS)
    same: list[int] = []
    other: list[int] = []
    for i in range(0, len(rows), 500):
        part = rows[i : i + 500]
        stored: dict[int, list[tuple[str, str, str]]] = {int(r["id"]): [] for r in part}
        for w, kind, text, answer in reg.db.execute(
            f"select window_id, kind, text, answer from prompts where kind in ({kinds}) "
            f"and window_id in ({','.join('?' * len(part))})",
            [r["id"] for r in part],
        ):
            stored[int(w)].append((kind, text, answer))
        for r in part:
            start, lead = starts[int(r["id"])], leads[int(r["id"])]
            reseeded = _seeds_changed(start, lead, r["prompt_rules"])
            now = None if reseeded else window_prompts(r["text"], r["title"], start, lead)
            if now is not None and sorted((p.kind, p.text, p.answer) for p in now) == sorted(stored[int(r["id"])]):
                same.append(int(r["id"]))
            else:
                other.append(int(r["id"]))
    return same, other


def _set(reg: Registry, column: str, value: int, ids: Sequence[int]) -> None:
    for i in range(0, len(ids), 500):
        part = list(ids[i : i + 500])
        reg.db.execute(f"update windows set {column} = ? where id in ({','.join('?' * len(part))})", [value, *part])


def settle(reg: Registry) -> int:
    """Record the current rules on the windows whose prompts they would write the same (no prompt changes,
    nothing to retrain), and on the others that they were compared. Returns how many are the same. The
    caller holds the bank lock."""
    same, other = _compare(reg)
    with reg.db.atomic():
        _set(reg, "prompt_rules", RULES, same)
        _set(reg, "rules_checked", RULES, other)
    return len(same)


def rules_state(reg: Registry) -> RulesState:
    """How many windows older rules wrote, read from the registry alone (cheap, for `info` and the TUI): a
    window whose prompts these rules write the same counts until `settle` records it (the next `train`
    or `reprompt`)."""
    n, outdated, oldest = reg.db.execute(
        "select count(*), sum(prompt_rules < ?), min(case when prompt_rules < ? then prompt_rules end) "
        "from windows where prompted = 1",
        [RULES, RULES],
    ).fetchone()
    return RulesState(RULES, int(n), int(outdated or 0), None if oldest is None else int(oldest))


def outdated_note(reg: Registry) -> str | None:
    """One line for `train` and `info` when some windows' prompts were written by older rules."""
    st = rules_state(reg)
    if not st.outdated:
        return None
    return (
        f"{st.outdated} of {st.windows} windows have cloze prompts written by older rules (v{st.oldest}; memctl now "
        f"writes v{st.current}); `memctl reprompt --bank {reg.name}` rewrites those these rules write otherwise, "
        "then `memctl train` retrains"
    )


def reprompt(reg: Registry, all_windows: bool = False) -> RepromptReport:
    """Delete the rule-written prompts of the windows written by older rules (every window with
    `all_windows`), mark them to be prompted again and every trained block stale, in one transaction;
    then drop interrupted checkpoints, which trained on the old prompts. The caller holds the bank lock."""
    settle(reg)
    where = "prompted = 1" + ("" if all_windows else f" and prompt_rules < {int(RULES)}")
    kinds = ", ".join(f"'{k}'" for k in RULE_KINDS)
    with reg.db.atomic():
        n_windows = reg.db.execute(f"select count(*) from windows where {where}").fetchone()[0]
        if not n_windows:
            return RepromptReport(0, 0)
        deleted = reg.db.execute(
            f"delete from prompts where kind in ({kinds}) and window_id in (select id from windows where {where})"
        ).rowcount
        # echo questions ask the cloze statements back (memctl.train.echo): they go with them, and are asked again
        # and so do naming prompts, which ask them again under their event's name (memctl.train.namings)
        reg.db.execute(
            f"delete from prompts where kind in (?, ?) and window_id in (select id from windows where {where})",
            [ECHO, NAMING],
        )
        reg.db.execute(f"update windows set echoed = 0, echo_kinds = 0, named = 0, echo_named = 0 where {where}")
        # self-study continuations whose seeds these rules name otherwise are sampled again too
        _set(reg, "studied", 0, _reseeded(reg, where))
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
