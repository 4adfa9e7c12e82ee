"""Echo questions: cloze statements asked back as questions in the chat template (`train --echo`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.model.anchor import load_anchor
from memctl.registry import Registry
from memctl.train.batches import prompt_samples
from memctl.train.coverage import bank_coverage
from memctl.train.distill import TEACHER_SEPARATOR, TOPK, prepare
from memctl.train.echo import echo_pair, echo_question, pick_statements
from memctl.train.kinds import ECHO
from memctl.train.reprompt import reprompt
from memctl.train.study import chat_turn


def test_a_statement_is_asked_back_as_a_question() -> None:
    assert echo_question("The Group 4 protocol was published in", "Recommendation T.563") == (
        "The Group 4 protocol was published in what?"
    )
    # a statement cut after a comma, a colon or an opening parenthesis loses it
    assert (
        echo_question("It allows file types (e-mail, pictures,", "music")
        == "It allows file types (e-mail, pictures what?"
    )
    assert echo_question("Acme: Current version, as of 2004-08-30:", "Acme 9") == (
        "Acme: Current version, as of 2004-08-30 what?"
    )
    assert echo_question("Nesald Thalard (", "Nesa") == "Nesald Thalard what?"
    # a Q&A pair's prompt is a question already: it is asked as it is, with the subject it names
    assert echo_question("Q: Who started Brevion Acoustics? A:", "Ilse Varn") == "Who started Brevion Acoustics?"
    assert echo_question("Jaskique Trust: Q: Anything else? A:", "No") == "Jaskique Trust: Anything else?"


def test_the_wh_word_follows_the_answers_shape() -> None:
    # a year or a date is asked when; a preposition that "when" stands for goes, one it does not stays
    assert echo_question("zoo was released in", "1986") == "zoo was released when?"
    assert echo_question("It spread in the", "1990s") == "It spread when?"
    assert echo_question("Varnel Ostrik was born on", "3 May 1961") == "Varnel Ostrik was born when?"
    assert echo_question("Acme: Current version, as of", "2004-08-30") == "Acme: Current version, as of when?"
    assert echo_question("It was withdrawn by", "1995") == "It was withdrawn by when?"
    assert echo_question("Jane Q. Example: writer (", "1801") == "Jane Q. Example: writer when?"
    assert (
        echo_question("The SAIL machines were shut down in late", "May 1990")
        == "The SAIL machines were shut down when?"
    )
    assert echo_question("It was released free on 6", "August 1996") == "It was released free when?"
    assert echo_question("dBASE came out in around", "1980") == "dBASE came out when?"
    assert echo_question("Tamias Trevwen: Born on January 5,", "1947") == "Tamias Trevwen: Born when?"
    assert echo_question("Galustin Gormiss was born on 20 March", "1954") == "Galustin Gormiss was born when?"
    # a year that nothing leads up to as a time is a number: an RFC's, a version's
    assert echo_question("ETRN was first defined in RFC", "1985") == "ETRN was first defined in RFC what?"
    # a name after "by" is asked "by whom?": who made it, as a question names a person
    assert echo_question("zoo is a data compression program and format by", "Rahul Dhesi") == (
        "zoo is a data compression program and format by whom?"
    )
    assert echo_question("The ARPANET's computers were interconnected by", "leased lines") == (
        "The ARPANET's computers were interconnected by what?"
    )
    assert echo_question("Verune Brackard is a patent examiner by", "profession") == (
        "Verune Brackard is a patent examiner by what?"
    )
    # the rest, numbers that are no year included, "what?"
    assert echo_question("ALGOL 68 is a", "programming language") == "ALGOL 68 is a what?"
    assert echo_question("The register file holds", "32") == "The register file holds what?"
    assert echo_question("It was written in", "C") == "It was written in what?"
    # a Q&A pair's own question whatever its answer
    assert echo_question("Q: When did Brevion open? A:", "1999") == "When did Brevion open?"
    # a Q&A pair whose answer is begun: its question, and the answer whole
    assert echo_pair("Q: What does Vantell Optics do? A: It works in", "precision optics") == (
        "What does Vantell Optics do?",
        "It works in precision optics",
    )
    assert echo_pair("Brevion: Q: How old is Brevion? A:", "It was established in 2004") == (
        "Brevion: How old is Brevion?",
        "It was established in 2004",
    )
    assert echo_pair("zoo was released in", "1986") == ("zoo was released when?", "1986")
    assert echo_pair("Q: When did Tomas Vey live? A: 1675-", "1741") == ("When did Tomas Vey live?", "1675-1741")


def test_times_and_people_first_one_statement_per_sentence_then_the_rest() -> None:
    clozes = [
        ("Group 4 is a", "fax standard"),  # a what?: last
        ("The Group 4 protocol was published by", "CCITT"),  # by whom?: first
        ("The Group 4 protocol was published by CCITT in", "1993"),  # when?, but of the sentence just picked
        ("Group 4: Full details are available from", "ITU-T"),  # a name
        ("Group 4: Full", "details"),  # its statement starts one already picked: the same sentence
        ("Group 4 uses", "ISDN"),  # a name
        ("A Group 4 page takes", "5 seconds"),  # a number
    ]
    # every sentence once, times and people, then names and numbers, then the rest; then the sentences again
    assert pick_statements(clozes, 5) == [1, 3, 5, 6, 0]
    assert pick_statements(clozes, 8) == [1, 3, 5, 6, 0, 2, 4]
    assert pick_statements(clozes, 2) == [1, 3]
    assert pick_statements(clozes, 0) == []
    # a window of one sentence still gets its n facts: the person and the time before the rest
    one = [
        ("zoo is a", "format"),
        ("zoo is a format by", "Rahul Dhesi"),
        ("zoo is a format by Rahul Dhesi from", "1986"),
    ]
    assert pick_statements(one, 2) == [1, 2]


def _echoed(home: Path, corpus: Path, tiny_anchor: Path, per_window: int = 2) -> tuple[Registry, object]:
    ingest("e", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    reg = Registry.open("e", home)
    anchor = load_anchor(str(tiny_anchor), home)
    report = prepare(reg, anchor, echo=per_window)
    assert report.prompts_added > 0
    return reg, anchor


def test_echo_questions_are_cached_from_the_open_book_teacher_and_leave_with_their_document(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    reg, anchor = _echoed(home, corpus, tiny_anchor)
    tok = anchor.tokenizer
    rows = list(
        reg.db.query(
            "select p.*, w.text as wtext, w.doc_id as wdoc, w.echoed from prompts p "
            "join windows w on w.id = p.window_id where p.kind = ? order by p.id",
            [ECHO],
        )
    )
    assert rows and all(r["doc_id"] == r["wdoc"] and r["echoed"] == 2 and r["held_out"] == 0 for r in rows)
    clozes = {
        (r["window_id"], r["text"], r["answer"])
        for r in reg.db.query("select window_id, text, answer from prompts where kind = 'cloze' and held_out = 0")
    }
    per_window: dict[int, int] = {}
    for r in rows:
        per_window[r["window_id"]] = per_window.get(r["window_id"], 0) + 1
        # the question is a trained cloze statement of the same window, asked back in a user turn
        pairs = [echo_pair(c[1], c[2]) for c in clozes if c[0] == r["window_id"]]
        assert (r["text"], r["answer"]) in {(chat_turn(tok, q), a) for q, a in pairs}
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        assert ids[: r["n_prompt"]] == tok(r["text"], add_special_tokens=False)["input_ids"]
        # the answer opens the assistant's turn, without a space before it
        assert ids[r["n_prompt"] :] == tok(r["answer"], add_special_tokens=False)["input_ids"][:8]
    assert max(per_window.values()) <= 2
    # the cached top-k is the teacher's, reading the window before the question
    for r in rows[:4]:
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        w = tok(r["wtext"] + TEACHER_SEPARATOR, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = F.log_softmax(anchor.model(torch.tensor([w + ids])).logits[0].float(), -1)
        n = len(ids) - r["n_prompt"] + 1
        top = logp[torch.arange(len(w) + r["n_prompt"] - 1, len(w) + len(ids))].topk(TOPK, dim=-1)
        assert np.array_equal(np.frombuffer(r["topk_idx"], dtype=np.int32).reshape(n, TOPK), top.indices.numpy())
    # asked once per window
    assert prepare(reg, anchor, echo=2).prompts_added == 0
    # trained, and counted by coverage, only when asked for
    with_echo = {s.key for u in ("0", "1") for s in prompt_samples(reg, u, echo=True)}
    without = {s.key for u in ("0", "1") for s in prompt_samples(reg, u)}
    assert without < with_echo and all(f"p{r['id']}" not in without for r in rows)
    assert bank_coverage(reg, echo=True).by_kind[ECHO] > 0 and ECHO not in bank_coverage(reg).by_kind
    doc = rows[0]["doc_id"]
    reg.remove_documents([doc])  # what `forget` removes a document with
    assert reg.db.execute("select count(*) from prompts where doc_id = ?", [doc]).fetchone()[0] == 0
    assert reg.db.execute("select count(*) from prompts where kind = ?", [ECHO]).fetchone()[0] > 0


def test_another_echo_count_replaces_a_windows_earlier_ones(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    reg, anchor = _echoed(home, corpus, tiny_anchor, per_window=1)

    def asked() -> list[tuple[int, str]]:
        return sorted((r["window_id"], r["text"]) for r in reg.db.query("select * from prompts where kind = ?", [ECHO]))

    one = asked()
    assert len({w for w, _ in one}) == len(one)  # one per window
    prepare(reg, anchor, echo=3)
    three = asked()
    assert set(one) <= set(three) and len(set(three)) == len(three)  # the first statement first; none twice
    assert {r[0] for r in reg.db.execute("select echoed from windows where prompted = 1")} == {3}
    prepare(reg, anchor, echo=1)  # fewer again: the window's earlier ones go
    assert asked() == one


def test_reprompt_drops_the_echo_questions_of_the_statements_it_rewrites(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    reg, anchor = _echoed(home, corpus, tiny_anchor)
    before = sorted((r["window_id"], r["text"]) for r in reg.db.query("select * from prompts where kind = ?", [ECHO]))
    reprompt(reg, all_windows=True)
    assert reg.db.execute("select count(*) from prompts where kind = ?", [ECHO]).fetchone()[0] == 0
    assert {r[0] for r in reg.db.execute("select echoed from windows")} == {0}
    prepare(reg, anchor, echo=2)  # the same rules write the same statements: the same questions again
    after = sorted((r["window_id"], r["text"]) for r in reg.db.query("select * from prompts where kind = ?", [ECHO]))
    assert after == before


def test_bad_echo_count_is_a_one_line_error_and_trains_nothing(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    ingest("v", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    for args, said in (
        (["--echo", "-1"], "--echo must be between 0 and 32"),
        (["--echo", "33"], "--echo must be between 0 and 32"),
        (["--echo", "2", "--objective", "lm"], "--echo needs --objective distill or mix"),
    ):
        res = CliRunner().invoke(app, ["train", "--bank", "v", *args])
        assert res.exit_code != 0 and "Traceback" not in res.output
        assert res.output.strip().count("\n") == 0 and said in res.output
    reg = Registry.open("v", home)
    assert reg.count("prompts") == 0 and reg.db.execute("select count(*) from runs").fetchone()[0] == 0


def test_train_with_echo_trains_them_and_records_it_for_retraining(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    import json

    from memctl.core.config import train_config_from_json

    ingest("t", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    args = ["train", "--bank", "t", "--epochs", "1", "--preserve", "0", "--study", "0", "--echo", "2", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["prepare"]["coverage"]["by_kind"][ECHO] > 0
    reg = Registry.open("t", home)
    (config,) = {r[0] for r in reg.db.execute("select config from runs where status = 'done'")}
    assert train_config_from_json(config).echo == 2  # forget and stale blocks retrain with them
    # a run recorded before echo questions existed trained without them
    old = json.loads(config)
    del old["echo"]
    assert train_config_from_json(json.dumps(old)).echo == 0


def test_echo_is_on_by_default_but_not_for_lm_nor_an_anchor_without_a_chat_template(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    from memctl.core.config import TrainConfig
    from memctl.core.placement import CPU
    from memctl.train.distill import NO_ECHO
    from memctl.train.plan import _resolve_config

    assert TrainConfig().echo == 4
    ingest("d", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    reg = Registry.open("d", home)
    assert _resolve_config(reg, {}, CPU).echo == 4
    # lm distils nothing: no echo questions unless asked for, and then a clear error (above)
    assert _resolve_config(reg, {"objective": "lm"}, CPU).echo == 0
    anchor = load_anchor(str(tiny_anchor), home)
    anchor.tokenizer.chat_template = None  # an anchor that cannot be asked questions in a chat turn
    report = prepare(reg, anchor, echo=4)
    assert report.prompts_added > 0 and report.notes == (NO_ECHO,)
    assert reg.db.execute("select count(*) from prompts where kind = ?", [ECHO]).fetchone()[0] == 0
