"""Blocking, access tags, audit and the block store that enforces them."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tree_digest
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.core.errors import InputError
from memctl.core.tree import best_matching, nodes_to_block
from memctl.ops.info import info
from memctl.privacy.controls import audit_doc, audit_node, set_blocked
from memctl.registry import Registry, block_id
from memctl.registry.access import reachable_blocks
from memctl.serve.session import BankSession
from memctl.serve.store import BlockStore
from memctl.train.run import train

runner = CliRunner()
CFG = {"epochs": 2, "batch_size": 2, "objective": "mix"}
PROMPT = "Iron is a strong metal used in steel"

# every file the process opens, while recording is on (audit hooks cannot be removed: gate them)
_OPENED: list[str] = []
_RECORD = {"on": False}


def _hook(event: str, args: tuple) -> None:
    if _RECORD["on"] and event == "open" and isinstance(args[0], str | Path):
        _OPENED.append(str(args[0]))


sys.addaudithook(_hook)


@pytest.fixture()
def bank(home: Path, corpus: Path, tiny_anchor: Path) -> Registry:
    ingest("p", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    reg = Registry.open("p", home)
    for doc in ("gases/0.txt", "gases/1.txt", "gases/2.txt", "gases/3.txt"):
        reg.db["documents"].update(doc, {"tags": "public"})
    train("p", CFG, home=home)
    return reg


def test_a_blocked_block_is_never_read_and_answers_use_the_other_levels(home: Path, bank: Registry) -> None:
    with BankSession("p", home) as s:
        path = s.route([PROMPT])
        leaf = (2, int(path[0, 1]))
        set_blocked("p", True, nodes=[f"2:{leaf[1]}"], reason="test", home=home)
        blocked_file = str(bank.path / bank.block(*leaf)["file"])
        _OPENED.clear()
        _RECORD["on"] = True
        try:
            ans = s.generate([PROMPT], max_new_tokens=3, paths=path)[0]
        finally:
            _RECORD["on"] = False
        assert blocked_file not in _OPENED  # instrumented: the blocked file was never opened
        assert any(f.endswith(".safetensors") for f in _OPENED)  # the level-1 block was
        assert ans.blocks == [f"1:{path[0, 0]}"] and ans.withheld == [block_id(*leaf)]
        assert s.store.stats.withheld >= 1
        # the answer uses level 1 alone: same logits as fetching a path without a level-2 node
        ids = s.anchor.tokenizer(PROMPT, return_tensors="pt")
        with torch.no_grad(), s.handle.using(s.store.fetch_paths(path)):
            got = s.anchor.model(**ids).logits
        only_l1 = np.array([[path[0, 0], leaf[1]]])
        with torch.no_grad(), s.handle.using(BlockStore(bank).fetch_paths(only_l1[:, :1])):
            want = s.anchor.model(**ids).logits
        assert torch.equal(got, want)
    row = bank.block(*leaf)
    assert row["blocked"] == 1 and row["blocked_reason"] == "test" and row["blocked_at"]
    log = list(bank.db.query("select action, target, reason from privacy_log"))
    assert log == [{"action": "block", "target": block_id(*leaf), "reason": "test"}]


def test_blocking_from_another_process_and_retraining_are_never_served_stale(home: Path, bank: Registry) -> None:
    with BankSession("p", home) as s:
        path = s.route([PROMPT])
        first = s.store.fetch_paths(path)
        assert len(first.levels) == 2
        other = Registry.open("p", home)  # another connection, as another process would have
        with other.db.atomic():
            other.db.execute("update blocks set blocked = 1 where level = 1 and idx = ?", [int(path[0, 0])])
        assert len(s.store.fetch_paths(path).levels) == 1  # the cached level-1 block is not served
        with other.db.atomic():
            other.db.execute("update blocks set blocked = 0")
        train("p", {**CFG, "seed": 7}, subtree=int(path[0, 0]), retrain=True, home=home)  # new files, new bytes
        fresh = BlockStore(Registry.open("p", home)).fetch_paths(path)
        served = s.store.fetch_paths(path)
        for a, b in zip(served.levels, fresh.levels, strict=True):
            assert torch.equal(a.down, b.down)
        assert not torch.equal(first.levels[0].down, served.levels[0].down)


def test_a_block_read_ahead_and_then_replaced_is_not_served_stale(home: Path, bank: Registry) -> None:
    with BankSession("p", home) as s:
        path = s.route([PROMPT])
        l1, leaf = (1, int(path[0, 0])), (2, int(path[0, 1]))
        read = s.store.read_ahead([l1, leaf])
        assert set(read) == {l1, leaf}
        old = {key: read[key][1]["down"] for key in read}
        train("p", {**CFG, "seed": 7}, subtree=l1[1], retrain=True, home=home)  # new files, new bytes
        now = Registry.open("p", home)
        for key in (l1, leaf):
            served = s.store.get(*key, read)
            assert served is not None
            assert torch.equal(served["down"], now.read_block(now.block(*key))["down"])
            assert not torch.equal(served["down"], old[key])


def test_a_commit_made_while_the_store_reads_the_registry_is_seen_by_its_next_look(
    home: Path, bank: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store notes the registry's version from before it read the block table: a block blocked by
    another process between that read and the end of the refresh is withheld at the next request
    (it used to note the version from after, and serve the block until some later commit)."""
    store = BlockStore(Registry.open("p", home))
    leaf = next((2, r["idx"]) for r in bank.blocks("level = 2 and file is not null"))
    other = Registry.open("p", home)  # another connection, as another process would have
    read_rows = store.reg.blocks

    def rows_then_commit(*args: object, **kwargs: object) -> list[dict]:
        rows = read_rows(*args, **kwargs)
        with other.db.atomic():
            other.db.execute("update blocks set blocked = 1 where level = ? and idx = ?", list(leaf))
        monkeypatch.setattr(store.reg, "blocks", read_rows)  # once
        return rows

    monkeypatch.setattr(store.reg, "blocks", rows_then_commit)
    store.refresh(force=True)
    assert store.get(*leaf) is None
    assert store.withheld(*leaf) and store.stats.withheld == 1 and store.stats.misses == 0


