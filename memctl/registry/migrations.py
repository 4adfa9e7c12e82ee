"""Numbered schema migrations. Append new ones; never edit an applied one."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime

import sqlite_utils


def _m001_initial(db: sqlite_utils.Database) -> None:
    db["banks"].create(
        {
            "name": str,
            "created": str,
            "config": str,
            "anchor": str,
            "anchor_sha256": str,
            "anchor_params": int,
            "anchor_layers": int,
        },
        pk="name",
    )
    db["documents"].create(
        {"id": str, "source": str, "title": str, "sha256": str, "n_chars": int, "tags": str, "added": str},
        pk="id",
    )
    db["documents"].create_index(["sha256"])
    db["windows"].create(
        {
            "id": int,
            "doc_id": str,
            "idx": int,
            "char_start": int,
            "char_end": int,
            "sha256": str,
            "text": str,
            "n_tokens": int,
            "path": str,  # comma-separated node index per level
            "l1": int,  # level-1 node: the training unit
            "embedding": bytes,  # float32 (dim,), L2-normalised
        },
        pk="id",
        foreign_keys=[("doc_id", "documents", "id")],
    )
    db["windows"].create_index(["doc_id"])
    db["windows"].create_index(["l1"])
    db["nodes"].create({"level": int, "idx": int, "centroid": bytes, "n_windows": int}, pk=("level", "idx"))
    db["blocks"].create(
        {
            "id": str,  # "L:I" or "generic"
            "level": int,  # 0 for the generic memory
            "idx": int,
            "rank": int,
            "file": str,
            "sha256": str,
            "dtype": str,
            "n_params": int,
            "trained_tokens": int,
            "state": str,  # init | trained | stale
            "updated": str,
        },
        pk="id",
    )
    db["blocks"].create_index(["level", "idx"], unique=True)
    db["block_docs"].create({"block_id": str, "doc_id": str, "tokens": int}, pk=("block_id", "doc_id"))
    db["block_docs"].create_index(["doc_id"])
    db["runs"].create(
        {
            "id": int,
            "started": str,
            "finished": str,
            "status": str,  # running | done | failed
            "unit": str,  # level-1 node index or "generic"
            "config": str,
            "steps": int,
            "tokens": int,
            "loss_first": float,
            "loss_last": float,
            "seconds": float,
        },
        pk="id",
    )


def _m002_prompts(db: sqlite_utils.Database) -> None:
    """Self-study prompts about windows, with their route and cached teacher distributions."""
    db["prompts"].create(
        {
            "id": int,
            "window_id": int,
            "doc_id": str,
            "kind": str,  # cloze | paraphrase | question (m006) | study (m007)
            "text": str,
            "answer": str,
            "path": str,  # the prompt's own route, comma-separated
            "l1": int,
            "held_out": int,  # 1: never trained on, scored while training
            "ids": bytes,  # int32 tokens of prompt + answer (the student's input)
            "n_prompt": int,  # how many of those tokens are the prompt
            "topk_idx": bytes,  # int32 (answer tokens + 1, k): the teacher's top-k next tokens
            "topk_logp": bytes,  # float32 (answer tokens + 1, k): their log-probabilities
        },
        pk="id",
        foreign_keys=[("window_id", "windows", "id"), ("doc_id", "documents", "id")],
    )
    db["prompts"].create_index(["window_id"])
    db["prompts"].create_index(["doc_id"])
    db["prompts"].create_index(["l1"])
    db["windows"].add_column("prompted", int, not_null_default=0)


def _m003_privacy(db: sqlite_utils.Database) -> None:
    """Blocking (with reason and time), an audit log of privacy actions, forget reports, and
    reference documents: never trained, the 'unseen' baseline of forgetting proofs."""
    db["blocks"].add_column("blocked", int, not_null_default=0)
    db["blocks"].add_column("blocked_reason", str)
    db["blocks"].add_column("blocked_at", str)
    db["privacy_log"].create(
        {"id": int, "at": str, "action": str, "target": str, "reason": str, "detail": str}, pk="id"
    )
    db["forget_reports"].create({"id": int, "at": str, "mode": str, "docs": str, "report": str}, pk="id")
    db["reference_docs"].create(
        {"id": str, "source": str, "title": str, "sha256": str, "text": str, "added": str}, pk="id"
    )


def _m004_eval_runs(db: sqlite_utils.Database) -> None:
    """Evaluation runs (their parameters and results, for `eval --history`) and the answers of a run
    still in progress, so a stopped run resumes where it was."""
    db["eval_runs"].create(
        {
            "id": int,
            "key": str,  # hash of the parameters, the probe file and the bank's state: what resumes
            "started": str,
            "finished": str,
            "status": str,  # running | done
            "probes": str,  # the probe file as given
            "bank_state": str,
            "params": str,  # JSON
            "results": str,  # JSON, when done
            "seconds": float,
        },
        pk="id",
    )
    db["eval_runs"].create_index(["key"])
    db["eval_items"].create(
        {
            "run_id": int,
            "item": str,  # setup|probe index|variant
            "doc": str,  # the probe's document: forgetting it removes the row
            "answer": str,
            "correct": int,
            "nll": float,  # perplexity items
            "tokens": int,
            "seconds": float,
        },
        pk=("run_id", "item"),
        foreign_keys=[("run_id", "eval_runs", "id")],
    )
    db["eval_items"].create_index(["doc"])


def _m005_preserve(db: sqlite_utils.Database) -> None:
    """Text the anchor wrote on its own, with its own top-k next-token distributions: what memories
    must leave unchanged (memctl.train.preserve). No corpus text, so nothing here belongs to a document."""
    db["preserve"].create({"id": int, "ids": bytes, "topk_idx": bytes, "topk_logp": bytes}, pk="id")


def _m006_questions(db: sqlite_utils.Database) -> None:
    """How many anchor-written questions each window was asked for (memctl.train.questions): 0 = none yet."""
    db["windows"].add_column("questioned", int, not_null_default=0)


def _m007_study(db: sqlite_utils.Database) -> None:
    """How many self-study continuations each window was asked for (memctl.train.study): 0 = none yet."""
    db["windows"].add_column("studied", int, not_null_default=0)


def _m008_study_hidden(db: sqlite_utils.Database) -> None:
    """The open-book teacher's hidden states at a few memory layers along a self-study continuation
    (float16, (tokens + 1, layers, d)), for `train --match-hidden`; null for every other prompt."""
    db["prompts"].add_column("hidden", bytes)


def _m009_prompt_rules(db: sqlite_utils.Database) -> None:
    """The version of the cloze rules (memctl.train.prompts.RULES) that wrote each window's prompts: 0 for
    prompts written before the rules were versioned (`memctl reprompt` rewrites older ones)."""
    db["windows"].add_column("prompt_rules", int, not_null_default=0)


def _m010_run_dtype(db: sqlite_utils.Database) -> None:
    """The compute dtype each run trained its unit in (fp32 or bf16: memctl.core.placement), so that
    `forget` retrains a unit in it. Runs recorded before this were fp32 unless `--dtype bf16` was passed."""
    db["runs"].add_column("dtype", str, not_null_default="fp32")


def _m011_echo(db: sqlite_utils.Database) -> None:
    """How many echo questions each window was asked for (memctl.train.echo, `train --echo`): 0 = none yet."""
    db["windows"].add_column("echoed", int, not_null_default=0)


def _m012_rules_checked(db: sqlite_utils.Database) -> None:
    """The newest cloze rules (memctl.train.prompts.RULES) that were run again on a window written by older
    ones and wrote other prompts (memctl.train.reprompt.settle): 0 = never. Such a window is not compared
    again until the rules change once more."""
    db["windows"].add_column("rules_checked", int, not_null_default=0)


def _m013_echo_kinds(db: sqlite_utils.Database) -> None:
    """How many kind questions each window was asked for (memctl.train.echo, `train --echo-kinds`): 0 = none."""
    db["windows"].add_column("echo_kinds", int, not_null_default=0)


def _m014_named(db: sqlite_utils.Database) -> None:
    """Whether each window's cloze prompts were asked again under the name of their event
    (memctl.train.namings, `train --event-names`): 0 = not yet."""
    db["windows"].add_column("named", int, not_null_default=0)


def _m015_echo_named(db: sqlite_utils.Database) -> None:
    """How many of each window's naming prompts were asked back as echo questions under its event's name
    (memctl.train.echo, `train --echo-names`): 0 = none, or not an event's window."""
    db["windows"].add_column("echo_named", int, not_null_default=0)


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _m001_initial,
    _m002_prompts,
    _m003_privacy,
    _m004_eval_runs,
    _m005_preserve,
    _m006_questions,
    _m007_study,
    _m008_study_hidden,
    _m009_prompt_rules,
    _m010_run_dtype,
    _m011_echo,
    _m012_rules_checked,
    _m013_echo_kinds,
    _m014_named,
    _m015_echo_named,
]


