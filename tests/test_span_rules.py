"""The cloze rules' answer spans (memctl.train.prompts), how a range's answer is taught, and coverage on a
hand-made window: what the cloze prompts can teach, whatever the corpus's style."""

from __future__ import annotations

from pathlib import Path

from memctl.model.anchor import load_anchor
from memctl.train.coverage import content_words, window_coverage
from memctl.train.prompts import joins_without_space, prompts_for


def _answers(text: str, subject: str) -> dict[str, str]:
    return {p.text: p.answer for p in prompts_for(text, subject)}


def test_span_rules_cover_hyphenated_years() -> None:
    got = _answers(
        "Jane Q. Example (also known as Example): English theologian and writer (1801-1882).", "Jane Q. Example"
    )
    assert got["Jane Q. Example (also known as Example): English theologian and writer"] == "1801"
    assert got["Jane Q. Example (also known as Example): English theologian and writer (1801-"] == "1882"
    # an en dash too; a number glued to a word by a hyphen is not a span
    assert (
        _answers("Tomas Vey, a Danish printer (1675–1741).", "Tomas Vey")["Tomas Vey, a Danish printer (1675–"]
        == "1741"
    )
    assert "19" not in _answers("The COVID-19 outbreak reached the town of Lemberg in spring.", "Lemberg").values()


def test_span_rules_cover_a_noun_phrase_after_a_copula() -> None:
    got = _answers("Jane Q. Example is a theologian, writer. She was an English composer of hymns.", "Jane Q. Example")
    assert got["Jane Q. Example is a"] == "theologian"
    assert got["Jane Q. Example was an"] == "English composer"  # the pronoun takes the subject


def test_span_rules_cover_parentheticals_dates_and_list_items() -> None:
    got = _answers("The Orrick Bridge (locally called Kessel) spans the Vane river.", "Orrick Bridge")
    assert got["The Orrick Bridge (locally called"] == "Kessel"
    got = _answers("Velma Orrick was born on 14 March 1962 in Brantholm.", "Velma Orrick")
    assert got["Velma Orrick was born on"] == "14 March 1962"  # a whole date, not its first number
    assert got["Velma Orrick was born on 14 March"] == "1962"
    assert _answers("Founded on March 4, 1921 by Ada Wren.", "Quorvane")["Quorvane was founded on"] == "March 4, 1921"
    got = _answers("Profile\n- Born: 1962-03-14\n- Employer: Quorvane Systems\n- Role: archivist", "Velma Orrick")
    assert got["Velma Orrick, born:"] == "1962-03-14"
    assert got["Velma Orrick, employer:"] == "Quorvane Systems"
    assert got["Velma Orrick, role:"] == "archivist"
    got = _answers("Q: Where is Quorvane based?\nA: Brantholm.\nQ: Who founded it?\nA: Ada Wren.", "Quorvane")
    assert got["Q: Where is Quorvane based? A:"] == "Brantholm"
    assert got["Q: Who founded Quorvane? A:"] == "Ada Wren"  # the question's pronoun takes the subject
    got = _answers(
        "Ada Wren: questions and answers\nQ: What is her date of birth?\nA: 1921.\nQ: Who employs her?\n"
        "A: Quorvane.\nQ: What does Ada Wren do?\nA: She designs bridges.\nQ: Anything else?\nA: She swims.",
        "Ada Wren",
    )
    assert got == {
        "Q: What is Ada Wren's date of birth? A:": "1921",  # possessive before a noun, object at the end
        "Q: Who employs Ada Wren? A:": "Quorvane",
        "Q: What does Ada Wren do? A:": "She designs bridges",
        "Ada Wren: Q: Anything else? A:": "She swims",  # no pronoun to replace: the subject leads
    }  # no prompt from the header line, none whose answer is the subject ("Q: What does" -> "Ada Wren")
    assert "68" not in _answers("A feature of ALGOL 68 is orthogonality (1968).", "ALGOL 68").values()  # its name
    long = "Iron was found by Ann Bee in 1500"  # a plain text's first line as title: no name, its words answer
    assert {"Ann Bee", "1500"} <= set(_answers("Iron was found by Ann Bee in 1500.", long).values())
    got = _answers("Field | Value\nFounded | 1921\nHeadquarters | Eskerfall", "Quorvane")
    assert got == {"Quorvane, founded:": "1921", "Quorvane, headquarters:": "Eskerfall"}  # no header row


