"""Serving: RAG inside the routed leaf, the Python API on a user's own model, chat (library, line
mode and the Textual app under its pilot)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from memctl import Memories
from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.model.memory import memory_delta
from memctl.privacy.controls import set_blocked
from memctl.registry import Registry, block_id
from memctl.serve.chat import Chat, ChatSettings
from memctl.serve.rag import Retriever
from memctl.serve.session import BankSession
from memctl.serve.store import BlockStore, block_bytes
from memctl.train.run import train

runner = CliRunner()
QUERIES = ["Iron is a strong metal", "Neon is a noble gas", "The owl hunts at night", "copper conducts"]


@pytest.fixture()
def bank(home: Path, corpus: Path, tiny_anchor: Path) -> Registry:
    ingest("s", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    reg = Registry.open("s", home)
    for doc in ("gases/0.txt", "gases/1.txt", "animals/2.txt"):
        reg.db["documents"].update(doc, {"tags": "public"})
    train("s", {"epochs": 2, "batch_size": 2, "objective": "mix"}, home=home)
    return reg


def _window_path(reg: Registry, window_id: int) -> list[int]:
    return [
        int(v) for v in reg.db.execute("select path from windows where id = ?", [window_id]).fetchone()[0].split(",")
    ]


def test_rag_retrieves_inside_the_routed_leaf_deterministically(home: Path, bank: Registry) -> None:
    with BankSession("s", home) as s:
        x = s.embedder.encode(QUERIES)
        paths = s.route(QUERIES)
        leaf = Retriever(bank, min_windows=1).retrieve(x, paths)
        again = Retriever(bank, min_windows=1).retrieve(x, paths)
        assert [r.window_id for r in leaf] == [r.window_id for r in again]  # deterministic
        emb = dict(zip(*bank.embeddings(), strict=True))
        for q, r, path in zip(x, leaf, paths, strict=True):
            assert r is not None and r.widened == 0 and r.node == f"2:{path[1]}"
            assert _window_path(bank, r.window_id) == list(path)  # inside the routed leaf
            ids = [w["id"] for w in bank.windows("path = ?", [",".join(map(str, path))])]
            assert r.window_id == max(ids, key=lambda i: (float(emb[i] @ q), -i))  # its nearest window
        wide = Retriever(bank, min_windows=100).retrieve(x, paths)  # every leaf too small: its parent
        for r, path in zip(wide, paths, strict=True):
            assert r is not None and r.widened == 1 and r.node == f"1:{path[0]}"
            assert _window_path(bank, r.window_id)[0] == path[0]
        public = Retriever(bank, allow=frozenset({"public"}), min_windows=1).retrieve(x, paths)
        assert all(r is None or r.doc_id in {"gases/0.txt", "gases/1.txt", "animals/2.txt"} for r in public)
        set_blocked("s", True, nodes=[f"2:{paths[0][1]}"], home=home)
        after = Retriever(bank, min_windows=1).retrieve(x[:1], paths[:1])[0]
        assert after is None or _window_path(bank, after.window_id)[1] != paths[0][1]


def test_rag_puts_the_window_in_the_prompt(home: Path, bank: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    import memctl.serve.session as serve

    seen: list[list[str]] = []
    real = serve.greedy

    def spy(anchor, handle, texts, fetched, n, mix=0.0):  # noqa: ANN001, ANN202
        seen.append(list(texts))
        return real(anchor, handle, texts, fetched, n, mix)

    monkeypatch.setattr(serve, "greedy", spy)
    with BankSession("s", home) as s:
        plain = s.generate(QUERIES[:2], max_new_tokens=2)
        rag = s.generate(QUERIES[:2], max_new_tokens=2, rag=True)
    assert seen[0] == QUERIES[:2] and all(a.retrieved is None for a in plain)
    for text, ans, q in zip(seen[1], rag, QUERIES[:2], strict=True):
        window = bank.db.execute("select text from windows where id = ?", [ans.retrieved["window_id"]]).fetchone()[0]
        assert text == window + "\n\n" + q
        assert ans.retrieved["doc_id"] and ans.retrieved["title"] and "text" not in ans.retrieved


def test_memories_attach_to_a_users_model_and_detach_bit_identical(
    home: Path, bank: Registry, tiny_anchor: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_anchor).eval()
    tok = AutoTokenizer.from_pretrained(tiny_anchor, padding_side="left")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mlps = [type(layer.mlp) for layer in model.model.layers]
    enc = tok(QUERIES, return_tensors="pt", padding=True)
    with torch.no_grad():
        base = model(**enc).logits
    with Memories("s", home).attach(model) as mem:
        paths = mem.use(QUERIES)
        assert paths is not None and paths.shape == (4, 2) and len({tuple(p) for p in paths}) > 1
        with torch.no_grad():
            withmem = model(**enc).logits
            out = model.generate(**enc, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
            beams = model.generate(**enc, max_new_tokens=3, num_beams=2, do_sample=False, pad_token_id=tok.pad_token_id)
        assert out.shape[0] == 4 and beams.shape[0] == 4
        assert not torch.equal(base, withmem)
        # each row used its own blocks: row 0 alone gives the same logits as row 0 of the batch
        mem.use(QUERIES[:1])
        with torch.no_grad():
            one = model(**tok(QUERIES[:1], return_tensors="pt")).logits
        torch.testing.assert_close(one[0, -1], withmem[0, -1], rtol=1e-4, atol=1e-5)
    assert [type(layer.mlp) for layer in model.model.layers] == mlps
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        assert torch.equal(model(**enc).logits, base)


def test_chat_turns_stream_route_and_compare(home: Path, bank: Registry) -> None:
    with BankSession("s", home) as s:
        chat = Chat(s, ChatSettings(max_new_tokens=4))
        pieces: list[str] = []
        t1 = chat.turn(QUERIES[0], pieces.append)
        assert "".join(pieces).strip() == t1.reply and t1.tokens >= 1
        assert t1.path is not None and len(t1.labels) == 2 and all(t1.labels)
        assert t1.blocks == [f"1:{t1.path[0]}", f"2:{t1.path[1]}"]
        assert t1.timings["first_token_s"] <= t1.timings["generate_s"]
        assert t1.store["misses"] == 2 and t1.store["bytes_read"] > 0  # the path's two blocks, read once
        again = chat.turn(QUERIES[0])
        assert again.store["misses"] == 0 and again.store["hits"] == 2 and again.store["bytes_read"] == 0
        chat.history.pop()
        chat.settings = ChatSettings(max_new_tokens=4, route_on="conversation", rag=True)
        t2 = chat.turn(QUERIES[2])
        assert t2.path == [int(v) for v in s.route([QUERIES[0] + "\n" + QUERIES[2]])[0]]
        assert t2.retrieved is not None
        assert len(chat.history) == 2
        turns = chat.compare()
        assert [t.settings.mode for t in turns] == ["fetched", "generic", "none"] and len(chat.history) == 2
        assert turns[2].blocks == [] and turns[1].blocks == ["generic"]


def test_chat_plain_mode(home: Path, bank: Registry) -> None:
    script = f"{QUERIES[0]}\n/mode none\n{QUERIES[1]}\n/rag maybe\n/compare\n/quit\nnever read\n"
    res = runner.invoke(app, ["chat", "--bank", "s", "--plain", "--max-new-tokens", "3"], input=script)
    assert res.exit_code == 0, res.output
    assert "fetched 1:" in res.stderr and "anchor alone" in res.stderr
    assert "unknown command '/rag maybe'" in res.stderr
    assert res.stdout.count("fetched:") == 1 and res.stdout.count("none:") == 1  # the comparison
    bad = runner.invoke(app, ["chat", "--bank", "s"])  # no terminal: the app cannot start
    assert bad.exit_code == 2 and "--plain" in bad.stderr


def test_chat_app_under_the_pilot(home: Path, bank: Registry) -> None:
    from textual.widgets import Input

    from memctl.tui.chat import ChatApp, Message

    async def scenario() -> None:
        with BankSession("s", home) as s:
            app_ = ChatApp(Chat(s, ChatSettings(max_new_tokens=3)))
            async with app_.run_test() as pilot:
                app_.query_one(Input).value = QUERIES[0]
                await pilot.press("enter")
                await app_.workers.wait_for_complete()
                await pilot.pause()
                texts = [str(m.render()) for m in app_.query(Message)]
                assert texts[0] == QUERIES[0]
                assert any(t.startswith("fetched 1:") for t in texts)  # the path, with labels and timings
                assert "fetched memories" in app_.sub_title
                await pilot.press("f3", "f5", "f6")
                assert "generic memory" in app_.sub_title and "RAG on" in app_.sub_title
                assert "conversation" in app_.sub_title
                await pilot.press("f7")
                await app_.workers.wait_for_complete()
                await pilot.pause()
                assert len(app_.query(".compare > Message")) == 3

    asyncio.run(scenario())


def test_ask_rag_json(home: Path, bank: Registry) -> None:
    res = runner.invoke(app, ["ask", QUERIES[1], "--bank", "s", "--rag", "--json", "--max-new-tokens", "2"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["retrieved"]["doc_id"] and d["timings"]["retrieve_s"] >= 0
    assert np.isfinite(d["retrieved"]["score"])


def _logits(s: BankSession, ids: torch.Tensor, fetched: object) -> torch.Tensor:
    with torch.no_grad(), s.handle.using(fetched):  # type: ignore[arg-type]
        return s.anchor.model(input_ids=ids).logits


def test_int8_memories_follow_fp32_row_by_row(home: Path, bank: Registry) -> None:
    """--int8 packs each fetched path's blocks as int8 weights: every row's memory effect stays within
    rounding of the fp32 one, rows on different paths get their own pack, and rows of an expanded
    batch (beams) follow their sample."""
    with BankSession("s", home) as s32, BankSession("s", home, int8=True) as s8:
        paths = s32.route(QUERIES)
        assert len({tuple(p) for p in paths.tolist()}) >= 2
        ids = s32.anchor.tokenizer(QUERIES, return_tensors="pt", padding=True)["input_ids"]
        base = _logits(s32, ids, None)
        f8 = s8.store.fetch_paths(paths)
        assert f8.packed is not None and len(f8.packed) == len({tuple(p) for p in paths.tolist()})
        want = _logits(s32, ids, s32.store.fetch_paths(paths)) - base
        got = _logits(s8, ids, f8) - base
        for row in range(len(QUERIES)):
            assert want[row].norm() > 0
            # int8 weights and 7-bit activations, through a random tiny model: 0.03-0.12 measured
            assert (got[row] - want[row]).norm() / want[row].norm() < 0.2, row
        expanded = _logits(s8, ids.repeat_interleave(2, 0), f8) - base.repeat_interleave(2, 0)
        assert torch.allclose(expanded[0::2], got, atol=1e-5) and torch.allclose(expanded[1::2], got, atol=1e-5)
        generic = s8.store.fetch_generic(len(QUERIES))
        assert generic.packed is not None and generic.packed[0][0].tolist() == list(range(len(QUERIES)))


def test_eval_fetches_int8_too_one_path_or_a_beams_union(home: Path, bank: Registry) -> None:
    """`eval --int8` fetches through fetch_union (each row its beam's paths): it must serve the int8
    packs, not the float blocks, and a beam's union follows the fp32 union within rounding."""
    with BankSession("s", home) as s32, BankSession("s", home, int8=True) as s8:
        paths = s32.route(QUERIES)
        ids = s32.anchor.tokenizer(QUERIES, return_tensors="pt", padding=True)["input_ids"]
        base = _logits(s32, ids, None)
        one = s8.fetch_union(paths[:, None, :])
        assert one.packed is not None
        assert torch.equal(_logits(s8, ids, one), _logits(s8, ids, s8.store.fetch_paths(paths)))
        other = paths.copy()
        other[:, -1] = (other[:, -1] + 1) % bank.config.tree.k**bank.config.tree.p  # a second leaf
        beam = np.stack([paths, other], axis=1)  # (B, 2, p): two paths per row, level 1 shared or not
        want = _logits(s32, ids, s32.fetch_union(beam)) - base
        f8 = s8.fetch_union(beam)
        assert f8.packed is not None and sum(len(r) for r, _ in f8.packed) == len(QUERIES)
        got = _logits(s8, ids, f8) - base
        assert not torch.allclose(got, _logits(s8, ids, one) - base)  # the second leaf counts
        for row in range(len(QUERIES)):
            assert (got[row] - want[row]).norm() / want[row].norm() < 0.2, row


def test_int8_packs_never_serve_a_blocked_block(home: Path, bank: Registry) -> None:
    with BankSession("s", home, int8=True) as s:
        paths = s.route(QUERIES[:1])
        s.store.fetch_paths(paths)
        level1 = (1, int(paths[0, 0]))
        assert any(key == level1 for path in s.store._packs for key, _sha in path)
        set_blocked("s", True, nodes=[f"1:{level1[1]}"], home=home)
        f = s.store.fetch_paths(paths)
        assert f.packed is not None
        assert not any(key == level1 for path in s.store._packs for key, _sha in path)
        assert all(lv.gate.shape[0] == 1 for lv in f.levels) and len(f.levels) == 1  # the leaf alone


def test_int8_pack_of_a_block_replaced_mid_fetch_is_not_kept(
    home: Path, bank: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process retrains a level-1 block after this fetch read it and before it read the leaf:
    this fetch may serve what it read, but its pack must not be kept under the new file's sha256
    (it was, and every later fetch of the path served the old weights through it)."""
    with BankSession("s", home, int8=True) as s:
        paths = s.route(QUERIES[:1])
        level1 = (1, int(paths[0, 0]))
        served = s.store.get
        retrained: list[bool] = []

        def get_then_retrain(level: int, idx: int, read: dict | None = None) -> dict | None:
            block = served(level, idx, read)
            if (level, idx) == level1 and not retrained:
                retrained.append(True)
                train("s", {"epochs": 1, "batch_size": 2, "objective": "mix", "seed": 7}, subtree=idx, retrain=True,
                      home=home)  # fmt: skip
            return block

        monkeypatch.setattr(s.store, "get", get_then_retrain)
        s.store.fetch_paths(paths)
        monkeypatch.undo()
        assert retrained
        later = s.store.fetch_paths(paths)
        fresh = BlockStore(Registry.open("s", home), int8=True).fetch_paths(paths)
        x = torch.randn(1, 3, s.anchor.hidden, generator=torch.Generator().manual_seed(0))
        act = torch.nn.functional.silu
        for slot in range(len(s.reg.config.memory.layers)):
            assert torch.equal(memory_delta(x, later, slot, act), memory_delta(x, fresh, slot, act))


def test_int8_packs_count_against_the_byte_budget(home: Path, bank: Registry) -> None:
    """A new pack that takes the cache over its budget makes older, unpinned blocks leave (and the
    packs that used them): a fetch whose blocks were all cached used to leave the cache over budget."""
    with BankSession("s", home, int8=True) as s:
        paths = s.route(QUERIES)
        a, b = next((p, q) for p in paths for q in paths if p[1] != q[1])
        probe = BlockStore(s.reg, int8=True)
        probe.fetch_paths(a[None])
        pack = next(n for _packed, n in probe._packs.values())
        blocks = {(lvl + 1, int(n)): probe.get(lvl + 1, int(n)) for p in (a, b) for lvl, n in enumerate(p)}
        budget = sum(block_bytes(blk) for blk in blocks.values() if blk is not None) + pack  # room for one pack
        store = BlockStore(s.reg, cache_bytes=budget, int8=True)
        store.fetch_paths(a[None])
        store.fetch_paths(b[None])  # reads b's leaf within budget, then b's pack is one pack too many
        assert store.cached_bytes <= budget
        assert block_id(2, int(b[1])) in store.cached() and block_id(2, int(a[1])) not in store.cached()
        assert len(store._packs) == 1 and store.stats.evictions == 1


def test_ask_int8_json(home: Path, bank: Registry) -> None:
    res = runner.invoke(app, ["ask", QUERIES[1], "--bank", "s", "--int8", "--json", "--max-new-tokens", "2"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["int8"] is True and d["blocks"] and d["store"]["misses"] >= 1


def test_int8_packing_lets_no_deprecation_warning_through() -> None:
    """Torch warns once per process that quantized tensors are deprecated; pack_int8 silences it for
    its whole pool of packers. It used to silence it inside each worker, and catch_warnings is not
    thread-safe: one worker's exit could restore the filters while another warned, and the warning
    reached `ask --int8`'s stderr. A fresh process, so the once-per-process warning is still due."""
    code = (
        "import torch, warnings\n"
        "from memctl.model.memory import pack_int8\n"
        "warnings.simplefilter('error')\n"
        "b = [{p: torch.randn(8, 64, 96) for p in ('gate', 'up', 'down')} for _ in range(2)]\n"
        "packed = pack_int8(b)\n"
        "assert len(packed) == 8 and packed[0][2] == 128\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deprecated" not in proc.stderr
