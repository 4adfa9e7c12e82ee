"""A document titled by an id or a date is about what its lead names (memctl.train.leads)."""

from __future__ import annotations

import pytest

from memctl.train.leads import MAX_LEAD_WORDS, is_label, label_lead, lead, topic
from memctl.train.prompts import prompts_for
from memctl.train.study import subject_of

TIMELINE = (
    "INC-1770: Harvion gateway, Arvenhall data centre, August 12, 2024.\n"
    "12:29 Alert fired; Yrune Trevicott acknowledged it.\n"
    "14:14 Cause found: a cache stampede after a deploy.\n"
    "18:08 Service restored, 339 minutes after the alert.\n"
)
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
    "Minutes of the operations review held on 2023-06-02. Present: Lirith Vessery, Davias Hovby.\n"
    "1. INC-7049 (Rynora notification hub, May 24, 2023): the outage lasted 63 minutes."
)
POSTMORTEM = "On September 12, 2022, the Jaskell dashboard stopped responding. Service came back after 28 minutes."


@pytest.mark.parametrize(
    ("title", "text", "label"),
    [
        ("INC-1770 timeline", TIMELINE, True),
        ("Re: INC-1436 resolved", MAIL, True),
        ("INC-7533", TICKET, True),
        ("Operations review, 2023-06-02", MINUTES, True),  # the text writes "operations" in lowercase
        ("Operations review, 2023-06-02", "Present: Lirith Vessery.", False),  # "Operations" may be a name
        ("Postmortem INC-5855: Jaskell dashboard outage", POSTMORTEM, False),  # names its subject
        ("ALGOL 68", "ALGOL 68 is a successor of ALGOL 60.", False),  # a number is no id
        ("Oberon-2", "Oberon-2 is an extension of Oberon by N. Wirth.", False),  # a name with a number
        ("Hydrogen", "Hydrogen is a chemical element with symbol H.", False),
        ("Vindrel chamber register, part 1", "Aurias Haldton is employed by Cyraris Instruments.", False),
    ],
)
def test_a_label_is_an_id_or_a_date_and_no_name(title: str, text: str, label: bool) -> None:
    assert is_label(title, text) is label


def test_the_lead_is_the_first_sentence_that_names_something() -> None:
    # the title's id that opens the line is dropped; the trailing full stop too
    assert lead("INC-1770 timeline", TIMELINE) == "Harvion gateway, Arvenhall data centre, August 12, 2024"
    # mail headers are passed over, and a sentence's first word is no name
    assert lead("Re: INC-1436 resolved", MAIL) == "Hi all, the Tarnvane login service is healthy again"
    # "Ticket INC-7533" names nothing the title does not
    assert lead("INC-7533", TICKET) == "Service: Grodion report builder"
    # a list of names says nothing of them: the minutes' lead is their first item
    assert lead("Operations review, 2023-06-02", MINUTES) == (
        "INC-7049 (Rynora notification hub, May 24, 2023): the outage lasted 63 minutes"
    )
    long = "INC-1: " + " ".join(["the Harvion gateway"] * 10) + "."
    assert len(lead("INC-1", long).split()) == MAX_LEAD_WORDS
    assert lead("INC-1", "all lowercase text here.\n12:00 nothing named") == ""


def test_only_a_label_gets_its_lead() -> None:
    assert label_lead("INC-1770 timeline", TIMELINE) == "Harvion gateway, Arvenhall data centre, August 12, 2024"
    assert label_lead("Postmortem INC-5855: Jaskell dashboard outage", POSTMORTEM) == ""
    assert topic("INC-1770 timeline", TIMELINE) == (
        "INC-1770 timeline (Harvion gateway, Arvenhall data centre, August 12, 2024)"
    )
    assert topic(" Hydrogen ", "Hydrogen is a gas.") == "Hydrogen"
    assert topic("", TIMELINE) == ""


def test_a_labels_prompts_name_its_lead_but_the_leads_own() -> None:
    prompts = prompts_for(TIMELINE, "INC-1770 timeline")
    about = "INC-1770 timeline (Harvion gateway, Arvenhall data centre, August 12, 2024)"
    cause = [p for p in prompts if p.text.endswith("Cause found: a cache stampede after a")]
    assert [p.text for p in cause] == [f"{about}: 14:14 Cause found: a cache stampede after a"]
    assert any(p.text.startswith(f"{about}: 18:08 Service restored,") and p.answer == "339" for p in prompts)
    # the lead's own facts are asked with the title alone: with the lead, the prompt would give them
    site = [p for p in prompts if p.answer == "Arvenhall"]
    assert site and all(p.text.startswith("INC-1770 timeline: INC-1770: Harvion gateway,") for p in site)
    # a pronoun gets the whole topic: "It was down for" is about the Tarnvane login service
    mail = prompts_for(MAIL, "Re: INC-1436 resolved")
    assert any(
        p.text == "Re: INC-1436 resolved (Hi all, the Tarnvane login service is healthy again) was down for"
        and p.answer == "218"
        for p in mail
    )


def test_a_title_that_names_its_subject_keeps_its_prompts() -> None:
    title = "Postmortem INC-5855: Jaskell dashboard outage"
    prompts = prompts_for(POSTMORTEM, title)
    assert prompts and all(p.text.startswith(f"{title}:") for p in prompts)


def test_self_study_seeds_name_the_topic() -> None:
    assert subject_of("INC-7533", TICKET) == "INC-7533 (Service: Grodion report builder)"
    assert subject_of("Hydrogen", "Hydrogen is a gas.") == "Hydrogen"
