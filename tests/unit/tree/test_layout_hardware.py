"""Conformance tests for SPEC section 1: ``HARDWARE.toml``, the layers a target reads, the parent
leaf, symlinks in the tree and subdirectories (the rest of section 1 is in the other
``tests/unit/tree/test_layout_*.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch import tree as L
from metrale_orch.tree import (
    DeadShadow,
    Hardware,
    InheritsError,
    Layer,
    Layout,
    LayoutError,
    ManifestError,
    NoKernelDirectory,
    RedirectError,
    RetiredKey,
    Role,
    SymlinkError,
    Tier,
    UnknownHardware,
    UnknownModel,
    UnknownVendor,
    discover,
    hardware,
    kernel_source_dir,
)
from tests.support.tree import (
    T,
    files,
    hw,
    kernel_toml,
    model,
    overlay,
    plain,
    rel,
    rels,
    symlink,
    write,
)

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
