"""A subject's other names, read from its document's opening, and how prompts and seeds take turns over them."""

from __future__ import annotations

import json
from pathlib import Path

from memctl.build.ingest import ingest
from memctl.model.anchor import load_anchor
from memctl.registry import Registry
from memctl.train.distill import prepare
from memctl.train.kinds import STUDY
from memctl.train.prompts import Prompt, prompts_for
from memctl.train.study import seeds_for
from memctl.train.subjects import abbreviates, aliases, names

KAOS = "Kent Applicative Operating System"
KAOS_TEXT = (
    "(KAOS) A functional operating system concept using dynamic process creation. "
    "It was described in 1989 by Dr. John Cupitt in his PhD thesis at the University of Kent. "
    "It ran on a network of Sun workstations. The system was written in 1988 at Canterbury."
)


def test_an_opening_parenthetical_gives_an_abbreviation_or_a_name_introduced_as_another() -> None:
    assert aliases(KAOS, KAOS_TEXT) == ("KAOS",)  # FOLDOC: the text opens with it
    assert aliases("Open Database Connectivity", "Open Database Connectivity (ODBC) is a standard API.") == ("ODBC",)
    assert aliases("Group 4", "(G4) The CCITT fax protocol for ISDN.") == ("G4",)
    assert aliases("Kungliga Tekniska Högskolan", "(KTH, Royal Institute of Technology) A university.") == ("KTH",)
    rexx = '(REXX, or "System Product Interpreter", originally known as "REX") A scripting language.'
    assert aliases("Restructured EXtended eXecutor", rexx) == ("REXX",)
    jane = "Jane Q. Example (also known as Example): English theologian and writer (1801-1882)."
    assert aliases("Jane Q. Example", jane) == ("Example",)
    assert aliases("Corel VENTURA", '(Previously "Ventura Publisher") A desktop publisher.') == ("Ventura Publisher",)
    assert names(KAOS, KAOS_TEXT) == (KAOS, "KAOS")


def test_other_parentheticals_give_no_alias() -> None:
    assert aliases("Hydrogen", "Hydrogen (symbol H) is the chemical element with atomic number 1.") == ()
    assert aliases("Tomas Vey", "Tomas Vey (1675-1741) was a Danish printer.") == ()
    assert aliases("Acme Ltd", "Acme Ltd (UK) makes tide gauges.") == ()  # not an abbreviation, not introduced
    assert aliases("NetHack", "(Unix) A dungeon game similar to rogue.") == ()
    assert aliases("Bourne shell", "(sh) The original command-line interpreter.") == ()  # not a name
    assert aliases("Quorvane", "Quorvane makes tide gauges (since 1962).") == ()  # not at the opening
    assert aliases("", "(ODBC) A standard.") == () and names("", "(ODBC) A standard.") == ()
    assert names("Neon", "Neon is a gas.") == ("Neon",)


def test_abbreviation_test() -> None:
    assert abbreviates("ODBC", "Open DataBase Connectivity")
    assert abbreviates("ARPANET", "Advanced Research Projects Agency Network")
    assert abbreviates("Win95", "Windows 95")
    assert not abbreviates("UK", "Acme Ltd")  # another first letter
    assert not abbreviates("KSO", "Kent Applicative Operating System")  # no O after the S
    assert not abbreviates("Windows 95 OSR", "Windows 95")  # as long as the long form


def test_cloze_sentences_take_turns_over_the_subjects_names() -> None:
    got = prompts_for(KAOS_TEXT, KAOS, aliases=("KAOS",))
    by_answer = {p.answer: p.text for p in got}
    # sentence 1 (no span) by its title, sentence 2 by its alias, sentence 3 by its title again (the pronoun
    # takes the name), sentence 4 by its alias, as a prefix
    assert by_answer["1989"] == "KAOS was described in"
    assert by_answer["Dr. John Cupitt"] == "KAOS was described in 1989 by"
    assert by_answer["Sun"] == f"{KAOS} ran on a network of"
    assert by_answer["1988"] == "KAOS: The system was written in"
    # the prompts of one sentence share its name, so the shorter ones ride in the longer
    cupitt = [p.text for p in got if p.text.startswith("KAOS was described")]
    assert all(b.startswith(a) for a, b in zip(cupitt, cupitt[1:], strict=False))
    # an alias prefix never gives away the answer it asks for (the title's prefix still asks for the alias)
    text = "An application submits queries. The driver pack serves ODBC and SQL."
    assert prompts_for(text, "Open DB", aliases=("ODBC",)) == [
        Prompt("cloze", "The driver pack serves ODBC and", "SQL")
    ]
    assert Prompt("cloze", "Open DB: The driver pack serves", "ODBC") in prompts_for(text, "Open DB")
    # without aliases, the prompts are those of the subject alone
    assert prompts_for(KAOS_TEXT, KAOS, aliases=()) == prompts_for(KAOS_TEXT, KAOS)


def test_seeds_take_turns_over_the_subjects_names(tiny_anchor: Path, home: Path) -> None:
    tok = load_anchor(str(tiny_anchor), home).tokenizer
    seeds = seeds_for(tok, KAOS, ("KAOS",))
    assert [s.query.count(KAOS) for s in seeds[:4]] == [1, 0, 1, 0]
    assert "KAOS" in seeds[1].query and "KAOS" in seeds[1].text
    assert seeds_for(tok, "Neon", ()) == seeds_for(tok, "Neon")


def test_every_window_of_a_document_reads_the_aliases_of_its_opening(
    tiny_anchor: Path, home: Path, tmp_path: Path
) -> None:
    tail = " ".join(f"In {1990 + i} it ran at Site {chr(65 + i)} for {i + 2} years." for i in range(12))
    rows = [
        {"id": "kaos", "title": KAOS, "text": KAOS_TEXT + " " + tail},
        {"id": "neon", "title": "Neon", "text": "Neon is a noble gas discovered in 1898 by William Ramsay."},
    ]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ingest("a", [src], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), window=48, home=home, id_field="id")
    reg = Registry.open("a", home)
    assert reg.db.execute("select count(*) from windows where doc_id = 'kaos'").fetchone()[0] >= 3
    prepare(reg, load_anchor(str(tiny_anchor), home), study=2)
    later = reg.db.execute(
        "select p.kind, p.text from prompts p join windows w on w.id = p.window_id "
        "where p.doc_id = 'kaos' and w.idx > 0 order by p.id"
    ).fetchall()
    cloze = [t for k, t in later if k == "cloze"]
    assert any(t.startswith("KAOS") for t in cloze) and any(t.startswith(KAOS) for t in cloze)
    study = [t for k, t in later if k == STUDY]
    assert any("about KAOS" in t for t in study) and any(f"about {KAOS}" in t for t in study)
    neon = reg.db.execute("select text from prompts where doc_id = 'neon' and kind = 'cloze'").fetchall()
    assert neon and all(t.startswith("Neon") for (t,) in neon)
