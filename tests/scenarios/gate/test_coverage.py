"""The release gate's coverage check (metrale_orch.gate) and ``metrale-orch coverage``.

Real tools: one small tree (one target ``hw/m/q`` for sm_90a, three common modules, one
renamed by KERNEL.toml, a family file and a fusion file naming their kernels) is built
once with nvcc; each test copies the built project, seeds one defect (editing and
rebuilding only what it needs: the local cache serves every unchanged module) and runs
the real ptxas. The parsers, the PTX ISA table and the setting are checked on values.

The tests of this topic that run in-process are in ``tests/unit/gate/test_coverage.py``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from metrale_orch.cli import main
from metrale_orch.config import load_config
from metrale_orch.gate import (
    CACHE_NAME,
    check_coverage,
)
from metrale_orch.paths import STATE_DIR
from metrale_orch.resources import PtxasMissing
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support import REPO
from tests.support.build import make_cache, make_config
from tests.support.gate import FAMILIES, TREE, _cli
from tests.support.trust import doit_run, write_files

TARGET = "hw/m/q"


def _tools() -> None:
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc and ptxas are not installed")


def _build(root: Path, cache_dir: Path) -> None:
    config = make_config(root, cache_dir)
    result = build_target(
        root,
        Target.parse(TARGET),
        config=config,
        cache=make_cache(config),
        environ=dict(os.environ),
    )
    assert not result.failed, result.failure_text()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the built project, the local cache that holds its modules)."""
    _tools()
    tmp = tmp_path_factory.mktemp("coverage")
    root = write_files(tmp / "proj", TREE)
    _build(root, tmp / "cache")
    return root, tmp / "cache"


