"""One resolved target drawn as a graph: Graphviz ``dot`` or Mermaid text (pure).

The picture shows what ``metrale-orch layout TARGET`` lists, in the shape of the tree:
each of the target's layers is a cluster, each entry a node in the layer that
contributed it, each declared shadow a struck-through loser with an edge from its
winner labelled with the declared reason, each ``[sources] use`` an edge from the file
taken to the entry, and a model redirect an edge between the two model names. Given the
installed module names (the build's ``[modules]`` renames), a renamed module's node says
the name its artefact is installed under.

Everything is root-relative POSIX text and emitted in a fixed order (layers by index,
entries by name, shadows as the layout orders them), so the same tree always draws the
same text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.paths import rel_posix
from metrale_orch.tree.values import Entry, Layout

__all__ = ["FORMATS", "PictureFormat", "draw_layout"]

PictureFormat = Literal["dot", "mermaid"]
#: The formats :func:`draw_layout` writes.
FORMATS: tuple[PictureFormat, ...] = ("dot", "mermaid")

#: U+0336 COMBINING LONG STROKE OVERLAY: strikes text through wherever it is shown
#: (Mermaid labels have no strike-through markup).
_STRIKE = "\u0336"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Node:
    id: str
    label: str
    #: Index of the layer cluster the node sits in; ``None`` outside every layer.
    layer: int | None
    kind: Literal["entry", "loser", "file", "model"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Edge:
    tail: str
    head: str
    label: str
    kind: Literal["use", "shadow", "redirect"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Graph:
    title: str
    clusters: tuple[tuple[int, str], ...]
    nodes: tuple[_Node, ...]
    edges: tuple[_Edge, ...]


def draw_layout(
    layout: Layout, root: Path, fmt: PictureFormat, names: Mapping[str, str] | None = None
) -> str:
    """The layout as ``dot`` or ``mermaid`` text ending in a newline (pure); ``names``
    (stem -> installed name) labels each renamed module with its name."""
    return "\n".join(_render(_graph(layout, root, names or {}), _SYNTAX[fmt])) + "\n"


def _installed_as(layout: Layout, names: Mapping[str, str]) -> dict[Path, str]:
    """Source -> `` (installed as <name>)`` for each module ``names`` renames (pure)."""
    return {
        entry.source: f" (installed as {names[stem]})"
        for stem, entry in layout.modules()
        if names.get(stem, stem) != stem
    }


def _graph(layout: Layout, root: Path, names: Mapping[str, str]) -> _Graph:
    clusters = tuple(
        (i, f"{i} {layer.role.value} {layer.tier.value}: {rel_posix(layer.dir, root)}")
        for i, layer in enumerate(layout.layers)
    )
    nodes: list[_Node] = []
    edges: list[_Edge] = []
    by_source: dict[tuple[str, Path], str] = {}
    losers = {shadow.loser for shadow in layout.shadows}
    renamed = _installed_as(layout, names)
    loser_ids: dict[Path, str] = {}
    entries: list[tuple[str, str, Entry]] = [
        (role, name, entry)
        for role, entries_of in (("leaf", layout.leaf), ("common", layout.common))
        for name, entry in sorted(entries_of.items())
    ]
    for n, (role, name, entry) in enumerate(entries):
        node_id = f"e{n}"
        # A common file whose stem a leaf source replaces is staged but not compiled:
        # one node, struck through, rather than the entry and its loser twice.
        lost = entry.source in losers
        label = name if lost else name + renamed.get(entry.source, "")
        nodes.append(
            _Node(id=node_id, label=label, layer=entry.layer, kind="loser" if lost else "entry")
        )
        by_source[(role, entry.source)] = node_id
        if lost:
            loser_ids[entry.source] = node_id
        if entry.used:
            file_id = f"u{n}"
            nodes.append(
                _Node(id=file_id, label=rel_posix(entry.source, root), layer=None, kind="file")
            )
            edges.append(_Edge(tail=file_id, head=node_id, label="use", kind="use"))
    for n, shadow in enumerate(layout.shadows):
        loser_id = loser_ids.get(shadow.loser, "")
        if not loser_id:
            loser_id = f"s{n}"
            layer = next(
                (i for i, lay in enumerate(layout.layers) if shadow.loser.parent == lay.dir),
                None,
            )
            label = shadow.name if layer is not None else rel_posix(shadow.loser, root)
            nodes.append(_Node(id=loser_id, label=label, layer=layer, kind="loser"))
        winner_id = by_source.get((shadow.role.value, shadow.winner))
        if winner_id is None:
            winner_id = f"w{n}"
            nodes.append(
                _Node(id=winner_id, label=rel_posix(shadow.winner, root), layer=None, kind="file")
            )
        reason = " ".join(shadow.reason.split())
        edges.append(
            _Edge(tail=winner_id, head=loser_id, label=f"shadows: {reason}", kind="shadow")
        )
    target = layout.target
    if layout.source_model != target.model:
        nodes.append(_Node(id="m0", label=f"model {target.model}", layer=None, kind="model"))
        nodes.append(_Node(id="m1", label=f"model {layout.source_model}", layer=None, kind="model"))
        edges.append(_Edge(tail="m0", head="m1", label="redirect", kind="redirect"))
    return _Graph(title=str(target), clusters=clusters, nodes=tuple(nodes), edges=tuple(edges))


# ------------------------------------------------------------------------------------ dot


def _dot_text(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _dot_node(node: _Node) -> str:
    if node.kind == "loser":
        return f"{node.id} [label=<<S>{_html(node.label)}</S>>, style=dashed, fontcolor=gray40];"
    shape = {"entry": "box", "file": "note", "model": "ellipse"}[node.kind]
    return f"{node.id} [label={_dot_text(node.label)}, shape={shape}];"


def _dot_edge(edge: _Edge) -> str:
    style = {"use": "solid", "shadow": "dashed", "redirect": "bold"}[edge.kind]
    return f"{edge.tail} -> {edge.head} [label={_dot_text(edge.label)}, style={style}];"


# ------------------------------------------------------------------------------------ mermaid


def _mermaid_text(text: str) -> str:
    return '"' + text.replace('"', "#quot;").replace("\n", " ") + '"'


def _mermaid_node(node: _Node) -> str:
    if node.kind == "loser":
        struck = "".join(ch + _STRIKE for ch in node.label)
        return f"{node.id}[{_mermaid_text(struck)}]:::shadowed"
    if node.kind == "model":
        return f"{node.id}([{_mermaid_text(node.label)}])"
    return f"{node.id}[{_mermaid_text(node.label)}]"


def _mermaid_edge(edge: _Edge) -> str:
    arrow = {"use": "-->", "shadow": "-.->", "redirect": "==>"}[edge.kind]
    return f"{edge.tail} {arrow}|{_mermaid_text(edge.label)}| {edge.head}"


# ------------------------------------------------------------------------------------ both


@dataclass(frozen=True, slots=True, kw_only=True)
class _Syntax:
    """How one format spells each part of the graph."""

    head: Callable[[_Graph], tuple[str, ...]]
    cluster: Callable[[int, str], tuple[str, ...]]
    cluster_end: str
    node: Callable[[_Node], str]
    edge: Callable[[_Edge], str]
    tail: tuple[str, ...]


_SYNTAX: dict[PictureFormat, _Syntax] = {
    "dot": _Syntax(
        head=lambda g: (
            f"digraph {_dot_text(g.title)} {{",
            "  rankdir=LR;",
            '  node [shape=box, fontname="monospace"];',
        ),
        cluster=lambda i, title: (f"  subgraph cluster_L{i} {{", f"    label={_dot_text(title)};"),
        cluster_end="  }",
        node=_dot_node,
        edge=_dot_edge,
        tail=("}",),
    ),
    "mermaid": _Syntax(
        head=lambda g: ("flowchart LR",),
        cluster=lambda i, title: (f"  subgraph L{i}[{_mermaid_text(title)}]",),
        cluster_end="  end",
        node=_mermaid_node,
        edge=_mermaid_edge,
        tail=("  classDef shadowed stroke-dasharray: 4 3,color:#888",),
    ),
}


def _render(graph: _Graph, syntax: _Syntax) -> Iterator[str]:
    """Clusters with their nodes, then the nodes outside every layer, then the edges."""
    yield from syntax.head(graph)
    for index, title in graph.clusters:
        yield from syntax.cluster(index, title)
        yield from (f"    {syntax.node(n)}" for n in graph.nodes if n.layer == index)
        yield syntax.cluster_end
    yield from (f"  {syntax.node(n)}" for n in graph.nodes if n.layer is None)
    yield from (f"  {syntax.edge(e)}" for e in graph.edges)
    yield from syntax.tail
