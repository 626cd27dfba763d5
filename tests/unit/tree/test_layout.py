"""Conformance tests for SPEC section 1 (layout resolution), rule by rule.

Each test builds a small tree in ``tmp_path`` with the helpers of ``tests.support.tree``
and asserts the outcome the SPEC text prescribes: the value, or the error's type, its data
attributes and the important parts of its message.
"""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest

from metrale_orch import tree as L
from metrale_orch.errors import MetraleError
from metrale_orch.tree import (
    HEADER_EXTS,
    DeadShadow,
    Entry,
    Hardware,
    InheritsError,
    KernelManifest,
    Layer,
    Layout,
    LayoutError,
    ManifestError,
    NoKernelDirectory,
    RedirectError,
    RetiredKey,
    Role,
    SelfShadow,
    Shadow,
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
    dump,
    hardware,
    kernel_manifest,
    kernel_source_dir,
    source_ext,
    stem_of,
    supports_quant,
    symlinks,
    walk,
)
from metrale_orch.tree.files import child_maker
from tests.support.tree import files, hw, kernel_toml, model, rel, symlink, write

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


def T(text: str) -> Target:
    return Target.parse(text)


def plain(root: Path, hw_name: str = "h", model_name: str = "m", vendor: object = None) -> None:
    """A hardware tree with one model (empty ``[model]``)."""
    hw(root, hw_name, vendor=vendor)
    model(root, hw_name, model_name)


def overlay(root: Path) -> None:
    """Child tree ``c`` inheriting parent ``p``; both hold model ``m``."""
    hw(root, "p")
    hw(root, "c", inherits="p")
    model(root, "p", "m")
    model(root, "c", "m")


def rels(root: Path, paths: Iterable[Path]) -> list[str]:
    return [rel(root, p) for p in paths]


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


# --------------------------------------------------------------------------- HARDWARE.toml


def test_hardware_defaults(tmp_path: Path) -> None:
    write(tmp_path, "kernels/h/HARDWARE.toml", "")
    got = hardware(tmp_path / "kernels", "h")
    assert isinstance(got, Hardware)
    assert (got.name, got.vendor, got.arch, got.inherits, got.source_ext) == (
        "h",
        "nvidia",
        None,
        None,
        "cu",
    )


def test_hardware_keys_read(tmp_path: Path) -> None:
    hw(tmp_path, "p", vendor="amd")
    hw(tmp_path, "h", vendor="rocm", arch="gfx942", inherits="p")
    got = hardware(tmp_path / "kernels", "h")
    assert (got.name, got.vendor, got.arch, got.inherits, got.source_ext) == (
        "h",
        "rocm",
        "gfx942",
        "p",
        "cu",
    )


@pytest.mark.parametrize("raw", ['hardware = "apple"\n', "hardware = 3\n", "hardware = [1]\n"])
def test_hardware_not_a_table_reads_as_absent(tmp_path: Path, raw: str) -> None:
    hw(tmp_path, "h", raw=raw)
    got = hardware(tmp_path / "kernels", "h")
    assert (got.vendor, got.arch, got.inherits, got.source_ext) == ("nvidia", None, None, "cu")


def test_hardware_other_keys_ignored(tmp_path: Path) -> None:
    hw(tmp_path, "h", raw='[hardware]\narch = "sm_90"\nfoo = 1\n[defaults]\nx = true\n')
    assert hardware(tmp_path / "kernels", "h").arch == "sm_90"


def test_unknown_hardware_missing_file_and_dir(tmp_path: Path) -> None:
    (tmp_path / "kernels/h").mkdir(parents=True)
    with pytest.raises(UnknownHardware) as ei:
        hardware(tmp_path / "kernels", "h")
    assert ei.value.hardware == "h"
    assert ei.value.path == tmp_path / "kernels/h/HARDWARE.toml"
    assert "kernels/h/HARDWARE.toml" in str(ei.value)
    with pytest.raises(UnknownHardware) as ei2:
        discover(tmp_path, T("nope/m/q"))
    assert "kernels/nope/HARDWARE.toml" in str(ei2.value)


def test_hardware_bad_toml(tmp_path: Path) -> None:
    hw(tmp_path, "h", raw="[hardware\nvendor = \n")
    with pytest.raises(ManifestError) as ei:
        hardware(tmp_path / "kernels", "h")
    assert ei.value.path == tmp_path / "kernels/h/HARDWARE.toml"
    assert "kernels/h/HARDWARE.toml" in str(ei.value)
    # The error stands alone (no chained context from the pass's memo), also when the
    # same snapshot is asked again and answers from what it kept.
    assert ei.value.__context__ is None and ei.value.__cause__ is None
    snap = L.TreeSnapshot(tmp_path)
    for _ in range(2):
        with pytest.raises(ManifestError) as again:
            L.discover(tmp_path, L.Target(hardware="h", model="m", quant="q"), snap)
        assert again.value.__context__ is None


@pytest.mark.parametrize(
    "raw",
    [
        "[kernels]\noverrides = {}\n",
        '[kernels]\noverrides = ["x.cu"]\n',
        "kernels = { overrides = 1 }\n",
        '[kernels.overrides]\n"x" = "y"\n',
    ],
)
def test_retired_overrides(tmp_path: Path, raw: str) -> None:
    hw(tmp_path, "h", raw=raw)
    with pytest.raises(RetiredKey) as ei:
        hardware(tmp_path / "kernels", "h")
    assert ei.value.path == tmp_path / "kernels/h/HARDWARE.toml"
    assert "overrides" in str(ei.value)
    assert "kernels/h/HARDWARE.toml" in str(ei.value)
    assert "[shadow]" in str(ei.value)


@pytest.mark.parametrize(
    "raw", ['kernels = "overrides"\n', 'kernels = ["overrides"]\n', "[kernels]\nother = 1\n"]
)
def test_kernels_without_retired_key_is_fine(tmp_path: Path, raw: str) -> None:
    hw(tmp_path, "h", raw=raw)
    assert hardware(tmp_path / "kernels", "h").vendor == "nvidia"


@pytest.mark.parametrize("key", ["vendor", "arch", "inherits"])
@pytest.mark.parametrize("value", ["1", "true", '["nvidia"]', "{ a = 1 }"])
def test_hardware_key_not_a_string(tmp_path: Path, key: str, value: str) -> None:
    hw(tmp_path, "h", raw=f"[hardware]\n{key} = {value}\n")
    with pytest.raises(ManifestError) as ei:
        hardware(tmp_path / "kernels", "h")
    assert ei.value.key is not None and key in ei.value.key
    assert key in str(ei.value)
    assert "kernels/h/HARDWARE.toml" in str(ei.value)


@pytest.mark.parametrize("vendor", ["intel", "NVIDIA", "Metal", ""])
def test_unknown_vendor(tmp_path: Path, vendor: str) -> None:
    hw(tmp_path, "h", vendor=vendor)
    with pytest.raises(UnknownVendor) as ei:
        hardware(tmp_path / "kernels", "h")
    assert ei.value.vendor == vendor
    assert ei.value.path == tmp_path / "kernels/h/HARDWARE.toml"
    assert "kernels/h/HARDWARE.toml" in str(ei.value)
    assert repr(vendor) in str(ei.value) or f'"{vendor}"' in str(ei.value)


