"""``metrale-orch layout TARGET --format dot|mermaid``: the picture holds every layer, entry,
shadow, ``use`` and redirect of the resolved target (checked structurally on the sample
tree, which has all four), and the same tree always draws the same text."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from metrale_orch.cli import main
from metrale_orch.paths import rel_posix
from metrale_orch.steps.plan import module_names
from metrale_orch.tree import Layout, Target, discover
from metrale_orch.tree.picture import draw_layout
from tests.support import REPO
from tests.support.tree import hw, kernel_toml, model, write

STRIKE = "\u0336"

#: The sample tree's targets that show each feature: shadows from both roles, ``use``
#: from a leaf and a common layer, a model redirect.
SHADOWS = "hopper/qwen3-8b/bf16"
USES = "b300/qwen3-8b/bf16"
REDIRECT = "gb10/qwen3-4b/bf16"
#: A leaf source replacing a common file of the same stem: the loser is also an entry.
LEAF_OVER_COMMON = "hopper/gemma3-4b/bf16"


def _layout(target: str) -> Layout:
    return discover(REPO, Target.parse(target))


def _mermaid_clusters(text: str) -> dict[str, list[str]]:
    """Cluster title -> the labels of the nodes declared inside it ('' = outside)."""
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        if m := re.match(r'\s*subgraph L\d+\["(.*)"\]$', line):
            current = m.group(1)
            out[current] = []
        elif line.strip() == "end":
            current = ""
        elif m := re.match(r'\s*\w+\(?\["(.*)"\]\)?(:::shadowed)?$', line):
            out[current].append(m.group(1))
    return out


def _dot_clusters(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        if m := re.match(r'\s*label="(.*)";$', line):
            current = m.group(1)
            out[current] = []
        elif line.strip() == "}":
            current = ""
        elif m := re.match(r'\s*\w+ \[label=(?:"(.*?)"|<<S>(.*?)</S>>)', line):
            out[current].append(m.group(1) or f"~{m.group(2)}")
    return out


def _expected(layout: Layout, *, struck: str) -> dict[str, list[str]]:
    """What each layer must hold: its entries (struck through when a shadow's loser: a
    common file a leaf source replaces by stem), and the losers from other layers."""

    def strike(name: str) -> str:
        return struck + name if struck == "~" else "".join(ch + STRIKE for ch in name)

    losers = {s.loser for s in layout.shadows}
    want: dict[str, list[str]] = {}
    titles = []
    for i, layer in enumerate(layout.layers):
        title = f"{i} {layer.role.value} {layer.tier.value}: {rel_posix(layer.dir, REPO)}"
        titles.append(title)
        want[title] = []
    sources = set()
    for entries in (layout.leaf, layout.common):
        for name, entry in entries.items():
            sources.add(entry.source)
            lost = entry.source in losers
            want[titles[entry.layer]].append(strike(name) if lost else name)
    for shadow in layout.shadows:
        if shadow.loser in sources:
            continue
        layer = next(i for i, lay in enumerate(layout.layers) if lay.dir == shadow.loser.parent)
        want[titles[layer]].append(strike(shadow.name))
    return {k: sorted(v) for k, v in want.items()}


@pytest.mark.parametrize("target", [SHADOWS, USES, REDIRECT, LEAF_OVER_COMMON])
def test_mermaid_has_every_layer_entry_and_shadow(target: str) -> None:
    layout = _layout(target)
    got = _mermaid_clusters(draw_layout(layout, REPO, "mermaid"))
    inside = {k: sorted(v) for k, v in got.items() if k}
    assert inside == _expected(layout, struck=STRIKE)


@pytest.mark.parametrize("target", [SHADOWS, USES, REDIRECT, LEAF_OVER_COMMON])
def test_dot_has_every_layer_entry_and_shadow(target: str) -> None:
    layout = _layout(target)
    got = _dot_clusters(draw_layout(layout, REPO, "dot"))
    inside = {k: sorted(v) for k, v in got.items() if k and k != target}
    assert inside == _expected(layout, struck="~")


@pytest.mark.parametrize("target", [SHADOWS, LEAF_OVER_COMMON])
def test_shadow_edges_carry_the_declared_reason_from_the_winner(target: str) -> None:
    layout = _layout(target)
    assert len(layout.shadows) >= 2
    text = draw_layout(layout, REPO, "mermaid")
    ids = dict(re.findall(r'\s*(\w+)\["([^"]*)"\]', text))
    edges = re.findall(r'\s*(\w+) -\.->\|"shadows: (.*)"\| (\w+)', text)
    got = sorted((ids[t], reason, ids[h].replace(STRIKE, "")) for t, reason, h in edges)
    want = sorted((s.name, " ".join(s.reason.split()), s.name) for s in layout.shadows)
    assert got == want


def test_use_edges_come_from_the_file_taken() -> None:
    layout = _layout(USES)
    used = {
        name: rel_posix(e.source, REPO)
        for entries in (layout.leaf, layout.common)
        for name, e in entries.items()
        if e.used
    }
    assert len(used) >= 2
    for fmt, arrow in (("mermaid", r'-->\|"use"\|'), ("dot", r"->")):
        text = draw_layout(layout, REPO, fmt)  # type: ignore[arg-type]
        ids = dict(re.findall(r'^\s*(\w+) ?\[(?:label=)?"([^"]*)"', text, re.M))
        if fmt == "mermaid":
            pairs = re.findall(rf"\s*(\w+) {arrow} (\w+)", text)
        else:
            pairs = re.findall(r'\s*(\w+) -> (\w+) \[label="use"', text)
        assert sorted((ids[h], ids[t]) for t, h in pairs) == sorted(used.items()), fmt


def test_redirect_is_an_edge_between_the_model_names() -> None:
    layout = _layout(REDIRECT)
    assert layout.source_model != layout.target.model
    mermaid = draw_layout(layout, REPO, "mermaid")
    assert '(["model qwen3-4b"])' in mermaid and '(["model qwen3-8b"])' in mermaid
    assert re.search(r'\s*m0 ==>\|"redirect"\| m1', mermaid)
    dot = draw_layout(layout, REPO, "dot")
    assert 'm0 -> m1 [label="redirect", style=bold];' in dot
    # A target without a redirect draws no model nodes.
    assert "redirect" not in draw_layout(_layout(SHADOWS), REPO, "mermaid")


def test_labels_are_escaped(tmp_path: Path) -> None:
    hw(tmp_path, "h", vendor="nvidia", arch="sm_90")
    model(tmp_path, "h", "m")
    write(tmp_path, "kernels/h/m/q/a.cu", "x")
    write(tmp_path, "kernels/h/common/a.cu", "y")
    kernel_toml(tmp_path, "kernels/h/m/q", shadow={"a": 'say "why" <here> & \\ there'})
    layout = discover(tmp_path, Target.parse("h/m/q"))
    dot = draw_layout(layout, tmp_path, "dot")
    assert r'label="shadows: say \"why\" <here> & \\ there"' in dot
    mermaid = draw_layout(layout, tmp_path, "mermaid")
    assert '|"shadows: say #quot;why#quot; <here> & \\ there"|' in mermaid


@pytest.mark.parametrize("fmt", ["dot", "mermaid"])
def test_cli_prints_the_picture(fmt: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(REPO), "layout", SHADOWS, "--format", fmt], out=out, err=err)
    assert code == 0, err.getvalue()
    layout = _layout(SHADOWS)
    names = module_names(layout, REPO)  # the CLI names renamed modules as installed
    assert out.getvalue() == draw_layout(layout, REPO, fmt, names)  # type: ignore[arg-type]


def test_cli_refuses_a_picture_without_a_target() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(REPO), "layout", "--format", "dot"], out=out, err=err)
    assert code == 2
    assert "--format dot needs a TARGET" in err.getvalue()