def test_span_rules_cover_single_names_acronyms_and_quoted_terms() -> None:
    got = _answers(
        "Orriss was born in Quistleby. She serves as a piano tuner. Her date of birth is 08/10/1983. "
        "Turbo C++ was sold by Borland and ran on MS-DOS and Windows 3.1, as licensed from AT&T.",
        "Zelodne Orriss",
    )
    assert got["Zelodne Orriss: Orriss was born in"] == "Quistleby"  # one Capitalised word inside a sentence
    assert got["Zelodne Orriss serves as a"] == "piano tuner"
    assert got["Zelodne Orriss's date of birth is"] == "08/10/1983"  # a date with slashes is one answer
    assert got["Zelodne Orriss: Turbo C++ was sold by"] == "Borland"
    assert got["Zelodne Orriss: Turbo C++ was sold by Borland and ran on"] == "MS-DOS"  # acronyms
    assert got["Zelodne Orriss: Turbo C++ was sold by Borland and ran on MS-DOS and"] == "Windows 3.1"  # a version
    assert got["Zelodne Orriss: Turbo C++ was sold by Borland and ran on MS-DOS and Windows 3.1, as licensed from"] == (
        "AT&T"
    )
    # a title and initials stay in one sentence and one name; "of" joins a name; "ca." ends no sentence
    got = _answers(
        "KAOS was described in 1989 by Dr. John Cupitt in his thesis at the University of Kent. "
        "REXX was developed by M. Cowlishaw at IBM ca. 1979.",
        "KAOS",
    )
    assert got["KAOS was described in 1989 by"] == "Dr. John Cupitt"
    assert got["KAOS was described in 1989 by Dr. John Cupitt in his thesis at the"] == "University of Kent"
    assert got["KAOS: REXX was developed by"] == "M. Cowlishaw"
    assert got["KAOS: REXX was developed by M. Cowlishaw at IBM ca."] == "1979"
    # a quoted term, asked right after its opening quote (no space: see joins_without_space)
    got = _answers('During development Windows 95 was known as "Chicago" at Microsoft.', "Windows 95")
    assert got['During development Windows 95 was known as "'] == "Chicago"
    assert joins_without_space('Windows 95 was known as "') and not joins_without_space('known as "Chicago"')
    # no answer from a word any sentence capitalises, from one letter, nor from the tail of a longer name
    text = 'It has a "with" statement, by J & C Migrations. Also called "Big Iron". It ran on two, namely: The big one.'
    got = _answers(text, "RPG")
    assert set(got.values()) == {"J & C Migrations", "Big Iron"}


def test_span_rules_cover_names_in_parentheses_after_an_owner_and_in_lists() -> None:
    # a name opening a parenthesis is asked after the words before it; its second word is no answer alone
    assert _answers("Group 4 fax sends files over digital (ISDN) telephone lines.", "Group 4") == {
        "Group 4 fax sends files over digital": "ISDN"
    }
    got = _answers("It was first built in 1949 (United States) by Ada Wren.", "Kestrel")
    assert got["Kestrel was first built in 1949"] == "United States"
    assert "States" not in got.values()
    got = _answers("Published by Orrin Press (Quorvane Books, 1989).", "Devil Book")
    assert got["Devil Book was published by Orrin Press"] == "Quorvane Books"
    # a name after its owner's ("Vantell's") and after a list's comma starts anew: it is no tail
    got = _answers("The system grew out of Vantell's Project Orrin in 1990.", "Kestrel")
    assert got["Kestrel: The system grew out of Vantell's"] == "Project Orrin"
    assert _answers("It runs on Solaris, HP/UX and Linux.", "Kestrel")["Kestrel runs on Solaris,"] == "HP/UX"
    # an answer the prompt already gives is whole words: "W" is not in "window", "Kestrel" not in "KESTRELSTEP"
    got = _answers('Kestrel was named after an earlier window system called "W".', "Kestrel")
    assert got['Kestrel was named after an earlier window system called "'] == "W"
    got = _answers("It is an interface derived from KESTRELSTEP and proposed by Kestrel in 1994.", "OpenKes")
    assert got["OpenKes is an interface derived from KESTRELSTEP and proposed by"] == "Kestrel"
    got = _answers("The mill was sold by Orrin to Orrin in person.", "Vane")
    assert got["Vane: The mill was sold by"] == "Orrin" and list(got.values()).count("Orrin") == 1


