"""Export and import: a round trip is exact, a tag-restricted export carries nothing private, and a
bad archive, a foreign anchor or a taken name is refused leaving nothing behind."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sqlite3
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import TOPICS, tree_digest
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from tiny import build_tiny_llama

from memctl.build.ingest import ingest
from memctl.core.errors import AnchorError, BankStateError, InputError, IntegrityError
from memctl.ops.transfer import export_bank, import_bank
from memctl.privacy.controls import set_blocked
from memctl.registry import Registry
from memctl.registry.access import reachable_blocks
from memctl.serve.session import BankSession
from memctl.train.run import train

PRIVATE = "metals/0.txt"  # untagged: only the owner may use it
SECRET = b"strong metal used in steel"
REFERENCE = b"Tin is a soft metal that was once used for cans"
REASON = "holds a named supplier"
PUBLIC = frozenset({"public"})


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, tiny_anchor: Path) -> Path:
    """A trained bank 'src' (every document tagged 'public' but PRIVATE, one reference document),
    built on a copy of the tiny anchor that is deleted afterwards: importers live on another machine."""
    root = tmp_path_factory.mktemp("source")
    docs, refs, anchor, home = root / "docs", root / "refs", root / "anchor", root / "home"
    for topic, sents in TOPICS.items():
        (docs / topic).mkdir(parents=True)
        for i, s in enumerate(sents):
            (docs / topic / f"{i}.txt").write_text(f"{s}\n\nMore about {topic}: note {i} of the {topic} notes.\n")
    refs.mkdir()
    (refs / "r1.txt").write_text(REFERENCE.decode() + " and toys.")
    shutil.copytree(tiny_anchor, anchor)
    ingest("src", [docs], anchor=str(anchor), embedder="hash", tree=(2, 2), home=home)
    ingest("src", [refs], reference=True, home=home)
    reg = Registry.open("src", home)
    for (doc_id,) in list(reg.db.execute("select id from documents where id != ?", [PRIVATE])):
        reg.db["documents"].update(doc_id, {"tags": "public"})
    reg.close()
    train("src", {"epochs": 1, "batch_size": 2, "objective": "mix"}, home=home)
    shutil.rmtree(anchor)
    return home / "banks" / "src"


@pytest.fixture()
def src(home: Path, source: Path) -> Registry:
    shutil.copytree(source, home / "banks" / "src")
    return Registry.open("src", home)


def _blocks(reg: Registry) -> dict[str, dict[str, torch.Tensor]]:
    return {r["id"]: reg.read_block(r) for r in reg.blocks("file is not null")}


def _bank_files(reg: Registry) -> list[str]:
    """What the bank's directory holds, but SQLite's write-ahead log and index (there while it is open)."""
    return sorted(p.name for p in reg.path.iterdir() if not p.name.endswith(("-wal", "-shm")))


def _leftovers(home: Path) -> list[str]:
    """Everything under home/banks but the source bank and the writer lock file beside each bank that is
    there (memctl.registry.lock; a lock file of no bank is a leftover): a refused import must leave this empty."""
    names = {p.name for p in (home / "banks").iterdir()}
    locks = {f".{n}.lock" for n in names}
    return sorted(n for n in names - locks if n != "src")


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def _write_tar(path: Path, members: dict[str, bytes], extra: Callable[[tarfile.TarFile], None] | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra:
            extra(tar)
    return path


def _edit_registry(data: bytes, tmp: Path, *sql: tuple[str, list]) -> bytes:
    db = tmp / "edit.db"
    db.write_bytes(data)
    conn = sqlite3.connect(db)
    for statement, params in sql:
        conn.execute(statement, params)
    conn.commit()
    conn.close()
    return db.read_bytes()


def _reseal(members: dict[str, bytes]) -> dict[str, bytes]:
    """Make the manifest's registry checksum match a tampered registry, as a forger would."""
    manifest = json.loads(members["manifest.json"])
    manifest["registry_sha256"] = hashlib.sha256(members["registry.db"]).hexdigest()
    members["manifest.json"] = json.dumps(manifest).encode()
    return members