def test_cache_respects_its_byte_budget_and_pins_shallow_levels(home: Path, bank: Registry) -> None:
    leaves = [(2, r["idx"]) for r in bank.blocks("level = 2 and file is not null")]
    l1 = [(1, r["idx"]) for r in bank.blocks("level = 1 and file is not null")]

    def size(key: tuple[int, int]) -> int:
        return sum(t.numel() * t.element_size() for t in bank.read_block(bank.block(*key)).values())

    store = BlockStore(bank, cache_bytes=sum(size(k) for k in l1) + size(leaves[0]))  # pins + one leaf
    for key in l1 + leaves + l1:
        assert store.get(*key) is not None
    unpinned = [b for b in store.cached() if not b.startswith("1:")]
    assert len(unpinned) == 1 and unpinned[0] == block_id(*leaves[-1])  # least recently used went first
    assert all(block_id(*k) in store.cached() for k in l1)  # pinned: never evicted
    assert store.stats.evictions == len(leaves) - 1
    assert store.stats.hits == len(l1) and store.stats.misses == len(l1) + len(leaves)
    assert store.stats.bytes_read == sum(size(k) for k in l1 + leaves)
    tight = BlockStore(bank, cache_bytes=1)  # pins alone overfill it
    for key in l1 + [leaves[0], leaves[0], leaves[1]]:
        tight.get(*key)
    assert tight.stats.hits == 1  # the leaf just read survives until the next question
    assert [b for b in tight.cached() if not b.startswith("1:")] == [block_id(*leaves[1])]


