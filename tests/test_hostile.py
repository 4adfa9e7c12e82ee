"""Hostile input (issue 26): bad option values and files at the command line, --json errors and NaN,
and a CLI that never touches the network. Corpus readers and windowing:
test_hostile_input.py; archives: test_hostile_archive.py."""

from __future__ import annotations

import io
import json
import math
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import tree_digest
from typer.testing import CliRunner

from memctl.build.ingest import ingest
from memctl.cli import app
from memctl.core.errors import InputError
from memctl.registry import Registry

runner = CliRunner()


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args))


def one_error_line(res: Any, code: int = 2) -> str:
    assert res.exit_code == code, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    return lines[0]


# ---- the command line: one line, exit 2, the bank as it was ---------------------------------------
def _hostile_files(root: Path) -> list[tuple[Path, str]]:
    root.mkdir()
    cases = {
        "latin.txt": ("caf\xe9 au lait".encode("latin-1"), "line 1: not UTF-8"),
        "nul.md": (b"ok\n\x00\x01", "line 2: looks binary"),
        "broken.jsonl": (b'{"text": "a"}\n{"text": \n', "line 2: not valid JSON"),
        "nocol.csv": (b"body\nx\n", "no column 'text'"),
        "blank.txt": (b"  \n\n\t", "is empty"),
        "num.jsonl": (b'{"text": 7}\n', "line 1: 'text' is empty or not text"),
        "nope.txt": (None, "no such file or directory"),
        "loop.txt": ("loop", "link loop"),
    }
    out = []
    for name, (data, msg) in cases.items():
        p = root / name
        if data == "loop":
            p.symlink_to(p)
        elif data is not None:
            p.write_bytes(data)
        out.append((p, msg))
    return out