def test_round_trip_is_exact_and_serves(home: Path, src: Registry, tiny_anchor: Path, tmp_path: Path) -> None:
    out = tmp_path / "src.memctl"
    res = export_bank("src", out, home=home)
    n_files = src.count("blocks") - src.db.execute("select count(*) from blocks where file is null").fetchone()[0]
    assert (res.blocks, res.documents, res.bytes, res.allow) == (n_files, 12, out.stat().st_size, None)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == ["src.memctl"]  # no temp file left
    assert _bank_files(src) == ["blocks", "checkpoints", "registry.db"]  # no work copy
    members = _members(out)
    blocks = {r["file"] for r in src.blocks("file is not null")}
    assert set(members) == {"manifest.json", "registry.db"} | blocks
    manifest = json.loads(members["manifest.json"])
    assert manifest["format"] == "memctl-bank" and manifest["allow"] is None
    assert manifest["registry_sha256"] == hashlib.sha256(members["registry.db"]).hexdigest()
    assert SECRET in members["registry.db"]  # a full export carries everything (so the grep below means something)
    exported = src.db.execute("select detail from privacy_log where action = 'export'").fetchone()[0]
    assert json.loads(exported) == {"allow": None, "blocks": n_files}
    with pytest.raises(InputError, match="already exists"):
        export_bank("src", out, home=home)

    # the anchor copy the bank names is gone, as on another machine: import asks for --anchor
    with pytest.raises(AnchorError, match="not on this machine.*--anchor PATH"):
        import_bank(out, "copy", home=home)
    assert _leftovers(home) == []

    got = import_bank(out, "copy", anchor=str(tiny_anchor), home=home)
    assert (got.bank, got.path, got.blocks, got.documents) == ("copy", home / "banks" / "copy", n_files, 12)
    copy = Registry.open("copy", home)
    want, have = _blocks(src), _blocks(copy)
    assert set(have) == set(want) and len(want) == n_files
    for bid in want:
        for part in ("gate", "up", "down"):
            assert torch.equal(have[bid][part], want[bid][part]), (bid, part)
    for table in ("documents", "windows", "prompts", "nodes", "block_docs", "reference_docs"):
        assert copy.count(table) == src.count(table), table
    assert copy.config.anchor == str(tiny_anchor.resolve()) and copy.bank["name"] == "copy"
    assert json.loads(copy.config.to_json()) | {"anchor": None} == json.loads(src.config.to_json()) | {"anchor": None}
    assert copy.db.execute("select count(*) from privacy_log where action = 'import'").fetchone()[0] == 1
    copy.close()
    with BankSession("copy", home) as session:
        (answer,) = session.generate(["Iron is a metal"], max_new_tokens=2)
        assert answer.blocks  # trained blocks on its route were served

    digest = tree_digest(home / "banks" / "copy")
    with pytest.raises(BankStateError, match="already exists"):
        import_bank(out, "copy", anchor=str(tiny_anchor), home=home)
    assert tree_digest(home / "banks" / "copy") == digest and _leftovers(home) == ["copy"]