@pytest.mark.parametrize(
    ("raw", "error", "key"),
    [
        # retired key before vendor-is-a-string
        ("[kernels]\noverrides = 1\n[hardware]\nvendor = 1\n", RetiredKey, None),
        # vendor is a string before vendor is known ... before arch
        ("[hardware]\nvendor = 1\narch = 1\n", ManifestError, "vendor"),
        # vendor known before arch is a string
        ('[hardware]\nvendor = "intel"\narch = 1\n', UnknownVendor, None),
        # arch before inherits
        ("[hardware]\narch = 1\ninherits = 1\n", ManifestError, "arch"),
        ('[hardware]\ninherits = 2\nvendor = "intel"\n', UnknownVendor, None),
        # own checks before the inherits checks
        ('[hardware]\narch = 1\ninherits = "h"\n', ManifestError, "arch"),
        ('[hardware]\nvendor = "x"\ninherits = "missing"\n', UnknownVendor, None),
    ],
)
def test_hardware_check_order(
    tmp_path: Path, raw: str, error: type[LayoutError], key: str | None
) -> None:
    hw(tmp_path, "h", raw=raw)
    with pytest.raises(error) as ei:
        hardware(tmp_path / "kernels", "h")
    if key is not None:
        assert isinstance(ei.value, ManifestError)
        assert ei.value.key is not None and key in ei.value.key
        other = {"vendor", "arch", "inherits"} - {key}
        assert not any(o in ei.value.key for o in other)


def test_inherits_self(tmp_path: Path) -> None:
    hw(tmp_path, "h", inherits="h")
    with pytest.raises(InheritsError) as ei:
        hardware(tmp_path / "kernels", "h")
    assert (ei.value.hardware, ei.value.parent) == ("h", "h")
    assert "kernels/h/HARDWARE.toml" in str(ei.value)


@pytest.mark.parametrize(
    ("parent_raw", "cause"),
    [
        (None, UnknownHardware),
        ("[hardware\n", ManifestError),
        ('[hardware]\nvendor = "intel"\n', UnknownVendor),
        ("[hardware]\narch = 5\n", ManifestError),
        ("[kernels]\noverrides = 1\n", RetiredKey),
    ],
)
def test_inherits_parent_fails_to_load(
    tmp_path: Path, parent_raw: str | None, cause: type[LayoutError]
) -> None:
    hw(tmp_path, "h", inherits="p")
    if parent_raw is not None:
        hw(tmp_path, "p", raw=parent_raw)
    with pytest.raises(InheritsError) as ei:
        hardware(tmp_path / "kernels", "h")
    assert (ei.value.hardware, ei.value.parent) == ("h", "p")
    assert isinstance(ei.value.cause, cause)
    assert "kernels/h/HARDWARE.toml" in str(ei.value)
    assert "'p'" in str(ei.value) or '"p"' in str(ei.value)


def test_inherits_chain_refused(tmp_path: Path) -> None:
    hw(tmp_path, "g")
    hw(tmp_path, "p", inherits="g")
    hw(tmp_path, "h", inherits="p")
    with pytest.raises(InheritsError) as ei:
        hardware(tmp_path / "kernels", "h")
    assert ei.value.parent == "p"
    # the parent itself is a fine tree
    assert hardware(tmp_path / "kernels", "p").inherits == "g"


@pytest.mark.parametrize(("child", "parent"), [("nvidia", "apple"), ("metal", "cuda")])
def test_inherits_other_source_extension(tmp_path: Path, child: str, parent: str) -> None:
    hw(tmp_path, "p", vendor=parent)
    hw(tmp_path, "h", vendor=child, inherits="p")
    with pytest.raises(InheritsError) as ei:
        hardware(tmp_path / "kernels", "h")
    assert ei.value.parent == "p"


def test_inherits_same_extension_other_vendor(tmp_path: Path) -> None:
    hw(tmp_path, "p", vendor="nvidia")
    hw(tmp_path, "h", vendor="hip", inherits="p")
    got = hardware(tmp_path / "kernels", "h")
    assert (got.vendor, got.inherits, got.source_ext) == ("hip", "p", "cu")


def test_discover_wraps_hardware_errors(tmp_path: Path) -> None:
    hw(tmp_path, "h", inherits="h")
    model(tmp_path, "h", "m")
    files(tmp_path, "kernels/h/m/q/x.cu")
    with pytest.raises(InheritsError):
        discover(tmp_path, T("h/m/q"))


# --------------------------------------------------------------------------- layers


