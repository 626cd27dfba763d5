"""``metrale-orch sass-diff`` on a tree where several targets install the same artefact,
and on a base directory whose files are not what its manifests record (issue 43).

Two targets (``h/m/q``, ``h/m/r``) build the same source for the same arch into
byte-identical PTX, as the targets of one hardware do on a real tree: a change to it is
one change, shown once with both targets. A base whose artefact is missing or edited
after the build is refused (exit 2, one line) rather than compared by its manifest alone.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from metrale_orch.sass import compare_builds
from tests.support.nvcc_tree import built_tree, run_cli

OPS = """\
extern "C" __global__ void scale(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}
"""
TARGETS = ("h/m/q", "h/m/r")

pytestmark = pytest.mark.nvcc


def _tree(root: Path, ops: str) -> Path:
    files = {
        "kernels/h/HARDWARE.toml": '[hardware]\narch = "sm_90a"\n',
        "kernels/h/m/MODEL.toml": "[model]\n",
        "kernels/h/m/q/ops.cu": ops,
        "kernels/h/m/r/ops.cu": ops,
    }
    return built_tree(root, files, TARGETS)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(base tree, changed tree), each built; ``scale`` multiplies once more in the second."""
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc and ptxas are not installed")
    base = _tree(tmp_path_factory.mktemp("base") / "tree", OPS)
    more = OPS.replace("x[i] * 2.0f + 1.0f", "(x[i] * 2.0f + 1.0f) * x[i]")
    changed = _tree(tmp_path_factory.mktemp("changed") / "tree", more)
    return base, changed


def test_one_change_installed_by_two_targets_is_shown_once(trees: tuple[Path, Path]) -> None:
    base, changed = trees
    assert (base / "build/h/m/q/ops.ptx").read_bytes() == (
        base / "build/h/m/r/ops.ptx"
    ).read_bytes()
    environ = dict(os.environ)
    code, out, err = run_cli(changed, ["sass-diff", str(base / "build")], environ)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    counts = [ln for ln in lines if ln.startswith("h/m/")]
    assert counts == ["h/m/q, h/m/r: ops: scale (sm_90a): 1 line changed (+1 -0)"]
    assert sum(ln.startswith("--- ") for ln in lines) == 1
    assert [ln for ln in lines if ln.startswith("+") and not ln.startswith("+++")] == [
        "+FMUL R#, R#, R# ;"
    ]
    assert lines[-1] == (
        f"sass-diff {(base / 'build').as_posix()} → build: 1 kernel changed in 2 targets "
        "(2 modules, 1 disassembled)"
    )

    code, out, _ = run_cli(changed, ["sass-diff", str(base / "build"), "--json"], environ)
    (change,) = json.loads(out)["changes"]
    assert (change["target"], change["targets"], change["kernel"]) == (
        "h/m/q",
        list(TARGETS),
        "scale",
    )
    assert code == 1


@pytest.mark.parametrize("damage", ["edited", "missing"])
def test_a_base_whose_files_are_not_its_manifests_is_refused(
    trees: tuple[Path, Path], tmp_path: Path, damage: str
) -> None:
    """The base is a copy of this very build, one artefact then damaged: by the manifests
    alone nothing changed; by the files, the base is not the build it says it is."""
    root, _ = trees
    copy = tmp_path / "copy"
    shutil.copytree(root / "build", copy)
    ptx = copy / "h/m/r/ops.ptx"
    if damage == "edited":
        ptx.write_text(ptx.read_text() + "// edited after the build\n")
    else:
        ptx.unlink()
    environ = dict(os.environ)
    code, out, err = run_cli(root, ["sass-diff", str(copy)], environ)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "Traceback" not in err
    shown = copy.as_posix()
    assert err.startswith(
        f"error: sass-diff: {shown}/h/m/r/ops.ptx, listed in {shown}/h/m/r/manifest.json, "
        + ("is missing" if damage == "missing" else "is not the bytes")
    )
    assert "copy it again whole, or rebuild it" in err
    from metrale_orch.sass import ArtefactMismatch  # here: the test must fail on the output

    with pytest.raises(ArtefactMismatch):
        compare_builds(root, copy, root / "build", None, environ)
