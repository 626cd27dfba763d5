"""Includes beyond the layout (SPEC 3.3.1): cross-model includes, escapes, the mirror."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metrale_orch.steps.staging import beyond_layout, stage
from metrale_orch.tree import Target, discover, resolve_all
from metrale_orch.tree.beyond import TREE_DIR, IncludeMemo, layer_include, quoted_includes
from tests.support.trust import base_env, doit_run, orch_run, write_files

HW = '[hardware]\nvendor = "nvidia"\narch = "sm_121f"\n'
KQUANT = (
    '#include "../../../gb10/qwen/nvfp4/q4k_vendor/mma.cuh"\n'
    '#include <cuda_bf16.h>\n#if 0\n#include "not_anywhere.cuh"\n#endif\n'
    'extern "C" __global__ void kquant(int* o) { o[0] = MMA; }\n'
)


def _tree(root: Path, extra: dict[str, str] | None = None) -> Path:
    files = {
        "kernels/gb10/HARDWARE.toml": HW,
        "kernels/gb10/dsv4/MODEL.toml": "[model]\n",
        "kernels/gb10/dsv4/nvfp4/kquant.cu": KQUANT,
        "kernels/gb10/qwen/MODEL.toml": "[model]\n",
        "kernels/gb10/qwen/nvfp4/gemv.cu": 'extern "C" __global__ void gemv() {}\n',
        "kernels/gb10/qwen/nvfp4/q4k_vendor/mma.cuh": '#pragma once\n#include "sib.cuh"\n',
        "kernels/gb10/qwen/nvfp4/q4k_vendor/sib.cuh": "#define MMA 7\n",
        **(extra or {}),
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_quoted_includes_with_lines_and_forms() -> None:
    text = (
        b'#include "a.h"\n%:include "b.h"\n#inc\\\nlude "c.h"\n'
        b'/* x */ # include "d.h"\n#include <e.h>\n'
    )
    assert quoted_includes(text) == ((1, "a.h"), (2, "b.h"), (3, "c.h"), (4, "d.h"))


def test_cross_model_include_is_found_and_mirrored(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    layout = discover(root, Target.parse("gb10/dsv4/nvfp4"))
    beyond = beyond_layout(root, layout)
    assert beyond.errors == ()
    assert sorted(beyond.files) == [
        "gb10/qwen/nvfp4/q4k_vendor/mma.cuh",
        "gb10/qwen/nvfp4/q4k_vendor/sib.cuh",
    ]
    extra = {rel: path for rel, path in beyond.files.items()}
    staged = stage(layout, tmp_path / "stage", extra)
    assert f"{TREE_DIR}/gb10/qwen/nvfp4/q4k_vendor/mma.cuh" in staged.hashes
    # The module's -I makes the include's own spelling find the mirrored copy.
    inc = layer_include("dsv4/nvfp4", "gb10/dsv4/nvfp4")
    found = (
        tmp_path / "stage/dsv4/nvfp4" / inc / "../../../gb10/qwen/nvfp4/q4k_vendor/mma.cuh"
    ).resolve()
    assert found == (tmp_path / "stage" / TREE_DIR / "gb10/qwen/nvfp4/q4k_vendor/mma.cuh").resolve()
    assert found.read_text() == (root / "kernels/gb10/qwen/nvfp4/q4k_vendor/mma.cuh").read_text()
    # Dropping the include drops the mirror on the next staging.
    staged = stage(layout, tmp_path / "stage", {})
    assert not any(k.startswith(TREE_DIR) for k in staged.hashes)


@pytest.mark.parametrize(
    ("include", "line"),
    [("../../../../outside.cuh", 2), ("ABS", 2)],
    ids=["dotdot", "absolute"],
)
def test_include_escaping_kernels_is_an_error_naming_file_and_line(
    tmp_path: Path, include: str, line: int
) -> None:
    outside = tmp_path / "outside.cuh"
    outside.write_text("#define MMA 1\n")
    spelled = str(outside) if include == "ABS" else include
    root = _tree(
        tmp_path,
        {"kernels/gb10/dsv4/nvfp4/kquant.cu": f'// k\n#include "{spelled}"\n' + KQUANT},
    )
    beyond = beyond_layout(root, discover(root, Target.parse("gb10/dsv4/nvfp4")))
    assert len(beyond.errors) == 1
    err = beyond.errors[0]
    assert (err.where, err.line) == ("kernels/gb10/dsv4/nvfp4/kquant.cu", line)
    assert "outside kernels/" in str(err) and str(err).startswith(
        f"kernels/gb10/dsv4/nvfp4/kquant.cu:{line}:"
    )


def test_an_include_resolving_nowhere_is_left_to_the_compiler(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    beyond = beyond_layout(root, discover(root, Target.parse("gb10/qwen/nvfp4")))
    assert beyond.files == {} and beyond.errors == ()


def test_a_shared_memo_reuses_a_walk_only_where_the_stage_answers_alike(tmp_path: Path) -> None:
    """gb10's common ``k.cu`` includes ``extra.cuh``: gb10 stages none (left to the
    compiler), hopper (inheriting gb10) stages its own, which escapes kernels/. One memo
    across all targets (as ``check`` shares it) gives each target what a fresh one gives,
    so hopper's targets report the escape and gb10's do not."""
    outside = tmp_path / "outside.cuh"
    outside.write_text("#define X 1\n")
    root = _tree(
        tmp_path / "proj",
        {
            "kernels/gb10/common/k.cu": '#include "extra.cuh"\nextern "C" __global__ void k() {}\n',
            "kernels/hopper/HARDWARE.toml": (
                '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\ninherits = "gb10"\n'
            ),
            "kernels/hopper/common/extra.cuh": '#include "../../../../outside.cuh"\n',
            "kernels/hopper/qwen/MODEL.toml": "[model]\n",
        },
    )
    memo = IncludeMemo(root / "kernels", lambda p: p.read_bytes())
    targets = [t for t, _ in resolve_all(root)]
    assert [str(t) for t in targets] == ["gb10/dsv4/nvfp4", "gb10/qwen/nvfp4", "hopper/qwen/nvfp4"]
    escapes = {}
    for target in targets:
        layout = discover(root, target)
        shared, fresh = beyond_layout(root, layout, memo=memo), beyond_layout(root, layout)
        assert shared.files == fresh.files, target
        assert [str(e) for e in shared.errors] == [str(e) for e in fresh.errors], target
        escapes[str(target)] = [e.where for e in shared.errors]
    assert escapes == {
        "gb10/dsv4/nvfp4": [],
        "gb10/qwen/nvfp4": [],
        "hopper/qwen/nvfp4": ["kernels/hopper/common/extra.cuh"],
    }


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
