"""A document titled by an id or a date is about what its lead names (memctl.train.leads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memctl.build.ingest import ingest
from memctl.model.anchor import load_anchor
from memctl.registry import Registry
from memctl.train.distill import prepare
from memctl.train.kinds import STUDY
from memctl.train.leads import MAX_LEAD_WORDS, document_lead, is_label, label_lead, lead, topic, window_leads
from memctl.train.prompts import RULES, prompts_for
from memctl.train.reprompt import reprompt, settle
from memctl.train.study import subject_of

TIMELINE = (
    "INC-1770: Harvion gateway, Arvenhall data centre, August 12, 2024.\n"
    "12:29 Alert fired; Yrune Trevicott acknowledged it.\n"
    "14:14 Cause found: a cache stampede after a deploy.\n"
    "18:08 Service restored, 339 minutes after the alert.\n"
)
ABOUT = "INC-1770 timeline (Harvion gateway, Arvenhall data centre, August 12, 2024)"
MAIL = (
    "From: Yrisca Brackiss\nTo: operations list\nSubject: INC-1436 resolved\n\n"
    "Hi all, the Tarnvane login service is healthy again. It was down for 218 minutes on March 23, 2022 "
    "at the Orskeld data centre; the culprit was a DNS record deleted by mistake."
)
TICKET = (
    "Ticket INC-7533\nService: Grodion report builder\nOpened: 12 November 2022\n"
    "Site: Brantholm data centre\nTime to restore: 322 min\nResolved by: Nesova Quenard"
)
MINUTES = (
    "Minutes of the operations review held on 2 July 2023. Present: Lirith Vessery, Davias Hovby.\n\n"
    "1. INC-7049 (Rynora notification hub, May 24, 2023): the outage lasted 63 minutes."
)
POSTMORTEM = "On September 12, 2022, the Jaskell dashboard stopped responding. Service came back after 28 minutes."


@pytest.mark.parametrize(
    ("title", "text", "label"),
    [
        ("INC-1770 timeline", TIMELINE, True),
        ("INC-1770 Timeline", TIMELINE + "The timeline is kept.", True),  # title case, a word the text lowercases
        ("Re: INC-1436 resolved", MAIL, True),
        ("INC-7533", TICKET, True),
        ("Operations review, 2 July 2023", MINUTES, True),  # a date; the text writes "operations" in lowercase
        ("Operations review, 2023-07-02", MINUTES, True),
        ("Standup notes, March 2024", "Notes of the standup: Quorvane shipped.", True),  # a month and a year
        ("Operations review, 2023-06-02", "Present: Lirith Vessery.", False),  # "Operations" may be a name
        ("Postmortem INC-5855: Jaskell dashboard outage", POSTMORTEM, False),  # names its subject
        ("ALGOL 68", "ALGOL 68 is a successor of ALGOL 60.", False),  # a number is no id
        ("Windows 3.1", "Windows 3.1 shipped in 1992; windows overlap.", False),  # nor is a decimal
        ("Oberon-2", "Oberon-2 is an extension of Oberon by N. Wirth.", False),  # a name with a number
        ("libpython3.11", "Shared Python runtime library (version 3.11).", False),  # an id has no lowercase
        ("MP3", "MP3 is a coding format for digital audio.", False),  # an id the text calls by name
        ("PDP-7", "A minicomputer: the PDP-7 was sold by DEC.", False),
        ("iPhone 4S", "The phone sold well; a 4S cost more.", False),  # a name with a capital inside
        ("Hydrogen", "Hydrogen is a chemical element with symbol H.", False),
        ("Vindrel chamber register, part 1", "Aurias Haldton is employed by Cyraris Instruments.", False),
    ],
)
def test_a_label_is_an_id_or_a_date_and_no_name(title: str, text: str, label: bool) -> None:
    assert is_label(title, text) is label


def test_the_lead_is_the_first_sentence_that_names_something() -> None:
    # the title's id that opens the line as a label is dropped; the trailing full stop too
    assert lead("INC-1770 timeline", TIMELINE) == "Harvion gateway, Arvenhall data centre, August 12, 2024"
    # mail headers are passed over, and the greeting dropped
    assert lead("Re: INC-1436 resolved", MAIL) == "the Tarnvane login service is healthy again"
    # "Ticket INC-7533" names nothing the title does not
    assert lead("INC-7533", TICKET) == "Service: Grodion report builder"
    # a list of names says nothing of them: the minutes' lead is their first item
    assert lead("Operations review, 2 July 2023", MINUTES) == (
        "INC-7049 (Rynora notification hub, May 24, 2023): the outage lasted 63 minutes"
    )
    # a sentence that opens on a pronoun, a greeting alone and a quoted line are no lead; an acronym names
    text = "It was fixed by Orand Skel.\n\n> Quorvane said so.\n\nHi Lirith, thanks.\n\n"
    text += "A minicomputer sold by DEC in 1964."
    assert lead("X-1", text) == "A minicomputer sold by DEC in 1964"
    # cut to MAX_LEAD_WORDS words, before a parenthesis the cut leaves open
    long = "INC-1: " + " ".join(["the Harvion gateway"] * 10) + "."
    assert len(lead("INC-1", long).split()) == MAX_LEAD_WORDS
    assert lead("INC-1", "INC-1: the Harvion gateway failed at the main site (in the Arvenhall data centre).") == (
        "the Harvion gateway failed at the main site"
    )
    assert lead("INC-1", "all lowercase text here.\n12:00 nothing named") == ""


def test_only_a_label_gets_its_lead() -> None:
    assert label_lead("INC-1770 timeline", TIMELINE) == "Harvion gateway, Arvenhall data centre, August 12, 2024"
    assert label_lead("Postmortem INC-5855: Jaskell dashboard outage", POSTMORTEM) == ""
    assert label_lead("MP3", "MP3 is a coding format. Fraunhofer developed it.") == ""
    # a document's lead is read from all of its windows: a later window has it too
    assert document_lead("INC-1770 timeline", [TIMELINE, "19:00 Closed by Orand Skel."]) == label_lead(
        "INC-1770 timeline", TIMELINE
    )
    assert topic("INC-1770 timeline", "Harvion gateway, Arvenhall data centre, August 12, 2024") == ABOUT
    assert topic(" Hydrogen ", "") == "Hydrogen" and topic("", "x") == ""


def test_a_labels_prompts_name_its_lead_but_the_leads_own() -> None:
    prompts = prompts_for(TIMELINE, "INC-1770 timeline")
    cause = [p for p in prompts if p.text.endswith("Cause found: a cache stampede after a")]
    assert [p.text for p in cause] == [f"{ABOUT}: 14:14 Cause found: a cache stampede after a"]
    assert any(p.text.startswith(f"{ABOUT}: 18:08 Service restored,") and p.answer == "339" for p in prompts)
    # the lead's own facts are asked with the title alone: with the lead, the prompt would give them
    site = [p for p in prompts if p.answer == "Arvenhall"]
    assert site and all(p.text.startswith("INC-1770 timeline: INC-1770: Harvion gateway,") for p in site)
    # a pronoun gets the whole topic: "It was down for" is about the Tarnvane login service
    mail = prompts_for(MAIL, "Re: INC-1436 resolved")
    about = "Re: INC-1436 resolved (the Tarnvane login service is healthy again)"
    assert any(p.text == f"{about} was down for" and p.answer == "218" for p in mail)


def test_no_prompt_gives_its_answer_through_the_lead() -> None:
    """An answer the lead says is asked under the title alone; the title's id is never an answer."""
    text = (
        "INC-9: Harvion gateway outage at the Arvenhall data centre.\n\n"
        "Engineers at Arvenhall restarted it. The root cause was tracked as INC-9 by Orand Skel."
    )
    prompts = prompts_for(text, "INC-9 report")
    assert prompts
    for p in prompts:
        assert p.answer.lower() not in p.text.lower(), p
    assert any(p.answer == "Arvenhall" and p.text.startswith("INC-9 report: Engineers at") for p in prompts)
    assert any(p.answer == "Orand Skel" and "(Harvion gateway outage" in p.text for p in prompts)
    # a later window of the document: every sentence names the document's lead
    later = prompts_for(
        "19:00 Closed by Orand Skel after a review.", "INC-1770 timeline", lead=lead("INC-1770 timeline", TIMELINE)
    )
    assert later and all(p.text.startswith(ABOUT) for p in later)


