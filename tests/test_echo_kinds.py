"""Kind questions: a cloze answer asked by the words after it that say what it is, of the window's subject
alone (`train --echo-kinds`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.model.anchor import load_anchor
from memctl.registry import Registry
from memctl.train.distill import prepare
from memctl.train.echo import kind_ask, kind_questions, kind_subject
from memctl.train.kinds import ECHO
from memctl.train.prompts import prompts_for
from memctl.train.reprompt import reprompt
from memctl.train.study import chat_turn


def test_a_number_is_asked_by_the_plural_or_unit_after_it() -> None:
    assert kind_ask("339", " minutes after the alert.") == "how many minutes?"
    assert kind_ask("218", " minutes on March 23, 2022") == "how many minutes?"
    assert kind_ask("2", " power feeds.") == "how many power feeds?"  # a phrase that ends its clause
    assert kind_ask("97 min", "\nFollow-up: ...") == "how many min?"  # a field's value with its unit
    assert kind_ask("11,000", " undergraduate students and") is None  # one plural word, or a whole phrase
    assert kind_ask("11,000", " students and 4,000 staff") == "how many students?"
    # no kind: a year (a time, asked "when?"), a verb, a stop word, a number's own words, nothing after it
    assert kind_ask("1993", " releases.") is None
    assert kind_ask("12", " restarted.") is None
    assert kind_ask("40", " of them.") is None
    assert kind_ask("20", " million users") is None
    assert kind_ask("97", ".") is None
    assert kind_ask("97", ":30 the service") is None


def test_a_name_is_asked_by_the_noun_phrase_that_ends_its_clause() -> None:
    assert kind_ask("Jorvasse", " data centre. No customer data was lost.") == "which data centre?"
    assert kind_ask("Orskeld", " site.") == "which site?"
    assert kind_ask("Quorvane", " team, who") == "which team?"
    # a verb after a name, a clause that goes on, an answer neither a name nor a number: no kind
    assert kind_ask("Mavova Faldwen", " led the recovery.") is None
    assert kind_ask("Selova Thaling", " acknowledged it.") is None
    assert kind_ask("Brunard Gormere", " rolled out a fix for the gateway.") is None
    assert kind_ask("Wirth", " et al.") is None
    assert kind_ask("a cache stampede", " after a deploy.") is None


def test_the_subject_keeps_the_parts_of_its_lead_that_do_not_give_the_answer() -> None:
    title, lead = "INC-1770 timeline", "Harvion gateway, Arvenhall data centre, August 12, 2024"
    about = f"{title} ({lead})"
    statement = f"{about}: 18:08 Service restored,"
    assert kind_subject(statement, "339", [title], lead) == about
    assert kind_subject(statement, "Arvenhall", [title], lead) == "INC-1770 timeline (Harvion gateway, August 12, 2024)"
    # the longest subject the statement names; none named: no question
    assert kind_subject("Ferrovia, section Quorvane: it employs", "300", ["Ferrovia", "Ferrovia, section"], "") == (
        "Ferrovia, section"
    )
    assert kind_subject("Someone else: it employs", "300", ["Ferrovia"], "") is None
    assert kind_subject("Vantell: Vantell Optics employs", "Vantell", ["Vantell"], "") is None  # gives it away


def test_kind_questions_of_a_window_drop_a_question_with_two_answers() -> None:
    window = (
        "Vantell Optics has 3,557 employees. In 2001 it moved 120 employees to its Ostrel plant. "
        "Its lab in Harrow has 40 engineers. It sold 12 patents to Brisquay."
    )
    clozes = [(p.text, p.answer) for p in prompts_for(window, "Vantell Optics") if p.kind == "cloze"]
    assert ("Vantell Optics: In 2001 it moved", "120") in clozes  # the subject among a statement's last words
    got = kind_questions(window, clozes, ["Vantell Optics"], "", 8)
    # "how many employees?" is asked of 3,557 and of 120: neither is its answer; the year is no count
    assert got == [
        ("Vantell Optics: how many patents?", "12"),
        ("Vantell Optics: which plant?", "Ostrel"),
        ("Vantell Optics: how many engineers?", "40"),
    ]
    assert kind_questions(window, clozes, ["Vantell Optics"], "", 1) == got[:1]


INCIDENTS = {
    "inc-1": "INC-1 timeline",
    "inc-2": "Postmortem INC-2: Jaskell dashboard outage",
}
TEXTS = {
    "inc-1": "INC-1: Harvion gateway, Arvenhall data centre, August 12, 2024.\n12:29 Alert fired.\n"
    "14:14 Cause found: a cache stampede after a deploy.\n18:08 Service restored, 339 minutes after the alert.",
    "inc-2": "On September 12, 2022, the Jaskell dashboard stopped responding for customers served from the "
    "Jorvasse data centre. Service came back after 28 minutes, once Brunard Gormere rolled out a fix.",
}


def _bank(home: Path, tmp_path: Path, tiny_anchor: Path) -> tuple[Registry, object]:
    import json

    src = tmp_path / "inc.jsonl"
    src.write_text("".join(json.dumps({"id": k, "title": INCIDENTS[k], "text": TEXTS[k]}) + "\n" for k in INCIDENTS))
    ingest("k", [src], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), home=home, id_field="id")
    return Registry.open("k", home), load_anchor(str(tiny_anchor), home)


def _asked(reg: Registry) -> list[tuple[str, str, str]]:
    return sorted(
        (r["doc_id"], r["text"], r["answer"]) for r in reg.db.query("select * from prompts where kind = ?", [ECHO])
    )


def test_kind_questions_are_cached_with_their_document_and_replaced_by_another_count(
    home: Path, tmp_path: Path, tiny_anchor: Path
) -> None:
    reg, anchor = _bank(home, tmp_path, tiny_anchor)
    tok = anchor.tokenizer  # type: ignore[attr-defined]
    prepare(reg, anchor, echo=0, echo_kinds=4)
    got = _asked(reg)
    assert (
        "inc-1",
        chat_turn(tok, "INC-1 timeline (Harvion gateway, Arvenhall data centre, August 12, 2024): how many minutes?"),
        "339",
    ) in got
    assert (
        "inc-1",
        chat_turn(tok, "INC-1 timeline (Harvion gateway, August 12, 2024): which data centre?"),
        "Arvenhall",
    ) in got
    assert ("inc-2", chat_turn(tok, "Postmortem INC-2: Jaskell dashboard outage: how many minutes?"), "28") in got
    rows = list(
        reg.db.query(
            "select p.*, w.doc_id as wdoc from prompts p join windows w on w.id = p.window_id where p.kind = ?", [ECHO]
        )
    )
    assert all(r["doc_id"] == r["wdoc"] and r["held_out"] == 0 and r["topk_idx"] is not None for r in rows)
    # the answer opens the assistant's turn, without a space before it
    for r in rows:
        ids = np.frombuffer(r["ids"], dtype=np.int32).tolist()
        assert (
            ids[r["n_prompt"] :] == tok(r["answer"], add_special_tokens=False)["input_ids"][: len(ids) - r["n_prompt"]]
        )
    assert {r[0] for r in reg.db.execute("select echo_kinds from windows")} == {4}
    assert prepare(reg, anchor, echo=0, echo_kinds=4).prompts_added == 0  # asked once per window
    prepare(reg, anchor, echo=0, echo_kinds=1)  # another count: the earlier ones go
    one = _asked(reg)
    assert len(one) == 2 and set(one) < set(got)
    prepare(reg, anchor, echo=2, echo_kinds=1)  # echo questions beside them
    both = _asked(reg)
    assert set(one) < set(both)
    # reprompt drops them with the statements they came from; forgetting a document removes its own
    reprompt(reg, all_windows=True)
    assert _asked(reg) == [] and {r[0] for r in reg.db.execute("select echo_kinds from windows")} == {0}
    prepare(reg, anchor, echo=2, echo_kinds=1)
    assert _asked(reg) == both
    reg.remove_documents(["inc-1"])
    assert {d for d, _, _ in _asked(reg)} == {"inc-2"}


def test_bad_kind_count_is_a_one_line_error_and_trains_nothing(home: Path, tmp_path: Path, tiny_anchor: Path) -> None:
    reg, _ = _bank(home, tmp_path, tiny_anchor)
    for args, said in (
        (["--echo-kinds", "-1"], "--echo-kinds must be between 0 and 32"),
        (["--echo-kinds", "2", "--echo", "0", "--objective", "lm"], "--echo-kinds needs --objective distill or mix"),
    ):
        res = CliRunner().invoke(app, ["train", "--bank", "k", *args])
        assert res.exit_code != 0 and "Traceback" not in res.output
        assert res.output.strip().count("\n") == 0 and said in res.output
    assert reg.count("prompts") == 0 and reg.db.execute("select count(*) from runs").fetchone()[0] == 0


def test_the_answer_share_makes_the_answer_most_likely_and_keeps_the_teachers_shape() -> None:
    import torch

    from memctl.train.answershare import with_answer

    idx = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [1, 2, 3, 4]])
    logp = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.5, 0.2, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1]]))
    same_idx, same_logp = with_answer(idx, logp, [7, 99], 0.0)
    assert same_idx is idx and same_logp is logp  # no share: the teacher's targets as they are
    new_idx, new_logp = with_answer(idx, logp, [7, 99], 0.5)
    p = new_logp.exp()
    assert torch.allclose(p.sum(-1), torch.ones(3))
    # the answer's token in the top-k: half the mass on it, the teacher's shape on the rest
    assert torch.equal(new_idx[0], idx[0]) and torch.allclose(p[0], torch.tensor([0.2, 0.15, 0.6, 0.05]))
    # not in it: it takes the least likely slot, whose teacher mass goes
    assert new_idx[1].tolist() == [9, 10, 11, 99]
    assert torch.allclose(p[1], torch.tensor([0.5 * 5 / 9, 0.5 * 2 / 9, 0.5 * 2 / 9, 0.5]))
    # the position after the answer keeps the teacher's target; the inputs are not changed
    assert torch.allclose(p[2], logp[2].exp()) and idx[1, 3] == 12
    assert all(int(new_idx[i, p[i].argmax()]) == t for i, t in enumerate([7, 99]))


def test_the_answer_share_reaches_echo_questions_only(home: Path, tmp_path: Path, tiny_anchor: Path) -> None:
    import torch.nn.functional as F

    from memctl.train.batches import prompt_samples

    reg, anchor = _bank(home, tmp_path, tiny_anchor)
    prepare(reg, anchor, echo=2, echo_kinds=2)
    kinds = {f"p{r['id']}": r["kind"] for r in reg.db.query("select id, kind from prompts")}
    units = [str(r[0]) for r in reg.db.execute("select distinct l1 from windows")]
    plain = {(s.key, s.path): s for u in units for s in prompt_samples(reg, u, echo=True)}
    shared = {(s.key, s.path): s for u in units for s in prompt_samples(reg, u, echo=True, echo_answer=0.5)}
    assert plain.keys() == shared.keys() and any(kinds[k] == ECHO for k, _ in plain)
    for key, s in shared.items():
        if kinds[key[0]] != ECHO:
            assert s.topk_idx is not None and plain[key].topk_idx is not None
            assert s.topk_idx.equal(plain[key].topk_idx) and s.topk_logp.equal(plain[key].topk_logp)
            continue
        answer = s.ids[s.n_prompt :]
        p = F.softmax(s.topk_logp, -1)
        for i, token in enumerate(answer):
            assert int(s.topk_idx[i, p[i].argmax()]) == token and float(p[i].max()) >= 0.5 - 1e-6
