"""What the bank owner's console (`memctl browse`) shows and does, as plain library calls.

* `BankView.overview`: the anchor, the configuration, sizes, coverage, a count per level of trained,
  stale, untrained and blocked blocks, the last evaluation run, the privacy log's last entries.
* `route_view`: a text routed exactly as `ask` routes it (`Memories.route_gated`, relevance gate
  included), with each level's similarity, the gate's verdict and the nearest windows in the leaf.
* `BankView.block_detail` / `doc_detail`: a node (windows, documents, tokens, its block) and a
  document (its windows' text, tags, paths, the blocks it shaped with their shares).
* Actions, each the library call its CLI command makes (so each lands in the privacy log exactly as
  the CLI's do): `toggle_block` and `toggle_doc` (`privacy.set_blocked`), `plan_forget` and
  `forget_doc` (`forget.plan_forget`, `forget.forget`), and `ask_path`: a question answered through
  a node's path (forced) beside the anchor alone (`serve.BankSession.generate`; asking changes nothing).

Reads the registry only, except for those actions; the anchor is loaded on the first `ask_path`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..build.labels import node_label, path_prefix
from ..core.tree import Tree
from ..privacy.controls import audit_doc, audit_node, doc_blocks, privacy_log, set_blocked
from ..registry import Registry, block_id, memctl_home

if TYPE_CHECKING:
    from ..privacy.forget import ForgetPlan, ForgetReport
    from ..serve.api import Memories
    from ..serve.session import BankSession
    from ..train.loop import TrainEvent

PREVIEW_CHARS = 600
LOG_ENTRIES = 5  # privacy-log entries the overview shows
NEAREST_WINDOWS = 5  # windows of the routed leaf a route view lists
SNIPPET_CHARS = 160
ASK_TOKENS = 32  # as `memctl ask`
Progress = Callable[[str, int, int], None]


@dataclass
class NodeInfo:
    level: int  # 0: the generic memory
    idx: int
    windows: int
    label: str
    state: str  # init | trained | stale | dropped | none
    blocked: bool
    n_params: int

    @property
    def id(self) -> str:
        return block_id(self.level, self.idx)


@dataclass(frozen=True)
class Hop:
    """One level of a routed path."""

    level: int
    idx: int
    similarity: float  # cosine of the text to the node's centroid (the gate reads `RouteView.relevance`)
    label: str
    state: str
    blocked: bool

    @property
    def id(self) -> str:
        return block_id(self.level, self.idx)


@dataclass(frozen=True)
class NearWindow:
    window_id: int
    doc_id: str
    title: str
    score: float  # cosine of the text to the window
    snippet: str


@dataclass
class RouteView:
    """A text routed as `ask` routes it, with what the relevance gate made of it."""

    text: str
    hops: list[Hop]
    relevance: float  # what the relevance gate reads (memctl.build.routing: to the leaf's centroid or nearest window)
    floor: float  # the bank's relevance floor (0: gate off)
    unrelated: bool  # below the floor: nothing fetched, nothing retrieved, the anchor answers alone
    windows: list[NearWindow] = field(default_factory=list)  # nearest windows in the leaf

    @property
    def path(self) -> list[int]:
        return [h.idx for h in self.hops]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AskResult:
    """One question through a forced path, and the anchor alone."""

    question: str
    node: str
    path: list[int]
    mode: str  # fetched (a tree node) | generic (the generic memory)
    answer: str
    blocks: list[str]  # served
    withheld: list[str]  # on the path, blocked or untrained-but-present
    anchor_answer: str


def _cos(x: np.ndarray, c: np.ndarray) -> float:
    den = float(np.linalg.norm(x) * np.linalg.norm(c))
    return float(x @ c) / den if den > 0 else 0.0


def ancestors(tree: Tree, level: int, idx: int) -> list[int]:
    """The path from level 1 down to (level, idx)."""
    return [idx // tree.k ** (level - 1 - lv) for lv in range(level)]


def forced_path(tree: Tree, x: np.ndarray, level: int, idx: int, reg: Registry | None = None) -> list[int]:
    """The path through (level, idx), routed inside its subtree by the bank's rule: with `reg` and a
    bank that routes to its `nearest` window (memctl.build.routing), the path of the window under the node
    nearest `x` (dim,); otherwise greedy descent (the nearest child at each deeper level, as
    `tree.route` chooses)."""
    if reg is not None and getattr(reg.config, "routing", "tree") == "nearest" and level < tree.p:
        rows = reg.db.execute(
            "select path, embedding from windows where l1 = ? and path like ? order by id",
            [ancestors(tree, level, idx)[0], path_prefix(tree, level, idx)],
        ).fetchall()
        if rows:
            vecs = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows])  # (N, dim)
            best = rows[int(np.argmax(vecs @ np.asarray(x, dtype=np.float32)))][0]
            return [int(v) for v in best.split(",")]
    path = ancestors(tree, level, idx)
    node = idx
    for lv in range(level, tree.p):
        kids = tree.centroids[lv][node * tree.k : (node + 1) * tree.k]  # (k, dim)
        d2 = (kids**2).sum(1) - 2.0 * (kids @ x)
        node = node * tree.k + int(d2.argmin())
        path.append(node)
    return path


def nearest_windows(reg: Registry, path: list[int], x: np.ndarray, n: int = NEAREST_WINDOWS) -> list[NearWindow]:
    """The `n` windows routed to exactly this leaf that lie nearest `x` (ties: lowest id)."""
    rows = list(
        reg.db.query("select w.id, w.doc_id, w.text, w.embedding, d.title from windows w join documents d "
                     "on d.id = w.doc_id where w.l1 = ? and w.path = ? order by w.id",
                     [path[0], ",".join(map(str, path))])
    )  # fmt: skip
    if not rows:
        return []
    vecs = np.stack([np.frombuffer(r["embedding"], dtype=np.float32) for r in rows])  # (N, dim)
    scores = vecs @ np.asarray(x, dtype=np.float32)
    out = []
    for i in np.argsort(-scores, kind="stable")[:n]:
        r = rows[int(i)]
        text = " ".join(r["text"].split())
        snippet = text[:SNIPPET_CHARS] + ("…" if len(text) > SNIPPET_CHARS else "")
        out.append(NearWindow(int(r["id"]), r["doc_id"], r["title"] or "", float(scores[i]), snippet))
    return out


def route_view(
    mem: Memories, text: str, label: Callable[[int, int], str], *, judge: bool = True, n: int = NEAREST_WINDOWS
) -> RouteView:
    """Route `text` as `ask` does (`route_gated`, the relevance gate unless `judge` is False)."""
    r = mem.route_gated([text], judge=judge)
    x, path = r.x[0], [int(v) for v in r.paths[0]]
    hops = []
    for lv, node in enumerate(path):
        row = mem.reg.block(lv + 1, node)
        hops.append(
            Hop(lv + 1, node, _cos(x, mem.tree.centroids[lv][node]), label(lv + 1, node), _state(row),
                bool(row and row["blocked"]))
        )  # fmt: skip
    floor = mem.relevance_floor if judge else 0.0
    rel = float(r.relevance[0])
    return RouteView(text, hops, rel, floor, bool(r.off[0]), nearest_windows(mem.reg, path, x, n))


class BankView:
    def __init__(self, name: str, home: Path | None = None) -> None:
        self.name = name
        self.home = home or memctl_home()
        self.reg = Registry.open(name, self.home)
        self.tree: Tree = self.reg.load_tree()
        self._labels: dict[tuple[int, int], str] = {}
        self._memories: Memories | None = None
        self._session: BankSession | None = None

    def __enter__(self) -> BankView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for m in (self._session, self._memories):
            if m is not None:
                m.close()
        self._session = self._memories = None
        self.reg.close()

    # ---- the bank as a whole ------------------------------------------------------------------------
    def summary(self) -> str:
        cfg = self.reg.config
        docs, windows = self.reg.count("documents"), self.reg.count("windows")
        blocked = self.reg.db.execute("select count(*) from blocks where blocked = 1").fetchone()[0]
        return (
            f"{self.name}: {docs} documents, {windows} windows; tree k={cfg.tree.k}, p={cfg.tree.p}; "
            f"ranks {cfg.memory.ranks}; {blocked} block(s) blocked"
        )

    def overview(self, log_entries: int = LOG_ENTRIES) -> dict[str, Any]:
        """`bank.info` (anchor, configuration, sizes, coverage) with a count per level of trained,
        stale, untrained and blocked blocks, the last evaluation run and the privacy log's tail."""
        from ..eval.runs import EvalRuns
        from .info import info

        d = info(self.name, self.home)
        runs = EvalRuns(self.reg).history(limit=20)
        last = next((r for r in runs if r["status"] == "done"), runs[0] if runs else None)
        log = privacy_log(self.name, self.home)
        spec = d["anchor"]["spec"]
        return {
            "bank": self.name,
            "anchor": {**d["anchor"], "name": Path(spec).name if spec != "default" else "default (SmolLM2-135M)"},
            "config": {"embedder": d["embedder"], "window": d["window"], "tree": d["tree"], "memory": d["memory"]},
            "documents": d["documents"],
            "windows": d["windows"],
            "tokens": d["tokens"],
            "bytes_on_disk": d["bytes_on_disk"],
            "bank_params": d["bank_params"],
            "fetched_params": d["fetched_params"],
            "fetched_bytes": 4 * d["fetched_params"],  # float32 blocks
            "fetched_ratio": d["fetched_ratio"],
            "training": d["training"],
            "coverage": d["coverage"],
            "prompt_rules_note": d["prompt_rules"]["note"],  # prompts from older rules (memctl reprompt)
            "levels": level_states(self.reg),
            "last_eval": _eval_summary(last) if last else None,
            "privacy_log": [{k: e[k] for k in ("at", "action", "target", "reason")} for e in log[-log_entries:]],
            "privacy_log_total": len(log),
        }

    # ---- nodes ------------------------------------------------------------------------------------------
    def label(self, level: int, idx: int) -> str:
        if level == 0:
            return "generic memory"
        if (level, idx) not in self._labels:
            self._labels[(level, idx)] = node_label(self.reg, self.tree, level, idx)
        return self._labels[(level, idx)]

    def forget_labels(self) -> None:
        """Labels are cached; after a forget they are made again from the documents left."""
        self._labels.clear()

    def node(self, level: int, idx: int) -> NodeInfo:
        row = self.reg.block(level, idx)
        n = (
            self.reg.db.execute("select n_windows from nodes where level = ? and idx = ?", [level, idx]).fetchone()
            if level
            else (self.reg.count("windows"),)  # the generic memory trains on every window
        )
        return NodeInfo(
            level,
            idx,
            int(n[0]) if n else 0,
            self.label(level, idx),
            _state(row),
            bool(row["blocked"]) if row else False,
            int(row["n_params"]) if row else 0,
        )

    def children(self, level: int, idx: int) -> list[NodeInfo]:
        """Children of a node (level 0, idx 0: the root, whose children are level 1)."""
        if level >= self.tree.p:
            return []
        first = idx * self.tree.k if level else 0
        return [self.node(level + 1, first + j) for j in range(self.tree.k)]

    def block_detail(self, level: int, idx: int) -> dict[str, Any]:
        """audit_node, with the node's label, windows, documents and tokens, and its block's rank,
        bytes, trained tokens and last training time."""
        d = audit_node(self.name, block_id(level, idx), self.home)
        info = self.node(level, idx)
        row = self.reg.block(level, idx) or {}
        if level:
            where, params = "l1 = ? and path like ?", [ancestors(self.tree, level, idx)[0],
                                                       path_prefix(self.tree, level, idx)]  # fmt: skip
        else:
            where, params = "1", []
        n_docs, tokens = self.reg.db.execute(
            f"select count(distinct doc_id), coalesce(sum(n_tokens), 0) from windows where {where}", params
        ).fetchone()
        f = self.reg.path / row["file"] if row.get("file") else None
        d.update(
            label=info.label,
            windows=info.windows,
            n_documents=int(n_docs),
            window_tokens=int(tokens),
            state=info.state,
            rank=row.get("rank"),
            bytes=f.stat().st_size if f is not None and f.exists() else 0,
            trained_tokens=row.get("trained_tokens") or 0,
            trained_at=row.get("updated") if row.get("file") else None,
        )
        return d

    # ---- documents --------------------------------------------------------------------------------------
    def doc_detail(self, doc_id: str) -> dict[str, Any]:
        """audit_doc, the start of the document's text, and every window (text and path)."""
        d = audit_doc(self.name, doc_id, self.home)
        rows = self.reg.windows("doc_id = ?", [doc_id])
        text = "\n\n".join(r["text"] for r in rows)
        d["preview"] = text[:PREVIEW_CHARS] + ("…" if len(text) > PREVIEW_CHARS else "")
        d["window_texts"] = [{"idx": r["idx"], "path": r["path"], "tokens": r["n_tokens"], "text": r["text"]}
                             for r in rows]  # fmt: skip
        d["blocked"] = self.doc_blocked(doc_id)
        return d

    def doc_blocked(self, doc_id: str) -> bool:
        """Whether every block the document can have shaped is blocked (what `block --doc` blocks)."""
        keys = doc_blocks(self.reg, [doc_id])
        rows = [self.reg.block(*k) for k in keys]
        return bool(rows) and all(r is not None and r["blocked"] for r in rows)

    # ---- actions (each one the CLI's library call) ---------------------------------------------------
    def toggle_block(self, level: int, idx: int, reason: str = "browse") -> bool:
        """Block the node's block, or unblock it if blocked (as `memctl block --node`); the new state."""
        info = self.node(level, idx)
        set_blocked(self.name, not info.blocked, nodes=[info.id], reason=reason, home=self.home)
        return not info.blocked

    def toggle_doc(self, doc_id: str, reason: str = "browse") -> bool:
        """Block every block the document shaped, or unblock them if all are (as `memctl block --doc`)."""
        blocked = not self.doc_blocked(doc_id)
        set_blocked(self.name, blocked, docs=[doc_id], reason=reason, home=self.home)
        return blocked

    def plan_forget(self, doc_id: str) -> ForgetPlan:
        """What forgetting the document costs (units to retrain, tokens, time last time); changes nothing."""
        from ..privacy.forget import plan_forget

        return plan_forget(self.name, [doc_id], mode="exact", home=self.home)

    def forget_doc(
        self,
        plan: ForgetPlan,
        progress: Progress | None = None,
        train_progress: Callable[[TrainEvent], None] | None = None,
    ) -> ForgetReport:
        """Carry out the plan (as `memctl forget --doc ID --yes`)."""
        from ..privacy.forget import forget

        if self._session is not None:  # forget attaches the anchor it loads; ours goes first
            self._session.close()
            self._session = None
        report = forget(plan, home=self.home, progress=progress, train_progress=train_progress)
        self.forget_labels()
        return report

    def memories(self) -> Memories:
        """The bank's tree, embedder and gate, for routing (no model)."""
        if self._memories is None:
            from ..serve.api import Memories

            self._memories = Memories(self.name, self.home)
        return self._memories

    def search(self, text: str) -> RouteView:
        """Route `text` as `ask` routes it, with the relevance gate."""
        from ..core.errors import InputError

        if not text.strip():
            raise InputError("type something to search for")
        return route_view(self.memories(), text, self.label)

    def ask_path(self, level: int, idx: int, question: str, progress: Progress | None = None) -> AskResult:
        """Answer `question` through the path of (level, idx), forced (its ancestors, then routing
        inside its subtree; the generic memory for level 0), and with the anchor alone."""
        from ..core.errors import InputError

        if not question.strip():
            raise InputError("the question is empty")
        step = progress or (lambda *_: None)
        step("loading the anchor", 0, 3)
        if self._session is None:
            from ..serve.session import BankSession

            self._session = BankSession(self.name, self.home)
        s = self._session
        step("through the path", 1, 3)
        if level == 0:
            path: list[int] = []
            ans = s.generate([question], mode="generic", max_new_tokens=ASK_TOKENS)[0]
        else:
            path = forced_path(self.tree, s.embedder.encode([question])[0], level, idx, self.reg)
            ans = s.generate([question], mode="fetched", max_new_tokens=ASK_TOKENS,
                             paths=np.array([path], dtype=np.int64))[0]  # fmt: skip
        step("anchor alone", 2, 3)
        alone = s.generate([question], mode="none", max_new_tokens=ASK_TOKENS)[0]
        step("done", 3, 3)
        mode = "generic" if level == 0 else "fetched"
        return AskResult(question, block_id(level, idx), path, mode, ans.text.strip(), ans.blocks, ans.withheld,
                         alone.text.strip())  # fmt: skip


