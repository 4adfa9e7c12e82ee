"""`memctl browse`: a bank owner's console, a Textual app over memctl.ops.browse.

First the overview (anchor, configuration, sizes, coverage, blocks per level, the last evaluation,
the privacy log). `t` opens the tree: every node with its block's state and label; the selected
node's detail and the documents that shaped its block; the highlighted document's windows, tags,
paths and the blocks it shaped. `/` searches: the text is routed as `ask` routes it (relevance gate
included); the tree opens the path with each level's similarity, and the route panel lists the
gate's verdict and the nearest windows in the leaf. Actions (each behind a confirmation, run in a
worker with progress, written to the privacy log as the CLI's are): `b` block/unblock the node,
`d` block/unblock the document, `a` ask through the node's path beside the anchor alone, `f` forget
the document (its cost first). `?` lists the keys.
"""

from __future__ import annotations

from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.timer import Timer
from textual.widgets import ContentSwitcher, DataTable, Footer, Header, Input, Static, Tree
from textual.widgets.tree import TreeNode

from ..core.errors import MemctlError
from ..ops.browse import BankView, Hop, NodeInfo, RouteView
from .actions import BrowseActions
from .base import run_app
from .overview import Overview, human_bytes
from .widgets import HelpScreen, PathView, TaskBar, fit

Key = tuple[int, int]
LABEL_CHARS = 48  # a node's label in the tree is cut here; the detail pane shows it whole
SEARCH_DELAY = 0.3  # seconds of no typing before a live search
TREE_ACTIONS = ("block_node", "block_doc", "ask", "forget", "show_overview")

HELP = "\n\n".join(
    [
        "[b]memctl browse[/b]: the bank's overview first, then its tree.",
        "[b]o[/b] overview · [b]t[/b] tree · [b]/[/b] search · [b]r[/b] refresh · [b]?[/b] this help · [b]q[/b] quit",
        "[b]Search[/b] routes the text as `memctl ask` does, relevance gate included: the tree opens the path, each "
        "node on it marked ▶ with its similarity; the route panel shows the gate's verdict and the nearest windows "
        "in the leaf. Enter moves to the tree; Escape clears the search.",
        "[b]Tree[/b]: the arrows move, Enter or Space opens a node, Tab moves to the documents that shaped the "
        "selected block; highlighting one shows its windows, tags, paths and the blocks it shaped.",
        "[b]Actions[/b] ask first, run in the background with progress, and are written to the privacy log as the "
        "CLI's are:",
        "  [b]b[/b] block or unblock the selected node's block (as `memctl block --node`)\n"
        "  [b]d[/b] block or unblock every block the highlighted document shaped (as `memctl block --doc`)\n"
        "  [b]a[/b] ask a question through the selected node's path, forced, beside the anchor alone\n"
        "  [b]f[/b] forget the highlighted document: its cost first, then exact retraining (as `memctl forget`)",
    ]
)


def node_text(n: NodeInfo, hop: Hop | None = None) -> str:
    styles = {"trained": "[green]trained[/green]", "stale": "[yellow]stale[/yellow]"}
    state = "[b red]BLOCKED[/b red]" if n.blocked else styles.get(n.state, f"[dim]{n.state}[/dim]")
    head = f"[b reverse] ▶ {n.id} {hop.similarity:.2f} [/b reverse]" if hop else n.id
    return f"{head} {state} [dim]{n.windows}w[/dim] {escape(fit(n.label, LABEL_CHARS))}"