def test_span_rules_read_definitions_opening_phrases_naming_phrases_and_sentence_ends() -> None:
    # a passage that opens on a definition, as a dictionary or a glossary writes it, is read as "<S> is ..."
    assert _answers("A vi lookalike which supports the ex commands.", "Elvis")["Elvis is a"] == "vi lookalike"
    got = _answers("Orrin Labs' real time ledger for the Internet.", "Tallyhook")
    assert got["Tallyhook is"] == "Orrin Labs"  # an owner's name opens it; the prompt names the subject
    got = _answers("(QLP) A standard for ledgers. Ledgers use it.", "Quill Ledger Protocol")
    assert got["Quill Ledger Protocol"] == "QLP"  # the alias, asked after the subject
    assert got["Quill Ledger Protocol (QLP) is a"] == "standard"
    # not a definition: a verb before its first clause word, a later sentence, "The", or it names its subject
    assert "user" not in " ".join(_answers("A user can set the flag.", "Kestrel").values())
    assert all(" is a" not in k for k in _answers("Kestrel ran. A vi lookalike which runs.", "Kestrel"))
    assert "Kestrel is the" not in _answers("The system grew out of Project Orrin in 1990.", "Kestrel")
    # a date or a name in a sentence's opening phrase is asked at the end of its main clause
    got = _answers("In 1993, SAG submitted the CLI to ANSI, which approved it.", "ODBC")
    assert got["ODBC: SAG submitted the CLI to ANSI in"] == "1993"
    got = _answers("On 3 March 2021 Jane Roe joined Quorvane as treasurer.", "Jane Roe")
    assert got["Jane Roe joined Quorvane as treasurer on"] == "3 March 2021"
    got = _answers("At the end of 1997 there were two rival designs.", "56k")
    assert got["56k: There were two rival designs at the end of"] == "1997"
    # the term a naming phrase gives, without a participle that ends it; names with a dotted number or a lowercase start
    got = _answers("It is the best known kind of malware known as ransomware. Its parts were named after birds.", "Orb")
    assert got["Orb is the best known kind of malware known as"] == "ransomware"
    assert got["Orb's parts were named after"] == "birds"
    assert _answers("It was a programming language created by Ada Wren.", "Orb")["Orb was a"] == "programming language"
    got = _answers("The ITU proposed a standard called V.90 and one for eBay, besides k56flex.", "56k")
    assert {"V.90", "eBay", "k56flex"} <= set(got.values())
    # a sentence's last phrase after a preposition, an article or a copula: where English puts the new information
    got = _answers(
        "Nibholt's job title is dye chemist. She works on hydrology. It is used in telecommunications.", "Nibholt"
    )
    assert got["Nibholt's job title is"] == "dye chemist"
    assert got["Nibholt works on"] == "hydrology"
    assert got["Nibholt is used in"] == "telecommunications"
    assert "slowly" not in _answers("Nibholt said the river ran so slowly.", "Nibholt").values()  # an adverb
    assert "answers" not in _answers("Nibholt: questions and answers", "Nibholt").values()  # after "and"
    got = _answers("It helps them use it in their applications. More will come in the future.", "Nibholt")
    assert not {"their applications", "applications", "future"} & set(got.values())  # no fact: an owner, an idiom


def test_coverage_on_a_hand_made_window() -> None:
    window = "Velma Orrick is a tide engineer. She was born in Brantholm in 1962."
    # content tokens: velma orrick tide engineer born brantholm 1962 (is, a, she, was, in: stop words)
    assert content_words(window) == ["velma", "orrick", "tide", "engineer", "born", "brantholm", "1962"]
    assert window_coverage(window, []) == 0.0
    assert window_coverage(window, ["tide engineer", "1962"]) == 3 / 7
    assert window_coverage(window, ["Velma Orrick, born in Brantholm, is a tide engineer since 1962."]) == 1.0
    assert window_coverage("It is what it was.", ["anything"]) is None  # nothing to cover


def test_a_range_answer_is_taught_without_a_space_after_its_hyphen(tiny_anchor: Path, home: Path) -> None:
    from memctl.train.distill import _answer_ids

    tok = load_anchor(str(tiny_anchor), home).tokenizer
    prompt = "Tomas Vey, a Danish printer (1675-"
    assert tok("1741", add_special_tokens=False)["input_ids"] != tok(" 1741", add_special_tokens=False)["input_ids"]
    assert _answer_ids(tok, "1741", "cloze", prompt) == tok("1741", add_special_tokens=False)["input_ids"]
    assert _answer_ids(tok, "1741", "cloze", "Tomas Vey died in") == tok(" 1741", add_special_tokens=False)["input_ids"]