def test_a_title_that_names_its_subject_keeps_its_prompts() -> None:
    title = "Postmortem INC-5855: Jaskell dashboard outage"
    prompts = prompts_for(POSTMORTEM, title)
    assert prompts and all(p.text.startswith(f"{title}:") for p in prompts)
    assert prompts_for(POSTMORTEM, title, lead="") == prompts


def test_self_study_seeds_name_the_topic() -> None:
    assert subject_of("INC-7533", TICKET) == "INC-7533 (Service: Grodion report builder)"
    assert subject_of("INC-7533", "Opened: 12 November 2022", "Service: Grodion report builder") == (
        "INC-7533 (Service: Grodion report builder)"
    )
    assert subject_of("Hydrogen", "Hydrogen is a gas.") == "Hydrogen"


def test_a_bank_names_the_lead_in_every_window_and_reprompt_resamples_its_seeds(
    tmp_path: Path, home: Path, tiny_anchor: Path
) -> None:
    """Through ingest and `prepare`: a timeline cut into several windows names its lead in the prompts and
    seeds of each; written by rules v4, its windows are outdated (their seeds change), and `reprompt`
    samples their self-study again, while a document whose title names it keeps its prompts."""
    steps = "\n".join(f"{12 + i // 4}:{10 * (i % 4) + 5} Step {i}: Orand Skel checked the queue." for i in range(30))
    docs = tmp_path / "docs.jsonl"
    rows = [
        {"id": "inc", "title": "INC-1770 timeline", "text": TIMELINE + steps},
        {"id": "pm", "title": "Postmortem INC-5855: Jaskell dashboard outage", "text": POSTMORTEM},
    ]
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ingest("t", [docs], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), home=home, window=96, id_field="id")
    reg = Registry.open("t", home)
    inc = [r[0] for r in reg.db.execute("select id from windows where doc_id = 'inc' order by id")]
    assert len(inc) >= 3
    assert set(window_leads(reg, {"inc", "pm"}).items()) == {(w, lead("INC-1770 timeline", TIMELINE)) for w in inc} | {
        (r[0], "") for r in reg.db.execute("select id from windows where doc_id = 'pm'")
    }
    prepare(reg, load_anchor(str(tiny_anchor), home), study=1)
    said = lead("INC-1770 timeline", TIMELINE).replace(",", "").split()
    for w in inc[1:]:  # later windows hold no lead sentence: every prompt names the lead, but for its words
        rows = reg.db.execute("select text, answer from prompts where window_id = ? and kind = 'cloze'", [w])
        got = [(t, a) for t, a in rows]
        assert got and all(t.startswith(ABOUT) or a in said for t, a in got)
        assert any(t.startswith(ABOUT) for t, _ in got)
    seeds = [r[0] for r in reg.db.execute("select text from prompts where doc_id = 'inc' and kind = ?", [STUDY])]
    assert seeds and all(ABOUT in s for s in seeds)
    reg.db.execute("update windows set prompt_rules = 4")
    n_pm = reg.db.execute("select count(*) from windows where doc_id = 'pm'").fetchone()[0]
    assert settle(reg) == n_pm  # the postmortem's prompts are the same; the timeline's seeds are not
    assert reprompt(reg).windows == len(inc)
    studied = dict(reg.db.execute("select doc_id, max(studied) from windows group by doc_id").fetchall())
    assert studied == {"inc": 0, "pm": 1}
    assert (
        reg.db.execute("select count(*) from windows where doc_id = 'pm' and prompt_rules = ?", [RULES]).fetchone()[0]
        == n_pm
    )
    reg.close()