def test_two_layers_without_inherits(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu", "kernels/h/common/y.cu")
    lay = discover(tmp_path, T("h/m/q"))
    assert isinstance(lay, Layout)
    assert lay.target == T("h/m/q")
    assert [(x.role, x.tier, x.hardware, x.dir) for x in lay.layers] == [
        (Role.LEAF, Tier.OWN, "h", tmp_path / "kernels/h/m/q"),
        (Role.COMMON, Tier.OWN, "h", tmp_path / "kernels/h/common"),
    ]
    assert all(isinstance(x, Layer) and x.manifest is None for x in lay.layers)
    # index = position: the own common layer is index 1 here
    assert lay.common["y.cu"].layer == 1
    assert lay.leaf["x.cu"].layer == 0


def test_four_layers_with_inherits(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(
        tmp_path,
        "kernels/c/m/q/a.cu",
        "kernels/p/m/q/b.cu",
        "kernels/c/common/c.cu",
        "kernels/p/common/d.cu",
    )
    lay = discover(tmp_path, T("c/m/q"))
    assert [(x.role, x.tier, x.hardware, rel(tmp_path, x.dir)) for x in lay.layers] == [
        (Role.LEAF, Tier.OWN, "c", "kernels/c/m/q"),
        (Role.LEAF, Tier.PARENT, "p", "kernels/p/m/q"),
        (Role.COMMON, Tier.OWN, "c", "kernels/c/common"),
        (Role.COMMON, Tier.PARENT, "p", "kernels/p/common"),
    ]
    assert {n: e.layer for n, e in lay.leaf.items()} == {"a.cu": 0, "b.cu": 1}
    assert {n: e.layer for n, e in lay.common.items()} == {"c.cu": 2, "d.cu": 3}
    assert lay.hardware.inherits == "p"


@pytest.mark.parametrize("only", ["kernels/c/m/q", "kernels/p/m/q", "kernels/c/common"])
def test_missing_layer_dirs_are_fine(tmp_path: Path, only: str) -> None:
    overlay(tmp_path)
    files(tmp_path, f"{only}/x.cu")
    lay = discover(tmp_path, T("c/m/q"))
    assert len(lay.layers) == 4
    entries = {**lay.leaf, **lay.common}
    assert rels(tmp_path, [e.source for e in entries.values()]) == [f"{only}/x.cu"]


def test_only_parent_common_exists(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/p/common/x.cu")
    lay = discover(tmp_path, T("c/m/q"))
    assert dict(lay.leaf) == {}
    assert lay.common["x.cu"].layer == 3
    assert [s for s, _ in lay.modules()] == ["x"]


def test_empty_existing_dir_counts_as_existing(tmp_path: Path) -> None:
    plain(tmp_path)
    (tmp_path / "kernels/h/m/q").mkdir()
    lay = discover(tmp_path, T("h/m/q"))
    assert dict(lay.leaf) == {} and dict(lay.common) == {}
    assert list(lay.modules()) == []


def test_no_kernel_directory(tmp_path: Path) -> None:
    overlay(tmp_path)
    with pytest.raises(NoKernelDirectory) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.target == T("c/m/q")
    assert set(rels(tmp_path, ei.value.dirs)) == {
        "kernels/c/m/q",
        "kernels/p/m/q",
        "kernels/c/common",
        "kernels/p/common",
    }
    assert "c/m/q" in str(ei.value)
    assert "kernels/c/m/q" in str(ei.value)


def test_no_kernel_directory_two_layers(tmp_path: Path) -> None:
    plain(tmp_path)
    with pytest.raises(NoKernelDirectory) as ei:
        discover(tmp_path, T("h/m/q"))
    assert set(rels(tmp_path, ei.value.dirs)) == {"kernels/h/m/q", "kernels/h/common"}


def test_unknown_model(tmp_path: Path) -> None:
    hw(tmp_path, "h")
    files(tmp_path, "kernels/h/common/x.cu", "kernels/h/afile")
    for name in ["m", "afile"]:
        with pytest.raises(UnknownModel) as ei:
            discover(tmp_path, T(f"h/{name}/q"))
        # the data names the model; the lead's resolver shares one error across the
        # model's quants, so the quant is not asserted
        assert (ei.value.target.hardware, ei.value.target.model) == ("h", name)
        assert ei.value.model_dir == tmp_path / f"kernels/h/{name}"
        assert f"kernels/h/{name}" in str(ei.value)


def test_model_dir_without_model_toml_owns_its_sources(tmp_path: Path) -> None:
    # SPEC 1.5: the model step only checks that the directory exists; the seed: "A model
    # directory with no MODEL.toml owns its own sources".
    hw(tmp_path, "h")
    files(tmp_path, "kernels/h/m/q/x.cu")
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.source_model == "m"
    assert list(lay.leaf) == ["x.cu"]
    assert kernel_source_dir(tmp_path / "kernels/h/m") == tmp_path / "kernels/h/m"


# --------------------------------------------------------------------------- parent leaf


def test_parent_leaf_follows_parents_redirect_of_own_source_name(tmp_path: Path) -> None:
    hw(tmp_path, "p")
    hw(tmp_path, "c", inherits="p")
    model(tmp_path, "c", "alias", kernel_source="base")
    model(tmp_path, "c", "base")
    model(tmp_path, "p", "base", kernel_source="pbase")
    model(tmp_path, "p", "pbase")
    model(tmp_path, "p", "alias")  # not consulted: the own *source* name is "base"
    files(
        tmp_path,
        "kernels/c/base/q/own.cu",
        "kernels/p/pbase/q/par.cu",
        "kernels/p/base/q/wrong.cu",
        "kernels/p/alias/q/wrong2.cu",
        "kernels/c/alias/q/wrong3.cu",
    )
    lay = discover(tmp_path, T("c/alias/q"))
    assert lay.source_model == "base"
    assert lay.model_dir == tmp_path / "kernels/c/alias"
    assert rels(tmp_path, [x.dir for x in lay.layers[:2]]) == [
        "kernels/c/base/q",
        "kernels/p/pbase/q",
    ]
    assert sorted(lay.leaf) == ["own.cu", "par.cu"]


def test_parent_leaf_without_model_toml_is_used_as_is(tmp_path: Path) -> None:
    overlay(tmp_path)
    (tmp_path / "kernels/p/m/MODEL.toml").unlink()
    files(tmp_path, "kernels/p/m/q/par.cu")
    lay = discover(tmp_path, T("c/m/q"))
    assert rel(tmp_path, lay.layers[1].dir) == "kernels/p/m/q"
    assert list(lay.leaf) == ["par.cu"]


def test_parent_leaf_missing_parent_model_dir(tmp_path: Path) -> None:
    hw(tmp_path, "p")
    hw(tmp_path, "c", inherits="p")
    model(tmp_path, "c", "m")
    files(tmp_path, "kernels/c/m/q/x.cu")
    lay = discover(tmp_path, T("c/m/q"))
    assert rel(tmp_path, lay.layers[1].dir) == "kernels/p/m/q"


def test_parent_allow_list_is_not_consulted(tmp_path: Path) -> None:
    overlay(tmp_path)
    model(tmp_path, "p", "m", supported_quants=["other"])
    files(tmp_path, "kernels/p/m/q/par.cu")
    lay = discover(tmp_path, T("c/m/q"))
    assert list(lay.leaf) == ["par.cu"]


@pytest.mark.parametrize(
    ("value", "error"),
    [("nope", RedirectError), ("m", RedirectError), (3, ManifestError), ("", ManifestError)],
)
def test_parent_leaf_redirect_can_fail(
    tmp_path: Path, value: object, error: type[LayoutError]
) -> None:
    overlay(tmp_path)
    model(tmp_path, "p", "m", kernel_source=value)
    files(tmp_path, "kernels/c/m/q/x.cu")
    with pytest.raises(error) as ei:
        discover(tmp_path, T("c/m/q"))
    assert "kernels/p/m/MODEL.toml" in str(ei.value)


# --------------------------------------------------------------------------- symlinks


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("x.cu", "../../../../elsewhere.cu"),  # file link to a kernel file
        ("inc", "../../../../incdir"),  # directory link
        ("gone.cu", "does-not-exist.cu"),  # dangling
        ("README.md", "../../../../elsewhere.cu"),  # non-kernel name
        ("KERNEL.md", "nowhere"),  # dangling non-kernel
    ],
)
@pytest.mark.parametrize("layer_dir", ["kernels/c/m/q", "kernels/p/common", "kernels/c/common"])
def test_symlink_child_is_an_error(tmp_path: Path, name: str, target: str, layer_dir: str) -> None:
    overlay(tmp_path)
    files(tmp_path, "elsewhere.cu", "incdir/a.cuh", f"{layer_dir}/ok.cuh")
    link = symlink(tmp_path, f"{layer_dir}/{name}", target)
    with pytest.raises(SymlinkError) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.path == link
    assert f"{layer_dir}/{name}" in str(ei.value)


def test_symlink_outside_layer_dirs_is_not_discovers_business(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu", "kernels/h/other/y.cu")
    symlink(tmp_path, "kernels/h/link", "other")
    symlink(tmp_path, "kernels/h/m/q2", "q")
    lay = discover(tmp_path, T("h/m/q"))
    assert list(lay.leaf) == ["x.cu"]


# --------------------------------------------------------------------------- subdirectories


def test_subdirectories_first_layer_kept_no_declaration(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(
        tmp_path,
        "kernels/c/m/q/include/own.h",
        "kernels/p/m/q/include/par.h",
        "kernels/p/m/q/extra/e.h",
        "kernels/c/common/include/x/deep.cuh",
        "kernels/c/common/include/README.md",
        "kernels/p/common/include/pc.h",
        "kernels/p/common/vendor/v.h",
    )
    lay = discover(tmp_path, T("c/m/q"))
    assert {k: rel(tmp_path, v) for k, v in lay.leaf_subdirs.items()} == {
        "extra": "kernels/p/m/q/extra",
        "include": "kernels/c/m/q/include",
    }
    assert {k: rel(tmp_path, v) for k, v in lay.common_subdirs.items()} == {
        "include": "kernels/c/common/include",
        "vendor": "kernels/p/common/vendor",
    }
    assert list(lay.shadows) == []
    assert sorted(rels(tmp_path, set(lay.inputs()))) == [
        "kernels/c/common/include/README.md",
        "kernels/c/common/include/x/deep.cuh",
        "kernels/c/m/q/include/own.h",
        "kernels/p/common/vendor/v.h",
        "kernels/p/m/q/extra/e.h",
    ]


def test_subdirectory_shadow_key_is_dead(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/c/m/q/include/a.h", "kernels/p/m/q/include/a.h")
    kernel_toml(tmp_path, "kernels/c/m/q", shadow={"include": "vendored"})
    with pytest.raises(DeadShadow) as ei:
        discover(tmp_path, T("c/m/q"))
    assert ei.value.stem == "include"


# --------------------------------------------------------------------------- [sources] use


def use_tree(root: Path, *uses: str, layer: str = "kernels/h/m/q") -> None:
    plain(root)
    hw(root, "other")
    files(
        root,
        "kernels/h/m/q/own.cu",
        "kernels/h/common/c.cu",
        "kernels/other/common/x.cu",
        "kernels/other/common/hdr.cuh",
        "kernels/other/common/y.h",
        "kernels/other/common/t.txt",
        "kernels/other/common/u.CU",
        "kernels/other/common/k.cpp",
        "kernels/other/common/k.metal",
        "outside.cu",
        "kernels_extra/z.cu",
    )
    (root / "kernels/other/common/dir.cu").mkdir()
    kernel_toml(root, layer, use=uses)


def use_error(root: Path, target: str = "h/m/q") -> UseError:
    with pytest.raises(UseError) as ei:
        discover(root, T(target))
    return ei.value


def test_use_brings_entries(tmp_path: Path) -> None:
    use_tree(tmp_path, "../other/common/x.cu", "../other/common/hdr.cuh", "../other/common/y.h")
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.leaf["x.cu"] == Entry(
        name="x.cu", source=tmp_path / "kernels/other/common/x.cu", layer=0, used=True
    )
    assert lay.leaf["hdr.cuh"].used and lay.leaf["y.h"].used
    assert lay.leaf["own.cu"].used is False
    assert list(lay.leaf) == sorted(lay.leaf)
    manifest = lay.layers[0].manifest
    assert isinstance(manifest, KernelManifest)
    assert manifest.path == tmp_path / "kernels/h/m/q/KERNEL.toml"
    assert tuple(manifest.uses) == (
        "../other/common/x.cu",
        "../other/common/hdr.cuh",
        "../other/common/y.h",
    )
    assert dict(manifest.shadow) == {}
    assert dict(lay.modules())["x"].source == tmp_path / "kernels/other/common/x.cu"
    assert tmp_path / "kernels/other/common/x.cu" in lay.inputs()


@pytest.mark.parametrize(
    "use",
    [
        "./../other/./common/x.cu",
        "../other/common/../common/x.cu",
        "nonexistent/../../other/common/x.cu",
        "../../kernels/other/common/x.cu",  # leaves kernels/ and comes back: inside
        "../other//common/x.cu",
    ],
)
def test_use_normalised_lexically(tmp_path: Path, use: str) -> None:
    use_tree(tmp_path, use)
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.leaf["x.cu"].source == tmp_path / "kernels/other/common/x.cu"
    assert lay.leaf["x.cu"].used


def test_use_links_not_resolved_by_normalisation(tmp_path: Path) -> None:
    # `link/..` drops `link` lexically; resolving the link would land in other/.
    use_tree(tmp_path, "link/../lib2/w.cu")
    files(tmp_path, "kernels/other/deep/x.h", "kernels/h/lib2/w.cu", "kernels/other/lib2/w.cu")
    symlink(tmp_path, "kernels/h/link", "../other/deep")
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.leaf["w.cu"].source == tmp_path / "kernels/h/lib2/w.cu"


def test_use_through_linked_directory_only_final_component_checked(tmp_path: Path) -> None:
    # Step 4 tests the final component only; a linked directory earlier on the path is walked.
    use_tree(tmp_path, "dirlink/x.cu")
    symlink(tmp_path, "kernels/h/dirlink", "../other/common")
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.leaf["x.cu"].source == tmp_path / "kernels/h/dirlink/x.cu"


def test_use_absolute(tmp_path: Path) -> None:
    absolute = str(tmp_path / "kernels/other/common/x.cu")
    use_tree(tmp_path, absolute)
    err = use_error(tmp_path)
    assert err.use == absolute
    assert err.manifest == tmp_path / "kernels/h/m/q/KERNEL.toml"
    assert "must be relative to kernels/h" in str(err)
    assert "kernels/h/m/q/KERNEL.toml" in str(err)


@pytest.mark.parametrize(
    "use", ["../../outside.cu", "../../kernels_extra/z.cu", "../..", "../../../x.cu"]
)
def test_use_escapes_kernels(tmp_path: Path, use: str) -> None:
    use_tree(tmp_path, use)
    err = use_error(tmp_path)
    assert err.use == use
    assert "escapes kernels/" in str(err)
    assert "kernels/h/m/q/KERNEL.toml" in str(err)


@pytest.mark.parametrize("target", ["x.cu", "nowhere.cu", "..", "t.txt"])
def test_use_final_component_symlink(tmp_path: Path, target: str) -> None:
    use_tree(tmp_path, "../other/common/ln.cu")
    link = symlink(tmp_path, "kernels/other/common/ln.cu", target)
    with pytest.raises(SymlinkError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert ei.value.path == link
    assert "kernels/other/common/ln.cu" in str(ei.value)


@pytest.mark.parametrize(
    "use", ["../other/common/missing.cu", "../other/common/dir.cu", "../other/common", "."]
)
def test_use_not_a_regular_file(tmp_path: Path, use: str) -> None:
    use_tree(tmp_path, use)
    err = use_error(tmp_path)
    assert "no such file" in str(err)
    assert err.use == use


@pytest.mark.parametrize(
    "use", ["../other/common/t.txt", "../other/common/u.CU", "../other/common/k.cpp"]
)
def test_use_not_a_kernel_file(tmp_path: Path, use: str) -> None:
    use_tree(tmp_path, use)
    err = use_error(tmp_path)
    assert "not a .cu source or a header" in str(err)


def test_use_metal_file_in_cuda_tree_and_cu_in_metal_tree(tmp_path: Path) -> None:
    use_tree(tmp_path, "../other/common/k.metal")
    assert "not a .cu source or a header" in str(use_error(tmp_path))
    hw(tmp_path, "h", vendor="apple")
    kernel_toml(tmp_path, "kernels/h/m/q", use=["../other/common/x.cu"])
    assert "not a .metal source or a header" in str(use_error(tmp_path))
    # headers are kernel files of a Metal tree too
    kernel_toml(tmp_path, "kernels/h/m/q", use=["../other/common/hdr.cuh", "../other/common/y.h"])
    lay = discover(tmp_path, T("h/m/q"))
    assert sorted(lay.leaf) == ["hdr.cuh", "y.h"]


def test_use_collides_with_directory_entry(tmp_path: Path) -> None:
    use_tree(tmp_path, "../other/common/x.cu")
    files(tmp_path, "kernels/h/m/q/x.cu")
    with pytest.raises(UseCollides) as ei:
        discover(tmp_path, T("h/m/q"))
    assert ei.value.name == "x.cu"
    assert ei.value.use == "../other/common/x.cu"
    assert ei.value.existing == tmp_path / "kernels/h/m/q/x.cu"
    assert ei.value.manifest == tmp_path / "kernels/h/m/q/KERNEL.toml"
    assert "kernels/h/m/q/KERNEL.toml" in str(ei.value)


def test_use_collides_with_earlier_use(tmp_path: Path) -> None:
    files(tmp_path, "kernels/third/x.cu")
    use_tree(tmp_path, "../other/common/x.cu", "../third/x.cu")
    with pytest.raises(UseCollides) as ei:
        discover(tmp_path, T("h/m/q"))
    assert ei.value.use == "../third/x.cu"
    assert ei.value.existing == tmp_path / "kernels/other/common/x.cu"


def test_use_same_file_twice_collides(tmp_path: Path) -> None:
    use_tree(tmp_path, "../other/common/x.cu", "../other/./common/x.cu")
    with pytest.raises(UseCollides):
        discover(tmp_path, T("h/m/q"))


def test_use_own_dir_file_collides(tmp_path: Path) -> None:
    use_tree(tmp_path, "m/q/own.cu")
    with pytest.raises(UseCollides):
        discover(tmp_path, T("h/m/q"))


@pytest.mark.parametrize(
    ("uses", "expect"),
    [
        # the first failing string wins, whatever its step
        (["../other/common/missing.cu", "/abs.cu"], "no such file"),
        (["/abs.cu", "../../outside.cu"], "must be relative"),
        (["../other/common/t.txt", "../other/common/x.cu", "../other/common/x.cu"], "not a .cu"),
    ],
)
def test_use_strings_checked_in_file_order(tmp_path: Path, uses: list[str], expect: str) -> None:
    use_tree(tmp_path, *uses)
    assert expect in str(use_error(tmp_path))


def test_use_step_order(tmp_path: Path) -> None:
    # 1 before 3: an absolute path outside kernels/ is "must be relative"
    use_tree(tmp_path, str(tmp_path / "outside.cu"))
    assert "must be relative" in str(use_error(tmp_path))
    # 3 before 4: a symlink outside kernels/ escapes
    symlink(tmp_path, "ln.cu", "outside.cu")
    kernel_toml(tmp_path, "kernels/h/m/q", use=["../../ln.cu"])
    assert "escapes kernels/" in str(use_error(tmp_path))
    # 4 before 5: a dangling link is a SymlinkError, not "no such file"
    symlink(tmp_path, "kernels/other/dangling.cu", "nothing.cu")
    kernel_toml(tmp_path, "kernels/h/m/q", use=["../other/dangling.cu"])
    with pytest.raises(SymlinkError):
        discover(tmp_path, T("h/m/q"))
    # 4 before 6: a link with a non-kernel name is a SymlinkError
    symlink(tmp_path, "kernels/other/ln.txt", "common/t.txt")
    kernel_toml(tmp_path, "kernels/h/m/q", use=["../other/ln.txt"])
    with pytest.raises(SymlinkError):
        discover(tmp_path, T("h/m/q"))
    # 5 before 6: a missing non-kernel file is "no such file"
    kernel_toml(tmp_path, "kernels/h/m/q", use=["../other/missing.txt"])
    assert "no such file" in str(use_error(tmp_path))
    # 6 before 7 cannot meet: only kernel files are entries


def test_use_joined_to_the_layers_own_tree(tmp_path: Path) -> None:
    # a parent layer's `use` is relative to kernels/<parent>/, not to the child's tree
    overlay(tmp_path)
    files(tmp_path, "kernels/p/shared/s.cu", "kernels/c/shared/s.cu", "kernels/c/m/q/a.cu")
    kernel_toml(tmp_path, "kernels/p/m/q", use=["shared/s.cu"])
    lay = discover(tmp_path, T("c/m/q"))
    assert lay.leaf["s.cu"] == Entry(
        name="s.cu", source=tmp_path / "kernels/p/shared/s.cu", layer=1, used=True
    )


def test_use_in_common_layer_and_absolute_message_names_layer_tree(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/p/extra/e.cuh", "kernels/c/m/q/a.cu")
    kernel_toml(tmp_path, "kernels/p/common", use=["extra/e.cuh"])
    lay = discover(tmp_path, T("c/m/q"))
    assert lay.common["e.cuh"] == Entry(
        name="e.cuh", source=tmp_path / "kernels/p/extra/e.cuh", layer=3, used=True
    )
    kernel_toml(tmp_path, "kernels/p/common", use=["/abs/e.cuh"])
    err = use_error(tmp_path, "c/m/q")
    assert "must be relative to kernels/p" in str(err)
    assert "kernels/p/common/KERNEL.toml" in str(err)


def test_used_file_may_be_a_source_of_a_non_target_dir(tmp_path: Path) -> None:
    # a use may reach any tree under kernels/, even a directory that is no hardware tree
    use_tree(tmp_path, "../lib/w.cu")
    files(tmp_path, "kernels/lib/w.cu")
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.leaf["w.cu"].source == tmp_path / "kernels/lib/w.cu"


# --------------------------------------------------------------------------- MODEL.toml


def redirect_tree(root: Path, value: object) -> None:
    hw(root, "h")
    model(root, "h", "alias", kernel_source=value)
    files(root, "kernels/h/alias/q/x.cu", "kernels/h/common/c.cu")


def test_redirect(tmp_path: Path) -> None:
    redirect_tree(tmp_path, "base")
    model(tmp_path, "h", "base")
    files(tmp_path, "kernels/h/base/q/b.cu")
    lay = discover(tmp_path, T("h/alias/q"))
    assert lay.source_model == "base"
    assert lay.model_dir == tmp_path / "kernels/h/alias"
    assert lay.layers[0].dir == tmp_path / "kernels/h/base/q"
    assert list(lay.leaf) == ["b.cu"]
    assert kernel_source_dir(tmp_path / "kernels/h/alias") == tmp_path / "kernels/h/base"
    assert kernel_source_dir(tmp_path / "kernels/h/base") == tmp_path / "kernels/h/base"


def test_no_redirect(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu")
    lay = discover(tmp_path, T("h/m/q"))
    assert lay.source_model == "m"
    assert lay.model_dir == tmp_path / "kernels/h/m"


@pytest.mark.parametrize("value", [1, True, ["base"], "", "   ", "\t"])
def test_kernel_source_bad_value(tmp_path: Path, value: object) -> None:
    redirect_tree(tmp_path, value)
    model(tmp_path, "h", "base")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/alias/q"))
    assert ei.value.key is not None and "kernel_source" in ei.value.key
    assert ei.value.path == tmp_path / "kernels/h/alias/MODEL.toml"
    assert "kernels/h/alias/MODEL.toml" in str(ei.value)
    with pytest.raises(ManifestError):
        kernel_source_dir(tmp_path / "kernels/h/alias")


def test_model_toml_bad_toml(tmp_path: Path) -> None:
    hw(tmp_path, "h")
    model(tmp_path, "h", "m", raw="[model\n")
    files(tmp_path, "kernels/h/m/q/x.cu")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/m/MODEL.toml" in str(ei.value)


@pytest.mark.parametrize("case", ["missing", "file", "no_model_toml", "chain", "self", "to_self"])
def test_redirect_errors(tmp_path: Path, case: str) -> None:
    hw(tmp_path, "h")
    files(tmp_path, "kernels/h/alias/q/x.cu", "kernels/h/common/c.cu")
    value = "base"
    if case == "file":
        write(tmp_path, "kernels/h/base", "not a dir")
    elif case == "no_model_toml":
        files(tmp_path, "kernels/h/base/q/b.cu")
    elif case == "chain":
        model(tmp_path, "h", "base", kernel_source="third")
        model(tmp_path, "h", "third")
    elif case == "self":
        model(tmp_path, "h", "base", kernel_source="base")
    elif case == "to_self":
        value = "alias"
    model(tmp_path, "h", "alias", kernel_source=value)
    with pytest.raises(RedirectError) as ei:
        discover(tmp_path, T("h/alias/q"))
    assert ei.value.path == tmp_path / "kernels/h/alias/MODEL.toml"
    assert ei.value.model_dir == tmp_path / "kernels/h/alias"
    assert ei.value.referent == tmp_path / "kernels/h" / value
    assert "kernels/h/alias/MODEL.toml" in str(ei.value)
    with pytest.raises(RedirectError):
        kernel_source_dir(tmp_path / "kernels/h/alias")


def test_redirect_referent_not_normalised(tmp_path: Path) -> None:
    # the referent is <hw dir>/<value> as written; "./base" names the same directory
    hw(tmp_path, "h")
    model(tmp_path, "h", "alias", kernel_source="./base")
    model(tmp_path, "h", "base")
    files(tmp_path, "kernels/h/base/q/b.cu")
    lay = discover(tmp_path, T("h/alias/q"))
    assert lay.layers[0].dir == tmp_path / "kernels/h/./base/q"
    assert list(lay.leaf) == ["b.cu"]


def allow_tree(root: Path, quants: object, *, source_quants: object = None) -> None:
    hw(root, "h")
    if source_quants is None:
        model(root, "h", "m", supported_quants=quants)
    else:
        model(root, "h", "m", supported_quants=quants, kernel_source="s")
        model(root, "h", "s", supported_quants=source_quants)
        files(root, "kernels/h/s/q/y.cu")
    files(root, "kernels/h/m/q/x.cu", "kernels/h/common/c.cu")


def test_allow_list_absent_every_quant_resolves_even_common_only(tmp_path: Path) -> None:
    allow_tree(tmp_path, None)
    lay = discover(tmp_path, T("h/m/nothing-here"))
    assert dict(lay.leaf) == {}
    assert list(lay.common) == ["c.cu"]


def test_allow_list_listed(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["a", "q"])
    assert list(discover(tmp_path, T("h/m/q")).leaf) == ["x.cu"]
    assert supports_quant(tmp_path / "kernels/h/m", "q")
    assert not supports_quant(tmp_path / "kernels/h/m", "b")


@pytest.mark.parametrize("quant", ["b", "Q", " q", "q "])
def test_allow_list_quant_not_listed(tmp_path: Path, quant: str) -> None:
    allow_tree(tmp_path, ["a", "q"])
    files(tmp_path, f"kernels/h/m/{quant}/z.cu")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, Target(hardware="h", model="m", quant=quant))
    msg = str(ei.value)
    assert "not supported" in msg
    assert "no common-only fallback" in msg
    assert "kernels/h/m/MODEL.toml" in msg
    assert ei.value.path == tmp_path / "kernels/h/m/MODEL.toml"


@pytest.mark.parametrize(
    "raw",
    [
        "[]",
        '"q"',
        '["q", ""]',
        '["q", "  "]',
        '["q", 1]',
        '["q", ["a"]]',
        "1",
        "{ q = 1 }",
    ],
)
def test_allow_list_malformed(tmp_path: Path, raw: str) -> None:
    hw(tmp_path, "h")
    model(tmp_path, "h", "m", raw=f"[model]\nsupported_quants = {raw}\n")
    files(tmp_path, "kernels/h/m/q/x.cu")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert ei.value.key is not None and "supported_quants" in ei.value.key
    assert "kernels/h/m/MODEL.toml" in str(ei.value)
    assert "supported_quants" in str(ei.value)


def test_allow_list_redirect_source_must_allow(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["q"], source_quants=["other"])
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/s/MODEL.toml" in str(ei.value)
    assert "not supported" in str(ei.value)


def test_allow_list_model_checked_before_source(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["other"], source_quants=["other2"])
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/m/MODEL.toml" in str(ei.value)
    assert "kernels/h/s/MODEL.toml" not in str(ei.value)


def test_allow_list_source_malformed(tmp_path: Path) -> None:
    allow_tree(tmp_path, None, source_quants=[])
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/s/MODEL.toml" in str(ei.value)


def test_allow_list_both_allow(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["q"], source_quants=["q"])
    assert list(discover(tmp_path, T("h/m/q")).leaf) == ["y.cu"]


def test_walk_ignores_allow_list(tmp_path: Path) -> None:
    allow_tree(tmp_path, ["a"])
    files(tmp_path, "kernels/h/m/b/z.cu")
    assert [str(t) for t in walk(tmp_path)] == ["h/m/b", "h/m/q"]


def test_supports_quant_without_list(tmp_path: Path) -> None:
    plain(tmp_path)
    assert supports_quant(tmp_path / "kernels/h/m", "anything")


# --------------------------------------------------------------------------- KERNEL.toml


def test_kernel_manifest_parse(tmp_path: Path) -> None:
    write(
        tmp_path,
        "d/KERNEL.toml",
        '[sources]\nuse = ["a.cu", "b.cuh"]\n[shadow]\nx = "  because  "\n"a.b" = "r"\n'
        '[build]\nflags = ["-O3"]\n[modules]\nx = 1\n[shadow_exempt]\ny = 2\n',
    )
    got = kernel_manifest(tmp_path / "d")
    assert got is not None
    assert got.path == tmp_path / "d/KERNEL.toml"
    assert tuple(got.uses) == ("a.cu", "b.cuh")
    assert dict(got.shadow) == {"x": "  because  ", "a.b": "r"}
    assert kernel_manifest(tmp_path / "nowhere") is None
    (tmp_path / "e").mkdir()
    assert kernel_manifest(tmp_path / "e") is None


def test_kernel_manifest_empty_file(tmp_path: Path) -> None:
    write(tmp_path, "d/KERNEL.toml", "")
    got = kernel_manifest(tmp_path / "d")
    assert got is not None
    assert tuple(got.uses) == () and dict(got.shadow) == {}


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("sources = 1\n", "sources"),
        ('sources = ["a.cu"]\n', "sources"),
        ('[sources]\nuse = []\nextra = "x"\n', "sources"),
        ('[sources]\nuse = "a.cu"\n', "use"),
        ('[sources]\nuse = { a = "b" }\n', "use"),
        ('[sources]\nuse = ["a.cu", 1]\n', "use"),
        ('[sources]\nuse = [["a.cu"]]\n', "use"),
        ('shadow = "x"\n', "shadow"),
        ('shadow = ["x"]\n', "shadow"),
        ("[shadow]\nx = 1\n", "shadow"),
        ("[shadow]\nx = true\n", "shadow"),
        ('[shadow]\nx = ["r"]\n', "shadow"),
        ('[shadow]\nx = ""\n', "shadow"),
        ('[shadow]\nx = "   "\n', "shadow"),
        ('[shadow]\nx = "\\t\\n"\n', "shadow"),
        ("[shadow.x]\nreason = 'r'\n", "shadow"),
    ],
)
def test_kernel_manifest_errors(tmp_path: Path, raw: str, key: str) -> None:
    plain(tmp_path)
    write(tmp_path, "kernels/h/m/q/KERNEL.toml", raw)
    with pytest.raises(ManifestError) as ei:
        kernel_manifest(tmp_path / "kernels/h/m/q")
    assert ei.value.path == tmp_path / "kernels/h/m/q/KERNEL.toml"
    assert key in str(ei.value)
    assert "kernels/h/m/q/KERNEL.toml" in str(ei.value)
    with pytest.raises(ManifestError):
        discover(tmp_path, T("h/m/q"))


def test_kernel_manifest_bad_toml(tmp_path: Path) -> None:
    plain(tmp_path)
    write(tmp_path, "kernels/h/common/KERNEL.toml", "[shadow\n")
    with pytest.raises(ManifestError) as ei:
        discover(tmp_path, T("h/m/q"))
    assert "kernels/h/common/KERNEL.toml" in str(ei.value)


def test_kernel_manifest_other_tables_ignored(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu")
    write(
        tmp_path,
        "kernels/h/m/q/KERNEL.toml",
        '[build]\nnvcc = ["-lineinfo"]\n[modules]\nx = "y"\n[shadow_exempt]\nz = 3\n'
        "[anything]\nelse = 1\n",
    )
    lay = discover(tmp_path, T("h/m/q"))
    assert list(lay.configs()) == [tmp_path / "kernels/h/m/q/KERNEL.toml"]
    assert list(lay.leaf) == ["x.cu"]


def test_shadow_reason_kept_untrimmed(tmp_path: Path) -> None:
    overlay(tmp_path)
    files(tmp_path, "kernels/c/m/q/x.cu", "kernels/p/m/q/x.cu")
    kernel_toml(tmp_path, "kernels/c/m/q", shadow={"x": "  faster on c \n"})
    lay = discover(tmp_path, T("c/m/q"))
    assert [s.reason for s in lay.shadows] == ["  faster on c \n"]


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


# --------------------------------------------------------------------------- the Layout


def full_tree(root: Path) -> None:
    hw(root, "p", arch="sm_90")
    hw(root, "c", inherits="p", arch="sm_100")
    model(root, "c", "m", kernel_source="s")
    model(root, "c", "s")
    model(root, "p", "s")
    files(
        root,
        "kernels/c/s/q/k1.cu",
        "kernels/c/s/q/k3.cu",
        "kernels/c/s/q/h1.cuh",
        "kernels/c/s/q/inc/deep/d.h",
        "kernels/p/s/q/k2.cu",
        "kernels/p/s/q/k3.cu",
        "kernels/p/s/q/inc/shadowed.h",
        "kernels/c/common/k1.cu",
        "kernels/c/common/k4.cu",
        "kernels/c/common/c.h",
        "kernels/p/common/k5.cu",
        "kernels/p/common/k4.cu",
        "kernels/p/common/pinc/x.cuh",
        "kernels/lib/used.cu",
    )
    kernel_toml(root, "kernels/c/s/q", shadow={"k1": "r1", "k3": "r3"})
    kernel_toml(root, "kernels/c/common", use=["../lib/used.cu"], shadow={"k4": "r4"})
    kernel_toml(root, "kernels/p/common")


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


# --------------------------------------------------------------------------- walk


def test_walk(tmp_path: Path) -> None:
    hw(tmp_path, "b")
    hw(tmp_path, "a", inherits="p")
    hw(tmp_path, "p")
    write(tmp_path, "kernels/nohw/m/MODEL.toml", "")  # no HARDWARE.toml: not hardware
    files(tmp_path, "kernels/nohw/m/q/x.cu", "kernels/README.md")
    model(tmp_path, "a", "m")
    model(tmp_path, "a", "z")
    model(tmp_path, "a", "alias", kernel_source="base")
    model(tmp_path, "a", "base")
    model(tmp_path, "p", "m")
    model(tmp_path, "p", "base", kernel_source="pb")
    model(tmp_path, "p", "pb")
    files(
        tmp_path,
        "kernels/a/m/q2/x.cu",
        "kernels/a/m/q1/x.cu",
        "kernels/a/m/notes.md",
        "kernels/a/nomodel/q/x.cu",
        "kernels/a/common/x.cu",
        "kernels/a/base/bq/x.cu",
        "kernels/a/alias/own/x.cu",  # not the source model's dir
        "kernels/p/m/q1/y.cu",
        "kernels/p/m/q3/y.cu",
        "kernels/p/pb/pq/y.cu",
        "kernels/p/base/ignored/y.cu",
    )
    (tmp_path / "kernels/a/z/empty").mkdir(parents=True)
    write(tmp_path, "kernels/b/m/MODEL.toml", "")
    targets = walk(tmp_path)
    assert [str(t) for t in targets] == [
        "a/alias/bq",
        "a/alias/pq",
        "a/base/bq",
        "a/base/pq",
        "a/m/q1",
        "a/m/q2",
        "a/m/q3",
        "a/z/empty",
        "p/base/pq",
        "p/m/q1",
        "p/m/q3",
        "p/pb/pq",
    ]
    assert all(isinstance(t, Target) for t in targets)
    assert targets == sorted(targets)


def test_walk_model_toml_must_be_a_file(tmp_path: Path) -> None:
    hw(tmp_path, "h")
    (tmp_path / "kernels/h/m/MODEL.toml").mkdir(parents=True)
    (tmp_path / "kernels/h/m/q").mkdir()
    assert walk(tmp_path) == []


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("[hardware\n", ManifestError),
        ('[hardware]\nvendor = "intel"\n', UnknownVendor),
        ('[hardware]\ninherits = "nope"\n', InheritsError),
        ("[kernels]\noverrides = 1\n", RetiredKey),
    ],
)
def test_walk_hardware_errors_abort(tmp_path: Path, raw: str, error: type[LayoutError]) -> None:
    plain(tmp_path, "a")
    files(tmp_path, "kernels/a/m/q/x.cu")
    hw(tmp_path, "z", raw=raw)
    with pytest.raises(error):
        walk(tmp_path)
    with pytest.raises(error):
        dump(tmp_path)


# --------------------------------------------------------------------------- symlinks()


def test_symlinks(tmp_path: Path) -> None:
    files(tmp_path, "kernels/h/common/x.cu", "kernels/h/real/inner.cu", "outside/o.cu")
    symlink(tmp_path, "outside/innerlink.cu", "o.cu")
    a = symlink(tmp_path, "kernels/h/common/y.cu", "x.cu")
    b = symlink(tmp_path, "kernels/h/dangling", "nowhere")
    c = symlink(tmp_path, "kernels/h/linkdir", "real")
    d = symlink(tmp_path, "kernels/h/out", "../../outside")
    e = symlink(tmp_path, "kernels/h/real/deep.cuh", "inner.cu")
    symlink(tmp_path, "notkernels.cu", "outside/o.cu")
    got = symlinks(tmp_path)
    assert list(got) == sorted([a, b, c, d, e])
    assert list(got) == sorted(got)


def test_symlinks_none(tmp_path: Path) -> None:
    files(tmp_path, "kernels/h/common/x.cu")
    assert list(symlinks(tmp_path)) == []


# --------------------------------------------------------------------------- dump


def test_dump(tmp_path: Path) -> None:
    full_tree(tmp_path)
    files(tmp_path, "kernels/c/other/q/x.cu")
    model(tmp_path, "c", "other", supported_quants=["nope"])
    got = dump(tmp_path)
    data = json.loads(got) if isinstance(got, str) else got
    text = json.dumps(data)
    assert str(tmp_path) not in text
    assert list(data) == sorted(data)
    assert list(data) == ["c/m/q", "c/other/q", "c/s/q", "p/s/q"]
    assert set(data["c/other/q"]) == {"error"}
    assert "not supported" in data["c/other/q"]["error"]
    assert "kernels/c/other/MODEL.toml" in data["c/other/q"]["error"]
    assert data["c/m/q"] == {
        "common": {
            "c.h": ["kernels/c/common/c.h", 2, False],
            "k1.cu": ["kernels/c/common/k1.cu", 2, False],
            "k4.cu": ["kernels/c/common/k4.cu", 2, False],
            "k5.cu": ["kernels/p/common/k5.cu", 3, False],
            "used.cu": ["kernels/lib/used.cu", 2, True],
        },
        "common_subdirs": {"pinc": "kernels/p/common/pinc"},
        "configs": [
            "kernels/p/common/KERNEL.toml",
            "kernels/c/common/KERNEL.toml",
            "kernels/c/s/q/KERNEL.toml",
        ],
        "layers": [
            ["leaf", "own", "kernels/c/s/q"],
            ["leaf", "parent", "kernels/p/s/q"],
            ["common", "own", "kernels/c/common"],
            ["common", "parent", "kernels/p/common"],
        ],
        "leaf": {
            "h1.cuh": ["kernels/c/s/q/h1.cuh", 0, False],
            "k1.cu": ["kernels/c/s/q/k1.cu", 0, False],
            "k2.cu": ["kernels/p/s/q/k2.cu", 1, False],
            "k3.cu": ["kernels/c/s/q/k3.cu", 0, False],
        },
        "leaf_subdirs": {"inc": "kernels/c/s/q/inc"},
        "modules": {
            "k1": "kernels/c/s/q/k1.cu",
            "k2": "kernels/p/s/q/k2.cu",
            "k3": "kernels/c/s/q/k3.cu",
            "k4": "kernels/c/common/k4.cu",
            "k5": "kernels/p/common/k5.cu",
            "used": "kernels/lib/used.cu",
        },
        "shadows": [
            ["leaf", "k1.cu", "kernels/c/s/q/k1.cu", "kernels/c/common/k1.cu", "r1"],
            ["leaf", "k3.cu", "kernels/c/s/q/k3.cu", "kernels/p/s/q/k3.cu", "r3"],
            ["common", "k4.cu", "kernels/c/common/k4.cu", "kernels/p/common/k4.cu", "r4"],
        ],
        "source_model": "s",
    }
    for value in data.values():
        assert list(value) == sorted(value)


def test_dump_relative_root_matches_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full_tree(tmp_path)
    absolute = dump(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert dump(Path(".")) == absolute
    assert dump(".") == absolute


def test_dump_error_entries_name_files_relative(tmp_path: Path) -> None:
    plain(tmp_path)
    files(tmp_path, "kernels/h/m/q/x.cu", "kernels/h/common/x.cu")
    got = dump(tmp_path)
    data = json.loads(got) if isinstance(got, str) else got
    assert set(data) == {"h/m/q"}
    message = data["h/m/q"]["error"]
    assert '[shadow] x = "<reason>"' in message
    assert "kernels/h/m/q/KERNEL.toml" in message
    assert str(tmp_path) not in message


def test_dump_empty_tree(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    got = dump(tmp_path)
    assert (json.loads(got) if isinstance(got, str) else got) == {}


def test_child_maker_matches_joinpath() -> None:
    # The one private pathlib method the tree uses (files.child_maker): same result as `/`.

    for parent in (Path("/a/b"), Path("rel"), Path(".")):
        child = child_maker(parent)("c.cu")
        assert type(child) is type(parent / "c.cu")
        assert child == parent / "c.cu" and str(child) == str(parent / "c.cu")


def test_entry_and_layer_values_compare_hash_and_pickle() -> None:

    entry = Entry(name="a.cu", source=Path("/k/a.cu"), layer=0, used=False)
    twin = pickle.loads(pickle.dumps(entry))
    assert twin == entry and hash(twin) == hash(entry)
    assert repr(entry) == "Entry(name='a.cu', source=PosixPath('/k/a.cu'), layer=0, used=False)"
    layer = Layer(role=Role.LEAF, tier=Tier.OWN, hardware="h", dir=Path("/k"), manifest=None)
    assert pickle.loads(pickle.dumps(layer)) == layer
    assert hash(layer) == hash(Layer(**{f: getattr(layer, f) for f in layer.__slots__}))
