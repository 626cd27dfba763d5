"""Conformance tests for SPEC section 1: the order ``discover`` finds targets in, and the
``Layout`` value resolution returns (the rest of section 1 is in the other
``tests/unit/tree/test_layout_*.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from metrale_orch.tree import (
    DeadShadow,
    Entry,
    InheritsError,
    LayoutError,
    ManifestError,
    RedirectError,
    Role,
    SymlinkError,
    UndeclaredShadow,
    UnknownHardware,
    UnknownModel,
    UnknownVendor,
    discover,
    hardware,
)
from tests.support.tree import (
    T,
    files,
    full_tree,
    hw,
    kernel_toml,
    model,
    overlay,
    plain,
    rel,
    rels,
    symlink,
)

# --------------------------------------------------------------------------- discover order


def order_tree(root: Path) -> None:
    """Valid 4-layer tree; each order test adds two faults."""
    overlay(root)
    files(
        root,
        "kernels/c/m/q/a.cu",
        "kernels/p/m/q/b.cu",
        "kernels/c/common/c.cu",
        "kernels/p/common/d.cu",
    )


def append(root: Path, relpath: str, text: str) -> None:
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(text)


def fault(root: Path, name: str) -> type[LayoutError]:
    """Introduce one fault; return the error it causes alone."""
    if name == "hardware":
        hw(root, "c", inherits="c")
        return InheritsError
    if name == "model":
        shutil.rmtree(root / "kernels/c/m")
        return UnknownModel
    if name == "redirect":
        model(root, "c", "m", kernel_source="missing", supported_quants=None)
        return RedirectError
    if name == "allow_model":
        model(root, "c", "m", supported_quants=["zz"])
        return ManifestError
    if name == "own_leaf_manifest":
        append(root, "kernels/c/m/q/KERNEL.toml", "[sources]\nuse = 1\n")
        return ManifestError
    if name == "parent_leaf_redirect":
        model(root, "p", "m", kernel_source="nowhere")
        return RedirectError
    if name == "parent_leaf_manifest":
        append(root, "kernels/p/m/q/KERNEL.toml", "[sources]\nuse = 1\n")
        return ManifestError
    if name == "own_common_manifest":
        append(root, "kernels/c/common/KERNEL.toml", "[sources]\nuse = 2\n")
        return ManifestError
    if name == "parent_common_manifest":
        append(root, "kernels/p/common/KERNEL.toml", "[sources]\nuse = 3\n")
        return ManifestError
    if name == "scan0":
        symlink(root, "kernels/c/m/q/l0.cu", "a.cu")
        return SymlinkError
    if name == "merge1":
        files(root, "kernels/c/m/q/b.cu")
        return UndeclaredShadow
    if name == "scan2":
        symlink(root, "kernels/c/common/l2.cu", "c.cu")
        return SymlinkError
    if name == "scan3":
        symlink(root, "kernels/p/common/l3.cu", "d.cu")
        return SymlinkError
    if name == "merge3":
        files(root, "kernels/c/common/d.cu")
        return UndeclaredShadow
    if name == "leaf_over_common":
        files(root, "kernels/c/m/q/c.cu")
        return UndeclaredShadow
    if name == "dead":
        append(root, "kernels/p/m/q/KERNEL.toml", '[shadow]\nzz = "dead"\n')
        return DeadShadow
    raise AssertionError(name)


_IN_MODEL_DIR = {
    "redirect",
    "allow_model",
    "own_leaf_manifest",
    "scan0",
    "merge1",
    "leaf_over_common",
}

ORDER = [
    "hardware",
    "model",
    "redirect",
    "allow_model",
    "own_leaf_manifest",
    "parent_leaf_redirect",
    "parent_leaf_manifest",
    "own_common_manifest",
    "parent_common_manifest",
    "scan0",
    "merge1",
    "scan2",
    "scan3",
    "merge3",
    "leaf_over_common",
    "dead",
]


@pytest.mark.parametrize("name", ORDER)
def test_each_fault_alone(tmp_path: Path, name: str) -> None:
    order_tree(tmp_path)
    assert discover(tmp_path, T("c/m/q")).target == T("c/m/q")
    expected = fault(tmp_path, name)
    with pytest.raises(expected):
        discover(tmp_path, T("c/m/q"))


def _message_marker(name: str) -> str:
    return {
        "own_leaf_manifest": "kernels/c/m/q/KERNEL.toml",
        "parent_leaf_manifest": "kernels/p/m/q/KERNEL.toml",
        "own_common_manifest": "kernels/c/common/KERNEL.toml",
        "parent_common_manifest": "kernels/p/common/KERNEL.toml",
        "redirect": "kernels/c/m/MODEL.toml",
        "parent_leaf_redirect": "kernels/p/m/MODEL.toml",
        "allow_model": "not supported",
        "scan0": "l0.cu",
        "scan2": "l2.cu",
        "scan3": "l3.cu",
        "merge1": "kernels/p/m/q/b.cu",
        "merge3": "kernels/p/common/d.cu",
        "leaf_over_common": "kernels/c/m/q/c.cu",
        "dead": "zz",
    }.get(name, "")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (a, b)
        for i, a in enumerate(ORDER)
        for b in ORDER[i + 1 :]
        # removing the model dir removes faults inside it; both faults below edit one key
        if not (a == "model" and b in _IN_MODEL_DIR) and (a, b) != ("redirect", "allow_model")
    ],
)
def test_discover_check_order(tmp_path: Path, first: str, second: str) -> None:
    order_tree(tmp_path)
    fault(tmp_path, second)
    expected = fault(tmp_path, first)
    with pytest.raises(LayoutError) as ei:
        discover(tmp_path, T("c/m/q"))
    assert type(ei.value) is expected, (first, second, str(ei.value))
    marker = _message_marker(first)
    assert marker in str(ei.value), (first, second, str(ei.value))


def test_redirect_before_allow_list(tmp_path: Path) -> None:
    order_tree(tmp_path)
    model(tmp_path, "c", "m", kernel_source="missing", supported_quants=["zz"])
    with pytest.raises(RedirectError):
        discover(tmp_path, T("c/m/q"))


def test_parent_redirect_before_no_kernel_directory(tmp_path: Path) -> None:
    overlay(tmp_path)
    model(tmp_path, "p", "m", kernel_source="nowhere")
    with pytest.raises(RedirectError):
        discover(tmp_path, T("c/m/q"))


def test_allow_list_before_no_kernel_directory(tmp_path: Path) -> None:
    overlay(tmp_path)
    model(tmp_path, "c", "m", supported_quants=["other"])
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("c/m/q"))
    assert "not supported" in str(ei.value)


def test_unknown_hardware_before_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(UnknownHardware):
        discover(tmp_path, T("h/m/q"))


def test_symlink_before_use_in_same_layer(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu")
    symlink(tmp_path, "kernels/h/m/q/zz.cu", "x.cu")
    kernel_toml(tmp_path, "kernels/h/m/q", use=["/abs.cu"])
    with pytest.raises(SymlinkError):
        discover(tmp_path, T("h/m/q"))


def test_layout_attributes_and_methods(tmp_path: Path) -> None:
    full_tree(tmp_path)
    lay = discover(tmp_path, T("c/m/q"))
    k = tmp_path / "kernels"
    assert lay.target == T("c/m/q")
    assert lay.hardware == hardware(k, "c")
    assert (lay.hardware.name, lay.hardware.arch, lay.hardware.inherits) == ("c", "sm_100", "p")
    assert lay.source_model == "s"
    assert lay.model_dir == k / "c/m"
    assert [x.dir for x in lay.layers] == [k / "c/s/q", k / "p/s/q", k / "c/common", k / "p/common"]
    assert [x.manifest.path if x.manifest else None for x in lay.layers] == [
        k / "c/s/q/KERNEL.toml",
        None,
        k / "c/common/KERNEL.toml",
        k / "p/common/KERNEL.toml",
    ]
    assert {n: (rel(tmp_path, e.source), e.layer, e.used) for n, e in lay.leaf.items()} == {
        "h1.cuh": ("kernels/c/s/q/h1.cuh", 0, False),
        "k1.cu": ("kernels/c/s/q/k1.cu", 0, False),
        "k2.cu": ("kernels/p/s/q/k2.cu", 1, False),
        "k3.cu": ("kernels/c/s/q/k3.cu", 0, False),
    }
    assert list(lay.leaf) == sorted(lay.leaf)
    assert {n: (rel(tmp_path, e.source), e.layer, e.used) for n, e in lay.common.items()} == {
        "c.h": ("kernels/c/common/c.h", 2, False),
        "k1.cu": ("kernels/c/common/k1.cu", 2, False),
        "k4.cu": ("kernels/c/common/k4.cu", 2, False),
        "k5.cu": ("kernels/p/common/k5.cu", 3, False),
        "used.cu": ("kernels/lib/used.cu", 2, True),
    }
    assert list(lay.common) == sorted(lay.common)
    assert dict(lay.leaf_subdirs) == {"inc": k / "c/s/q/inc"}
    assert dict(lay.common_subdirs) == {"pinc": k / "p/common/pinc"}
    assert [(s.role, s.name, s.winner, s.loser, s.reason) for s in lay.shadows] == [
        (Role.LEAF, "k1.cu", k / "c/s/q/k1.cu", k / "c/common/k1.cu", "r1"),
        (Role.LEAF, "k3.cu", k / "c/s/q/k3.cu", k / "p/s/q/k3.cu", "r3"),
        (Role.COMMON, "k4.cu", k / "c/common/k4.cu", k / "p/common/k4.cu", "r4"),
    ]
    assert list(lay.configs()) == [
        k / "p/common/KERNEL.toml",
        k / "c/common/KERNEL.toml",
        k / "c/s/q/KERNEL.toml",
    ]
    assert [(s, rel(tmp_path, e.source)) for s, e in lay.modules()] == [
        ("k1", "kernels/c/s/q/k1.cu"),
        ("k2", "kernels/p/s/q/k2.cu"),
        ("k3", "kernels/c/s/q/k3.cu"),
        ("k4", "kernels/c/common/k4.cu"),
        ("k5", "kernels/p/common/k5.cu"),
        ("used", "kernels/lib/used.cu"),
    ]
    assert all(isinstance(e, Entry) for _, e in lay.modules())
    assert rels(tmp_path, lay.sources()) == sorted(
        [
            "kernels/c/s/q/k1.cu",
            "kernels/p/s/q/k2.cu",
            "kernels/c/s/q/k3.cu",
            "kernels/c/common/k4.cu",
            "kernels/p/common/k5.cu",
            "kernels/lib/used.cu",
        ],
        key=lambda s: Path(s),
    )
    assert list(lay.sources()) == sorted(lay.sources())
    assert sorted(rels(tmp_path, set(lay.inputs()))) == [
        "kernels/c/common/KERNEL.toml",
        "kernels/c/common/c.h",
        "kernels/c/common/k1.cu",
        "kernels/c/common/k4.cu",
        "kernels/c/s/q/KERNEL.toml",
        "kernels/c/s/q/h1.cuh",
        "kernels/c/s/q/inc/deep/d.h",
        "kernels/c/s/q/k1.cu",
        "kernels/c/s/q/k3.cu",
        "kernels/lib/used.cu",
        "kernels/p/common/KERNEL.toml",
        "kernels/p/common/k5.cu",
        "kernels/p/common/pinc/x.cuh",
        "kernels/p/s/q/k2.cu",
    ]


def test_layout_paths_under_root_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu")
    monkeypatch.chdir(tmp_path)
    lay = discover(Path("."), T("h/m/q"))
    assert lay.leaf["x.cu"].source == Path("kernels/h/m/q/x.cu")
    assert lay.model_dir == Path("kernels/h/m")


def test_layout_is_frozen(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu")
    lay = discover(tmp_path, T("h/m/q"))
    with pytest.raises((AttributeError, TypeError)):
        lay.source_model = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        lay.leaf["y.cu"] = lay.leaf["x.cu"]  # type: ignore[index]


def test_discover_is_repeatable_after_tree_changes(tmp_path: Path) -> None:
    # no state leaks between independent calls
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu")
    assert list(discover(tmp_path, T("h/m/q")).leaf) == ["x.cu"]
    files(tmp_path, "kernels/h/m/q/y.cu")
    assert list(discover(tmp_path, T("h/m/q")).leaf) == ["x.cu", "y.cu"]
    hw(tmp_path, "h", vendor="intel")
    with pytest.raises(UnknownVendor):
        discover(tmp_path, T("h/m/q"))
