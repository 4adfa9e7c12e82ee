"""Documents of sections: each paragraph's subject, the prompts that name it, and the seeds of a window."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from memctl.build.ingest import ingest
from memctl.model.anchor import load_anchor
from memctl.registry import Registry
from memctl.train.distill import prepare
from memctl.train.kinds import STUDY
from memctl.train.prompts import RULES, prompts_for
from memctl.train.reprompt import reprompt, rules_state, settle
from memctl.train.sections import opening_name, openings, passages, sectioned, subjects
from memctl.train.study import MAX_SECTION_SEEDS, window_seeds

TITLE = "Vindrel chamber register, part 1"
REGISTER = """Aurias Haldton is employed by Cyraris Instruments. His date of birth is 27 June 1989.

Velell Energy: profile
- Year founded: 1906
- Based in: Quistleby

MEMO
To: Records Desk
From: Personnel Office
Re: Fenodne Orrmere

Fenodne Orrmere's current position is typesetter. She was born in Ostervale.

No further action is needed.

Summary table
Attribute | Detail
Name | Orand Mordicott
Place of birth | Gravenlith
Role | court stenographer"""

# one subject, whose second paragraph opens on another name and whose third on a pronoun
ONE_SUBJECT = """Nesald Thalard trained in glaciology. His birthplace is Brisquay.

Dralaris Systems hired him in 1990 as a harbour master.