def test_hostile_ingests_are_one_line_and_leave_the_bank_as_it_was(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path
) -> None:
    cases = _hostile_files(tmp_path / "bad")
    new_bank = ["--anchor", str(tiny_anchor), "--embedder", "hash", "--tree", "2,2"]
    for path, msg in cases:  # a new bank: nothing is created
        line = one_error_line(invoke("ingest", str(path), "--bank", "fresh", *new_bank))
        assert msg in line and path.name in line, line
        assert not Registry.exists("fresh", home)
    ingest("b", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    before = tree_digest(home / "banks" / "b")
    for path, msg in cases:
        line = one_error_line(invoke("ingest", str(corpus / "metals"), str(path), "--bank", "b"))
        assert msg in line and path.name in line, line
        assert tree_digest(home / "banks" / "b") == before


@pytest.mark.parametrize(
    "args,message",
    [
        (["--ranks", "100000000", "--tree", "2,1"], "beyond the 64 GiB limit"),
        (["--window", "0"], "--window must be at least 16"),
        (["--window", "1000000"], "--window must be between 16 and the anchor's context"),
        (["--tree", "64,6"], "blocks, more than"),
        (["--tree", "1,2"], "--tree K,P needs"),
        (["--tree", "2,2", "--ranks", "4,x"], "comma-separated integers"),
        (["--seed", "-1"], "--seed must be between 0"),
        (["--memory-layers", "last:99"], "--memory-layers last:N"),
    ],
)
def test_bad_ingest_options_are_one_line(
    home: Path, corpus: Path, tiny_anchor: Path, args: list[str], message: str
) -> None:
    res = invoke("ingest", str(corpus), "--bank", "b", "--anchor", str(tiny_anchor), "--embedder", "hash", *args)
    assert message in one_error_line(res)
    assert not Registry.exists("b", home)


def test_ingest_says_how_many_hidden_entries_it_left_out(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    (corpus / ".git").mkdir()
    (corpus / ".git" / "notes.txt").write_text("Unnamed repository; edit this file")
    (corpus / ".swap.md").write_text("an editor's copy")
    args = ("--bank", "b", "--anchor", str(tiny_anchor), "--embedder", "hash", "--tree", "2,2")
    res = invoke("ingest", str(corpus), *args)
    assert res.exit_code == 0, res.output
    assert "2 hidden file(s) or folder(s) left out" in " ".join(res.stdout.split())
    reg = Registry.open("b", home)
    ids = set(reg.doc_hashes())
    reg.close()
    assert ids and not [i for i in ids if i.startswith(".") or "/." in i]


def test_bad_train_and_eval_values_are_one_line(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest("b", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    before = tree_digest(home / "banks" / "b")
    for args, message in (
        (["--epochs", "0"], "--epochs must be between 1"),
        (["--epochs", "100000000"], "--epochs must be between 1"),
        (["--lr", "nan"], "--lr must be a positive number"),
        (["--lr", "inf"], "--lr must be a positive number"),
        (["--lr", "-1"], "--lr must be a positive number"),
        (["--batch-size", "0"], "--batch-size must be between 1"),
        (["--batch-size", "1000000"], "--batch-size must be between 1"),
        (["--patience", "0"], "--patience must be at least 1"),
        (["--seed", "-5"], "--seed must be between 0"),
        (["--preserve", "nan"], "--preserve must be between 0 and 4"),
    ):
        assert message in one_error_line(invoke("train", "--bank", "b", *args)), args
    assert tree_digest(home / "banks" / "b") == before
    probes = tmp_path / "p.jsonl"
    probes.write_text('{"doc": "x", "kind": "k", "prompt": "Iron is", "answers": ["metal"]}\n')
    for args, message in (
        (["--probes", str(probes), "--block-fraction", "2"], "block fractions must be in [0, 1]"),
        (["--probes", str(probes), "--block-fraction", "nan"], "block fractions must be in [0, 1]"),
        (["--probes", str(tmp_path / "none.jsonl")], "no such"),
        (["--probes", str(probes), "--limit", "1", "--seed", "-1"], "--seed must be between 0"),
    ):
        assert message in one_error_line(invoke("eval", "--bank", "b", *args)), args
    real = Path.open

    def deny(self: Path, *a: Any, **k: Any) -> Any:  # an unreadable probe file (root reads chmod 000 ones)
        if self.name == "p.jsonl":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "open", deny)
    assert "cannot read it" in one_error_line(invoke("eval", "--bank", "b", "--probes", str(probes)))


def test_undecodable_text_unbounded_values_and_unwritable_places_are_one_line(
    home: Path, corpus: Path, tiny_anchor: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by trying the CLI as a hostile user would (2026-12-03): each of these once ended in a traceback,
    an "internal error", a NaN mixture with a numpy warning, a run that never ended, or an eval whose
    report was lost after the whole run."""
    ingest("b", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 2), home=home)
    before = tree_digest(home / "banks" / "b")
    bad = "caf\udce9 au lait"  # how a latin-1 byte in argv or a pipe reaches Python
    probes = tmp_path / "p.jsonl"
    probes.write_text('{"doc": "x", "kind": "k", "prompt": "Iron is", "answers": ["metal"]}\n')
    for args, message in (
        (["ask", bad, "--bank", "b"], "the prompt is not valid UTF-8 text (byte 0xE9 after 'caf')"),
        (["ask", "Iron", "--bank", "b", "--max-new-tokens", "100000000"], "--max-new-tokens must be between 1 and 4,"),
        (["ask", "Iron", "--bank", "b", "--relevance-ramp", "inf"], "--relevance-ramp is a multiple"),
        (["ask", "Iron", "--bank", "b", "--cache-mb", "nan"], "--cache-mb is the block cache's size"),
        (["ask", "Iron", "--bank", "b", "--cache-mb", "inf"], "--cache-mb is the block cache's size"),
        (["chat", "--bank", "b", "--plain", "--max-new-tokens", "5000"], "--max-new-tokens must be between 1"),
        (["block", "--bank", "b", "--node", "1:0", "--reason", bad], "--reason is not valid UTF-8 text"),
        (["block", "--bank", "b", "--query", bad, "--fraction", "0.5"], "--query is not valid UTF-8 text"),
        (["train", "--bank", "b", "--preserve-pool", str(10**20)], "--preserve-pool must be between 1 and 65,536"),
        (["eval", "--bank", "b", "--probes", str(probes), "--beam", str(10**20)], "--beam must be between 1 and"),
        # an empty --allow (an empty shell variable) reached no block and answered with the anchor alone
        (["ask", "Iron", "--bank", "b", "--allow", ","], "--allow needs at least one tag"),
        (["chat", "--bank", "b", "--plain", "--allow", ""], "--allow needs at least one tag"),
        (["eval", "--bank", "b", "--probes", str(probes), "--allow", " , "], "--allow needs at least one tag"),
        (["info", "--bank", "b", "--allow", ""], "--allow needs at least one tag"),
        (["export", "--bank", "b", str(tmp_path / "x.memctl"), "--allow", ","], "--allow needs at least one tag"),
        # a file name the file system could not decode is named whole, before it reaches the registry
        (["eval", "--bank", "b", "--probes", f"{tmp_path}/caf\udce9.jsonl"], "caf\\xe9.jsonl is not valid UTF-8"),
        (["import", f"{tmp_path}/caf\udce9.memctl"], "the archive " + f"{tmp_path}/caf\\xe9.memctl is not valid UTF-8"),
        (["ingest", str(corpus), "--bank", "c", "--anchor", "caf\udce9"], "the anchor caf\\xe9 is not valid UTF-8"),
    ):
        assert message in one_error_line(invoke(*args)), args
    assert tree_digest(home / "banks" / "b") == before and not (home / "banks" / "c").exists()

    # a chat line that is not UTF-8: one error line, and the chat answers the next line
    from memctl.serve.chat import Chat

    seen: list[str] = []
    real_turn = Chat.turn

    def turn(self: Chat, message: str, *a: Any, **k: Any) -> Any:
        seen.append(message)
        return real_turn(self, message, *a, **k)

    monkeypatch.setattr(Chat, "turn", turn)
    chat = ["chat", "--bank", "b", "--plain", "--max-new-tokens", "2"]
    res = runner.invoke(app, chat, input=b"caf\xe9 au lait\nIron is\n")
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "the message is not valid UTF-8 text" in res.stderr and seen == [bad, "Iron is"]
    assert res.stderr.count("error:") == 1 and res.stderr.count("first token") == 1  # the second line's turn
    seen.clear()
    res = runner.invoke(app, [*chat, "--json"], input=b"caf\xe9 au lait\nIron is\n")
    rows = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert res.exit_code == 0 and len(rows) == 2 and seen == [bad, "Iron is"], res.output
    assert "not valid UTF-8" in rows[0]["error"] and "reply" in rows[1]
    bad_probe = tmp_path / "bad.jsonl"
    bad_probe.write_text(probes.read_text() + '{"prompt": "caf\\udce9 is", "answers": ["x"]}\n')
    line = one_error_line(invoke("eval", "--bank", "b", "--probes", str(bad_probe)))
    assert "bad.jsonl:2: the probe is not valid UTF-8 text (byte 0xE9 after 'caf')" in line

    # a report or an archive in a place that cannot be written: refused before any work
    import memctl.eval.evaluate

    ran: list[int] = []
    monkeypatch.setattr(memctl.eval.evaluate, "run_eval", lambda *a, **k: ran.append(1))
    locked = tmp_path / "locked"
    locked.mkdir()

    real_mkdir = Path.mkdir

    def deny(self: Path, *a: Any, **k: Any) -> Any:  # root writes through chmod: refuse as a read-only disk would
        if locked in self.parents or self == locked / "report":
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", deny)
    res = invoke("eval", "--bank", "b", "--probes", str(probes), "--report", str(locked / "report"))
    assert "cannot write there (Permission denied)" in one_error_line(res) and not ran

    import memctl.ops.transfer as transfer

    def no_file(folder: Path, part: Path) -> Any:
        raise PermissionError(13, "Permission denied", str(part))

    monkeypatch.setattr(transfer, "archive_file", no_file)
    assert f"cannot write in {locked}: Permission denied" in one_error_line(
        invoke("export", str(locked / "b.memctl"), "--bank", "b")
    )
    assert tree_digest(home / "banks" / "b") == before


# ---- --json: errors are JSON, NaN is null ---------------------------------------------------------
def _strict(text: str) -> Any:
    def no_constant(c: str) -> None:
        raise AssertionError(f"bare {c} in JSON output")

    return json.loads(text, parse_constant=no_constant)


def test_json_errors_are_json_objects(home: Path, corpus: Path) -> None:
    res = invoke("info", "--bank", "nope", "--json")
    assert res.exit_code == 1
    doc = _strict(res.stdout)
    assert doc["exit_code"] == 1 and "nope" in doc["error"] and doc["type"] == "BankNotFound"
    res = invoke("ingest", str(corpus / "nothing"), "--bank", "b", "--json")
    assert res.exit_code == 2 and _strict(res.stdout)["type"] == "InputError"
    res = invoke("info", "--bank", "nope")  # without --json: nothing on stdout
    assert res.exit_code == 1 and not res.stdout.strip()


def test_json_output_never_holds_nan(home: Path, corpus: Path, tiny_anchor: Path, capsys: Any) -> None:
    from memctl.cli.common import print_json

    print_json({"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -math.inf}})
    assert _strict(capsys.readouterr().out) == {"a": None, "b": [None, 1.5], "c": {"d": None}}
    ingest("b", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), home=home)
    res = invoke("train", "--bank", "b", "--epochs", "1", "--preserve", "0", "--objective", "lm", "--json")
    assert res.exit_code == 0, res.output
    units = _strict(res.stdout)["units"]
    assert units and units[0]["preserve_first"] is None  # NaN (no preservation) comes out as null


# ---- no network ---------------------------------------------------------------------------------------
def test_the_cli_never_opens_a_network_socket(
    home: Path, corpus: Path, tiny_anchor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried: list[Any] = []
    real = socket.socket

    class Guard(real):  # type: ignore[misc, valid-type]
        def __init__(self, family: int = -1, *a: Any, **k: Any) -> None:
            if family in (-1, socket.AF_INET, socket.AF_INET6):
                tried.append(family)
                raise OSError("network access attempted under the socket guard")
            super().__init__(family, *a, **k)

    def no_net(*a: Any, **k: Any) -> Any:
        tried.append(a)
        raise OSError("network access attempted under the socket guard")

    monkeypatch.setattr(socket, "socket", Guard)
    monkeypatch.setattr(socket, "create_connection", no_net)
    monkeypatch.setattr(socket, "getaddrinfo", no_net)
    new = ["--anchor", str(tiny_anchor), "--embedder", "hash", "--tree", "2,1"]
    for args in (
        ["ingest", str(corpus), "--bank", "b", *new],
        ["train", "--bank", "b", "--epochs", "1", "--batch-size", "4", "--preserve", "0"],
        ["ask", "Iron is a", "--bank", "b", "--max-new-tokens", "4"],
        ["info", "--bank", "b"],
    ):
        res = invoke(*args)
        assert res.exit_code == 0, (args, res.output)
    assert tried == []


def test_the_embedding_spool_has_no_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed ingest leaves no `memctl-ingest-*` file behind: the spool is never named."""
    import numpy as np

    from memctl.build.stream import Spool

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    spool = Spool()
    spool.append(np.ones((3, 4), np.float32))
    assert list(tmp_path.iterdir()) == []
    assert spool.array().shape == (3, 4) and float(spool.array().sum()) == 12.0
    spool.close()


# ---- probe files and --json of ask, chat and browse -------------------------------------------------------
def test_an_unreadable_probe_file_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memctl.core.probes import load_probes

    with pytest.raises(InputError, match="is a directory") as e:
        load_probes(tmp_path)  # a directory given as the file
    assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)
    probes = tmp_path / "p.jsonl"
    probes.write_text('{"doc": "x", "kind": "k", "prompt": "Iron is", "answers": ["metal"]}\n')
    assert len(load_probes(probes)) == 1
    real = Path.read_text

    def deny(self: Path, *a: Any, **k: Any) -> Any:  # unreadable (root reads chmod 000 files)
        if self.name == "p.jsonl":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", deny)
    with pytest.raises(InputError, match="cannot read the probe file .Permission denied.") as e:
        load_probes(probes)  # a library caller, no CLI check in front
    assert str(probes) in str(e.value) and "\n" not in str(e.value)


def test_ask_chat_and_browse_json_never_hold_nan(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from dataclasses import dataclass, field

    import memctl.ops.browse
    import memctl.serve.session
    from memctl.cli.answer import _json_chat

    nan = float("nan")
    answer = {"answer": "x", "relevance": nan, "relevance_floor": math.inf, "timings": {"route_s": -math.inf}}
    monkeypatch.setattr(memctl.serve.session, "ask", lambda *a, **k: answer)
    res = invoke("ask", "Iron is", "--bank", "b", "--json")
    assert res.exit_code == 0, res.output
    assert _strict(res.stdout) == {
        "answer": "x",
        "relevance": None,
        "relevance_floor": None,
        "timings": {"route_s": None},
    }

    monkeypatch.setattr(memctl.ops.browse, "overview_json", lambda name: json.dumps({"bank": name, "loss": nan}))
    res = invoke("browse", "--bank", "b", "--json")
    assert res.exit_code == 0, res.output
    assert _strict(res.stdout) == {"bank": "b", "loss": None}

    @dataclass
    class FakeTurn:
        reply: str
        timings: dict[str, float] = field(default_factory=lambda: {"first_token_s": nan})

    class FakeChat:
        def turn(self, line: str) -> FakeTurn:
            return FakeTurn(line)

    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n\nagain\n/quit\n"))
    _json_chat(FakeChat())
    lines = capsys.readouterr().out.splitlines()  # one JSON object per line
    assert [_strict(ln) for ln in lines] == [
        {"reply": "hello", "timings": {"first_token_s": None}},
        {"reply": "again", "timings": {"first_token_s": None}},
    ]


def test_window_zero_from_the_library_is_refused(home: Path, corpus: Path, tiny_anchor: Path) -> None:
    with pytest.raises(InputError, match="--window must be at least 16 tokens"):
        ingest("b", [corpus], anchor=str(tiny_anchor), embedder="hash", tree=(2, 1), window=0, home=home)
    assert not Registry.exists("b", home) and not (home / "banks").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ingest", "docs", "--bank", "b", "--json", "--bogus"], "No such option: --bogus"),
        (["train", "--bank", "b", "--epochs", "abc", "--json"], "Invalid value for '--epochs'"),
    ],
)
def test_argument_parser_errors_under_json_print_the_json_error_too(home: Path, args: list[str], message: str) -> None:
    res = invoke(*args)
    assert res.exit_code == 2
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["type"] == "UsageError" and message in doc["error"] and doc["exit_code"] == 2
    plain = invoke(*[a for a in args if a != "--json"])  # without --json: nothing on stdout
    assert plain.exit_code == 2 and not plain.stdout.strip()