def test_allow_export_carries_only_what_the_tags_reach(
    home: Path, src: Registry, tiny_anchor: Path, tmp_path: Path
) -> None:
    reach = reachable_blocks(src, PUBLIC)
    trained = {r["id"] for r in src.blocks("file is not null")}
    assert reach and reach < trained  # PRIVATE trained some blocks, others it never touched
    victim = sorted(reach)[0]
    set_blocked("src", True, nodes=[victim], reason=REASON, home=home)
    expected = {r["id"] for r in src.blocks("file is not null and blocked = 0") if r["id"] in reach}
    assert expected and victim not in expected

    out = tmp_path / "public.memctl"
    res = export_bank("src", out, allow=PUBLIC, home=home)
    assert (res.blocks, res.documents, res.allow) == (len(expected), 11, ["public"])
    raw = out.read_bytes()
    for needle in (SECRET, REFERENCE, REASON.encode(), PRIVATE.encode()):
        assert needle not in raw, needle  # private text, reference text, block reason, even the id
    manifest = json.loads(_members(out)["manifest.json"])
    assert {b["id"] for b in manifest["blocks"]} == expected and manifest["allow"] == ["public"]

    got = import_bank(out, "pub", anchor=str(tiny_anchor), home=home)
    assert (got.blocks, got.documents) == (len(expected), 11)
    pub = Registry.open("pub", home)
    docs = {r[0] for r in pub.db.execute("select id from documents")}
    assert docs == set(src.doc_hashes()) - {PRIVATE}
    assert not pub.db.execute("select count(*) from windows where doc_id = ?", [PRIVATE]).fetchone()[0]
    assert {r[0] for r in pub.db.execute("select distinct doc_id from block_docs")} <= docs
    assert {r["id"] for r in pub.blocks("file is not null")} == expected
    withheld = pub.blocks("state = 'withheld'")
    assert {r["id"] for r in withheld} == trained - expected
    assert all(r["file"] is None and not r["blocked"] and r["blocked_reason"] is None for r in withheld)
    assert {r[0] for r in pub.db.execute("select distinct block_id from block_docs")} <= expected
    want = _blocks(src)
    for bid, tensors in _blocks(pub).items():
        assert torch.equal(tensors["down"], want[bid]["down"]), bid
    n_windows = pub.count("windows")
    for level in (1, 2):
        total = pub.db.execute("select sum(n_windows) from nodes where level = ?", [level]).fetchone()[0]
        assert total == n_windows
    assert pub.count("reference_docs") == pub.count("forget_reports") == 0
    assert [r[0] for r in pub.db.execute("select action from privacy_log")] == ["import"]
    pub.close()
    with BankSession("pub", home) as session:
        assert len(session.generate(["Neon is a gas"], max_new_tokens=2)) == 1


