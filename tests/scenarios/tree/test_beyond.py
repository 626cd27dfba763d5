"""Includes beyond the layout (SPEC 3.3.1): cross-model includes, escapes, the mirror.

These are the tests of this topic that start processes; the others are in
``tests/unit/tree/test_beyond.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.tree import KQUANT, _tree
from tests.support.trust import base_env, doit_run, orch_run, write_files

# ------------------------------------------------------------------------------ real builds


@pytest.mark.nvcc
def test_cross_model_include_builds_is_an_input_and_is_keyed(tmp_path: Path) -> None:

    root = _tree(tmp_path / "proj")
    write_files(root, {})  # the one-line dodo.py
    env = base_env(tmp_path / "cache")
    first = doit_run(root, ["build:gb10/dsv4/nvfp4"], env)
    assert first.returncode == 0, first.text
    ptx = root / "build/gb10/dsv4/nvfp4/kquant.ptx"
    assert "%r1, 7;" in ptx.read_text()
    assert doit_run(root, ["build:gb10/dsv4/nvfp4"], env).returncode == 0
    # The header two models away is an input: editing it makes the target stale, and the
    # cache (keyed by its content) does not serve the old artefact.
    sib = root / "kernels/gb10/qwen/nvfp4/q4k_vendor/sib.cuh"
    sib.write_text("#define MMA 9\n")
    why = orch_run(root, ["why", "gb10/dsv4/nvfp4"], env)
    assert "kernels/gb10/qwen/nvfp4/q4k_vendor/sib.cuh" in why.text, why.text
    again = doit_run(root, ["build:gb10/dsv4/nvfp4"], env)
    assert again.returncode == 0, again.text
    assert "%r1, 9;" in ptx.read_text()
    rdeps = orch_run(root, ["rdeps", "kernels/gb10/qwen/nvfp4/q4k_vendor/sib.cuh"], env)
    assert "gb10/dsv4/nvfp4" in rdeps.text, rdeps.text


def test_escaping_include_fails_the_build_naming_file_and_line(tmp_path: Path) -> None:

    (tmp_path / "outside.cuh").write_text("#define MMA 1\n")
    root = _tree(
        tmp_path / "proj",
        {"kernels/gb10/dsv4/nvfp4/kquant.cu": '#include "../../../../../outside.cuh"\n' + KQUANT},
    )
    write_files(root, {})
    run = doit_run(root, ["build:gb10/dsv4/nvfp4"], base_env(tmp_path / "cache"))
    assert run.returncode == 2, run.text
    assert "kernels/gb10/dsv4/nvfp4/kquant.cu:1:" in run.text and "outside kernels/" in run.text
    assert "Traceback" not in run.text


@pytest.mark.nvcc
def test_modules_that_reach_nothing_beyond_keep_their_keys(tmp_path: Path) -> None:
    """Only the module that includes across models gets the extra -I in its key: its
    siblings share keys (and cache entries) with the same module of other targets."""

    root = _tree(
        tmp_path / "proj",
        {"kernels/gb10/common/plain.cu": 'extern "C" __global__ void plain(int* o) { *o = 1; }\n'},
    )
    write_files(root, {})
    run = doit_run(root, ["build"], base_env(tmp_path / "cache"))
    assert run.returncode == 0, run.text

    def keys(target: str) -> dict[str, str]:
        doc = json.loads((root / "build" / target / "manifest.json").read_text())
        return {m["name"]: m["key"] for m in doc["modules"]}

    dsv4, qwen = keys("gb10/dsv4/nvfp4"), keys("gb10/qwen/nvfp4")
    assert dsv4["plain"] == qwen["plain"]
