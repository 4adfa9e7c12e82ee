"""`memctl eval`: the scoring rule, intervals, what each setup shows the model, block fractions, beam,
perplexity, resumable stored runs, reports and bad probe files. Tiny model, test embedder."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import memctl.eval.evaluate as ev
from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.core.errors import InputError
from memctl.core.probes import Probe, is_correct, load_probes, sample_probes, wilson
from memctl.core.tree import best_matching, nodes_to_block, route, route_avoiding, route_beam
from memctl.eval.report import missed, missed_section
from memctl.eval.runs import EvalRuns, ItemResult
from memctl.registry import Registry
from memctl.serve.api import unique_paths
from memctl.serve.session import BankSession
from memctl.train.run import train

runner = CliRunner()
PROBES = [
    {"doc": "gases/1.txt", "kind": "glow", "prompt": "Neon is a noble gas that glows", "answers": ["red"]},
    {"doc": "metals/0.txt", "kind": "use", "prompt": "Iron is a strong metal used in", "answers": ["steel"]},
    {"doc": "animals/3.txt", "kind": "size", "prompt": "The whale is the largest animal in the", "answers": ["sea"]},
    {"doc": "gases/0.txt", "kind": "use", "prompt": "Helium is a light gas used in", "answers": ["balloons"]},
    {"doc": "metals/1.txt", "kind": "use", "prompt": "Copper is a metal that conducts", "answers": ["electricity"]},
    {"doc": "", "kind": "glow", "prompt": "Argon is an inert gas used in", "answers": ["bulbs"]},
]


@pytest.fixture()
def bank(home: Path, corpus: Path, tiny_anchor: Path) -> Registry:
    ingest("e", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    train("e", {"epochs": 1, "batch_size": 4, "objective": "lm"}, home=home)
    return Registry.open("e", home)


@pytest.fixture()
def probe_file(tmp_path: Path) -> Path:
    p = tmp_path / "probes.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in PROBES))
    return p


def probes(known_only: bool = False) -> list[Probe]:
    return [Probe(d["doc"], d["kind"], d["prompt"], tuple(d["answers"])) for d in PROBES if d["doc"] or not known_only]


# ---- scoring ------------------------------------------------------------------------------------
def test_scoring_rule_whole_words_and_case_for_short_answers() -> None:
    assert is_correct(" 26, and it is a metal", ["26"])
    assert not is_correct(" 260", ["26"]) and not is_correct(" 126", ["26"])
    assert is_correct("It was found in 1898.", ["1898"])
    assert is_correct(" IRON is", ["iron"]) and is_correct(" iron is", ["Iron"])  # long answers ignore case
    assert is_correct(" symbol Fe.", ["Fe"]) and not is_correct(" symbol fe.", ["Fe"])  # short ones do not
    assert not is_correct(" Ferrous", ["Fe"])  # a whole word, not a prefix
    assert is_correct(" nothing or Neon", ["Argon", "Neon"])  # any of the answers


def test_wilson_intervals() -> None:
    assert wilson(0, 0) == (0.0, 0.0)
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-4)
    assert wilson(50, 100)[1] - wilson(50, 100)[0] < wilson(5, 10)[1] - wilson(5, 10)[0]  # narrower with n


def test_probe_sample_is_reproducible() -> None:
    ps = [Probe("d", "k", f"p{i}", ("a",)) for i in range(50)]
    a, b = sample_probes(ps, 10, 3), sample_probes(ps, 10, 3)
    assert a == b and len(a) == 10 and a != sample_probes(ps, 10, 4)
    assert [ps.index(p) for p in a] == sorted(ps.index(p) for p in a)  # file order kept
    with pytest.raises(InputError):
        sample_probes(ps, 0, 0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "probes.jsonl:2:"),
        ('{"prompt": "x"}', "probes.jsonl:2: missing key 'answers'"),
        ('{"prompt": "x", "answers": []}', "probes.jsonl:2: 'answers' must be a non-empty list"),
        ('{"prompt": " ", "answers": ["a"]}', "probes.jsonl:2: 'prompt' must be a non-empty string"),
        ("[1, 2]", "probes.jsonl:2: not a JSON object"),
    ],
)
def test_bad_probe_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    p = tmp_path / "probes.jsonl"
    p.write_text(json.dumps(PROBES[0]) + "\n" + line + "\n")
    with pytest.raises(InputError, match=message.replace("[", r"\[")):
        load_probes(p)


def test_bad_probe_file_in_the_cli_is_one_line_and_changes_nothing(home: Path, bank: Registry, tmp_path: Path) -> None:
    p = tmp_path / "probes.jsonl"
    p.write_text(json.dumps(PROBES[0]) + "\n\n" + '{"prompt": "x", "answers": "red"}\n')
    before = bank.count("eval_runs")
    res = runner.invoke(app, ["eval", "--bank", "e", "--probes", str(p)])
    assert res.exit_code == 2
    assert "probes.jsonl:3: 'answers' must be a non-empty list of strings" in res.output
    assert "Traceback" not in res.output
    assert bank.count("eval_runs") == before
    for args in (
        ["--setups", "anchor,magic"],
        ["--block-fraction", "0,x"],
        ["--block-fraction", "1.5"],
        ["--beam", "0"],
        ["--report", str(p)],  # a file, not a directory: refused before any answer
        ["--perplexity", str(p.parent / "missing.txt")],
    ):
        res = runner.invoke(app, ["eval", "--bank", "e", "--probes", str(p.parent / "none.jsonl"), *args])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output


# ---- what each setup shows the model ----------------------------------------------------------
def test_each_setup_changes_what_the_model_sees(home: Path, bank: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, list] = {}
    real = ev.greedy

    def spy(anchor, handle, texts, fetched, n, mix=0.0):  # noqa: ANN001, ANN202
        seen.setdefault(current[0], []).append((list(texts), fetched))
        return real(anchor, handle, texts, fetched, n, mix)

    current = [""]
    monkeypatch.setattr(ev, "greedy", spy)
    ps = probes(known_only=True)
    with BankSession("e", home) as s:
        plan = ev.plan_eval(s, ps, ev.EvalOptions())
        routes = s.route([p.prompt for p in ps])
        for group in dict.fromkeys(j.group for j in plan.jobs):
            current[0] = group
            sub = replace(plan, jobs=[j for j in plan.jobs if j.group == group])
            ev.run_jobs(s, sub, 16, {})
        retrieved = s.retriever.retrieve(s.embedder.encode([p.prompt for p in ps]), routes)
        [(anchor_texts, anchor_f)] = seen["anchor"]
        assert anchor_texts == [p.prompt for p in ps] and anchor_f is None
        [(_, generic_f)] = seen["generic"]
        generic = s.store.get(0, 0)
        assert len(generic_f.levels) == 1 and torch.equal(generic_f.levels[0].gate[0], generic["gate"])
        [(fetched_texts, fetched_f)] = seen["fetched"]
        assert fetched_texts == anchor_texts
        for lvl, lf in enumerate(fetched_f.levels):  # each row gets the blocks of its own route
            for i in range(len(ps)):
                want = s.store.get(lvl + 1, int(routes[i, lvl]))
                assert torch.equal(lf.gate[lf.index[i]], want["gate"]) and torch.equal(
                    lf.down[lf.index[i]], want["down"]
                )
        [(rag_texts, rag_f)] = seen["rag"]
        assert rag_f is None
        for t, p, r in zip(rag_texts, ps, retrieved, strict=True):
            assert t.endswith("\n\n" + p.prompt) and r is not None and t.startswith(r.text[:20])
        [(both_texts, both_f)] = seen["rag+fetched"]
        assert both_texts == rag_texts and len(both_f.levels) == len(fetched_f.levels)
        [(oracle_texts, oracle_f)] = seen["oracle-rag"]
        assert oracle_f is None
        for t, p in zip(oracle_texts, ps, strict=True):
            own = s.reg.windows("doc_id = ?", [p.doc])[0]["text"]
            assert t.startswith(own) and t.endswith(p.prompt)
        corrupted = [j for j in plan.jobs if j.group == "fetched-corrupted"]
        assert corrupted
        for j in corrupted:
            own = routes[j.index]
            assert (j.paths[0, :-1] == own[:-1]).all() and j.paths[0, -1] != own[-1]
            assert j.paths[0, -1] // s.tree.k == own[-1] // s.tree.k  # a sibling


def test_oracle_rag_needs_each_probe_document(home: Path, bank: Registry) -> None:
    with BankSession("e", home) as s:
        plan = ev.plan_eval(s, probes(), ev.EvalOptions())
        assert not any(j.group == "oracle-rag" for j in plan.jobs) and "oracle-rag skipped" in plan.notes[0]
        with pytest.raises(InputError, match="oracle-rag needs"):
            ev.plan_eval(s, probes(), ev.EvalOptions(("oracle-rag",), explicit=True))


# ---- block fractions and beam -------------------------------------------------------------------
def test_block_fractions_block_the_right_number_of_blocks(home: Path, bank: Registry) -> None:
    with BankSession("e", home) as s:
        tree = s.tree  # k=2, p=2
        assert nodes_to_block(tree, 0.25) == [1, 1] and nodes_to_block(tree, 0.5) == [1, 2]
        assert nodes_to_block(tree, 1.0) == [2, 4]
        ps = probes(known_only=True)
        opts = ev.EvalOptions(("fetched",), fractions=(0, 0.25, 0.5))
        plan = ev.plan_eval(s, ps, opts)
        x = s.embedder.encode([p.prompt for p in ps])
        for f, want in ((0.25, 2), (0.5, 3)):
            assert all(len(nodes) == want for nodes in plan.blocked[f])
            jobs = [j for j in plan.jobs if j.group == f"fetched blocked={f:g}"]
            assert len(jobs) == len(ps)
            for j, nodes in zip(jobs, plan.blocked[f], strict=True):
                assert nodes == best_matching(tree, x[j.index], f)
                for lvl, n in enumerate(j.paths[0]):  # rerouted: never a blocked node
                    assert n == -1 or (lvl + 1, int(n)) not in nodes
        withheld = ev.plan_eval(s, ps, replace(opts, blocking="withhold"))
        routes = s.route([p.prompt for p in ps])
        for j in (j for j in withheld.jobs if j.group == "fetched blocked=0.5"):
            for lvl, n in enumerate(j.paths[0]):
                own = int(routes[j.index, lvl])
                assert n == (-1 if (lvl + 1, own) in withheld.blocked[0.5][j.index] else own)
    # route_avoiding: with a level-1 node blocked, the route goes to the other subtree
    rng = np.random.default_rng(0)
    q = rng.normal(size=tree.dim).astype(np.float32)
    greedy = route(tree, q[None])[0]
    other = route_avoiding(tree, q, {(1, int(greedy[0]))})
    assert other[0] != greedy[0] and other[1] // tree.k == other[0]
    assert (route_avoiding(tree, q, {(1, 0), (1, 1)}) == -1).all()


def test_beam_fetches_the_best_leaves_and_each_block_once(home: Path, bank: Registry) -> None:
    with BankSession("e", home) as s:
        x = s.embedder.encode([p.prompt for p in probes()])
        assert (route_beam(s.tree, x, 1)[:, 0] == route(s.tree, x)).all()
        b = route_beam(s.tree, x, 3)
        assert all(len({tuple(r) for r in rows}) == 3 for rows in b)  # three distinct leaves
        assert (b[:, :, 1] // s.tree.k == b[:, :, 0]).all()  # each with its own ancestor
        own = unique_paths(b)
        for i in range(len(b)):
            kept = [(lvl, n) for j in range(3) for lvl, n in enumerate(own[i, j]) if n >= 0]
            assert len(kept) == len(set(kept)) == len({(lvl, n) for j in range(3) for lvl, n in enumerate(b[i, j])})
        f = s.fetch_union(b)
        assert sum(int((lv.index >= 0).sum()) for lv in f.levels) == sum(
            len({(lvl, n) for j in range(3) for lvl, n in enumerate(b[i, j])}) for i in range(len(b))
        )
        res = ev.run_eval(s, probes(), ev.EvalOptions(("fetched",), beam=3), store=False)
        one, three = res["beam"]
        assert one["beam"] == 1 and three["beam"] == 3
        assert one["blocks_per_probe"] == 2 and three["blocks_per_probe"] > one["blocks_per_probe"]
        assert three["params_per_probe"] > one["params_per_probe"]


# ---- perplexity, stored runs, reports ----------------------------------------------------------
def test_perplexity_routes_the_whole_document(home: Path, bank: Registry, tmp_path: Path) -> None:
    doc = tmp_path / "held.txt"
    doc.write_text(" ".join(f"The river number {i} runs quietly past the mill and the bridge." for i in range(40)))
    with BankSession("e", home) as s:
        opts = ev.EvalOptions(("anchor", "generic", "fetched"))
        plan = ev.plan_eval(s, [], opts, [doc.read_text()])
        chunks = [j for j in plan.jobs if j.group == "ppl fetched"]
        assert len(chunks) > 1  # longer than the bank's window: several chunks, one route
        whole = s.route([doc.read_text()])[0]
        assert all((j.paths[0] == whole).all() for j in chunks)
        res = ev.run_eval(s, [], opts, perplexity=doc, store=False)
        rows = {r["setup"]: r for r in res["perplexity"]["rows"]}
        assert rows["anchor"]["ratio_to_anchor"] == 1.0 and rows["anchor"]["tokens"] == rows["fetched"]["tokens"]
        assert rows["fetched"]["perplexity"] != rows["anchor"]["perplexity"]
        assert rows["fetched"]["worse_than_limit"] == (rows["fetched"]["ratio_to_anchor"] > 1.02)
        # per document: its route, the gate's verdict, its tokens and loss per setup, summing to the rows
        pp = res["perplexity"]
        (d,) = pp["documents"]
        assert d["route"] == [int(v) for v in whole] and d["tokens"] == rows["anchor"]["tokens"]
        assert d["nll"]["fetched"] == pytest.approx(rows["fetched"]["nll_per_token"] * d["tokens"])
        reading = float(s.route_gated([doc.read_text()]).relevance[0])  # the gate's reading, and its verdict
        assert d["relevance"] == pytest.approx(reading, abs=1e-4)
        assert d["gated"] == (s.relevance_floor > 0 and not reading >= s.relevance_floor)
        if not d["gated"]:  # one document that fetched: its ratio is the whole set's
            assert pp["gated"] == 0 and rows["fetched"]["fetched_docs"] == 1
            assert rows["fetched"]["ratio_on_fetched"] == pytest.approx(rows["fetched"]["ratio_to_anchor"])


def test_stopped_runs_resume_and_equal_a_full_run(
    home: Path, bank: Registry, probe_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = ev.EvalOptions(("anchor", "fetched"), batch_size=2)
    with BankSession("e", home) as s:
        full = ev.run_eval(s, probes(), opts, probes_path=probe_file, fresh=True)
        calls = {"n": 0}

        def stop_after_two(stage: str, done: int, total: int) -> None:
            if done:
                calls["n"] += 1
                if calls["n"] == 2:
                    raise KeyboardInterrupt

        with pytest.raises(ev.EvalInterrupted, match="4/12 answers stored; run the same command again"):
            ev.run_eval(s, probes(), opts, probes_path=probe_file, fresh=True, progress=stop_after_two)
        again = ev.run_eval(s, probes(), opts, probes_path=probe_file)
        assert again["resumed"] and again["resumed_answers"] == 4
        assert [r["correct"] for r in again["setups"]] == [r["correct"] for r in full["setups"]]
        assert again["answers"] == full["answers"]
        hist = EvalRuns(s.reg).history()
        assert [h["status"] for h in hist[:2]] == ["done", "done"] and hist[0]["answers_stored"] == 0
        assert s.reg.count("eval_items") == 0  # a finished run keeps aggregates only
    # forgetting a document removes the stored answers about it
    reg = Registry.open("e", home)
    run = EvalRuns(reg).open("p", {"x": 1})
    EvalRuns(reg).save(
        run.id, [ItemResult("fetched|0|", "gases/1.txt", "red"), ItemResult("fetched|1|", "metals/0.txt")]
    )
    reg.remove_documents(["gases/1.txt"])
    assert [r["doc"] for r in reg.db.query("select doc from eval_items")] == ["metals/0.txt"]


def test_cli_eval_report_json_and_history(home: Path, bank: Registry, probe_file: Path, tmp_path: Path) -> None:
    held = tmp_path / "held.txt"
    held.write_text("The ferry left the harbour at dawn, and the gulls followed it out past the lighthouse.")
    report = tmp_path / "report"
    args = ["eval", "--bank", "e", "--probes", str(probe_file), "--block-fraction", "0,0.25,0.5", "--beam", "2"]
    res = runner.invoke(app, [*args, "--perplexity", str(held), "--report", str(report), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    names = [r["setup"] for r in d["setups"]]
    assert names == ["anchor", "generic", "fetched", "rag", "rag+fetched", "fetched-corrupted"]  # oracle: no doc
    assert [r["fraction"] for r in d["blocking"]["rows"]] == [0, 0.25, 0.5]
    assert [r["nodes_per_level"] for r in d["blocking"]["rows"]] == [[0, 0], [1, 1], [1, 2]]
    assert d["routing"]["n"] == 5 and len(d["routing"]["levels"]) == 2
    for name in ("report.md", "accuracy_by_setup.png", "accuracy_vs_blocked.png"):
        assert (report / name).stat().st_size > 0
    assert (report / "accuracy_by_setup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (report / "report.md").read_text()
    assert "## Full vs blocked banks" in md and "| fetched |" in md and "## Perplexity" in md
    assert "memctl eval --bank e" in md or "eval --bank e" in md
    written = [json.loads(line) for line in (report / "answers.jsonl").read_text().splitlines()]
    assert [a["prompt"] for a in written] == [p["prompt"] for p in PROBES]
    assert written[0]["expected"] == ["red"] and set(written[0]["answers"]) >= {"anchor", "fetched", "rag"}
    with BankSession("e", home) as s:  # each probe: the gate's reading of it and its verdict
        readings = s.route_gated([p["prompt"] for p in PROBES]).relevance
        floor = s.relevance_floor
    assert [a["relevance"] for a in written] == pytest.approx([float(v) for v in readings], abs=1e-4)
    assert [a["unrelated"] for a in written] == [bool(floor > 0 and not v >= floor) for v in readings]
    assert "## What the memories missed" not in md  # no probe was answered open book (no oracle-rag here)
    res = runner.invoke(app, ["eval", "--bank", "e", "--probes", str(probe_file), "--setups", "anchor,fetched"])
    assert res.exit_code == 0 and "probe accuracy on e" in res.output
    reg = Registry.open("e")
    for doc in ("gases/0.txt", "gases/1.txt"):
        reg.db["documents"].update(doc, {"tags": "public"})
    res = runner.invoke(app, ["eval", "--bank", "e", "--probes", str(probe_file), "--setups", "fetched,rag",
                              "--allow", "public", "--json"])  # fmt: skip
    d = json.loads(res.output)
    assert d["params"]["allow"] == ["public"] and all(r["setup"] in ("fetched", "rag") for r in d["setups"])
    assert {p["retrieved"] for p in d["answers"]} <= {"gases/0.txt", "gases/1.txt", None}  # only allowed windows
    seen = [p["answers"] for p in d["answers"]]
    assert len(seen) == 6 and all(set(a) == {"fetched", "rag"} for a in seen)
    res = runner.invoke(app, ["eval", "--bank", "e", "--history", "--json"])
    hist = json.loads(res.output)
    assert len(hist) == 3 and hist[1]["params"]["setups"] == ["anchor", "fetched"]
    assert hist[0]["params"]["allow"] == ["public"]
    res = runner.invoke(app, ["eval", "--bank", "e", "--history"])
    assert res.exit_code == 0 and "evaluation runs of e" in res.output


def test_report_lists_what_open_book_answers_and_the_memories_miss() -> None:
    def probe(prompt: str, fetched: tuple[str, bool], book: tuple[str, bool], right: bool | None) -> dict:
        answers = {
            "fetched": {"text": fetched[0], "correct": fetched[1]},
            "oracle-rag": {"text": book[0], "correct": book[1]},
        }
        return {"prompt": prompt, "expected": ["1992"], "routed_right": right, "answers": answers}

    answers = [
        probe("ODBC | came out in", (" 2006-06-06\n\nThe answer", False), (" 1992", True), True),
        probe("Adaptec was founded in", (" 1981", True), (" 1981", True), True),
        probe("Group 4 fax uses", ("", False), (" ISDN lines", True), False),
        probe("KAOS was described in", (" 1989", True), (" 2019", False), True),
        probe("SAIL shut down in", (" 1991", False), (" 1989", False), True),
    ]
    lost, gained = missed(answers) or ([], -1)
    assert [a["prompt"] for a in lost] == ["ODBC | came out in", "Group 4 fax uses"] and gained == 1
    md = "\n".join(missed_section(answers))
    assert "Open book answers 2 probes that the fetched memories do not; the memories answer 1" in md
    assert "| ODBC \\| came out in | 1992 | 2006-06-06 The answer | 1992 | yes |" in md  # one line, pipe escaped
    assert "| Group 4 fax uses | 1992 | (nothing) | ISDN lines | no |" in md
    assert missed([{"prompt": "x", "answers": {"fetched": {"text": "", "correct": False}}}]) is None
    assert missed_section([]) == []


def test_cli_eval_int8_is_recorded_and_scores_every_probe(home: Path, bank: Registry, probe_file: Path) -> None:
    base = ["eval", "--bank", "e", "--probes", str(probe_file), "--setups", "fetched", "--json"]
    fp32 = json.loads(runner.invoke(app, base).output)
    res = runner.invoke(app, [*base, "--int8"])
    assert res.exit_code == 0, res.output
    int8 = json.loads(res.output)
    assert int8["params"]["int8"] is True and "int8" not in fp32["params"]
    assert int8["setups"][0]["n"] == fp32["setups"][0]["n"] > 0
    assert [p["route"] for p in int8["answers"]] == [p["route"] for p in fp32["answers"]]


def test_answer_tokens_sets_the_answer_length_and_is_validated(home: Path, bank: Registry, probe_file: Path) -> None:
    with BankSession("e", home) as s:
        short = ev.run_eval(s, probes(), ev.EvalOptions(("anchor",), answer_tokens=2), store=False)
        long = ev.run_eval(s, probes(), ev.EvalOptions(("anchor",), answer_tokens=12), store=False)
    tok = s.anchor.tokenizer
    for a, b in zip(short["answers"], long["answers"], strict=True):
        s_ids = tok(a["answers"]["anchor"]["text"], add_special_tokens=False).input_ids
        l_ids = tok(b["answers"]["anchor"]["text"], add_special_tokens=False).input_ids
        assert len(s_ids) <= 2 < len(l_ids) <= 12 and b["answers"]["anchor"]["text"].startswith(
            a["answers"]["anchor"]["text"]
        )
    assert long["params"]["probe_tokens"] == 12
    with pytest.raises(InputError, match="--answer-tokens"):
        ev.EvalOptions(answer_tokens=0).check()
    res = runner.invoke(app, ["eval", "--bank", "e", "--probes", str(probe_file), "--answer-tokens", "0"])
    assert res.exit_code != 0 and "--answer-tokens must be between 1 and" in res.output


def test_chat_asks_every_probe_in_the_chat_template_as_memctl_chat_does(
    home: Path, bank: Registry, probe_file: Path
) -> None:
    ps = probes(known_only=True)
    with BankSession("e", home) as s:
        raw = ev.plan_eval(s, ps, ev.EvalOptions(("anchor", "fetched", "rag", "oracle-rag")))
        chat = ev.plan_eval(s, ps, ev.EvalOptions(("anchor", "fetched", "rag", "oracle-rag"), chat=True))
        assert [j.item for j in chat.jobs] == [j.item for j in raw.jobs]
        for r, c in zip(raw.jobs, chat.jobs, strict=True):  # the same prompt, context included, in the user's turn
            assert c.prompt == s.encode_prompts([r.prompt], chat=True)[0] and r.prompt in c.prompt
            assert c.mode == r.mode and (c.paths is None) == (r.paths is None)
        assert any("chat template" in n for n in chat.notes) and not any("chat template" in n for n in raw.notes)
    base = ["eval", "--bank", "e", "--probes", str(probe_file), "--setups", "anchor", "--json"]
    plain = json.loads(runner.invoke(app, base).output)
    res = runner.invoke(app, [*base, "--chat"])
    assert res.exit_code == 0, res.output
    asked = json.loads(res.output)
    assert asked["params"]["chat"] is True and "chat" not in plain["params"]  # a run of its own
    assert asked["setups"][0]["n"] == plain["setups"][0]["n"] > 0
