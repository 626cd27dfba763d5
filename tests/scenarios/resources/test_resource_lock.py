"""The committed resource baseline: ``kernels.lock`` (metrale_orch.resources.lock) and
``metrale-orch resources --lock`` / ``--check``.

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/resources/test_resource_lock.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale_orch.resources import (
    read_lock,
)
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support.build import make_cache, make_config, write
from tests.support.resources import A, B, _cli

# --- the command on a real build -------------------------------------------------------------


def _probe(sums: int, cap: str = "") -> str:
    """A kernel keeping ``sums`` running sums live across a loop (more: more registers)."""
    return f"""#define SUMS {sums}
extern "C" __global__ void {cap} probe(float* __restrict__ out,
                                      const float* __restrict__ in, int n) {{
    float s[SUMS];
#pragma unroll
    for (int j = 0; j < SUMS; ++j) s[j] = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {{
        const float x = in[i];
#pragma unroll
        for (int j = 0; j < SUMS; ++j) s[j] = fmaf(s[j], x, (float)(j + 1));
    }}
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < SUMS; ++j) acc += s[j] * s[(j * 7 + 3) % SUMS];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}}
"""


#: Forty live sums under a 32-register cap: ptxas spills.
SPILLING = _probe(40, "__maxnreg__(32)")


def _tree(root: Path) -> Path:
    write(root, "kernels/h/HARDWARE.toml", '[hardware]\narch = "sm_90a"\n')
    write(
        root,
        "kernels/h/common/plain.cu",
        'extern "C" __global__ void plain(float* x) { x[threadIdx.x] += 1.0f; }\n',
    )
    write(root, "kernels/h/m/MODEL.toml", "[model]\n")
    for quant in ("a", "b"):
        write(root, f"kernels/h/m/{quant}/probe.cu", _probe(8))
    return root


def _build(root: Path, *targets: str) -> None:
    config = make_config(root, root.parent / "cache")
    cache = make_cache(config)
    for name in targets:
        result = build_target(
            root, Target.parse(name), config=config, cache=cache, environ=_environ()
        )
        assert not result.failed, result.failure_text()


@pytest.fixture(scope="module")
def locked_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree built, and its kernels.lock written by the command."""
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc and ptxas are not installed")
    root = _tree(tmp_path_factory.mktemp("lock") / "tree")
    _build(root, A, B)
    code, out, err = _cli(["--root", str(root), "resources", "--lock"], _environ())
    assert (code, err) == (0, ""), out
    return root


def _environ() -> dict[str, str]:
    return dict(os.environ)


