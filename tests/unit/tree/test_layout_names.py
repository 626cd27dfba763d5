"""Conformance tests for SPEC section 1 (layout resolution): the public names, ``Target``, and the
kinds of files a tree holds.

The SPEC's section 1 is tested rule by rule across ``tests/unit/tree/test_layout_*.py``, one file
per group of its parts. Each test builds a small tree in ``tmp_path`` with the helpers of
``tests.support.tree`` and asserts the outcome the SPEC text prescribes: the value, or the
error's type, its data attributes and the important parts of its message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch import tree as L
from metrale_orch.errors import MetraleError
from metrale_orch.tree import (
    HEADER_EXTS,
    DeadShadow,
    Entry,
    InheritsError,
    LayoutError,
    ManifestError,
    NoKernelDirectory,
    RedirectError,
    RetiredKey,
    Role,
    SelfShadow,
    SymlinkError,
    Target,
    Tier,
    UndeclaredShadow,
    UnknownHardware,
    UnknownModel,
    UnknownVendor,
    UseCollides,
    UseError,
    discover,
    source_ext,
    stem_of,
)
from tests.support.tree import T, files, kernel_toml, plain

ERRORS = [
    UnknownHardware,
    ManifestError,
    UnknownVendor,
    InheritsError,
    RedirectError,
    UnknownModel,
    NoKernelDirectory,
    SymlinkError,
    UseError,
    UseCollides,
    UndeclaredShadow,
    DeadShadow,
    SelfShadow,
    RetiredKey,
]


# --------------------------------------------------------------------------- public names


def test_public_names_and_error_hierarchy() -> None:
    for name in [
        "Target",
        "Role",
        "Tier",
        "Layer",
        "Entry",
        "Shadow",
        "Layout",
        "Hardware",
        "KernelManifest",
        "HEADER_EXTS",
        "discover",
        "walk",
        "symlinks",
        "hardware",
        "kernel_manifest",
        "kernel_source_dir",
        "supports_quant",
        "source_ext",
        "stem_of",
        "dump",
        "LayoutError",
        *[e.__name__ for e in ERRORS],
    ]:
        assert hasattr(L, name), name
    assert HEADER_EXTS == ("cuh", "h")
    assert issubclass(LayoutError, MetraleError)
    for err in ERRORS:
        assert issubclass(err, LayoutError)
        assert err is not LayoutError
    assert len(set(ERRORS)) == 14
    assert {Role.LEAF, Role.COMMON} == set(Role)
    assert {Tier.OWN, Tier.PARENT} == set(Tier)


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        ("w4a16_gemm.cu", "w4a16_gemm"),
        ("a.b.cu", "a.b"),
        ("x.cuh", "x"),
        ("x.h", "x"),
        ("x.metal", "x"),
        ("Makefile", "Makefile"),
        ("x.CU", "x"),
    ],
)
def test_stem_of(name: str, stem: str) -> None:
    assert stem_of(name) == stem


@pytest.mark.parametrize(
    ("vendor", "ext"),
    [
        ("nvidia", "cu"),
        ("cuda", "cu"),
        ("amd", "cu"),
        ("rocm", "cu"),
        ("scale", "cu"),
        ("hip", "cu"),
        ("apple", "metal"),
        ("metal", "metal"),
        ("NVIDIA", None),
        ("Apple", None),
        ("intel", None),
        ("", None),
        (" nvidia", None),
    ],
)
def test_source_ext(vendor: str, ext: str | None) -> None:
    # Exact and case-sensitive; the seed: "or None for an unknown vendor".
    assert source_ext(vendor) == ext


# --------------------------------------------------------------------------- Target


def test_target_str_parse_order_keywords() -> None:
    t = Target(hardware="hopper", model="qwen3", quant="w4a16")
    assert (t.hardware, t.model, t.quant) == ("hopper", "qwen3", "w4a16")
    assert str(t) == "hopper/qwen3/w4a16"
    assert Target.parse("hopper/qwen3/w4a16") == t
    assert hash(Target.parse(str(t))) == hash(t)
    raw = [("b", "a", "a"), ("a", "b", "a"), ("a", "a", "b"), ("a", "a", "a"), ("a", "b", "0")]
    targets = [Target(hardware=h, model=m, quant=q) for h, m, q in raw]
    assert [(x.hardware, x.model, x.quant) for x in sorted(targets)] == sorted(raw)
    assert Target(hardware="a", model="a", quant="a") < Target(hardware="a", model="a", quant="b")


# --------------------------------------------------------------------------- file kinds


def test_file_kinds_cuda_tree(tmp_path: Path) -> None:
    plain(tmp_path)
    q = "kernels/h/m/q"
    files(
        tmp_path,
        f"{q}/x.cu",
        f"{q}/a.b.cu",
        f"{q}/y.cuh",
        f"{q}/z.h",
        f"{q}/big.CU",
        f"{q}/k.cpp",
        f"{q}/k.hpp",
        f"{q}/.gitkeep",
        f"{q}/notes.md",
        f"{q}/x.metal",
        f"{q}/x.cu.bak",
        f"{q}/Makefile",
        f"{q}/w.H",
        f"{q}/w.CUH",
    )
    kernel_toml(tmp_path, q)
    lay = discover(tmp_path, T("h/m/q"))
    assert list(lay.leaf) == ["a.b.cu", "x.cu", "y.cuh", "z.h"]
    assert [stem for stem, _ in lay.modules()] == ["a.b", "x"]
    assert lay.leaf["a.b.cu"] == Entry(
        name="a.b.cu", source=tmp_path / q / "a.b.cu", layer=0, used=False
    )


def test_file_kinds_metal_tree(tmp_path: Path) -> None:
    plain(tmp_path, vendor="apple")
    files(
        tmp_path,
        "kernels/h/m/q/x.metal",
        "kernels/h/m/q/y.cuh",
        "kernels/h/m/q/z.h",
        "kernels/h/m/q/c.cu",
        "kernels/h/m/q/d.METAL",
        "kernels/h/common/n.metal",
        "kernels/h/common/n.cu",
    )
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.hardware.source_ext == "metal"
    assert list(lay.leaf) == ["x.metal", "y.cuh", "z.h"]
    assert list(lay.common) == ["n.metal"]
    assert [(s, e.name) for s, e in lay.modules()] == [("n", "n.metal"), ("x", "x.metal")]


def test_directory_named_like_a_source_is_a_subdirectory(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu/inner.cuh", "kernels/h/m/q/y.cu")
    lay = discover(tmp_path, T("h/m/q"))
    assert list(lay.leaf) == ["y.cu"]
    assert dict(lay.leaf_subdirs) == {"x.cu": tmp_path / "kernels/h/m/q/x.cu"}