@pytest.fixture
def project(built: tuple[Path, Path], tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A private copy of the built project (its build directory too) and the shared cache."""
    root, cache = built
    copy = tmp_path / "proj"
    shutil.copytree(root, copy)
    yield copy, cache


def _check(root: Path, environ: Mapping[str, str] | None = None) -> list[str]:
    got = check_coverage(load_config(root, {}), None, dict(environ or os.environ))
    return [p.line() for p in got.report.problems]


# --- the seeded defects, on a real build ----------------------------------------------------


@pytest.mark.nvcc
def test_a_clean_tree_passes_and_ptxas_answers_are_cached(project: tuple[Path, Path]) -> None:
    root, _ = project
    (root / "build" / STATE_DIR / CACHE_NAME).unlink(missing_ok=True)
    first = check_coverage(load_config(root, {}), None, dict(os.environ))
    assert first.report.problems == () and first.report.unchecked == ()
    assert (first.report.targets, first.report.modules, first.report.named) == (1, 3, 4)
    assert (first.ptxas_runs, first.cache_hits) == (3, 0)
    code, out, err = _cli(root)
    assert (code, err) == (0, "")
    assert out == (
        "coverage: no problem; 1 target, 3 modules, 4 named kernels checked, 0 unchecked; "
        "0 ptxas runs, 3 from the cache (build/.state)\n"
    )
    code, out, _ = _cli(root, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["problems"] == [] and doc["modules"] == 3
    assert list(doc) == sorted(doc)


@pytest.mark.nvcc
def test_a_family_kernel_no_module_exports_and_a_module_no_target_builds(
    project: tuple[Path, Path],
) -> None:
    root, _ = project
    write_files(
        root,
        {
            FAMILIES: TREE[FAMILIES]
            + '[[family]]\nname = "verify"\nkernels = ["attn::attn_verify", "ghost::spectre"]\n'
        },
    )
    code, out, _ = _cli(root)
    assert code == 1
    assert out.splitlines()[:2] == [
        "hw: ghost: named by kernels/hw/common/KERNEL_FAMILIES.toml (spectre), but no target "
        "of hw builds it",
        "hw/m/q: attn: kernel attn_verify (named by kernels/hw/common/KERNEL_FAMILIES.toml) "
        "is not exported (exports: attn_decode, attn_prefill)",
    ]
    assert out.splitlines()[2].startswith("coverage: 2 problems; 1 target, 3 modules")


@pytest.mark.nvcc
def test_lists_of_an_inherited_common_layer_apply_to_the_child(project: tuple[Path, Path]) -> None:
    root, cache = project
    write_files(
        root,
        {
            "kernels/kid/HARDWARE.toml": '[hardware]\ninherits = "hw"\narch = "sm_90a"\n',
            "kernels/kid/m/MODEL.toml": "[model]\n",
            "kernels/kid/common/FUSIONS.toml": (
                '[[rule]]\nkernels = [{ module = "ghost", func = "g" }]\n'
            ),
            FAMILIES: TREE[FAMILIES] + '[[family]]\nkernels = ["attn::attn_verify"]\n',
        },
    )
    config = make_config(root, cache)
    result = build_target(
        root,
        Target.parse("kid/m/q"),
        config=config,
        cache=make_cache(config),
        environ=dict(os.environ),
    )
    assert not result.failed, result.failure_text()
    missing = "is not exported (exports: attn_decode, attn_prefill)"
    assert _check(root) == [
        "hw/m/q: attn: kernel attn_verify (named by kernels/hw/common/KERNEL_FAMILIES.toml) "
        + missing,
        "kid: ghost: named by kernels/kid/common/FUSIONS.toml (g), but no target of kid builds it",
        "kid/m/q: attn: kernel attn_verify (named by kernels/hw/common/KERNEL_FAMILIES.toml) "
        + missing,
    ]


@pytest.mark.nvcc
def test_a_fusion_kernel_compiled_without_extern_c(project: tuple[Path, Path]) -> None:
    root, cache = project
    write_files(
        root,
        {"kernels/hw/common/norm.cu": "__global__ void rmsnorm(float* x) { x[0] *= 0.5f; }\n"},
    )
    _build(root, cache)
    assert _check(root) == [
        "hw/m/q: norm: kernel rmsnorm (named by kernels/hw/common/FUSIONS.toml) is exported "
        'only as the C++ name _Z7rmsnormPf: declare it extern "C"'
    ]


@pytest.mark.nvcc
def test_an_entry_exported_by_two_modules(project: tuple[Path, Path]) -> None:
    root, cache = project
    write_files(
        root,
        {"kernels/hw/common/dup.cu": 'extern "C" __global__ void rmsnorm(float* x) { }\n'},
    )
    _build(root, cache)
    assert _check(root) == [
        "hw/m/q: norm: exports rmsnorm, as dup does: a loader looking it up by name could "
        "get either"
    ]


@pytest.mark.nvcc
def test_a_leaf_whose_flags_retarget_it(project: tuple[Path, Path]) -> None:
    root, cache = project
    write_files(
        root, {"kernels/hw/m/q/KERNEL.toml": '[build]\nextra_nvcc_flags = ["-arch=sm_100a"]\n'}
    )
    _build(root, cache)
    assert _check(root) == [
        f"hw/m/q: {m}: build/hw/m/q/{m}.ptx: built for sm_100a, the hardware's arch is sm_90a"
        for m in ("attn", "norm", "rope_kernel")
    ]


@pytest.mark.nvcc
def test_min_cuda_older_than_the_toolkit(project: tuple[Path, Path]) -> None:
    root, _ = project
    write_files(root, {"pyproject.toml": '[tool.metrale-orch.deploy.hw]\nmin_cuda = "12.8"\n'})
    code, out, _ = _cli(root)
    assert code == 1
    assert out.splitlines()[:3] == [
        f"hw/m/q: {m}: PTX ISA 9.0 needs a CUDA 13.0 driver or newer, the deployment's "
        "minimum is CUDA 12.8: build with a CUDA 12.8 toolkit (or older) or raise min_cuda "
        "(deploy.hw.min_cuda)"
        for m in ("attn", "norm", "rope_kernel")
    ]
    write_files(root, {"pyproject.toml": '[tool.metrale-orch.deploy.hw]\nmin_cuda = "13.0"\n'})
    assert _cli(root)[0] == 0
    # A table naming no hardware of the tree: one line naming the file and the key.
    write_files(root, {"pyproject.toml": '[tool.metrale-orch.deploy.hoper]\nmin_cuda = "13.0"\n'})
    assert _cli(root) == (
        2,
        "",
        "error: pyproject.toml [tool.metrale-orch]: deploy.hoper: no hardware 'hoper' in "
        "kernels/ (hardware: hw)\n",
    )


@pytest.mark.nvcc
def test_a_ptx_that_ptxas_refuses(project: tuple[Path, Path]) -> None:
    root, _ = project
    ptx = root / "build" / "hw" / "m" / "q" / "norm.ptx"
    text = ptx.read_text()
    assert "st.global.f32" in text
    ptx.write_text(text.replace("st.global.f32", "bogus.op.f32", 1))
    (problem,) = _check(root)
    assert problem.startswith(
        "hw/m/q: norm: build/hw/m/q/norm.ptx: ptxas -arch=sm_90a refuses it: ptxas line "
    )
    assert "error : Not a name of any known instruction: 'bogus'" in problem
    assert str(root) not in problem
    # The answer is cached: the same line again without ptxas.
    got = check_coverage(load_config(root, {}), None, dict(os.environ))
    assert (got.ptxas_runs, [p.line() for p in got.report.problems]) == (0, [problem])


@pytest.mark.nvcc
def test_missing_artefacts_an_unbuilt_target_and_a_missing_ptxas(
    project: tuple[Path, Path], tmp_path: Path
) -> None:
    root, _ = project
    (root / "build" / "hw" / "m" / "q" / "rope_kernel.ptx").unlink()
    (root / "build" / "hw" / "m" / "q" / "norm.ptx").write_bytes(b"\0garbage")
    assert _check(root) == [
        "hw/m/q: norm: build/hw/m/q/norm.ptx: unreadable artefact: no .target directive: "
        "not a PTX module",
        "hw/m/q: rope_kernel: artefact build/hw/m/q/rope_kernel.ptx cannot be read (No such "
        "file or directory); rebuild the target",
    ]
    # nvcc found on PATH without its ptxas: what to install, exit 1.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvcc = shutil.which("nvcc")
    assert nvcc is not None
    (bin_dir / "nvcc").symlink_to(nvcc)
    environ = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    (root / "build" / STATE_DIR / CACHE_NAME).unlink(missing_ok=True)
    with pytest.raises(PtxasMissing, match="install the full CUDA toolkit"):
        _check(root, environ)
    shutil.rmtree(root / "build" / "hw")
    assert _check(root) == ["hw/m/q: (target): not built (no build/hw/m/q/manifest.json)"]


@pytest.mark.nvcc
def test_a_target_the_build_skips_here_is_listed_unchecked(project: tuple[Path, Path]) -> None:
    root, _ = project
    write_files(
        root,
        {
            "kernels/mac/HARDWARE.toml": '[hardware]\nvendor = "apple"\narch = "metal3.1"\n',
            "kernels/mac/m/MODEL.toml": "[model]\n",
            "kernels/mac/m/q/k.metal": "kernel void k(device float* x) { x[0] = 1; }\n",
        },
    )
    environ = {
        **os.environ,
        "PATH": os.pathsep.join(
            p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "xcrun").exists()
        ),
    }
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), "coverage"], environ=environ, out=out, err=err)
    assert (code, err.getvalue()) == (0, "")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        "mac/m/q: unchecked: not built here: toolchain 'metal' is not installed"
    )
    assert lines[1].startswith("coverage: no problem; 1 target, 3 modules, 4 named kernels")
    assert "1 unchecked" in lines[1]


@pytest.mark.nvcc
def test_doit_coverage_builds_first(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, cache = built
    fresh = write_files(tmp_path / "proj", TREE)
    env = {**os.environ, "METRALE_ORCH_LOCAL_CACHE": str(cache)}
    run = doit_run(fresh, ["coverage"], env)
    assert run.returncode == 0, run.text
    assert (fresh / "build" / "hw" / "m" / "q" / "manifest.json").is_file()
    assert "coverage: no problem; 1 target, 3 modules" in run.out
    write_files(fresh, {FAMILIES: '[[family]]\nkernels = ["attn::attn_gone"]\n'})
    run = doit_run(fresh, ["coverage"], env)
    assert run.returncode == 1, run.text
    assert "hw/m/q: attn: kernel attn_gone (named by" in run.out


def test_a_bad_family_file_is_one_line_exit_2(tmp_path: Path) -> None:
    root = write_files(tmp_path, {**TREE, FAMILIES: '[[family]]\nkernels = ["attn"]\n'})
    assert _cli(root) == (
        2,
        "",
        "error: kernels/hw/common/KERNEL_FAMILIES.toml: family[0].kernels[0]: 'attn' is not "
        "a module name and a function name (module::function, the module as it is built: "
        "after [modules] renames)\n",
    )
    write_files(root, {FAMILIES: "[[family]\n"})
    code, out, err = _cli(root)
    assert (code, out) == (2, "")
    assert err.startswith("error: kernels/hw/common/KERNEL_FAMILIES.toml: (file): cannot be read")


# --- the workflow's release gate step, run as a runner runs it ------------------------------


@pytest.mark.nvcc
def test_the_workflow_s_release_gate_step_runs_on_a_built_hardware(
    project: tuple[Path, Path], tmp_path: Path
) -> None:
    """The build job's "Release gate" step (ci/github/kernels.yml), its script run by bash
    in a built project: coverage, resources --check against a kernels.lock and size, each
    into the job summary; a problem in one fails the step after all three ran."""
    import yaml

    root, _cache = project
    workflow = yaml.safe_load((REPO / "ci/github/kernels.yml").read_text())
    (step,) = [s for s in workflow["jobs"]["build"]["steps"] if s.get("name") == "Release gate"]
    assert step["env"] == {"HW": "${{ matrix.hw }}"}
    assert main(["--root", str(root), "resources", "--lock"], environ=os.environ) == 0
    summary = tmp_path / "summary.md"
    bindir = str(Path(sys.executable).parent)  # metrale-orch, as the job's install puts it
    env = {**os.environ, "HW": "hw", "GITHUB_STEP_SUMMARY": str(summary)}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"

    def gate() -> tuple[int, str]:
        summary.write_text("")
        done = subprocess.run(["bash", "-c", step["run"]], cwd=root, env=env, check=False)
        return done.returncode, summary.read_text()

    code, text = gate()
    assert code == 0, text
    assert text.startswith("### Release gate: hw\n")
    assert "coverage: no problem" in text and "match kernels.lock" in text
    assert "### Installed size" in text
    lock = root / "kernels.lock"
    lock.write_text(lock.read_text().replace("attn_decode = ", "# attn_decode = "))
    code, text = gate()
    assert code == 1
    assert "attn_decode" in text and "### Installed size" in text  # the size report ran too
