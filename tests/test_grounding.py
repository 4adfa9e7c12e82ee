"""Self-study continuations cut before the first name or number their window does not give."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from memctl.build.ingest import ingest
from memctl.model.anchor import load_anchor
from memctl.registry import Registry
from memctl.train.distill import prepare
from memctl.train.grounding import first_ungrounded, grounded_tokens
from memctl.train.kinds import STUDY
from memctl.train.study import Continuation, Seed, ground

REXX = (
    'Restructured EXtended eXecutor: (REXX, or "System Product Interpreter") A scripting language for IBM VM '
    "and MVS systems, written by M. Cowlishaw in 1979 to replace EXEC2."
)


def test_the_first_claim_the_window_does_not_make() -> None:
    text = "REXX is a scripting language by M. Cowlishaw, specifically designed for Windows and DOS."
    assert text[first_ungrounded(text, REXX) :].startswith("Windows")  # the window never names Windows
    said = 'REXX, or "System Product Interpreter", is a scripting language written by M. Cowlishaw in 1979.'
    assert first_ungrounded(said, REXX) is None
    late = said.replace("1979", "1985")
    assert late[first_ungrounded(late, REXX) :] == "1985."  # a number the window does not give
    made_up = "Kent Applicative Operating System (KAS) is"
    assert made_up[first_ungrounded(made_up, "Kent Applicative Operating System") :] == "KAS) is"
    # a word may open a sentence or a list item, "I" is no claim, a list's numbers are no claims
    listed = "Certainly. Here are the facts:\n\n1. **Written** by M. Cowlishaw.\n2. I think so."
    assert first_ungrounded(listed, REXX) is None
    # the seed's own words are grounded ("What are the key facts about REXX?")
    assert first_ungrounded("The Regina interpreter runs it.", "A scripting language.", "Tell me about Regina.") is None
    assert first_ungrounded("It uses 3 stacks.", "It uses 13 stacks.") == 8  # a whole number, not a part of one


def test_grounded_tokens_end_right_before_the_claim(tiny_anchor: Path, home: Path) -> None:
    tok = load_anchor(str(tiny_anchor), home).tokenizer
    text = " REXX is a scripting language for IBM VM, designed for Windows and DOS."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    k = grounded_tokens(lambda x: tok.decode(list(x)), ids, REXX)
    head, next_piece = tok.decode(ids[:k]), tok.decode(ids[: k + 1])[len(tok.decode(ids[:k])) :]
    assert "W" not in head.split("for")[-1] and next_piece.strip().startswith("W")  # the claim's first token
    assert tok.decode(ids[:k]).strip() == "REXX is a scripting language for IBM VM, designed for"
    assert grounded_tokens(lambda x: tok.decode(list(x)), ids[:k], REXX) == k  # nothing left to cut


def _cont(n_prompt: int, answer: list[int], k: int = 4) -> Continuation:
    m = len(answer)
    rows = np.arange((m + 1) * k, dtype=np.int32).reshape(m + 1, k)
    return Continuation(Seed("q", "q", False), [1] * n_prompt + answer, n_prompt, rows, rows.astype(np.float32))


def test_a_cut_keeps_the_teachers_rows_of_the_kept_tokens_only(tiny_anchor: Path, home: Path) -> None:
    tok = load_anchor(str(tiny_anchor), home).tokenizer
    kept = tok(" written by M. Cowlishaw in", add_special_tokens=False)["input_ids"]
    bad = tok(" 1985 for Windows", add_special_tokens=False)["input_ids"]
    ct = _cont(3, kept + bad)
    cut = ground(tok, ct, REXX)
    assert cut is not None and cut.n_prompt == 3
    # the kept tokens are the targets: rows 0..len(kept)-1; the student reads all but the last of them
    assert len(cut.topk_idx) == len(kept) and (cut.topk_idx == ct.topk_idx[: len(kept)]).all()
    assert cut.ids == ct.ids[: 3 + len(kept) - 1] and len(cut.ids) - cut.n_prompt + 1 == len(cut.topk_idx)
    assert ground(tok, _cont(3, kept), REXX) is not None and ground(tok, _cont(3, kept), REXX).ids == _cont(3, kept).ids
    assert ground(tok, _cont(3, tok(" Windows", add_special_tokens=False)["input_ids"]), REXX) is None  # nothing left


def test_train_with_grounded_study_stores_only_grounded_continuations(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    ingest("g", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    reg = Registry.open("g", home)
    prepare(reg, load_anchor(str(tiny_anchor), home), study=3, study_grounded=True)
    rows = list(
        reg.db.query(
            "select p.text, p.answer, p.ids, p.n_prompt, p.topk_idx, w.text as window from prompts p "
            "join windows w on w.id = p.window_id where p.kind = ?",
            [STUDY],
        )
    )
    windows = reg.db.execute("select count(*) from windows").fetchone()[0]
    assert len(rows) < 3 * windows  # the tiny model's babble names what no window gives: some are dropped
    for r in rows:
        n_ids = len(np.frombuffer(r["ids"], dtype=np.int32))
        n_rows = len(np.frombuffer(r["topk_idx"], dtype=np.int32)) // 16
        assert n_rows == n_ids - r["n_prompt"] + 1
        at = first_ungrounded(r["answer"], r["window"], r["text"])
        # the stored text ends before the last target: a list item's number ("1" of "1.") may end it bare
        assert at is None or r["answer"][at:].strip().isdigit(), r["answer"]
