"""Build readiness and "every view shows why" (SPEC 3.1, 3.7), as a user runs them.

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/tasks/test_readiness.py``.
"""

from __future__ import annotations

from pathlib import Path

from metrale_orch.config import load_config
from metrale_orch.graph.check import check_tree, file_of
from metrale_orch.tasks.dicts import one_line, plan_error_task, plan_skip_task
from tests.support.tasks import HOPPER_HW, NVIDIA, project


def test_check_goes_on_past_a_bad_toolchain_file(tmp_path: Path) -> None:
    root, env = project(
        tmp_path,
        {
            "toolchains/broken.toml": "[toolchain]\n",
            "kernels/hopper/HARDWARE.toml": HOPPER_HW + "not_a_lever = 1\n",
        },
    )
    report = check_tree(root, env, load_config(root, env))
    assert [file_of(p) for p in report.problems] == [
        "kernels/hopper/HARDWARE.toml",
        "toolchains/broken.toml",
    ], report.problems
    assert report.problems[1] == "toolchains/broken.toml: name: is required"


def test_file_of_names_the_file_a_message_starts_with() -> None:
    assert file_of("kernels/h/HARDWARE.toml: [defaults] x") == "kernels/h/HARDWARE.toml"
    assert file_of('kernels/h/m/q/a.cu:12: #include "x"') == "kernels/h/m/q/a.cu"
    assert file_of("kernels/h/m/q/a.cu shadows kernels/h/common/a.cu") == "kernels/h/m/q/a.cu"
    assert file_of("pyproject.toml [tool.metrale-orch]: k: bad") == "pyproject.toml"
    assert file_of("toolchains/x.toml: program: bad") == "toolchains/x.toml"
    assert file_of("hopper/qwen/w4: staging common/x.cu: clash") == ""
    assert file_of("the tree cannot be walked: boom") == ""


def test_error_and_skip_docs_are_one_line() -> None:
    assert one_line("a\n  b \n\nc") == "a b c"
    task = plan_error_task(root=Path("/r"), target="h/m/q", message="first\nsecond")
    assert task["doc"] == "build h/m/q (error: first second)"
    assert "clean" in task
    assert "clean" not in plan_error_task(root=Path("/r"), target="x", message="m", clean=False)
    skip = plan_skip_task(root=Path("/r"), target="h/m/q", reason="no tool", explicit=False)
    assert skip["doc"] == "build h/m/q (skipped: no tool)"


def test_check_lists_a_missing_compiler_and_passes(tmp_path: Path) -> None:
    root, env = project(tmp_path)
    (root / "toolchains/nvcc.toml").unlink()  # the built-in nvcc, not on this PATH
    env = {k: v for k, v in env.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = str(tmp_path / "empty")
    report = check_tree(root, env, load_config(root, env))
    assert report.ok and report.skipping == 5, report
    assert [line.split(" is not installed")[0] for line in report.skipped] == [
        "toolchain 'metal'",
        "toolchain 'nvcc'",
    ]
    assert report.skipped[1].endswith(f"[target {', '.join(NVIDIA)}]")