class BrowseApp(BrowseActions):
    TITLE = "memctl browse"
    CSS_PATH = "memctl.tcss"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("o", "show_overview", "Overview"),
        Binding("t", "show_tree", "Tree"),
        Binding("slash", "search", "Search"),
        Binding("b", "block_node", "Block"),
        Binding("d", "block_doc", "Block doc"),
        Binding("a", "ask", "Ask"),
        Binding("f", "forget", "Forget"),
        Binding("r", "refresh", "Refresh", show=False),
        Binding("escape", "clear_search", "Clear search", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, view: BankView) -> None:
        super().__init__()
        self.view = view
        self.selected: Key | None = None
        self.selected_doc: str | None = None
        self.route: RouteView | None = None
        self.busy = False
        self._tnodes: dict[Key, TreeNode[Key]] = {}
        self._loaded: set[Key] = set()
        self._marked: dict[Key, Hop] = {}
        self._opened: set[Key] = set()  # nodes the last search opened (they were closed before it)
        self._wanted: str | None = None  # the search whose result the tree should show; older ones are dropped
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with ContentSwitcher(initial="overview", id="views"):
            yield Overview(id="overview")
            with Horizontal(id="tree-view"):
                with Vertical(id="left"):
                    yield Input(placeholder="/ search: routed as `ask` routes it", id="search")
                    yield Tree[Key](self.view.name, id="tree")
                with VerticalScroll(id="right", can_focus=False):
                    yield PathView("", id="route")
                    yield Static("", id="block")
                    yield DataTable(id="docs", cursor_type="row")
                    yield Static("", id="doctext")
        yield TaskBar(id="task")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.view.summary()
        self.query_one("#route", PathView).border_title = "route"
        self.query_one("#block", Static).border_title = "node"
        self.query_one("#docs", DataTable).border_title = "documents that shaped it"
        self.query_one("#doctext", Static).border_title = "document"
        table = self.query_one("#docs", DataTable)
        table.add_columns("document", "tokens", "share", "tags", "title")
        self._overview()
        self._build()

    def on_resize(self) -> None:
        self.query_one(Overview).set_class(self.size.width >= 120, "-wide")

    # ---- views ----------------------------------------------------------------------------------------
    @property
    def in_tree(self) -> bool:
        return self.query_one(ContentSwitcher).current == "tree-view"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in TREE_ACTIONS:
            return self.in_tree
        if action == "show_tree":
            return not self.in_tree
        return True

    def _switch(self, view: str) -> None:
        self.query_one(ContentSwitcher).current = view
        self.refresh_bindings()

    def action_show_overview(self) -> None:
        self._overview()
        self._switch("overview")

    def action_show_tree(self) -> None:
        self._switch("tree-view")
        self.query_one("#tree", Tree).focus()

    def action_search(self) -> None:
        self._switch("tree-view")
        self.query_one("#search", Input).focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(HELP))

    def action_refresh(self) -> None:
        self.view.forget_labels()
        self._overview()
        self._build()
        if self.route is not None:
            self._search(self.route.text)

    def _overview(self) -> None:
        try:
            self.query_one(Overview).show(self.view.overview())
        except MemctlError as e:
            self.notify(str(e), severity="error")
        self.sub_title = self.view.summary()

    # ---- the tree ---------------------------------------------------------------------------------------
    def _build(self) -> None:
        tree = self.query_one("#tree", Tree)
        tree.clear()
        self._tnodes.clear()
        self._loaded.clear()
        self._opened.clear()
        tree.root.expand()
        for child in self.view.children(0, 0):
            self._add(tree.root, child)
        generic = self.view.node(0, 0)
        self._tnodes[(0, 0)] = tree.root.add_leaf(node_text(generic), data=(0, 0))
        if self._marked:
            self._mark(self.route)

    def _add(self, parent: TreeNode[Key], info: NodeInfo) -> None:
        key = (info.level, info.idx)
        label = node_text(info, self._marked.get(key))
        if info.level < self.view.tree.p:
            self._tnodes[key] = parent.add(label, data=key, allow_expand=True)
        else:
            self._tnodes[key] = parent.add_leaf(label, data=key)

    def _load(self, key: Key) -> None:
        """The children of a node, added the first time it opens (a big bank has many)."""
        if key in self._loaded or key[0] == 0:
            return
        self._loaded.add(key)
        for kid in self.view.children(*key):
            self._add(self._tnodes[key], kid)

    def on_tree_node_expanded(self, event: Tree.NodeExpanded[Key]) -> None:
        if event.node.data is not None:
            self._load(event.node.data)

    def _all_keys(self) -> list[Key]:
        return list(self._tnodes)

    def _relabel(self, key: Key) -> None:
        if key in self._tnodes:
            self._tnodes[key].set_label(node_text(self.view.node(*key), self._marked.get(key)))

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[Key]) -> None:
        if event.node.data is not None:
            self.show_block(event.node.data)

    def show_block(self, key: Key) -> None:
        self.selected = key
        try:
            d = self.view.block_detail(*key)
        except MemctlError as e:
            self.query_one("#block", Static).update(f"[red]{escape(str(e))}[/red]")
            return
        level = "generic memory" if key[0] == 0 else f"level {key[0]}, node {key[1]}"
        trained = f"trained {d['trained_at'][:16].replace('T', ' ')}" if d["trained_at"] else "never trained"
        lines = [
            f"[b]{d['block']}[/b] ({level}): {escape(d['label'])}",
            f"{d['windows']:,} windows · {d['n_documents']:,} documents · {d['window_tokens']:,} tokens",
            f"block: {d['state']} · rank {d['rank']} · {d['n_params']:,} parameters · {human_bytes(d['bytes'])} · "
            f"{d['trained_tokens']:,} trained tokens · {trained}",
        ]
        if d["blocked"]:
            lines.append(f"[b red]blocked[/b red] {d['blocked_at'] or ''}: {escape(d['blocked_reason'] or '')}")
        self.query_one("#block", Static).update("\n".join(lines))
        table = self.query_one("#docs", DataTable)
        table.clear()
        for doc in d["documents"]:
            table.add_row(escape(fit(doc["id"], 32)), f"{doc['tokens']:,}", f"{100 * doc['share']:.1f}%",
                          escape(doc["tags"] or ""), escape(fit(doc["title"] or "", 60)), key=doc["id"])  # fmt: skip
        keys = [doc["id"] for doc in d["documents"]]
        if self.selected_doc in keys:  # the document stays highlighted when its node is shown again
            table.move_cursor(row=keys.index(self.selected_doc))
        if not d["documents"]:
            self.selected_doc = None
            self.query_one("#doctext", Static).update("[dim]no document trained this block yet[/dim]")

    # ---- documents -------------------------------------------------------------------------------------
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.show_doc(str(event.row_key.value))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.show_doc(str(event.row_key.value))

    def show_doc(self, doc_id: str) -> None:
        try:
            d = self.view.doc_detail(doc_id)
        except MemctlError as e:
            self.query_one("#doctext", Static).update(f"[red]{escape(str(e))}[/red]")
            return
        self.selected_doc = doc_id
        doc = d["document"]
        shaped = ", ".join(
            f"{b['block']} ({100 * b['share']:.1f}%{', blocked' if b['blocked'] else ''})"
            for b in d["blocks"]
            if b["tokens"]
        )
        text = [
            f"[b]{escape(doc['id'])}[/b]  {escape(doc['title'] or '')}" + ("  [b red]BLOCKED[/b red]" * d["blocked"]),
            f"source {escape(doc['source'] or '')}; tags {escape(doc['tags'] or '-')}; {d['windows']} window(s); "
            f"paths {', '.join(d['paths'])}",
            f"shaped: {shaped or 'no trained block yet'}",
        ]
        for w in d["window_texts"]:
            text += ["", f"[dim]window {w['idx']} · path {w['path']} · {w['tokens']} tokens[/dim]", escape(w["text"])]
        self.query_one("#doctext", Static).update("\n".join(text))

    # ---- search -----------------------------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id != "search":
            return
        if self._timer is not None:
            self._timer.stop()
        text = event.value
        if not text.strip():
            self.action_clear_search()
            return
        self._wanted = text
        self._timer = self.set_timer(SEARCH_DELAY, lambda: self._search(text))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "search" or not event.value.strip():
            return
        if self._timer is not None:
            self._timer.stop()
        self._search(event.value)
        self.query_one("#tree", Tree).focus()

    def _search(self, text: str) -> None:
        self._wanted = text
        self.run_search(text)

    @work(thread=True, exclusive=True, group="search")
    def run_search(self, text: str) -> None:
        try:
            rv = self.view.search(text)
        except MemctlError as e:
            self.call_from_thread(self.notify, str(e), severity="error")
            return
        self.call_from_thread(self._searched, text, rv)

    def _searched(self, text: str, rv: RouteView) -> None:
        """A search's result, unless the text changed while it ran: a live search of a half-typed text
        that finishes late must not open its path after the whole text's."""
        if text == self._wanted:
            self.show_route(rv)

    def show_route(self, rv: RouteView) -> None:
        self.route = rv
        panel = self.query_one("#route", PathView)
        panel.show(rv)
        panel.add_class("-shown")
        self._mark(rv)

    def _mark(self, rv: RouteView | None) -> None:
        """Mark the path's nodes (each with its similarity), open it, and put the cursor on its leaf. Nodes
        the previous search opened that this path does not pass close again (typing a query opens the path
        of each pause's text); nodes the user opened stay open."""
        old = set(self._marked)
        self._marked = {(h.level, h.idx): h for h in rv.hops} if rv else {}
        for key in old | set(self._marked):
            self._relabel(key)
        if rv is None or not rv.hops:
            self._opened.clear()  # clearing the search leaves the tree as it is, under the cursor
            return
        path = {(h.level, h.idx) for h in rv.hops[:-1]}
        for key in sorted(self._opened - path, reverse=True):  # deepest first
            self._tnodes[key].collapse()
        self._opened &= path
        for h in rv.hops[:-1]:
            key = (h.level, h.idx)
            self._load(key)
            if not self._tnodes[key].is_expanded:
                self._opened.add(key)
                self._tnodes[key].expand()
        for key in self._marked:  # nodes just loaded carry their mark already; relabel the rest
            self._relabel(key)
        leaf = self._tnodes[(rv.hops[-1].level, rv.hops[-1].idx)]
        tree = self.query_one("#tree", Tree)
        self.call_after_refresh(tree.move_cursor, leaf)

    def action_clear_search(self) -> None:
        self._wanted = None
        if self.route is None and not self._marked:
            return
        self.route = None
        self._mark(None)
        panel = self.query_one("#route", PathView)
        panel.remove_class("-shown")
        search = self.query_one("#search", Input)
        if search.value:
            search.value = ""
        self.query_one("#tree", Tree).focus()


def run_browse(view: BankView) -> None:
    run_app(BrowseApp(view))
