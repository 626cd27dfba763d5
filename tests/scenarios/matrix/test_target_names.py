"""Target names a CI matrix row cannot carry, and names too long for the file system
(issue 43, B3 and B8), as a user meets them through the commands.

A row's ``build`` is its doit task names joined by spaces, split at whitespace by the
workflow; each is matched as an fnmatch pattern, and doit reads an argument holding
``=`` as a variable. So ``matrix`` and ``check`` refuse a model, quant or hardware
directory whose name holds whitespace, ``*?[]`` or ``=``: one line naming the
directory, exit 2.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from metrale_orch.cli import main
from tests.support.project import doit, make_project, project_env, use_fake_compiler

RUNNERS = '[runners.cpu]\nlabels = ["cpu"]\ntoolchains = ["nvcc"]\n\n[default]\nrunner = "cpu"\n'


def _project(tmp_path: Path, model: str) -> tuple[Path, dict[str, str]]:
    """The test project with a hopper model directory named ``model``."""
    root = make_project(tmp_path / "proj")
    kernel = f'extern "C" __global__ void odd_k(float* x) {{ x[0] = {len(model)}.0f; }}\n'
    make_project(
        root,
        {
            f"kernels/hopper/{model}/MODEL.toml": "[model]\n",
            f"kernels/hopper/{model}/q/odd.cu": kernel,
            "ci/runners.toml": RUNNERS,
        },
    )
    use_fake_compiler(root, tmp_path / "bin")
    return root, project_env(tmp_path, fake_bin=tmp_path / "bin")


def orch(root: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *args], environ=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("model", "hazard"),
    [("a b", "whitespace"), ("a\tb", "whitespace"), ("c*", "'*'"), ("d?", "'?'"),
     ("e[1]", "'[]'"), ("f=g", "'='")],
)  # fmt: skip
def test_matrix_and_check_refuse_a_name_a_row_cannot_carry(
    tmp_path: Path, model: str, hazard: str
) -> None:
    root, env = _project(tmp_path, model)
    message = (
        f"kernels/hopper/{model}: the directory name holds {hazard}: target "
        f"hopper/{model}/q cannot be named in a matrix row or on doit's command line (a "
        "row's build tasks are split at whitespace, `*?[]` are patterns, `=` is a doit "
        "variable); rename the directory"
    )
    code, out, err = orch(root, env, "matrix")
    assert (code, out, err) == (2, "", f"error: {message}\n")
    code, out, err = orch(root, env, "check")
    assert code == 2, err
    assert f"problem: {message} [target hopper/{model}/q]\n" in err
    assert err.endswith("check: 1 problem in 1 file (1 of 6 targets affected)\n")


def test_plain_names_still_make_rows(tmp_path: Path) -> None:
    root, env = _project(tmp_path, "qwen3-8b_v1.5")
    code, out, err = orch(root, env, "matrix")
    assert code == 0, err
    assert "hopper/qwen3-8b_v1.5/q" in out
    assert orch(root, env, "check")[0] == 0


# ------------------------------------------------------------------- names the tree lacks

LONG = "x" * 300


def test_why_miss_refuses_a_target_the_tree_lacks_as_status_does(tmp_path: Path) -> None:
    """hopper has common files: keying hopper/qwen/nope staged them alone and said "hit"."""
    root, env = _project(tmp_path, "qwen3")
    code, out, err = orch(root, env, "why-miss", "hopper/qwen/nope")
    status = orch(root, env, "status", "hopper/qwen/nope")
    assert (code, out) == (2, "")
    assert (
        err
        == status[2]
        == (
            "error: no target matches 'hopper/qwen/nope' (targets of that hardware: "
            "hopper/qwen/w4, hopper/qwen/w8, hopper/qwen3/q); `metrale-orch status` lists every "
            "target\n"
        )
    )
    assert orch(root, env, "why", "hopper/qwen/nope")[2] == status[2]
    assert not (root / "build/hopper/qwen/nope").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("layout", f"hopper/qwen/{LONG}"),
        ("layout", f"{LONG}/qwen/w4"),
        ("why", f"hopper/{LONG}/w4"),
        ("status", f"hopper/qwen/{LONG}"),
        ("why-miss", f"hopper/qwen/{LONG}"),
        ("size", f"hopper/qwen/{LONG}"),
        ("resources", f"hopper/qwen/{LONG}"),
        ("rdeps", f"kernels/hopper/{LONG}/w4/scale.cu"),
    ],
    ids=lambda args: args[0] if args[0] != "layout" or args[1][0] == "h" else "layout-hw",
)
def test_a_name_too_long_for_a_directory_is_one_line(tmp_path: Path, args: tuple[str, str]) -> None:
    root, env = _project(tmp_path, "qwen3")
    code, _out, err = orch(root, env, *args)
    assert "internal error" not in err and "Traceback" not in err
    if args[0] == "rdeps":  # a file: the tree has none of that name
        assert code == 0
        return
    (line,) = err.splitlines()
    assert code == 2 and line.startswith("error: ") and LONG in line


def test_doit_build_of_a_name_too_long_fails_it_with_the_reason(tmp_path: Path) -> None:
    root, env = _project(tmp_path, "qwen3")
    run = doit(root, [f"build:hopper/qwen/{LONG}"], env)
    assert run.returncode == 2, run.text
    assert "Traceback" not in run.text and "OSError" not in run.text
    assert (
        f"FAILED build:hopper/qwen/{LONG}: not a target: 'hopper/qwen/{LONG}': a directory "
        "name is at most 255 bytes, one here is 300; `doit list` shows every target"
    ) in run.out
