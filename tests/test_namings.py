"""Naming prompts: a cloze prompt of an event's document asked again under the name a reader gives the event,
what it is about and when (`train --event-names`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.core.config import TrainConfig, train_config_from_json
from memctl.core.placement import CPU
from memctl.model.anchor import load_anchor
from memctl.registry import Registry
from memctl.train.batches import prompt_samples
from memctl.train.coverage import bank_coverage
from memctl.train.distill import prepare
from memctl.train.echo import echo_question
from memctl.train.kinds import ECHO, NAMING
from memctl.train.namings import event_naming, lead_name, month_year, renamed, title_name, window_namings
from memctl.train.plan import _resolve_config
from memctl.train.reprompt import reprompt
from memctl.train.study import chat_turn


def test_a_date_is_said_as_its_month_and_year() -> None:
    assert month_year("August 12, 2024") == "August 2024"
    assert month_year("12 Aug 2024") == "August 2024"
    assert month_year("Sept. 3, 1999") == "September 1999"
    assert month_year("2022-01-21") == "January 2022"
    assert month_year("2022-13-01") is None  # no such month
    assert month_year("08/10/1983") is None  # the 8th of October, or August the 10th


def test_the_name_opens_on_a_capitalised_word_and_ends_at_punctuation_or_a_stop_word() -> None:
    assert lead_name("Harvion gateway, Arvenhall data centre, August 12, 2024") == "Harvion gateway"
    assert lead_name("the Tarnvane login service is healthy again") == "Tarnvane login service"
    assert lead_name("Service: Ombrvane booking engine") == "Ombrvane booking engine"  # a field's key is none
    # a sentence word, a month or an id opens none; only the lead's first sentence is read
    assert lead_name("Minutes of the operations review held on 2023-06-02. Present: Lirith Vessery") is None
    assert lead_name("On May 3 INC-77 paged the Quorvane ledger team") == "Quorvane ledger team"
    # in a title: the longest run the document also writes
    text = "On September 12, 2022, the Jaskell dashboard stopped responding."
    assert title_name("Postmortem INC-5855: Jaskell dashboard outage", text) == "Jaskell dashboard"
    assert title_name("Postmortem INC-5855: Jaskell dashboard outage", "Nothing named here.") is None


def test_an_event_is_named_by_what_it_is_about_and_its_month() -> None:
    timeline = "INC-1770: Harvion gateway, Arvenhall data centre, August 12, 2024.\n18:08 Service restored."
    assert event_naming("INC-1770 timeline", "Harvion gateway, Arvenhall data centre, August 12, 2024", timeline) == (
        "Harvion gateway (August 2024)"
    )
    # no date in the lead: the document's first
    mail = "Hi all, the Tarnvane login service is healthy again. It was down for 218 minutes on 2022-03-23."
    assert event_naming("Re: INC-1436 resolved", "the Tarnvane login service is healthy again", mail) == (
        "Tarnvane login service (March 2022)"
    )
    post = "On September 12, 2022, the Jaskell dashboard stopped responding."
    assert (
        event_naming("Postmortem INC-5855: Jaskell dashboard outage", "", post) == "Jaskell dashboard (September 2022)"
    )
    # a title with no id or date is about no event; an event with no name, or no month, gets no naming
    assert event_naming("Jaskell dashboard", "", post) is None
    assert event_naming("Nesald Thalard", "", "Nesald Thalard was born on 3 May 1801 in Brantholm.") is None
    assert event_naming("INC-1770 timeline", "", timeline) is None  # a label with no lead names nothing
    assert event_naming("Postmortem INC-5855: Jaskell dashboard outage", "", "The Jaskell dashboard stopped.") is None


def test_a_prompt_is_renamed_unless_the_naming_gives_its_answer_away() -> None:
    about = "INC-1770 timeline (Harvion gateway, Arvenhall data centre, August 12, 2024)"
    subjects = [about, "INC-1770 timeline"]
    naming = "Harvion gateway (August 2024)"
    assert renamed(f"{about}: 18:08 Service restored,", subjects, naming, "339") == f"{naming}: 18:08 Service restored,"
    # the title alone, where a prompt names it so
    assert renamed("INC-1770 timeline: INC-1770: Harvion gateway,", subjects, naming, "Arvenhall") == (
        f"{naming}: INC-1770: Harvion gateway,"
    )
    for answer in ("2024", "August 12, 2024", "Harvion"):
        assert renamed(f"{about}: On", subjects, naming, answer) is None
    assert renamed("Someone else: it failed after", subjects, naming, "12") is None  # names no subject
    # a renamed statement two answers share is dropped; the others keep their order
    clozes = [
        (f"{about}: The cause was", "a cache stampede"),
        ("INC-1770 timeline: The cause was", "a deploy"),
        (f"{about}: Action for", "Davustin Gormicott"),
    ]
    assert window_namings(clozes, subjects, naming) == [(f"{naming}: Action for", "Davustin Gormicott")]


INCIDENTS = {
    "inc-1": (
        "INC-1 timeline",
        "INC-1: Harvion gateway, Arvenhall data centre, August 12, 2024.\n"
        "12:29 Alert fired.\n14:14 Cause found: a cache stampede after a deploy.\n"
        "18:08 Service restored, 339 minutes after the alert.",
    ),
    "inc-2": (
        "Postmortem INC-2: Jaskell dashboard outage",
        "On September 12, 2022, the Jaskell dashboard stopped "
        "responding for customers served from the Jorvasse data centre. Service came back after 28 minutes, "
        "once Brunard Gormere rolled out a fix.",
    ),
    "ent-3": ("Vantell Optics", "Vantell Optics was founded in 1998 in Ostrel. It employs 3,557 people."),
}


def _bank(home: Path, tmp_path: Path, tiny_anchor: Path) -> tuple[Registry, object]:
    src = tmp_path / "inc.jsonl"
    src.write_text("".join(json.dumps({"id": k, "title": t, "text": x}) + "\n" for k, (t, x) in INCIDENTS.items()))
    ingest("n", [src], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), home=home, id_field="id")
    return Registry.open("n", home), load_anchor(str(tiny_anchor), home)


def _named(reg: Registry, kind: str = NAMING) -> list[tuple[str, str, str]]:
    """The (document, text, answer) of every prompt of `kind`, sorted."""
    rows = reg.db.query("select doc_id, text, answer from prompts where kind = ?", [kind])
    return sorted((r["doc_id"], r["text"], r["answer"]) for r in rows)


def test_naming_prompts_are_cached_with_their_document_trained_on_request_and_go_with_it(
    home: Path, tmp_path: Path, tiny_anchor: Path
) -> None:
    reg, anchor = _bank(home, tmp_path, tiny_anchor)
    tok = anchor.tokenizer  # type: ignore[attr-defined]
    prepare(reg, anchor)
    assert _named(reg) == []  # prepare writes none unless the run asks for them
    prepare(reg, anchor, event_names=True)
    got = _named(reg)
    assert ("inc-1", "Harvion gateway (August 2024): 18:08 Service restored,", "339") in got
    assert ("inc-2", "Jaskell dashboard (September 2022): Service came back after", "28") in got
    assert {d for d, _, _ in got} == {"inc-1", "inc-2"}  # a document titled by a name is about no event
    assert not any(a in {"2024", "2022", "August 12, 2024"} for _, _, a in got)
    sql = "select p.*, w.doc_id as wdoc from prompts p join windows w on w.id = p.window_id where p.kind = ?"
    rows = list(reg.db.query(sql, [NAMING]))
    assert all(r["doc_id"] == r["wdoc"] and r["held_out"] == 0 and r["topk_idx"] is not None for r in rows)
    for r in rows:  # the answer goes on after a space, as its cloze's does
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        assert tok.decode(ids[r["n_prompt"] :]).strip().startswith(r["answer"].split()[0])
    # each asks again a trained cloze prompt of its window, never a held-out one
    for r in rows:
        naming = r["text"][: r["text"].index(")") + 1]
        sql = "select * from prompts where kind = 'cloze' and window_id = ? and answer = ?"
        clozes = reg.db.query(sql, [r["window_id"], r["answer"]])
        sources = [c for c in clozes if c["text"].endswith(r["text"][len(naming) :])]
        assert sources and all(c["held_out"] == 0 for c in sources)
    assert prepare(reg, anchor, event_names=True).prompts_added == 0  # asked once per window
    # coverage counts them where the run trains them
    assert bank_coverage(reg, named=True).by_kind[NAMING] > 0 and NAMING not in bank_coverage(reg).by_kind
    # trained only when the run asks for them
    units = [str(r[0]) for r in reg.db.execute("select distinct l1 from windows")]
    keys = {f"p{r['id']}" for r in rows}
    assert not any(s.key in keys for u in units for s in prompt_samples(reg, u, echo=True))
    assert any(s.key in keys for u in units for s in prompt_samples(reg, u, echo=True, named=True))
    # reprompt drops them with the statements they came from; forgetting a document removes its own
    reprompt(reg, all_windows=True)
    assert _named(reg) == [] and {r[0] for r in reg.db.execute("select named from windows")} == {0}
    prepare(reg, anchor, event_names=True)
    assert _named(reg) == got
    reg.remove_documents(["inc-1"])
    assert {d for d, _, _ in _named(reg)} == {"inc-2"}


def test_event_names_with_objective_lm_is_a_one_line_error(home: Path, tmp_path: Path, tiny_anchor: Path) -> None:
    reg, _ = _bank(home, tmp_path, tiny_anchor)
    res = CliRunner().invoke(app, ["train", "--bank", "n", "--event-names", "--echo", "0", "--objective", "lm"])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert res.output.strip().count("\n") == 0 and "--event-names needs --objective distill or mix" in res.output
    assert reg.count("prompts") == 0 and reg.db.execute("select count(*) from runs").fetchone()[0] == 0


def test_event_names_are_on_for_a_new_bank_off_under_lm_and_a_trained_bank_keeps_its_own(
    home: Path, tmp_path: Path, tiny_anchor: Path
) -> None:
    reg, _ = _bank(home, tmp_path, tiny_anchor)
    assert TrainConfig().event_names
    assert _resolve_config(reg, {}, CPU).event_names
    assert not _resolve_config(reg, {"objective": "lm"}, CPU).event_names  # lm distils nothing: none
    assert not _resolve_config(reg, {"event_names": False}, CPU).event_names
    # a bank trained before naming prompts existed keeps training without them
    old = dataclasses.asdict(TrainConfig())
    del old["event_names"]
    assert not train_config_from_json(json.dumps(old)).event_names


def test_an_events_statements_are_also_asked_back_as_questions_under_its_name(
    home: Path, tmp_path: Path, tiny_anchor: Path
) -> None:
    reg, anchor = _bank(home, tmp_path, tiny_anchor)
    tok = anchor.tokenizer  # type: ignore[attr-defined]
    prepare(reg, anchor, echo=4)
    plain = _named(reg, ECHO)
    assert plain and not any("(August 2024)" in t for _, t, _ in plain)
    prepare(reg, anchor, echo=4, event_names=True)  # naming prompts, but none asked back unless the run asks
    assert _named(reg, ECHO) == plain and _named(reg)
    prepare(reg, anchor, echo=4, event_names=True, echo_names=4)
    both = _named(reg, ECHO)
    assert set(plain) < set(both)  # the echo questions of the statements stay, asked under their subject
    extra = sorted(set(both) - set(plain))
    # asked in the chat template, under the event's name, of the naming prompts' statements alone
    question = "Harvion gateway (August 2024): 18:08 Service restored what?"
    assert ("inc-1", chat_turn(tok, question), "339") in extra
    assert {d for d, _, _ in extra} == {"inc-1", "inc-2"}  # a document about no event gets none
    named = {(d, t, a) for d, t, a in _named(reg)}
    for doc, text, answer in extra:
        assert any(d == doc and a == answer and echo_question(t, a) in text for d, t, a in named)
    flags = dict(reg.db.execute("select doc_id, max(echo_named) from windows group by doc_id").fetchall())
    assert flags == {"inc-1": 4, "inc-2": 4, "ent-3": 0}
    assert prepare(reg, anchor, echo=4, event_names=True, echo_names=4).prompts_added == 0  # asked once per window
    # trained, and routed, like every echo question; they leave with their document
    sql = "select p.* from prompts p where p.kind = ? and p.text like ?"
    rows = list(reg.db.query(sql, [ECHO, "%(August 2024)%"]))
    assert rows and all(r["held_out"] == 0 and r["topk_idx"] is not None and r["path"] for r in rows)
    # without them they go again, and the statements' own echo questions are left as they were
    prepare(reg, anchor, echo=4, event_names=True)
    assert _named(reg, ECHO) == plain
    prepare(reg, anchor, echo=4, event_names=True, echo_names=4)
    assert _named(reg, ECHO) == both
    reg.remove_documents(["inc-1"])
    assert {d for d, _, _ in _named(reg, ECHO)} == {"inc-2", "ent-3"}


def test_echo_names_need_event_names_and_are_off_unless_asked_for(
    home: Path, tmp_path: Path, tiny_anchor: Path
) -> None:
    reg, _ = _bank(home, tmp_path, tiny_anchor)
    assert TrainConfig().echo_names == 0 and _resolve_config(reg, {}, CPU).echo_names == 0
    assert _resolve_config(reg, {"echo_names": 4}, CPU).echo_names == 4
    for bad, message in (
        (["--echo-names", "4", "--no-event-names"], "--echo-names needs --event-names"),
        (["--echo-names", "-1"], "--echo-names must be between 0 and"),
    ):
        res = CliRunner().invoke(app, ["train", "--bank", "n", *bad])
        assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output
    assert reg.db.execute("select count(*) from runs").fetchone()[0] == 0  # nothing trained
    old = dataclasses.asdict(TrainConfig())
    del old["echo_names"]
    assert train_config_from_json(json.dumps(old)).echo_names == 0