He was awarded the Wickton Award in 2011."""


def test_opening_names() -> None:
    assert opening_name("Aurias Haldton is employed by Cyraris Instruments.") == "Aurias Haldton"
    assert opening_name("Velell Energy: profile\n- Year founded: 1906") == "Velell Energy"
    assert opening_name("Fenodne Orrmere's current position is typesetter.") == "Fenodne Orrmere"
    assert opening_name("About Dralique Machinery\nQ: Where is it based?") == "Dralique Machinery"
    assert opening_name("FAQ: Yrald Wickick\nQ: What is his job?") == "Yrald Wickick"
    assert opening_name("To: Records Desk\nFrom: Personnel Office") == ""  # a memo's recipient
    assert opening_name("## University of Kent\nFounded in 1965.") == "University of Kent"
    # sentence words, one Capitalised word, a lowercase opening: no name
    assert opening_name("The DTSS was developed at Dartmouth College.") == ""
    assert opening_name("Despite Java's aim to run anywhere, it did not.") == ""
    assert opening_name("Summary table\nName | Orand Mordicott") == ""
    assert opening_name("Neon is a noble gas.") == ""
    assert opening_name("an applet is a small program") == ""


def test_a_register_is_read_section_by_section() -> None:
    assert sectioned([REGISTER], TITLE)
    parts = passages(REGISTER, TITLE)
    assert [s for _, s in parts] == ["Aurias Haldton", "Velell Energy", "Fenodne Orrmere", "Orand Mordicott"]
    # the memo's header takes its "Re:" line's name, its closing line the subject before it
    memo = parts[2][0]
    assert memo.startswith("MEMO") and memo.endswith("No further action is needed.")
    # a table with no opening name: the name on its "Name" line
    assert parts[3][0].startswith("Summary table")
    assert "\n\n".join(p for p, _ in parts) == REGISTER  # nothing lost or reordered
    assert subjects(REGISTER, TITLE) == ["Aurias Haldton", "Velell Energy", "Fenodne Orrmere", "Orand Mordicott"]


def test_a_one_subject_document_keeps_its_title() -> None:
    assert not sectioned([ONE_SUBJECT], "Nesald Thalard")
    assert passages(ONE_SUBJECT, "Nesald Thalard") == [(ONE_SUBJECT, "Nesald Thalard")]
    # one window of a register may open a single section: the whole document decides
    first = REGISTER.split("\n\n")[0]
    assert not sectioned([first], TITLE)
    assert passages(first, TITLE, sections=True) == [(first, "Aurias Haldton")]
    assert passages(first, TITLE) == [(first, TITLE)]
    # title-case headings and instructions made of the text's own words are no names
    manual = (
        "Getting Started\nInstall the tool, then open it; getting started takes a minute.\n\n"
        "Click Save to keep your work. You can save as often as you like, or click a file to open it."
    )
    assert not sectioned([manual], "Quillpad manual")
    # a paragraph that names the title belongs to it, even in a register
    text = REGISTER + "\n\nThe Vindrel chamber register, part 1 was compiled in 1998."
    assert passages(text, TITLE)[-1] == ("The Vindrel chamber register, part 1 was compiled in 1998.", TITLE)


def test_a_section_runs_on_into_the_next_window() -> None:
    windows = [
        "Aurias Haldton is employed by Cyraris Instruments.",
        "His date of birth is 27 June 1989.\n\nVelell Energy: profile\n- Year founded: 1906",
        "- Based in: Quistleby",
    ]
    starts = openings(windows, TITLE)
    assert starts == [TITLE, "Aurias Haldton", "Velell Energy"]
    assert [s for _, s in passages(windows[1], TITLE, True, starts[1])] == ["Aurias Haldton", "Velell Energy"]
    got = {(p.text, p.answer) for p in prompts_for(windows[2], TITLE, sections=True, start=starts[2])}
    assert got == {("Velell Energy, based in:", "Quistleby")}
    assert openings(["Nesald Thalard trained in glaciology.", "He was born in Brisquay."], "Nesald Thalard") is None


def test_prompts_name_their_sections_subject() -> None:
    got = {(p.text, p.answer) for p in prompts_for(REGISTER, TITLE)}
    assert ("Aurias Haldton is employed by", "Cyraris Instruments") in got
    assert ("Velell Energy, year founded:", "1906") in got
    assert ("Fenodne Orrmere was born in", "Ostervale") in got  # "She was born in": the section's subject
    assert ("Orand Mordicott, place of birth:", "Gravenlith") in got
    assert not any(TITLE in text for text, _ in got)  # no prompt asks the register what each section answers
    # a one-subject document: every prompt names its title, as before
    one = prompts_for(ONE_SUBJECT, "Nesald Thalard")
    assert one and all("Nesald Thalard" in p.text for p in one)


def test_window_seeds_one_per_section() -> None:
    tok = SimpleNamespace(chat_template=None)  # raw seeds: "{S} is", "About {S}:", "{S}:"
    seeds = window_seeds(tok, TITLE, REGISTER, 2, "")
    assert [s.text for s in seeds] == [
        "Aurias Haldton is",
        "Velell Energy is",
        "Fenodne Orrmere is",
        "Orand Mordicott is",
    ]
    # not a document of sections: `per_window` seeds naming the title
    assert [s.text for s in window_seeds(tok, TITLE, REGISTER, 2, None)] == [f"{TITLE} is", f"About {TITLE}:"]
    # more sections than the cap: MAX_SECTION_SEEDS x per_window seeds, the names taking turns
    many = "\n\n".join(f"Person{chr(65 + i)} Surname{chr(65 + i)} works as a clerk." for i in range(12))
    capped = window_seeds(tok, "Staff list", many, 1, "")
    assert len(capped) == MAX_SECTION_SEEDS
    # fewer sections than per_window: the names take turns, each then in its next form
    two = "\n\n".join(REGISTER.split("\n\n")[:2])
    assert [s.text for s in window_seeds(tok, TITLE, two, 4, "")] == [
        "Aurias Haldton is",
        "Velell Energy is",
        "About Aurias Haldton:",
        "About Velell Energy:",
    ]


def test_a_bank_writes_section_prompts_and_seeds(tmp_path: Path, home: Path, tiny_anchor: Path) -> None:
    """Through ingest and `prepare`: a register cut into several windows gets prompts and self-study
    seeds that name its sections, even in a window that holds one section; a one-subject document
    keeps its title."""
    docs = tmp_path / "docs.jsonl"
    rows = [
        {"id": "reg", "title": TITLE, "text": REGISTER},
        {"id": "one", "title": "Nesald Thalard", "text": ONE_SUBJECT},
    ]
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ingest("s", [docs], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), home=home, window=96, id_field="id")
    reg = Registry.open("s", home)
    anchor = load_anchor(str(tiny_anchor), home)
    assert reg.db.execute("select count(*) from windows where doc_id = 'reg'").fetchone()[0] >= 3
    prepare(reg, anchor, study=1)
    names = ("Aurias Haldton", "Velell Energy", "Fenodne Orrmere", "Orand Mordicott")
    cloze = [r["text"] for r in reg.db.query("select text from prompts where doc_id = 'reg' and kind = 'cloze'")]
    assert cloze and [t for t in cloze if TITLE in t or not any(n in t for n in names)] == []
    assert all(any(n in t for t in cloze) for n in names)
    seeds = [r["text"] for r in reg.db.query("select text from prompts where doc_id = 'reg' and kind = ?", [STUDY])]
    assert {n for n in names if any(n in s for s in seeds)} == set(names)  # every section is asked about
    assert not any(TITLE in s for s in seeds)
    one = [r["text"] for r in reg.db.query("select text from prompts where doc_id = 'one'")]
    assert one and all("Nesald Thalard" in t for t in one)
    assert {r[0] for r in reg.db.execute("select distinct prompt_rules from windows")} == {RULES}
    # a bank whose prompts rules v1 wrote: only the register's windows are outdated, since v2 writes the
    # same prompts for every other document; `reprompt` rewrites those alone
    reg.db.execute("update windows set prompt_rules = 1")
    n_reg = reg.db.execute("select count(*) from windows where doc_id = 'reg'").fetchone()[0]
    assert rules_state(reg).outdated == reg.count("windows")  # until `settle` compares them
    assert settle(reg) == reg.count("windows") - n_reg and rules_state(reg).outdated == n_reg
    kept = reg.db.execute("select count(*) from prompts where doc_id = 'one' and kind = 'cloze'").fetchone()[0]
    report = reprompt(reg)
    assert report.windows == n_reg
    studied = dict(reg.db.execute("select doc_id, max(studied) from windows group by doc_id").fetchall())
    assert studied == {"reg": 0, "one": 1}  # the register's seeds are sampled again, by section
    assert reg.db.execute("select count(*) from prompts where doc_id = 'reg' and kind = 'cloze'").fetchone()[0] == 0
    assert reg.db.execute("select count(*) from prompts where doc_id = 'one' and kind = 'cloze'").fetchone()[0] == kept
    assert (
        reg.db.execute("select count(*) from windows where doc_id = 'one' and prompt_rules = ?", [RULES]).fetchone()[0]
        == reg.db.execute("select count(*) from windows where doc_id = 'one'").fetchone()[0]
    )
    assert rules_state(reg).outdated == 0  # the register's windows wait to be prompted again
    reg.close()