def test_fetched_blocks_are_bit_identical_to_the_trained_parameters(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memctl.train.records as rec

    trained: dict[str, dict[str, torch.Tensor]] = {}
    real = rec.write_unit

    def spy(reg, tu):  # noqa: ANN001, ANN202
        for pos, (level, first, _n) in enumerate(tu.unit.levels):
            for lvl, node in tu.seen:
                if lvl == level:
                    trained[block_id(lvl, node)] = tu.params.block(pos, node - first)
        return real(reg, tu)

    monkeypatch.setattr(rec, "write_unit", spy)
    ingest("t", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    train("t", CFG, home=home)
    store = BlockStore(Registry.open("t", home))
    assert trained
    for bid, want in trained.items():
        level, idx = (0, 0) if bid == "generic" else map(int, bid.split(":"))
        got = store.get(level, idx)
        assert got is not None and all(torch.equal(got[p], want[p]) for p in want)


def test_query_fraction_blocks_the_best_matching_share_of_every_level(home: Path, bank: Registry) -> None:
    tree = bank.load_tree()
    assert nodes_to_block(tree, 0.0) == [0, 0]
    assert nodes_to_block(tree, 0.25) == [1, 1] and nodes_to_block(tree, 0.5) == [1, 2]
    assert nodes_to_block(tree, 1.0) == [2, 4]
    with BankSession("p", home) as s:
        x = s.embedder.encode([PROMPT])[0]
        path = s.route([PROMPT])[0]
    picked = best_matching(tree, x, 0.5)
    assert picked[0] == (1, int(path[0]))  # the nearest level-1 node is the routed one
    res = set_blocked("p", True, query=PROMPT, fraction=0.5, home=home)
    assert sorted(res.changed) == sorted(block_id(*k) for k in picked) and len(res.changed) == 3
    r1, r2 = bank.config.memory.ranks
    assert math.isclose(res.blocked_param_share, (1 * r1 + 2 * r2) / (2 * r1 + 4 * r2))
    again = set_blocked("p", False, query=PROMPT, fraction=0.5, home=home)
    assert sorted(again.changed) == sorted(res.changed)


def test_access_tags_reach_only_blocks_whose_every_document_is_allowed(home: Path, bank: Registry) -> None:
    public = {"gases/0.txt", "gases/1.txt", "gases/2.txt", "gases/3.txt"}
    docs: dict[str, set[str]] = {}
    for r in bank.db.query("select block_id, doc_id from block_docs"):
        docs.setdefault(r["block_id"], set()).add(r["doc_id"])
    want = {b for b, ds in docs.items() if ds <= public}
    assert reachable_blocks(bank, frozenset({"public"})) == want
    assert "generic" not in want  # trained on everything
    with BankSession("p", home, allow=frozenset({"public"})) as s:
        for key in [(r["level"], r["idx"]) for r in bank.blocks("file is not null")]:
            assert s.store.has(*key) == (block_id(*key) in want)
            assert s.store.withheld(*key) == (block_id(*key) not in want)
    reach = {lv["level"]: lv for lv in info("p", home, allow=frozenset({"public"}))["access"]["levels"]}
    for level in (0, 1, 2):
        assert reach[level]["reachable"] == sum(1 for b in want if (0 if b == "generic" else int(b[0])) == level)
    none = {lv["level"]: lv["reachable"] for lv in info("p", home, allow=frozenset({"nobody"}))["access"]["levels"]}
    assert none == {0: 0, 1: 0, 2: 0}
    res = runner.invoke(app, ["ask", PROMPT, "--bank", "p", "--allow", "nobody", "--json", "--max-new-tokens", "2"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["blocks"] == [] and len(d["withheld"]) == 2 and d["store"]["bytes_read"] == 0


def test_ingest_tag_labels_new_and_present_documents(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    ingest("g", [corpus / "gases"], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), tags=frozenset({"a"}),
           home=home)  # fmt: skip
    res = ingest("g", [corpus / "gases"], tags=frozenset({"b"}), home=home)
    assert res.docs_added == 0 and res.tagged == 4
    tags = {r["id"]: r["tags"] for r in Registry.open("g", home).db.query("select id, tags from documents")}
    assert set(tags.values()) == {"a,b"}
    with pytest.raises(InputError, match="bad tag"):
        ingest("g", [corpus / "gases"], tags=frozenset({"no spaces"}), home=home)


def test_audit_accounts_for_every_training_token(home: Path, bank: Registry) -> None:
    doc = audit_doc("p", "metals/0.txt", home)
    assert doc["windows"] == 1 and doc["blocks"]
    path_blocks = {f"{lvl + 1}:{n}" for lvl, n in enumerate(doc["paths"][0].split(","))}
    assert path_blocks <= {b["block"] for b in doc["blocks"] if b["on_window_path"]}
    for b in doc["blocks"]:
        node = audit_node("p", b["block"], home)
        mine = [d for d in node["documents"] if d["id"] == "metals/0.txt"]
        if b["tokens"]:
            assert mine and mine[0]["tokens"] == b["tokens"] and math.isclose(mine[0]["share"], b["share"])
        assert node["tokens"] == bank.block(node["level"], node["node"])["trained_tokens"]
        assert math.isclose(sum(d["share"] for d in node["documents"]), 1.0) or not node["documents"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["block", "--bank", "p", "--doc", "nope"], "unknown document id 'nope'"),
        (["block", "--bank", "p", "--node", "3:0"], "level must be in 1..2"),
        (["block", "--bank", "p", "--node", "2:9"], "level 2 has nodes 0..3"),
        (["block", "--bank", "p", "--node", "x"], "bad node"),
        (["block", "--bank", "p", "--query", "iron"], "--query needs --fraction"),
        (["block", "--bank", "p", "--query", "iron", "--fraction", "1.5"], "--fraction must be in (0, 1]"),
        (["block", "--bank", "p", "--node", "1:0", "--doc", "gases/0.txt"], "exactly one of"),
        (["unblock", "--bank", "p", "--all", "--node", "1:0"], "--all only goes with unblock, alone"),
        (["audit", "--bank", "p", "--doc", "nope"], "unknown document id"),
        (["audit", "--bank", "p"], "exactly one of"),
        (["ask", "x", "--bank", "p", "--allow", "bad tag"], "bad tag"),
        (["forget", "--bank", "p", "--doc", "nope", "--yes"], "unknown document id"),
        (["forget", "--bank", "p", "--doc", "gases/0.txt"], "pass --yes"),
    ],
)
def test_privacy_commands_reject_bad_input_and_change_nothing(
    home: Path, bank: Registry, args: list[str], message: str
) -> None:
    before = tree_digest(bank.path)
    res = runner.invoke(app, args)
    assert res.exit_code != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("forget ")]
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.output
    assert tree_digest(bank.path) == before


def test_an_interrupted_block_changes_nothing(home: Path, bank: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    before = tree_digest(bank.path)

    def boom(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(Registry, "log", boom)  # after the rows are updated, inside the transaction
    with pytest.raises(KeyboardInterrupt):
        set_blocked("p", True, docs=["metals/0.txt"], home=home)
    assert tree_digest(bank.path) == before


def test_cli_block_audit_forget_round_trip(home: Path, bank: Registry) -> None:
    res = runner.invoke(app, ["block", "--bank", "p", "--doc", "metals/0.txt", "--reason", "asked", "--json"])
    assert res.exit_code == 0, res.output
    changed = json.loads(res.stdout)["changed"]
    node = json.loads(runner.invoke(app, ["audit", "--bank", "p", "--node", changed[0], "--json"]).stdout)
    assert node["blocked"] and node["blocked_reason"] == "asked"
    text = runner.invoke(app, ["audit", "--bank", "p", "--doc", "metals/0.txt"])
    assert text.exit_code == 0 and "blocks this document shaped" in text.stdout
    res = runner.invoke(app, ["forget", "--bank", "p", "--doc", "metals/0.txt", "--yes", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["docs"] == ["metals/0.txt"] and report["proofs"][0]["verdict"] == "unverified"
    log = json.loads(runner.invoke(app, ["audit", "--bank", "p", "--log", "--json"]).stdout)
    assert [r["action"] for r in log] == ["block", "forget"]
    assert runner.invoke(app, ["unblock", "--bank", "p", "--all"]).exit_code == 0
    assert "documents by tag" in runner.invoke(app, ["info", "--bank", "p", "--allow", "public"]).stdout


def test_an_interrupted_tagging_changes_nothing(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memctl.build.stream as bank_mod  # where ingest tags documents

    ingest("q", [corpus / "gases"], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), home=home)
    before = tree_digest(home / "banks" / "q")
    calls = {"n": 0}
    real = bank_mod.join_tags

    def flaky(tags):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # two documents already re-tagged inside the transaction
        return real(tags)

    monkeypatch.setattr(bank_mod, "join_tags", flaky)
    with pytest.raises(KeyboardInterrupt):
        ingest("q", [corpus / "gases"], tags=frozenset({"team"}), home=home)
    assert calls["n"] == 3
    assert tree_digest(home / "banks" / "q") == before
