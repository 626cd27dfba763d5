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
from tests.support.project import make_project, project_env, use_fake_compiler

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
