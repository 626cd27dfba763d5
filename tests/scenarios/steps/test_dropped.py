"""Shadow drops (SPEC 3.3.2, 4.1 ``shadowed_dropped``): the scan, the exemptions, the build.

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/steps/test_dropped.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from metrale_orch.steps.dropped import (
    entry_points,
)
from metrale_orch.steps.errors import BuildConfigError
from metrale_orch.steps.target import build_target
from tests.support.build import (
    compiles,
    fake_toolchain_env,
    make_cache,
    make_config,
    small_tree,
    write,
)
from tests.support.project import DoitRun, doit
from tests.support.steps import COMMON_SCALE, LEAF_TOML, T, _fork_tree


def _build(root: Path, tmp_path: Path) -> tuple[object, dict[str, object], list[str]]:
    env = fake_toolchain_env(tmp_path / "fakebin", tmp_path / "fake.log")
    config = make_config(root, tmp_path / "cache")
    result = build_target(root, T, config=config, cache=make_cache(config), environ=env)
    assert not result.failed, result.failure_text()
    manifest = json.loads((root / result.manifest).read_text())
    return result, manifest, list(result.warnings)


DROP_WARNING = (
    "hw1/m1/q1: module scale_q1 drops kernel scale_fast: kernels/hw1/m1/q1/scale.cu replaces "
    "kernels/hw1/common/scale.cu, which defines it; if intended, list it in a KERNEL.toml: "
    '[shadow_exempt] scale_q1 = ["scale_fast"]'
)


def test_a_build_records_drops_in_the_manifest_and_warns(tmp_path: Path) -> None:
    root = _fork_tree(tmp_path / "repo")
    _result, manifest, warnings = _build(root, tmp_path)
    assert manifest["shadowed_dropped"] == [["scale_q1", "scale_fast"]]
    assert warnings == [DROP_WARNING]


def test_no_drops_is_an_empty_list(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "repo")
    _result, manifest, warnings = _build(root, tmp_path)
    assert manifest["shadowed_dropped"] == []
    assert warnings == []


def test_exemptions_silence_the_warning_not_the_record(tmp_path: Path) -> None:
    # Exempted in the common KERNEL.toml, under the module's (renamed) name.
    common_toml = (
        '[build]\nextra_nvcc_flags = ["-DB=1", "-DA=1"]\n[modules]\nadd = "vector_add"\n'
        '[shadow_exempt]\nscale_q1 = ["scale_fast"]\n'
    )
    root = _fork_tree(tmp_path / "repo", extra={"kernels/hw1/common/KERNEL.toml": common_toml})
    _result, manifest, warnings = _build(root, tmp_path)
    assert manifest["shadowed_dropped"] == [["scale_q1", "scale_fast"]]
    assert warnings == []


def test_an_exemption_by_stem_is_not_one_by_module(tmp_path: Path) -> None:
    root = _fork_tree(tmp_path / "repo", LEAF_TOML + '[shadow_exempt]\nscale = ["scale_fast"]\n')
    _result, _manifest, warnings = _build(root, tmp_path)
    assert warnings == [DROP_WARNING]


def test_a_malformed_exemption_fails_before_any_compile(tmp_path: Path) -> None:
    root = _fork_tree(tmp_path / "repo", LEAF_TOML + "[shadow_exempt]\nscale_q1 = [1]\n")
    env = fake_toolchain_env(tmp_path / "fakebin", tmp_path / "fake.log")
    config = make_config(root, tmp_path / "cache")
    with pytest.raises(BuildConfigError) as ei:
        build_target(root, T, config=config, cache=make_cache(config), environ=env)
    assert str(ei.value) == (
        "kernels/hw1/m1/q1/KERNEL.toml: [shadow_exempt] scale_q1[0]: "
        "must be a kernel name (an identifier), got int 1"
    )
    assert (ei.value.path, ei.value.key) == (
        "kernels/hw1/m1/q1/KERNEL.toml",
        "[shadow_exempt] scale_q1[0]",
    )
    assert compiles(tmp_path / "fake.log") == []


def test_a_fork_including_its_namesake_drops_nothing_and_edits_are_seen(tmp_path: Path) -> None:
    # The leaf's ../../common include resolves against this target's staged common/.
    root = _fork_tree(tmp_path / "repo")
    write(
        root,
        "kernels/hw1/m1/q1/scale.cu",
        '#include "../../common/scale_impl.cuh"\nextern "C" __global__ void scale() {}\n'
        "#define SCALE_FAST scale_fast\n",
    )
    _result, manifest, warnings = _build(root, tmp_path)
    assert manifest["shadowed_dropped"] == [] and warnings == []
    # The common file gains a kernel: the next build drops it.
    write(root, "kernels/hw1/common/scale.cu", COMMON_SCALE + "__global__ void scale_v2() {}\n")
    _result, manifest, warnings = _build(root, tmp_path)
    assert manifest["shadowed_dropped"] == [["scale_q1", "scale_v2"]]
    assert [w.split(": ")[1] for w in warnings] == ["module scale_q1 drops kernel scale_v2"]


def test_a_build_follows_the_compile_include_flags(tmp_path: Path) -> None:
    root = _fork_tree(
        tmp_path / "repo",
        LEAF_TOML.replace('"-DC=1"', '"-Iinc", "-DC=1"'),
    )
    write(root, "kernels/hw1/m1/q1/scale.cu", '#include "fast.cuh"\n__global__ void scale() {}\n')
    write(root, "kernels/hw1/m1/q1/inc/fast.cuh", "__global__ void scale_fast() {}\n")
    _result, manifest, warnings = _build(root, tmp_path)
    assert manifest["shadowed_dropped"] == [] and warnings == []


# ------------------------------------------------------------------------------------ doit build


def _add_drop(root: Path) -> None:
    """A leaf ``add.cu`` in hopper/qwen/w8 that drops the common one (declared a shadow)."""
    k = root / "kernels"
    (k / "hopper/qwen/w8/add.cu").write_text('extern "C" __global__ void add_leaf() {}\n')
    (k / "hopper/qwen/w8/KERNEL.toml").write_text('[shadow]\nadd = "leaf variant"\n')


def _warnings(run: DoitRun) -> list[str]:
    return sorted(ln for ln in run.out.splitlines() if ln.startswith("warning: "))


def _drop(target: str) -> str:
    return (
        f"warning: {target}: module add drops kernel add_k: kernels/hopper/qwen/w8/add.cu "
        "replaces kernels/hopper/common/add.cu, which defines it; if intended, list it in a "
        'KERNEL.toml: [shadow_exempt] add = ["add_k"]'
    )


def test_doit_build_shows_the_drop_warning_and_the_exemption_silences_it(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    _add_drop(root)
    first = doit(root, ["build"], env)
    assert first.returncode == 0, first.text
    # gb10/qwen/w8 takes the parent's leaf add.cu over the parent's common add.cu.
    assert _warnings(first) == [_drop("gb10/qwen/w8"), _drop("hopper/qwen/w8")]
    for target in ("gb10/qwen/w8", "hopper/qwen/w8"):
        manifest = json.loads((root / "build" / target / "manifest.json").read_text())
        assert manifest["shadowed_dropped"] == [["add", "add_k"]]
    w4 = json.loads((root / "build/hopper/qwen/w4/manifest.json").read_text())
    assert w4["shadowed_dropped"] == []

    # A typo of the table is named; the drop still warns.
    common = root / "kernels/hopper/common/KERNEL.toml"
    common.write_text('[shadow_exmpt]\nadd = ["add_k"]\n')
    typo = doit(root, ["build"], env)
    assert typo.returncode == 0, typo.text
    assert (
        "warning: kernels/hopper/common/KERNEL.toml: [shadow_exmpt]: unknown table, did you "
        "mean `[shadow_exempt]`? (it is ignored)"
    ) in _warnings(typo)
    assert _drop("hopper/qwen/w8") in _warnings(typo)

    common.write_text('[shadow_exempt]\nadd = ["add_k"]\n')
    exempt = doit(root, ["build"], env)
    assert exempt.returncode == 0, exempt.text
    assert _warnings(exempt) == []
    manifest = json.loads((root / "build/hopper/qwen/w8/manifest.json").read_text())
    assert manifest["shadowed_dropped"] == [["add", "add_k"]]

    common.write_text('[shadow_exempt]\nadd = "add_k"\n')
    bad = doit(root, ["build:hopper/qwen/w8"], env)
    assert bad.returncode == 2, bad.text
    assert (
        "kernels/hopper/common/KERNEL.toml: [shadow_exempt] add: must be an array of kernel names"
    ) in bad.out
    assert "Traceback" not in bad.text


# ------------------------------------------------------------------------------------ real nvcc


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_scan_finds_the_entry_points_nvcc_emits(tmp_path: Path) -> None:
    """Every indirection the scan understands, against the compiler's own reading."""
    write(
        tmp_path,
        "body.cuh",
        "#define PAGED_CONCAT_(a, b) a##b\n#define PAGED_CONCAT(a, b) PAGED_CONCAT_(a, b)\n"
        'extern "C" __global__ void KERNEL_NAME(float* x) { x[0] = 1.0f; }\n'
        'extern "C" __global__ void __launch_bounds__(128) PAGED_CONCAT(KERNEL_NAME, _64)'
        "(float* x) { x[0] = 2.0f; }\n",
    )
    src = write(
        tmp_path,
        "r.cu",
        '#define ALIAS attn_fp8\n#define KERNEL_NAME ALIAS\n#include "body.cuh"\n'
        "#define INST(K) \\\n"
        '    extern "C" __global__ void wy##K(float* o) { o[0] = K; }\n'
        "INST(5)\nINST(16)\n"
        'extern "C" __global__\nvoid plain(int n) {}\n',
    )
    out = tmp_path / "r.ptx"
    subprocess.run(
        ["nvcc", "--ptx", "-arch=sm_90a", "-O3", str(src), "-o", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    emitted = sorted(re.findall(r"\.entry (\w+)\(", out.read_text()))
    texts = {p.name: p.read_text() for p in tmp_path.glob("*.cu*")}
    assert emitted == ["attn_fp8", "attn_fp8_64", "plain", "wy16", "wy5"]
    assert sorted(entry_points("r.cu", texts.get)) == emitted
