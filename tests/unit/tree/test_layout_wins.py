"""Conformance tests for SPEC section 1: wins, a nearer layer's file shadowing a farther one's, and
the declarations every win needs (the rest of section 1 is in the other
``tests/unit/tree/test_layout_*.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.tree import (
    DeadShadow,
    Role,
    SelfShadow,
    Shadow,
    UndeclaredShadow,
    discover,
    stem_of,
)
from tests.support.tree import T, files, kernel_toml, overlay, plain, rel, rels

# --------------------------------------------------------------------------- wins


def test_own_over_parent_undeclared_no_manifest(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/c/m/q/x.cu", "kernels/p/m/q/x.cu")
    with pytest.raises(UndeclaredShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    err = ei.value
    assert err.winner == tmp_path / "kernels/c/m/q/x.cu"
    assert err.loser == tmp_path / "kernels/p/m/q/x.cu"
    assert err.manifest == tmp_path / "kernels/c/m/q/KERNEL.toml"
    assert err.stem == "x"
    assert err.role == Role.LEAF
    msg = str(err)
    for part in [
        "kernels/c/m/q/x.cu",
        "kernels/p/m/q/x.cu",
        "kernels/c/m/q/KERNEL.toml",
        '[shadow] x = "<reason>"',
    ]:
        assert part in msg


def test_own_over_parent_undeclared_key_missing(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/c/m/q/x.cu", "kernels/p/m/q/x.cu", "kernels/c/m/q/y.cu")
    kernel_toml(tmp_path, "kernels/c/m/q", shadow={"y": "no"})
    with pytest.raises(UndeclaredShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    assert '[shadow] x = "<reason>"' in str(ei.value)
    assert ei.value.manifest == tmp_path / "kernels/c/m/q/KERNEL.toml"


def test_own_over_parent_declared_in_parent_layer_does_not_count(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/c/m/q/x.cu", "kernels/p/m/q/x.cu")
    kernel_toml(tmp_path, "kernels/p/m/q", shadow={"x": "wrong layer"})
    with pytest.raises(UndeclaredShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.manifest == tmp_path / "kernels/c/m/q/KERNEL.toml"


@pytest.mark.parametrize(
    ("role", "own", "parent"),
    [
        (Role.LEAF, "kernels/c/m/q", "kernels/p/m/q"),
        (Role.COMMON, "kernels/c/common", "kernels/p/common"),
    ],
)
@pytest.mark.parametrize("name", ["x.cu", "x.cuh", "x.h", "x.y.cu"])
def test_own_over_parent_declared(
    tmp_path: Path, role: Role, own: str, parent: str, name: str
) -> None:
    overlay(tmp_path)
    files(tmp_path, f"{own}/{name}", f"{parent}/{name}")
    stem = stem_of(name)
    kernel_toml(tmp_path, own, shadow={stem: "tuned"})
    lay = discover(tmp_path, T("c/m/q"))
    assert list(lay.shadows) == [
        Shadow(
            role=role,
            name=name,
            winner=tmp_path / own / name,
            loser=tmp_path / parent / name,
            reason="tuned",
        )
    ]
    entries = lay.leaf if role == Role.LEAF else lay.common
    # the loser leaves the role map; the winner keeps its layer index
    assert entries[name].source == tmp_path / own / name
    assert entries[name].layer == (0 if role == Role.LEAF else 2)
    assert tmp_path / parent / name not in set(lay.inputs())


def test_own_over_parent_undeclared_header(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/c/common/u.cuh", "kernels/p/common/u.cuh")
    with pytest.raises(UndeclaredShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.role == Role.COMMON
    assert ei.value.manifest == tmp_path / "kernels/c/common/KERNEL.toml"
    assert '[shadow] u = "<reason>"' in str(ei.value)


def test_leaf_over_common_undeclared(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu", "kernels/h/common/x.cu")
    with pytest.raises(UndeclaredShadow) as ei:
        discover(tmp_path, T("h/m/q"))
    err = ei.value
    assert (err.winner, err.loser, err.manifest, err.stem, err.role) == (
        tmp_path / "kernels/h/m/q/x.cu",
        tmp_path / "kernels/h/common/x.cu",
        tmp_path / "kernels/h/m/q/KERNEL.toml",
        "x",
        Role.LEAF,
    )
    assert '[shadow] x = "<reason>"' in str(err)


def test_leaf_over_common_declared_both_stay(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu", "kernels/h/common/x.cu", "kernels/h/common/y.cu")
    kernel_toml(tmp_path, "kernels/h/m/q", shadow={"x": "model specific"})
    lay = discover(tmp_path, T("h/m/q"))
    assert list(lay.shadows) == [
        Shadow(
            role=Role.LEAF,
            name="x.cu",
            winner=tmp_path / "kernels/h/m/q/x.cu",
            loser=tmp_path / "kernels/h/common/x.cu",
            reason="model specific",
        )
    ]
    assert "x.cu" in lay.leaf and "x.cu" in lay.common
    assert [(s, rel(tmp_path, e.source)) for s, e in lay.modules()] == [
        ("x", "kernels/h/m/q/x.cu"),
        ("y", "kernels/h/common/y.cu"),
    ]
    assert rels(tmp_path, lay.sources()) == ["kernels/h/common/y.cu", "kernels/h/m/q/x.cu"]
    assert tmp_path / "kernels/h/common/x.cu" in set(lay.inputs())


@pytest.mark.parametrize(
    ("leaf_name", "common_name"),
    [("x.cuh", "x.cuh"), ("x.h", "x.h"), ("x.cu", "x.cuh"), ("x.cuh", "x.cu"), ("x.h", "x.cuh")],
)
def test_headers_never_take_part_in_leaf_over_common(
    tmp_path: Path, leaf_name: str, common_name: str
) -> None:
    plain(tmp_path)
    files(tmp_path, f"kernels/h/m/q/{leaf_name}", f"kernels/h/common/{common_name}")
    lay = discover(tmp_path, T("h/m/q"))
    assert list(lay.shadows) == []
    assert list(lay.leaf) == [leaf_name] and list(lay.common) == [common_name]


def test_headers_shadow_key_for_header_only_pair_is_dead(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cuh", "kernels/h/common/x.cuh")
    kernel_toml(tmp_path, "kernels/h/m/q", shadow={"x": "r"})
    with pytest.raises(DeadShadow) as ei:
        discover(tmp_path, T("h/m/q"))
    assert ei.value.stem == "x"
    assert ei.value.manifest == tmp_path / "kernels/h/m/q/KERNEL.toml"
    assert "kernels/h/m/q/KERNEL.toml" in str(ei.value)


def test_leaf_over_common_by_stem_dotted(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/a.b.cu", "kernels/h/common/a.b.cu", "kernels/h/common/a.cu")
    kernel_toml(tmp_path, "kernels/h/m/q", shadow={"a.b": "r"})
    lay = discover(tmp_path, T("h/m/q"))
    assert [(s.name, s.loser) for s in lay.shadows] == [
        ("a.b.cu", tmp_path / "kernels/h/common/a.b.cu")
    ]
    assert [s for s, _ in lay.modules()] == ["a", "a.b"]


def test_leaf_over_common_loser_is_the_resolved_common(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(
        tmp_path,
        "kernels/c/m/q/x.cu",
        "kernels/c/common/x.cu",
        "kernels/p/common/x.cu",
    )
    kernel_toml(tmp_path, "kernels/c/m/q", shadow={"x": "leaf"})
    kernel_toml(tmp_path, "kernels/c/common", shadow={"x": "common"})
    lay = discover(tmp_path, T("c/m/q"))
    assert [(s.role, s.winner, s.loser, s.reason) for s in lay.shadows] == [
        (Role.LEAF, tmp_path / "kernels/c/m/q/x.cu", tmp_path / "kernels/c/common/x.cu", "leaf"),
        (
            Role.COMMON,
            tmp_path / "kernels/c/common/x.cu",
            tmp_path / "kernels/p/common/x.cu",
            "common",
        ),
    ]


def test_one_key_covers_several_wins_and_shadows_sorted(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(
        tmp_path,
        "kernels/c/m/q/x.cu",
        "kernels/p/m/q/x.cu",
        "kernels/c/common/x.cu",
        "kernels/c/m/q/a.cuh",
        "kernels/p/m/q/a.cuh",
        "kernels/c/common/k.h",
        "kernels/p/common/k.h",
    )
    kernel_toml(tmp_path, "kernels/c/m/q", shadow={"x": "rx", "a": "ra"})
    kernel_toml(tmp_path, "kernels/c/common", shadow={"k": "rk"})
    lay = discover(tmp_path, T("c/m/q"))
    got = [
        (s.role, s.name, rel(tmp_path, s.winner), rel(tmp_path, s.loser), s.reason)
        for s in lay.shadows
    ]
    assert got == [
        (Role.LEAF, "a.cuh", "kernels/c/m/q/a.cuh", "kernels/p/m/q/a.cuh", "ra"),
        (Role.LEAF, "x.cu", "kernels/c/m/q/x.cu", "kernels/c/common/x.cu", "rx"),
        (Role.LEAF, "x.cu", "kernels/c/m/q/x.cu", "kernels/p/m/q/x.cu", "rx"),
        (Role.COMMON, "k.h", "kernels/c/common/k.h", "kernels/p/common/k.h", "rk"),
    ]


def test_parent_leaf_wins_over_common_declared_in_parent_leaf(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/p/m/q/x.cu", "kernels/c/common/x.cu")
    with pytest.raises(UndeclaredShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.manifest == tmp_path / "kernels/p/m/q/KERNEL.toml"
    assert ei.value.winner == tmp_path / "kernels/p/m/q/x.cu"
    # a declaration in the own leaf is the wrong layer
    kernel_toml(tmp_path, "kernels/c/m/q", shadow={"x": "r"})
    with pytest.raises(UndeclaredShadow):
        discover(tmp_path, T("c/m/q"))
    (tmp_path / "kernels/c/m/q/KERNEL.toml").unlink()
    kernel_toml(tmp_path, "kernels/p/m/q", shadow={"x": "parent leaf"})
    lay = discover(tmp_path, T("c/m/q"))
    assert [(s.role, s.winner, s.loser, s.reason) for s in lay.shadows] == [
        (
            Role.LEAF,
            tmp_path / "kernels/p/m/q/x.cu",
            tmp_path / "kernels/c/common/x.cu",
            "parent leaf",
        )
    ]
    assert dict(lay.modules())["x"].layer == 1


def test_parent_leaf_key_dead_when_own_leaf_replaces_it(tmp_path: Path) -> None:
    # Literal 1.5: any [shadow] key of any layer (parent layers too) covering no win is dead.
    overlay(tmp_path)
    files(tmp_path, "kernels/c/m/q/x.cu", "kernels/p/m/q/x.cu", "kernels/p/common/x.cu")
    kernel_toml(tmp_path, "kernels/p/m/q", shadow={"x": "parent beats its common"})
    kernel_toml(tmp_path, "kernels/c/m/q", shadow={"x": "child beats all"})
    assert len(discover(tmp_path, T("p/m/q")).shadows) == 1
    with pytest.raises(DeadShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.manifest == tmp_path / "kernels/p/m/q/KERNEL.toml"
    assert ei.value.stem == "x"


@pytest.mark.parametrize(
    "layer_dir", ["kernels/c/m/q", "kernels/p/m/q", "kernels/c/common", "kernels/p/common"]
)
def test_dead_shadow_any_layer(tmp_path: Path, layer_dir: str) -> None:
    overlay(tmp_path)
    files(tmp_path, f"{layer_dir}/ghost.cu")
    kernel_toml(tmp_path, layer_dir, shadow={"ghost": "nothing to shadow"})
    with pytest.raises(DeadShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.manifest == tmp_path / layer_dir / "KERNEL.toml"
    assert ei.value.stem == "ghost"
    assert ei.value.target == T("c/m/q")
    assert f"{layer_dir}/KERNEL.toml" in str(ei.value)
    assert "ghost" in str(ei.value)


def test_dead_shadow_key_in_loser_layer(tmp_path: Path) -> None:
    # the key sits in the loser's layer, not the winner's: the win is undeclared
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu", "kernels/h/common/x.cu")
    kernel_toml(tmp_path, "kernels/h/common", shadow={"x": "r"})
    with pytest.raises(UndeclaredShadow):
        discover(tmp_path, T("h/m/q"))
    kernel_toml(tmp_path, "kernels/h/m/q", shadow={"x": "r"})
    with pytest.raises(DeadShadow) as ei:
        discover(tmp_path, T("h/m/q"))
    assert ei.value.manifest == tmp_path / "kernels/h/common/KERNEL.toml"


def test_self_shadow_leaf_use_of_common_file(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/common/x.cu", "kernels/h/m/q/y.cu")
    for shadow in [None, {"x": "declared anyway"}]:
        kernel_toml(tmp_path, "kernels/h/m/q", use=["common/x.cu"], shadow=shadow)
        with pytest.raises(SelfShadow) as ei:
            discover(tmp_path, T("h/m/q"))
        assert ei.value.path == tmp_path / "kernels/h/common/x.cu"
        assert ei.value.name == "x.cu"
        assert ei.value.manifest == tmp_path / "kernels/h/m/q/KERNEL.toml"
        assert "kernels/h/common/x.cu" in str(ei.value)


def test_self_shadow_own_common_use_of_parent_common_file(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/p/common/x.cuh")
    kernel_toml(tmp_path, "kernels/c/common", use=["../p/common/x.cuh"], shadow={"x": "r"})
    with pytest.raises(SelfShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.path == tmp_path / "kernels/p/common/x.cuh"


def test_self_shadow_uses_lexical_path_equality(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/common/x.cu")
    kernel_toml(tmp_path, "kernels/h/m/q", use=["./m/../common/./x.cu"])
    with pytest.raises(SelfShadow):
        discover(tmp_path, T("h/m/q"))


def test_leaf_use_of_common_header_is_no_win(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/common/x.cuh")
    kernel_toml(tmp_path, "kernels/h/m/q", use=["common/x.cuh"])
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.leaf["x.cuh"].used and not lay.common["x.cuh"].used
    assert list(lay.shadows) == []


def test_undeclared_names_first_in_sorted_order(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/c/m/q/b.cu", "kernels/p/m/q/b.cu")
    files(tmp_path, "kernels/c/m/q/a.cu", "kernels/p/m/q/a.cu")
    with pytest.raises(UndeclaredShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.stem == "a"
