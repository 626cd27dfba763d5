"""Staging (SPEC 3.2): role directories, depth relation, idempotence, stale removal."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from metrale_orch.fsutil import bytes_hash
from metrale_orch.steps.errors import StageError
from metrale_orch.steps.staging import SourceBytes, beyond_layout, plan_stage, stage
from metrale_orch.tree import Target, discover
from tests.support.build import small_tree, write

T = Target(hardware="hw1", model="m1", quant="q1")


def _files(top: Path) -> set[str]:
    return {p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file()}


def test_plan_maps_roles_to_depth_preserving_dirs(tmp_path: Path) -> None:
    small_tree(
        tmp_path,
        {
            "kernels/hw1/common/vendor/ocp/mx.h": "// mx\n",
            "kernels/hw1/m1/q1/third_party/x.cuh": "// x\n",
            "kernels/hw1/m1/q1/notes.md": "not staged\n",
        },
    )
    plan = plan_stage(discover(tmp_path, T))
    assert list(plan) == sorted(plan)
    assert plan["common/add.cu"] == tmp_path / "kernels/hw1/common/add.cu"
    assert plan["common/vendor/ocp/mx.h"] == tmp_path / "kernels/hw1/common/vendor/ocp/mx.h"
    assert plan["m1/q1/leaf.cu"] == tmp_path / "kernels/hw1/m1/q1/leaf.cu"
    assert plan["m1/q1/third_party/x.cuh"] == tmp_path / "kernels/hw1/m1/q1/third_party/x.cuh"
    # Manifests and non-kernel files of the role dirs are not part of the stage.
    assert not any(k.endswith((".toml", ".md")) for k in plan)


def test_redirected_model_stages_under_its_source_model(tmp_path: Path) -> None:
    small_tree(tmp_path, {"kernels/hw1/m2/MODEL.toml": '[model]\nkernel_source = "m1"\n'})
    plan = plan_stage(discover(tmp_path, Target(hardware="hw1", model="m2", quant="q1")))
    assert "m1/q1/leaf.cu" in plan
    assert not any(k.startswith("m2/") for k in plan)


def test_stage_is_idempotent_and_removes_stale(tmp_path: Path) -> None:
    small_tree(tmp_path, {"kernels/hw1/common/vendor/v.h": "// v\n"})
    out = tmp_path / "build/stage/hw1/m1/q1"
    first = stage(discover(tmp_path, T), out)
    assert _files(out) == set(first.files)
    assert first.written == tuple(sorted(first.files))
    assert set(first.hashes) == set(first.files)
    mtimes = {rel: os.stat(out / rel).st_mtime_ns for rel in first.files}

    again = stage(discover(tmp_path, T), out)
    assert again.written == () and again.removed == ()
    assert {rel: os.stat(out / rel).st_mtime_ns for rel in again.files} == mtimes

    # Unknown files and dirs in the stage are removed; a changed source is rewritten.
    write(out, "common/stray.cuh", "// stray\n")
    write(out, "old_model/q1/gone.cu", "// gone\n")
    (tmp_path / "kernels/hw1/common/vendor/v.h").unlink()
    (tmp_path / "kernels/hw1/common/vendor").rmdir()
    write(tmp_path, "kernels/hw1/common/deep.cuh", "// deep v2\n")
    third = stage(discover(tmp_path, T), out)
    assert third.written == ("common/deep.cuh",)
    assert set(third.removed) == {"common/stray.cuh", "old_model", "common/vendor"}
    assert _files(out) == set(third.files)
    assert (out / "common/deep.cuh").read_text() == "// deep v2\n"


def test_nothing_outside_the_layout_is_visible(tmp_path: Path) -> None:
    small_tree(
        tmp_path,
        {
            "kernels/hw1/m1/q2/other.cu": "// other quant\n",
            "kernels/hw1/m9/MODEL.toml": "[model]\n",
            "kernels/hw1/m9/q1/x.cu": "// other model\n",
            "kernels/hw2/HARDWARE.toml": '[hardware]\narch = "sm_90a"\n',
            "kernels/hw2/common/y.cu": "// other hw\n",
        },
    )
    staged = stage(discover(tmp_path, T), tmp_path / "s")
    assert _files(tmp_path / "s") == {
        "common/add.cu", "common/scale.cu", "common/util.cuh", "common/deep.cuh",
        "common/unrelated.cuh", "m1/q1/leaf.cu",
    }  # fmt: skip
    assert set(staged.files) == _files(tmp_path / "s")


def test_file_replaced_by_directory_and_back(tmp_path: Path) -> None:
    small_tree(tmp_path)
    out = tmp_path / "s"
    write(out, "common/vendor", "a file where a dir will go\n")
    write(tmp_path, "kernels/hw1/common/vendor/v.h", "// v\n")
    stage(discover(tmp_path, T), out)
    assert (out / "common/vendor/v.h").is_file()
    # A directory in the stage where a file belongs is replaced by the file.
    (out / "common/add.cu").unlink()
    (out / "common/add.cu").mkdir()
    stage(discover(tmp_path, T), out)
    assert (out / "common/add.cu").is_file()


def test_colliding_staged_paths_are_an_error(tmp_path: Path) -> None:
    small_tree(tmp_path)
    layout = discover(tmp_path, T)
    # A source model named like the common dir would mix leaf files into common/.
    with pytest.raises(StageError, match="source model named 'common'"):
        plan_stage(replace(layout, source_model="common"))
    # A subdirectory and an entry of one role landing on one path.
    with pytest.raises(StageError, match=r"m1/q1/leaf\.cu: is both a file and a directory"):
        plan_stage(replace(layout, leaf_subdirs={"leaf.cu": tmp_path / "kernels/hw1/common"}))


def test_a_link_in_the_stage_is_replaced_by_the_file(tmp_path: Path) -> None:
    small_tree(tmp_path)
    out = tmp_path / "s"
    stage(discover(tmp_path, T), out)
    elsewhere = tmp_path / "elsewhere.cu"
    elsewhere.write_bytes((out / "common/add.cu").read_bytes())  # the same bytes, linked
    (out / "common/add.cu").unlink()
    (out / "common/add.cu").symlink_to(elsewhere)
    staged = stage(discover(tmp_path, T), out)
    assert not (out / "common/add.cu").is_symlink()
    assert "common/add.cu" in staged.written
    assert elsewhere.read_bytes() == (out / "common/add.cu").read_bytes()


def test_the_stage_holds_the_bytes_the_include_walk_read(tmp_path: Path) -> None:
    """A target's include walk and its stage read each file once, through one
    :class:`SourceBytes`: a file edited between the two is staged as the walk read it."""
    small_tree(tmp_path)
    layout = discover(tmp_path, T)
    read = SourceBytes()
    beyond_layout(tmp_path, layout, read)
    walked = (tmp_path / "kernels/hw1/m1/q1/leaf.cu").read_bytes()
    write(tmp_path, "kernels/hw1/m1/q1/leaf.cu", "// edited after the walk\n")
    out = tmp_path / "build/stage/hw1/m1/q1"
    staged = stage(layout, out, read=read)
    assert (out / "m1/q1/leaf.cu").read_bytes() == walked
    assert staged.hashes["m1/q1/leaf.cu"] == bytes_hash(walked)
    # Without it, the stage reads the file as it is now.
    assert stage(layout, out).hashes["m1/q1/leaf.cu"] != bytes_hash(walked)
