"""Conformance tests for SPEC section 1: ``[sources] use``, a leaf reading a module from another
place (the rest of section 1 is in the other ``tests/unit/tree/test_layout_*.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.tree import (
    Entry,
    KernelManifest,
    SymlinkError,
    UseCollides,
    UseError,
    discover,
)
from tests.support.tree import T, files, hw, kernel_toml, overlay, plain, symlink

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
