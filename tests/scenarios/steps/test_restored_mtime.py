"""A same-size edit is always seen, whatever its mtime says (issue 18, item 1).

Each test builds a tiny project (one target ``hw/m/q``) with real ``doit`` and the
real ``nvcc``, lets every saved state settle (older than the racy window, so the
no-op path trusts stats), then changes one input to bytes of the same size and
sets its mtime back to the nanosecond (``os.utime(..., ns=...)``), as a tarball of a
later release with the same fixed mtime does. ``metrale-orch status`` must call the
target stale, ``doit build`` must rebuild it, and the result must equal a cache-off
build of the same tree state byte for byte. Kinds: a header, a module source, a
header found outside the tree (``CPATH``) and the installed artefact; then two
releases tarred with one ``--mtime`` and unpacked one over the other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from metrale_orch.fsutil import RACY_NS
from tests.support.trust import (
    HAS_NVCC,
    TARGET,
    Run,
    base_env,
    copy_project,
    diff_outputs,
    doit_run,
    orch_run,
    outputs,
    summary_counts,
    write_files,
)

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(not HAS_NVCC, reason="nvcc and gcc are needed on PATH"),
]

HW = "kernels/hw/HARDWARE.toml"
K = "kernels/hw/common/k.cu"
H = "kernels/hw/common/scale.cuh"


def header(scale: str) -> str:
    return f"#pragma once\n#define SCALE {scale}f\n"


def kernel(tag: str, scale_from: str = '"scale.cuh"', extra: str = "") -> str:
    return (
        f"// restored-mtime test: {tag}\n#include {scale_from}\n{extra}"
        'extern "C" __global__ void k(float* o) { o[0] = SCALE * o[1]; }\n'
    )


def tree(tag: str, *, scale: str = "2.0", scale_from: str = '"scale.cuh"') -> dict[str, str]:
    files = {
        HW: '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\n',
        "kernels/hw/m/MODEL.toml": "[model]\n",
        "kernels/hw/m/q/.gitkeep": "",
        K: kernel(tag, scale_from),
    }
    if scale_from == '"scale.cuh"':
        files[H] = header(scale)
    return files


def settle() -> None:
    """Wait until everything written so far is older than the racy window."""
    time.sleep(RACY_NS / 1e9 + 0.2)


def rewrite_keeping_stat(path: Path, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` (same length) in ``path`` and set its mtime back."""
    data = path.read_bytes()
    assert old in data and len(old) == len(new), f"harness: {old!r} not in {path}"
    st = os.stat(path)
    path.write_bytes(data.replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def clean_outputs(src: Path, dst: Path, env: Mapping[str, str]) -> dict[str, bytes]:
    """The outputs of a cache-off build of a copy of ``src``: the truth."""
    root = copy_project(src, dst)
    clean_env = {**env, "METRALE_ORCH_CACHE_MODE": "off"}
    clean_env["METRALE_ORCH_LOCAL_CACHE"] = str(dst.parent / f"{dst.name}-no-cache")
    run = doit_run(root, ["build"], clean_env)
    assert run.returncode == 0, f"the clean reference build failed:\n{run.text}"
    return outputs(root)


def built_and_settled(root: Path, env: Mapping[str, str]) -> None:
    """Build, then let the saved states settle: no-op runs refresh the states recorded
    within the racy window (the installed artefacts always are) until they are trusted."""
    settle()
    first = doit_run(root, ["build"], env)
    assert first.returncode == 0, first.text
    settle()
    noop = doit_run(root, ["build"], env)
    assert noop.returncode == 0 and summary_counts(noop).get("up to date") == 1, noop.text


def status_line(run: Run) -> str:
    lines = [ln for ln in run.lines if TARGET in ln]
    return lines[0] if lines else ""


def expect_seen(root: Path, env: Mapping[str, str], tmp: Path) -> None:
    """``status`` says stale, ``doit build`` rebuilds, and the result is a clean build's."""
    problems: list[str] = []
    status = orch_run(root, ["status"], env)
    if "stale" not in status_line(status):
        problems.append(f"`status` does not call the target stale:\n{status.text}")
    build = doit_run(root, ["build"], env)
    if build.returncode != 0:
        problems.append(f"the build after the edit failed:\n{build.text}")
    elif summary_counts(build).get("up to date", 0):
        problems.append(f"`doit build` called the edited target up to date:\n{build.text}")
    diff = diff_outputs(outputs(root), clean_outputs(root, tmp / "clean", env))
    if diff:
        problems.append(f"the artefacts differ from a clean build:\n{diff}")
    again = orch_run(root, ["status"], env)
    if "up to date" not in status_line(again):
        problems.append(f"`status` after the rebuild:\n{again.text}")
    assert not problems, "\n\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["header", "source"])
def test_same_size_edit_with_restored_mtime_is_rebuilt(tmp_path: Path, kind: str) -> None:
    env = base_env(tmp_path / "cache")
    root = write_files(tmp_path / "proj", tree(f"item1-{kind}"))
    built_and_settled(root, env)
    if kind == "header":
        rewrite_keeping_stat(root / H, b"2.0f", b"3.0f")
    else:
        rewrite_keeping_stat(root / K, b"SCALE * o[1]", b"SCALE + o[1]")
    expect_seen(root, env, tmp_path)


@pytest.mark.slow
def test_same_size_edit_of_a_header_outside_the_tree_is_rebuilt(tmp_path: Path) -> None:
    ext = tmp_path / "ext"
    ext.mkdir()
    (ext / "scale.cuh").write_text(header("2.0"))
    env = {**base_env(tmp_path / "cache"), "CPATH": str(ext)}
    root = write_files(tmp_path / "proj", tree("item1-external", scale_from="<scale.cuh>"))
    built_and_settled(root, env)
    rewrite_keeping_stat(ext / "scale.cuh", b"2.0f", b"3.0f")
    expect_seen(root, env, tmp_path)


@pytest.mark.slow
def test_same_size_edit_of_the_installed_artefact_is_restored(tmp_path: Path) -> None:
    env = base_env(tmp_path / "cache")
    root = write_files(tmp_path / "proj", tree("item1-artefact"))
    built_and_settled(root, env)
    ptx = root / "build" / TARGET / "k.ptx"
    good = ptx.read_bytes()
    rewrite_keeping_stat(ptx, b".entry k", b".entry j")
    expect_seen(root, env, tmp_path)
    assert ptx.read_bytes() == good


def _tar(src: Path, out: Path, mtime: str) -> None:
    argv = ["tar", "--sort=name", f"--mtime={mtime}", "--owner=0", "--group=0", "-cf", str(out)]
    subprocess.run([*argv, "-C", str(src), "kernels", "dodo.py"], check=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tar") is None, reason="tar is not installed")
def test_two_releases_tarred_with_one_mtime_unpacked_one_over_the_other(tmp_path: Path) -> None:
    """Release 2 changes one header by one byte; both tarballs carry the same fixed mtime
    (as SOURCE_DATE_EPOCH builds make them), so every file keeps size and mtime."""
    mtime = "2024-01-01 00:00:00"
    for release, scale in (("r1", "2.0"), ("r2", "3.0")):
        write_files(tmp_path / release, tree("item1-tarballs", scale=scale))
        _tar(tmp_path / release, tmp_path / f"{release}.tar", mtime)
    env = base_env(tmp_path / "cache")
    root = tmp_path / "checkout"
    root.mkdir()
    subprocess.run(["tar", "-xf", str(tmp_path / "r1.tar"), "-C", str(root)], check=True)
    built_and_settled(root, env)
    before = os.stat(root / H)
    subprocess.run(["tar", "-xf", str(tmp_path / "r2.tar"), "-C", str(root)], check=True)
    after = os.stat(root / H)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert b"3.0f" in (root / H).read_bytes()
    expect_seen(root, env, tmp_path)
