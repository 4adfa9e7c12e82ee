"""Routing by words as well as the embedding: BM25 over the windows (memctl.build.lexical) beside the cosine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tree_digest
from typer.testing import CliRunner

from memctl.build.lexical import DEFAULT_WEIGHT, LexicalIndex, relative, top, words
from memctl.build.routing import Router, WindowIndex, route_prompts
from memctl.cli import app
from memctl.core.config import BankConfig
from memctl.core.errors import InputError
from memctl.core.tree import Tree
from memctl.registry import Registry

runner = CliRunner()

# four outage reports: the embedder reads them as one subject; the names and months tell them apart
WINDOWS = [
    "The Harvion gateway went down for 339 minutes in August 2024 after a cache stampede.",
    "The Jaskell dashboard stopped responding in September 2022; a bad configuration push was to blame.",
    "The Harvion gateway failed again in October 2022, for 52 minutes, from an expired certificate.",
    "The Tarnvane login service was down for 218 minutes in March 2022 after a DNS record was deleted.",
]


def unit(*v: float) -> np.ndarray:
    a = np.array(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def test_bm25_scores_the_windows_that_share_a_contexts_rare_words() -> None:
    lex = LexicalIndex.build(WINDOWS)
    s = lex.scores("How long was the Harvion gateway down in October 2022?")
    assert int(np.argmax(s)) == 2  # name, month and year: only the third report has all four
    assert s[0] > s[1] and s[0] > s[3]  # the name alone beats the year alone ("2022" is in three)
    assert s[1] > 0 and s[3] > 0  # "2022" (and "down" for the fourth) still count a little
    # a word in every window weighs less than a word in one; stop words and single letters are no words
    common, rare = lex.scores("minutes")[0], lex.scores("stampede")[0]
    assert 0 < common < rare
    assert not lex.scores("what was it of the a").any()
    assert not lex.scores("Quorvane ledger").any()  # shares no word: no window scores
    assert len(lex) == 4 and LexicalIndex.build([]).scores("anything").shape == (0,)
    # relative: the best searched window is 1, and a context with no shared word changes nothing
    r = relative(s)
    assert r.max() == 1.0 and r[2] == 1.0 and (r >= 0).all()
    assert not relative(np.zeros(4, np.float32)).any()
    assert top(s, 2).tolist() == [2, 0] and top(np.zeros(3, np.float32), 2).tolist() == []


def test_a_date_in_any_form_gives_its_month_a_word() -> None:
    """A question names the month ("in May 2023") of a ticket opened "2023-05-12"; "may" is a stop word."""
    assert words("Opened: 2022-10-30 by ops") == ["opened", "2022", "10", "30", "ops", "month10"]
    assert "month8" in words("on 5 August 2024.") and "month8" in words("Aug 2024")
    assert words("in May 2023?") == ["2023", "month5"] and "month5" in words("May 12, 2023")
    assert "month5" not in words("You may 3 times") and "month3" not in words("the march of 3 armies")
    assert words("in may 2023?") == ["2023", "month5"] and "month3" in words("march 12, 2024")  # typed in a chat
    assert not any(w.startswith("month") for w in words("2023-13-01 build 2023-05-12x"))
    lex = LexicalIndex.build(["Ticket opened 2023-05-12 for the Wulmex payroll.", "Wulmex payroll, 2023-09-02."])
    assert int(np.argmax(lex.scores("Who fixed the Wulmex payroll in May 2023?"))) == 0


def four_reports() -> tuple[Tree, np.ndarray, np.ndarray]:
    """k=2, p=2 in 2-D: one window per leaf; the embeddings all but agree."""
    vecs = np.stack([unit(1, 0.02), unit(1, 0.04), unit(1, -0.02), unit(1, -0.04)])
    paths = np.array([[0, 0], [0, 1], [1, 2], [1, 3]], dtype=np.int64)
    tree = Tree(k=2, p=2, centroids=[np.stack([unit(1, 0.03), unit(1, -0.03)]), vecs.copy()], sizes=[])
    return tree, vecs, paths


def test_a_name_the_embedder_misses_routes_to_its_window_and_a_context_without_shared_words_by_cosine() -> None:
    tree, vecs, paths = four_reports()
    question = "How long was the Harvion gateway down in October 2022?"
    q = unit(1, 0.025)[None]  # the embedding leans to the first window: the wrong incident
    by_cosine = Router(tree, "nearest", WindowIndex.build(vecs, paths, 4))
    by_words = Router(tree, "nearest", WindowIndex.build(vecs, paths, 4, WINDOWS, DEFAULT_WEIGHT))
    assert by_cosine.route(q, [question])[0].tolist() == [0, 0]  # a bank without the words' weight
    assert by_words.route(q, [question])[0].tolist() == [1, 2]
    assert by_words.route(q)[0].tolist() == by_cosine.route(q)[0].tolist()  # no text: the embedding alone
    # no word shared with any window: exactly the cosine's route
    assert by_words.route(q, ["Quorvane ledger"])[0].tolist() == by_cosine.route(q)[0].tolist()
    # the gate still reads the cosine, whatever decided the route
    np.testing.assert_allclose(by_words.similarity(q, np.array([[1, 2]])), [float(vecs[2] @ q[0])], rtol=1e-6)
    # beams and routes around blocked nodes weigh the words too
    assert by_words.beam(q, 2, [question])[0, 0].tolist() == [1, 2]
    assert by_words.route_avoiding(q[0], {(2, 2)}, question).tolist() == [0, 0]  # next best: Harvion, August
    with pytest.raises(ValueError, match="one text per embedding"):
        by_words.route(np.concatenate([q, q]), [question])


def test_above_the_exact_limit_the_best_scoring_windows_join_the_candidates() -> None:
    """An inverted-file search probes the leaves nearest the embedding; the window the words point to may
    lie in another, and is searched all the same."""
    tree, vecs, paths = four_reports()
    index = WindowIndex.build(vecs, paths, 4, WINDOWS, DEFAULT_WEIGHT)
    q = unit(1, 0.04)[None]  # nearest leaf: leaf 1 alone
    question = ["Which cause took the Harvion gateway down in October 2022?"]
    ((cand, s),) = index.scores(tree, q, exact_limit=0, nprobe=1, texts=question)
    assert 2 in cand.tolist()  # leaf 2's window: found by its words
    assert int(cand[int(np.argmax(s))]) == 2
    ((exact_cand, exact),) = index.scores(tree, q, texts=question)
    assert int(exact_cand[int(np.argmax(exact))]) == 2


def tiny_bank(home: Path, corpus: Path, tiny_anchor: Path, *extra: str, name: str = "b") -> Registry:
    args = ["ingest", str(corpus), "--bank", name, "--anchor", str(tiny_anchor), "--embedder", "hash", "--tree", "2,2"]
    res = runner.invoke(app, [*args, *extra])
    assert res.exit_code == 0, res.output
    return Registry.open(name, home)


def test_new_banks_weigh_words_older_ones_read_the_cosine_and_sessions_may_choose(
    home: Path, corpus: Path, tiny_anchor: Path
) -> None:
    reg = tiny_bank(home, corpus, tiny_anchor)
    assert reg.config.lexical == DEFAULT_WEIGHT
    old = json.loads(reg.config.to_json())
    del old["lexical"]
    assert BankConfig.from_json(json.dumps(old)).lexical == 0.0  # a bank made before: cosine alone
    with pytest.raises(InputError, match="registry is damaged"):
        BankConfig.from_json(json.dumps({**old, "lexical": float("inf")}))
    index = WindowIndex.from_registry(reg, reg.load_tree())
    assert index.lexical is not None and len(index.lexical) == reg.count("windows")
    assert WindowIndex.from_registry(reg, reg.load_tree(), lexical=0.0).lexical is None  # a session's override
    # under --allow, the words of documents the session may not see weigh nothing (none carries the tag)
    some = reg.db.execute("select text from windows limit 1").fetchone()[0]
    assert index.lexical.scores(some).max() > 0
    hidden = WindowIndex.from_registry(reg, reg.load_tree(), allow=frozenset({"public"})).lexical
    assert hidden is not None and not hidden.scores(some).any()
    info = runner.invoke(app, ["info", "--bank", "b"])
    assert "words weigh 0.3" in info.output, info.output
    reg.close()
    assert tiny_bank(home, corpus, tiny_anchor, "--lexical", "0", name="c").config.lexical == 0.0
    assert tiny_bank(home, corpus, tiny_anchor, "--routing", "tree", name="t").config.lexical == 0.0
    from memctl.serve.api import Memories

    with Memories("t", home, lexical=0.5) as mem:  # a `tree` bank reads no words, whatever the session asks
        assert mem.lexical == 0.0


def test_a_training_prompt_weighs_words_among_its_own_documents_windows_only(
    home: Path, tmp_path: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its route depends on its own document: forgetting another never moves it."""
    d = tmp_path / "docs"
    d.mkdir()
    topics = ["apples pears orchards", "rivers boats harbours", "engines pistons valves", "violins choirs songs"]
    paras = [" ".join(f"{t} {t.split()[j % 3]}{j}." for j in range(30)) for t in topics]
    paras[2] += " The Vindrel chamber holds the ledger."
    (d / "long.txt").write_text("\n\n".join(paras) + "\n")
    (d / "other.txt").write_text("The Vindrel chamber is also named here, in another document.\n")
    reg = tiny_bank(home, d, tiny_anchor, "--window", "128")
    rows = list(reg.db.query("select id, doc_id, path, text, embedding from windows where doc_id like '%long%'"))
    assert len(rows) > 2
    doc = rows[0]["doc_id"]
    which = next(i for i, r in enumerate(rows) if "Vindrel" in r["text"])
    path_of = {i: [int(v) for v in r["path"].split(",")] for i, r in enumerate(rows)}
    other = next(i for i in path_of if path_of[i] != path_of[which])  # a window of the document in another leaf
    first, named = (np.frombuffer(rows[i]["embedding"], dtype=np.float32) for i in (other, which))
    x = (first + 0.95 * named)[None]  # the embedding leans to the other window, a little
    x /= np.linalg.norm(x)
    query = ["Where is the ledger of the Vindrel chamber kept?"]
    built: list[list[str]] = []
    original = LexicalIndex.build
    monkeypatch.setattr(LexicalIndex, "build", staticmethod(lambda texts: built.append(list(texts)) or original(texts)))
    assert route_prompts(reg, x, [doc])[0].tolist() == path_of[other]  # no query: the cosine alone
    assert route_prompts(reg, x, [doc], queries=query)[0].tolist() == path_of[which]
    # the word statistics are the document's own: the other document, which names the chamber too, takes no part
    assert built == [[r["text"] for r in rows]]
    reg.close()