def test_export_refusals_leave_nothing(home: Path, src: Registry, tmp_path: Path) -> None:
    out = tmp_path / "x.memctl"
    with pytest.raises(InputError, match="no document .* carries any of the tags nobody"):
        export_bank("src", out, allow=frozenset({"nobody"}), home=home)
    with pytest.raises(InputError, match="at least one tag"):
        export_bank("src", out, allow=frozenset(), home=home)
    with pytest.raises(InputError, match="does not exist"):
        export_bank("src", tmp_path / "nowhere" / "x.memctl", home=home)
    assert not out.exists() and _bank_files(src) == ["blocks", "checkpoints", "registry.db"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    out.write_bytes(b"an older archive")
    assert export_bank("src", out, home=home, overwrite=True).blocks > 0 and tarfile.is_tarfile(out)
    before = out.read_bytes()
    row = src.blocks("file is not null")[0]  # a block corrupted on the owner's disk is never shipped
    data = bytearray((src.path / row["file"]).read_bytes())
    data[-1] ^= 0x01
    (src.path / row["file"]).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match its checksum"):
        export_bank("src", out, home=home, overwrite=True)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["home", "x.memctl"]
    assert _bank_files(src) == ["blocks", "checkpoints", "registry.db"]


def _flip_block(members: dict[str, bytes], tmp: Path) -> dict[str, bytes]:
    name = sorted(n for n in members if n.startswith("blocks/"))[0]
    data = bytearray(members[name])
    data[-5] ^= 0x01
    members[name] = bytes(data)
    return members


def _flip_registry(members: dict[str, bytes], tmp: Path) -> dict[str, bytes]:
    data = bytearray(members["registry.db"])
    data[len(data) // 2] ^= 0x01
    members["registry.db"] = bytes(data)
    return members


def _reshape_block(members: dict[str, bytes], tmp: Path) -> dict[str, bytes]:
    """A block whose gate has one row too few, with every checksum (file name, registry, manifest) made
    to match: only the shape check can catch it."""
    old = sorted(n for n in members if n.startswith("blocks/L1-"))[0]
    tensors = st_load(members.pop(old))
    tensors["gate"] = tensors["gate"][:, :-1].contiguous()
    data = st_save(tensors)
    sha = hashlib.sha256(data).hexdigest()
    new = f"{old.split('.')[0]}.{sha[:16]}.safetensors"
    members[new] = data
    members["registry.db"] = _edit_registry(
        members["registry.db"], tmp, ("update blocks set file = ?, sha256 = ? where file = ?", [new, sha, old])
    )
    manifest = json.loads(members["manifest.json"])
    for b in manifest["blocks"]:
        if b["file"] == old:
            b.update(file=new, sha256=sha, bytes=len(data))
    members["manifest.json"] = json.dumps(manifest).encode()
    return _reseal(members)


def _newer_schema(members: dict[str, bytes], tmp: Path) -> dict[str, bytes]:
    sql = ("insert into schema_migrations (version, applied) values (?, ?)", [99, "2099-01-01"])
    members["registry.db"] = _edit_registry(members["registry.db"], tmp, sql)
    return _reseal(members)


def _extra_block(members: dict[str, bytes], tmp: Path) -> dict[str, bytes]:
    name = sorted(n for n in members if n.startswith("blocks/"))[0]
    members[f"blocks/L9-000000.{'0' * 16}.safetensors"] = members[name]
    return members


def _not_ours(members: dict[str, bytes], tmp: Path) -> dict[str, bytes]:
    members["manifest.json"] = json.dumps({"format": "zip", "version": 1}).encode()
    return members


def _dotdot(members: dict[str, bytes], tmp: Path) -> dict[str, bytes]:
    members["../evil"] = b"x"
    return members


@pytest.mark.parametrize(
    ("tamper", "error", "message"),
    [
        (_flip_block, IntegrityError, "blocks/.* does not match its checksum"),
        (_flip_registry, IntegrityError, "registry.db does not match its checksum"),
        (_reshape_block, IntegrityError, r"tensor 'gate' is F32 \[3, 8, 32\], expected F32 \[3, 9, 32\]"),
        (_newer_schema, InputError, "made by a newer memctl"),
        (_extra_block, IntegrityError, "has extra block file blocks/L9-000000"),
        (_not_ours, InputError, "not a memctl-bank manifest"),
        (_dotdot, InputError, r"unexpected member '\.\./evil'"),
    ],
)
def test_tampered_archives_are_refused_and_leave_nothing(
    home: Path,
    src: Registry,
    tiny_anchor: Path,
    tmp_path: Path,
    tamper: Callable[[dict[str, bytes], Path], dict[str, bytes]],
    error: type[Exception],
    message: str,
) -> None:
    good = export_bank("src", tmp_path / "good.memctl", home=home).file
    bad = _write_tar(tmp_path / "bad.memctl", tamper(_members(good), tmp_path))
    with pytest.raises(error, match=message):
        import_bank(bad, "copy", anchor=str(tiny_anchor), home=home)
    assert _leftovers(home) == []
    assert import_bank(good, "copy", anchor=str(tiny_anchor), home=home).blocks > 0  # the untampered one imports


def test_links_foreign_anchors_and_bad_names_are_refused(
    home: Path, src: Registry, tiny_anchor: Path, tmp_path: Path
) -> None:
    good = export_bank("src", tmp_path / "good.memctl", home=home).file

    def link(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("blocks/generic.0123456789abcdef.safetensors")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)

    linked = _write_tar(tmp_path / "link.memctl", _members(good), link)
    with pytest.raises(InputError, match="is a link"):
        import_bank(linked, "copy", anchor=str(tiny_anchor), home=home)
    other = build_tiny_llama(tmp_path / "other", seed=1)  # same shapes and tokenizer, other weights
    with pytest.raises(AnchorError, match=r"has sha256 [0-9a-f]{12} but bank 'copy' was built on [0-9a-f]{12}"):
        import_bank(good, "copy", anchor=str(other), home=home)
    with pytest.raises(InputError, match="bad bank name"):
        import_bank(good, "../up", anchor=str(tiny_anchor), home=home)
    with pytest.raises(BankStateError, match="bank 'src' already exists"):
        import_bank(good, anchor=str(tiny_anchor), home=home)  # the exported name is taken here
    with pytest.raises(InputError, match="not a memctl bank archive"):
        import_bank(tmp_path / "other" / "config.json", "copy", home=home)
    assert _leftovers(home) == []