def migrate(db: sqlite_utils.Database) -> int:
    """Apply pending migrations, each in its own transaction. Returns the schema version."""
    if "schema_migrations" not in db.table_names():
        db["schema_migrations"].create({"version": int, "applied": str}, pk="version")
    done = {r["version"] for r in db["schema_migrations"].rows}
    for version, step in enumerate(MIGRATIONS, start=1):
        if version in done:
            continue
        with db.atomic():
            step(db)
            db["schema_migrations"].insert({"version": version, "applied": datetime.now(UTC).isoformat()})
    return len(MIGRATIONS)


def lost_schema(conn: sqlite3.Connection, version: int) -> str:
    """The tables and columns that schema `version` has and this registry lacks ("table documents, column
    prompts.kind"), or "": a registry whose table was dropped would otherwise fail every command."""
    want = sqlite_utils.Database(memory=True)
    want["schema_migrations"].create({"version": int, "applied": str}, pk="version")
    for step in MIGRATIONS[:version]:  # doctor replays them: an applied migration must never change
        step(want)
    expected = {t: [c.name for c in want[t].columns] for t in want.table_names()}
    want.close()
    have = {t: {c[1] for c in conn.execute(f'PRAGMA table_info("{t}")')} for (t,) in
            conn.execute("select name from sqlite_master where type = 'table'")}  # fmt: skip
    lost = []
    for table, columns in expected.items():
        if table not in have:
            lost.append(f"table {table}")
        else:
            lost += [f"column {table}.{c}" for c in columns if c not in have[table]]
    return ", ".join(lost)