@pytest.fixture
def tree(locked_tree: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the locked tree (its build, lock and cache) to change and rebuild."""
    shutil.copytree(locked_tree.parent, tmp_path / "copy", symlinks=True)
    yield tmp_path / "copy" / "tree"


def _check(root: Path, *extra: str) -> tuple[int, str, str]:
    return _cli(["--root", str(root), "resources", "--check", *extra], _environ())


@pytest.mark.nvcc
def test_lock_written_and_an_unchanged_rebuild_checks_clean(tree: Path) -> None:
    lock = read_lock(tree / "kernels.lock", "kernels.lock")
    assert [t.target for t in lock.targets] == [A, B]
    assert [(k.kernel, k.arch) for k in lock.kernels_of(A)] == [
        ("plain", "sm_90a"),
        ("probe", "sm_90a"),
    ]
    assert all(k.registers > 0 and not k.spills for k in lock.kernels_of(A))
    text = (tree / "kernels.lock").read_text()
    assert '["h/m/a".sm_90a]\nplain = { regs = ' in text

    # Rebuilt from nothing (no build directory, no cache): the same lock checks clean.
    shutil.rmtree(tree / "build")
    shutil.rmtree(tree.parent / "cache")
    _build(tree, A, B)
    code, out, err = _check(tree)
    assert (code, err) == (0, "")
    assert out == "resources --check: 4 kernels of 2 built targets match kernels.lock\n"
    # And --lock of the same build writes the same bytes.
    assert _cli(["--root", str(tree), "resources", "--lock"], _environ())[0] == 0
    assert (tree / "kernels.lock").read_text() == text


@pytest.mark.nvcc
def test_a_kernel_changed_to_spill_fails_the_check_naming_it(tree: Path) -> None:
    write(tree, "kernels/h/m/a/probe.cu", SPILLING)
    _build(tree, A)
    code, out, err = _check(tree)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    spill = [ln for ln in lines if ": new spill: " in ln]
    assert spill == [
        f"{A} probe sm_90a: new spill: spill stores 0 B, loads 0 B → " + spill[0].split(" → ", 1)[1]
    ]
    assert spill[0].split(" → ", 1)[1].startswith("spill stores ")
    assert any(ln.startswith(f"{A} probe sm_90a: new stack frame: stack 0 B → ") for ln in lines)
    assert lines[-1].startswith("resources --check: ") and " problems against kernels.lock" in out
    assert not any(B in ln for ln in lines[:-1])  # the other target is clean

    # The same as a markdown table for a PR comment.
    code, md, _ = _check(tree, "--format", "markdown")
    assert code == 1
    assert "| target | kernel | arch | problem | kernels.lock | this build |" in md
    assert f"| {A} | `probe` | sm_90a | new spill | spill stores 0 B, loads 0 B | spill " in md
    # A check of the other target alone passes.
    assert _check(tree, "h/m/b")[0] == 0


@pytest.mark.nvcc
def test_register_growth_over_the_threshold_fails_and_under_passes(tree: Path) -> None:
    before = {k.kernel: k for k in read_lock(tree / "kernels.lock", "x").kernels_of(B)}["probe"]
    write(tree, "kernels/h/m/b/probe.cu", _probe(16))
    _build(tree, B)
    code, out, _ = _check(tree, "--json")
    (problem,) = json.loads(out)["problems"]
    grown = problem["now"]["registers"] - before.registers
    assert (problem["target"], problem["kernel"], problem["issue"]) == (
        B,
        "probe",
        "register-growth",
    )
    assert code == 1 and grown > 0
    code, out, _ = _check(tree, "--max-register-growth", str(grown - 1))
    (line, _summary) = out.splitlines()
    assert code == 1 and line == (
        f"{B} probe sm_90a: register growth: {before.registers} regs → "
        f"{before.registers + grown} regs (+{grown}, allowed +{grown - 1})"
    )
    code, out, _ = _check(tree, "--max-register-growth", str(grown))
    assert code == 0
    assert out.endswith(
        "; 1 changed within limits (`metrale-orch resources --lock` records them)\n"
    )


@pytest.mark.nvcc
def test_a_kernel_missing_from_the_lock_fails_and_a_partial_lock_adds_it(tree: Path) -> None:
    write(
        tree,
        "kernels/h/m/a/extra.cu",
        'extern "C" __global__ void extra(int* x) { x[threadIdx.x] = 7; }\n',
    )
    write(tree, "kernels/h/m/b/probe.cu", _probe(16))  # B changes too, but is not relocked
    _build(tree, A, B)
    code, out, _ = _check(tree, "h/m/a")
    (line, _summary) = out.splitlines()
    assert code == 1
    assert line.startswith(f"{A} extra sm_90a: not in kernels.lock: absent → regs ")

    before = (tree / "kernels.lock").read_text()
    code, out, err = _cli(["--root", str(tree), "resources", "--lock", "h/m/a"], _environ())
    assert (code, err) == (0, "")
    assert out == "kernels.lock: 5 kernels of 2 targets (3 from this build, 'h/m/a')\n"
    after = (tree / "kernels.lock").read_text()
    b_part = before[before.index('["h/m/b"') :]
    assert after.endswith(b_part)  # B's entries kept as they were
    assert "\nextra = { regs = " in after
    assert _check(tree, "h/m/a")[0] == 0
    assert _check(tree)[0] == 1  # B still grew past its lock


@pytest.mark.nvcc
def test_a_missing_or_malformed_lock_is_one_line_exit_2(tree: Path) -> None:
    lock = tree / "kernels.lock"
    lock.write_text(lock.read_text().replace("regs = ", "regs = -", 1))
    code, out, err = _check(tree)
    assert (code, out) == (2, "")
    assert err.startswith('error: kernels.lock: "h/m/a".sm_90a.plain.regs: expected a whole')
    assert err.count("\n") == 1
    lock.write_text("schema = 1\n[broken\n")
    code, out, err = _check(tree)
    assert (code, out) == (2, "") and err.startswith("error: kernels.lock: not valid TOML: ")
    assert "line 2" in err
    # --lock will not overwrite a file it cannot read (it keeps other targets' entries).
    assert _cli(["--root", str(tree), "resources", "--lock"], _environ())[0] == 2
    lock.unlink()
    code, out, err = _check(tree)
    assert (code, out) == (2, "")
    assert err == (
        "error: kernels.lock: does not exist; after a build, `metrale-orch resources --lock` "
        "writes it (commit it with the kernels)\n"
    )
    code, _, err = _cli(["--root", str(tree), "resources", "--format", "markdown"], _environ())
    assert code == 2 and err == "error: --format goes with --check\n"
    code, _, err = _cli(["--root", str(tree), "resources", "--lock", "--json"], _environ())
    assert code == 2 and err.startswith("error: --lock writes kernels.lock and prints no JSON")