def level_states(reg: Registry) -> list[dict[str, Any]]:
    """Per level (1..p), then the generic memory (level 0): blocks that are blocked, and of the
    others those trained, stale (trained before new documents came) and untrained (never trained,
    or dropped by forget)."""
    out = []
    p = reg.config.tree.p
    for level in [*range(1, p + 1), 0]:
        counts = {"trained": 0, "stale": 0, "untrained": 0, "blocked": 0}
        for r in reg.db.execute("select state, file, blocked from blocks where level = ?", [level]).fetchall():
            state, f, blocked = r
            key = "blocked" if blocked else "untrained" if not f else "stale" if state == "stale" else "trained"
            counts[key] += 1
        out.append({"level": level, "blocks": sum(counts.values()), **counts})
    return out


def _eval_summary(run: dict[str, Any]) -> dict[str, Any]:
    res = run["results"] or {}
    return {
        "id": run["id"],
        "status": run["status"],
        "finished": run["finished"],
        "probes": Path(run["probes"]).name if run["probes"] else "",
        "n": res.get("n", 0),
        "setups": [{"setup": s["setup"], "accuracy": s["accuracy"], "n": s["n"]} for s in res.get("setups", [])],
        "answers_stored": run["answers_stored"],
    }


def _state(row: dict[str, Any] | None) -> str:
    if row is None:
        return "none"
    if row["file"]:
        return str(row["state"])
    return "dropped" if row["state"] == "dropped" else "untrained"


def overview_json(name: str, home: Path | None = None) -> str:
    """`memctl browse --json`: the overview as JSON."""
    view = BankView(name, home)
    try:
        return json.dumps(view.overview(), default=str)
    finally:
        view.close()
