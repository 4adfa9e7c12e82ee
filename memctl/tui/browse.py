"""`memctl browse`: a Textual app over memctl.browse.

Left, the cluster tree: every node with its label (the titles of its most central documents), its
windows, and its block's state (trained, stale, untrained, BLOCKED). Right, the selected block: the
documents that shaped it, with their tokens and share. Select a document (Enter) to see the blocks it
shaped and the start of its text. `b` blocks or unblocks the selected node's block (recorded in the
privacy log, as `memctl block` does).
"""

from __future__ import annotations

from rich.markup import escape
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Header, Static, Tree
from textual.widgets.tree import TreeNode

from ..browse import BankView, NodeInfo
from ..errors import MemctlError

Key = tuple[int, int]


def node_text(n: NodeInfo) -> str:
    state = "[b red]BLOCKED[/b red]" if n.blocked else {"trained": "[green]trained[/green]"}.get(n.state, n.state)
    return f"{n.id}  {escape(n.label)}  [dim]{n.windows} windows[/dim]  {state}"


class BrowseApp(App[None]):
    TITLE = "memctl browse"
    CSS = """
    #tree { width: 45%; border: round $primary; }
    #right { width: 55%; }
    #block { height: auto; max-height: 12; padding: 0 1; }
    #docs { height: 1fr; border: round $primary; }
    #doc { height: 1fr; padding: 0 1; border: round $secondary; }
    """
    BINDINGS = [
        Binding("b", "toggle_block", "Block/unblock"),
        Binding("r", "refresh", "Refresh"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, view: BankView) -> None:
        super().__init__()
        self.view = view
        self.selected: Key | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield Tree(self.view.name, id="tree")
            with Vertical(id="right"):
                yield Static(self.view.summary(), id="block")
                yield DataTable(id="docs", cursor_type="row")
                with VerticalScroll(id="doc"):
                    yield Static("", id="doctext")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.view.summary()
        table = self.query_one("#docs", DataTable)
        table.add_columns("document", "title", "tokens", "share", "tags")
        self._build()
        self.query_one("#tree", Tree).focus()

    def _build(self) -> None:
        tree = self.query_one("#tree", Tree)
        tree.clear()
        tree.root.expand()
        for child in self.view.children(0, 0):
            self._add(tree.root, child)
        generic = self.view.node(0, 0)
        tree.root.add_leaf(node_text(generic), data=(0, 0))

    def _add(self, parent: TreeNode, info: NodeInfo) -> None:
        kids = self.view.children(info.level, info.idx)
        if kids:
            node = parent.add(node_text(info), data=(info.level, info.idx))
            for kid in kids:
                self._add(node, kid)
        else:
            parent.add_leaf(node_text(info), data=(info.level, info.idx))

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        if event.node.data is not None:
            self.show_block(event.node.data)

    def show_block(self, key: Key) -> None:
        self.selected = key
        try:
            d = self.view.block_detail(*key)
        except MemctlError as e:
            self.query_one("#block", Static).update(f"[red]{escape(str(e))}[/red]")
            return
        lines = [f"[b]{d['block']}[/b]  {escape(d['label'])}",
                 f"state {d['state']}; {d['n_params']:,} parameters; trained on {d['tokens']:,} tokens "
                 f"from {len(d['documents'])} document(s); {d['windows']} window(s) routed here"]  # fmt: skip
        if d["blocked"]:
            lines.append(f"[b red]blocked[/b red] {d['blocked_at'] or ''}: {escape(d['blocked_reason'] or '')}")
        self.query_one("#block", Static).update("\n".join(lines))
        table = self.query_one("#docs", DataTable)
        table.clear()
        for doc in d["documents"]:
            table.add_row(doc["id"], doc["title"] or "", f"{doc['tokens']:,}", f"{100 * doc['share']:.1f}%",
                          doc["tags"] or "", key=doc["id"])  # fmt: skip
        self.query_one("#doctext", Static).update("")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.show_doc(str(event.row_key.value))

    def show_doc(self, doc_id: str) -> None:
        d = self.view.doc_detail(doc_id)
        doc = d["document"]
        shaped = ", ".join(
            f"{b['block']} ({100 * b['share']:.1f}%{', blocked' if b['blocked'] else ''})"
            for b in d["blocks"]
            if b["tokens"]
        )
        text = [f"[b]{escape(doc['id'])}[/b]  {escape(doc['title'] or '')}",
                f"source {escape(doc['source'] or '')}; tags {escape(doc['tags'] or '-')}; {d['windows']} window(s); "
                f"paths {', '.join(d['paths'])}",
                f"shaped: {shaped or 'no trained block yet'}", "", escape(d["preview"])]  # fmt: skip
        self.query_one("#doctext", Static).update("\n".join(text))

    def action_toggle_block(self) -> None:
        if self.selected is None:
            return
        try:
            now_blocked = self.view.toggle_block(*self.selected, reason="memctl browse")
        except MemctlError as e:
            self.notify(str(e), severity="error")
            return
        node = self.query_one("#tree", Tree).cursor_node
        if node is not None and node.data == self.selected:
            node.set_label(node_text(self.view.node(*self.selected)))
        self.show_block(self.selected)
        self.sub_title = self.view.summary()
        self.notify(f"{'blocked' if now_blocked else 'unblocked'} {self.view.node(*self.selected).id}")

    def action_refresh(self) -> None:
        self._build()
        self.sub_title = self.view.summary()


def run_browse(view: BankView) -> None:
    BrowseApp(view).run()