def test_a_sessions_bad_lexical_weight_is_one_line(home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path) -> None:
    """Ingest's bad weights are in test_routing.py's bad-routing cases."""
    tiny_bank(home, corpus, tiny_anchor).close()
    probes = tmp_path / "probes.jsonl"
    probes.write_text(json.dumps({"doc": "x", "kind": "k", "prompt": "The answer is", "answers": ["y"]}) + "\n")
    before = tree_digest(home)
    for cmd in (["ask", "anything"], ["eval", "--probes", str(probes)], ["chat", "--plain"]):
        res = runner.invoke(app, [*cmd, "--bank", "b", "--lexical", "inf"], input="hello\n")
        lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
        assert res.exit_code != 0 and len(lines) == 1, res.output
        assert "--lexical must be between 0 and 10" in lines[0], res.output
    assert tree_digest(home) == before


def test_rag_picks_its_window_in_the_leaf_by_the_same_score(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    from memctl.serve.rag import Retriever

    reg = tiny_bank(home, corpus, tiny_anchor)
    rows = list(reg.db.query("select id, path, text, embedding from windows order by id"))
    by_l1: dict[str, list[dict]] = {}
    for r in rows:
        by_l1.setdefault(r["path"].split(",")[0], []).append(r)
    a, b = next(v for v in by_l1.values() if len(v) >= 2)[:2]
    ea, eb = (np.frombuffer(r["embedding"], dtype=np.float32) for r in (a, b))
    x = (ea + 0.95 * eb)[None]  # the embedding leans to window a, a little
    x /= np.linalg.norm(x)
    path = np.array([[int(v) for v in a["path"].split(",")]])
    wide = 10_000  # every window of the subtree is a candidate: the search widens to level 1
    assert Retriever(reg, min_windows=wide).retrieve(x, path)[0].window_id == a["id"]  # no text: the cosine
    question = " ".join(sorted(set(words(b["text"])) - set(words(a["text"])))[:3])  # a few of b's own words
    assert question
    found = Retriever(reg, min_windows=wide).retrieve(x, path, [question])[0]
    assert found.window_id == b["id"]  # its words point at b
    assert abs(found.score - float(eb @ x[0])) < 1e-5  # the score shown is still the cosine
    assert Retriever(reg, min_windows=wide, lexical=0.0).retrieve(x, path, [question])[0].window_id == a["id"]
    reg.close()
