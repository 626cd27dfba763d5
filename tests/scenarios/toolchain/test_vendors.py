"""SPEC 3.3: every vendor's compiler, driven as the reference build drives it.

nvcc runs for real where the machine has it; SCALE, hipcc and xcrun are not
installed here, so each is a fake compiler (a Python script on a private PATH,
in a fake SCALE root, or named by ``$METRALE_HIPCC``) that logs its argv, its
working directory and the text of every file it read, answers ``--version`` and
a clang driver's ``-###``, follows quoted includes like a preprocessor (next to
the including file, then the ``-I`` directories), writes the dependency list of
``-MD -MF`` and an artefact holding the source it was handed. The tests assert
the exact command lines and the text the compiler was handed.

The tests of this topic that run in-process are in ``tests/unit/toolchain/test_vendors.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import xxhash

from metrale_orch.steps.errors import ToolchainError, ToolchainMissing
from metrale_orch.steps.hip_mirror import (
    MIRROR_DIR,
)
from metrale_orch.steps.plan import plan_target
from metrale_orch.steps.results import TargetResult
from metrale_orch.steps.target import build_target
from metrale_orch.toolchain.definitions import builtin_toolchains, load_toolchains
from metrale_orch.toolchain.locate import find_program
from metrale_orch.toolchain.probe import (
    find_toolchain,
    probe_toolchain,
)
from metrale_orch.toolchain.stamps import toolchain_stamp
from metrale_orch.tree import Target, discover
from tests.support import REPO
from tests.support.build import (
    compiles,
    fake_toolchain_env,
    make_cache,
    make_config,
    small_tree,
    write,
)
from tests.support.toolchain import (
    _HIP,
    _needs_no_system_install,
    _sample,
    _script,
    fake_compiler,
    scale_root,
)


def logged(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def _tree_digest(folder: Path) -> str:
    h = xxhash.xxh3_128()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _normalise(argv: list[str], entry: dict[str, Any]) -> list[str]:
    """``argv`` with its temporary compile directory spelled ``<tmp>`` (absolute, or
    relative to the compile's cwd as the depfile argument is)."""
    out_arg = next(a for a in argv if a.endswith((".co", ".o", ".air", ".metallib", ".ptx")))
    tmp = os.path.dirname(out_arg)
    rel = os.path.relpath(tmp, entry["cwd"])
    return [a.replace(tmp, "<tmp>").replace(rel, "<tmp>") for a in argv]


def _build(root: Path, target: str, env: Mapping[str, str], **config: Any) -> TargetResult:
    settings = make_config(
        root, root.parent / "cache", build_dir=str(root.parent / "build"), **config
    )
    return build_target(
        root, Target.parse(target), config=settings, cache=make_cache(settings), environ=env
    )


# ------------------------------------------------------------------------------ nvcc


def test_nvcc_command_line_strict_and_extra_flags(tmp_path: Path) -> None:
    """``--ptx -arch -O3 <E> --Werror all-warnings <$METRALE_EXTRA_NVCC_FLAGS> <src> -o``;
    ``METRALE_KERNEL_NO_STRICT=1`` drops the strict pair; both change the keys."""
    root = small_tree(tmp_path / "proj")
    log = tmp_path / "nvcc.log"
    env = fake_toolchain_env(tmp_path / "bin", log)
    first = _build(root, "hw1/m1/q1", env)
    by_entry = {c["argv"][c["argv"].index("-o") - 1]: c for c in compiles(log)}
    leaf = by_entry["leaf.cu"]["argv"]  # the fake logs its arguments, not its own path
    assert leaf[: leaf.index("-o")] == [
        "--ptx", "-arch=sm_90a", "-O3",
        "-DA=1", "-DX", "-DB=1", "-DC=1", "-I.", "--Werror", "all-warnings", "leaf.cu",
    ]  # fmt: skip
    assert leaf[-1].startswith("-Xcompiler=-MD,-MF,")

    log.unlink()
    loose = {**env, "METRALE_KERNEL_NO_STRICT": "1", "METRALE_EXTRA_NVCC_FLAGS": "-DE=1 '-DS=a b'"}
    second = _build(root, "hw1/m1/q1", loose)
    leaf = next(c["argv"] for c in compiles(log) if "leaf.cu" in c["argv"])
    assert leaf[: leaf.index("-o")] == [
        "--ptx", "-arch=sm_90a", "-O3",
        "-DA=1", "-DX", "-DB=1", "-DC=1", "-I.", "-DE=1", "-DS=a b", "leaf.cu",
    ]  # fmt: skip
    # Part of every key of the targets they change: nothing came from the cache.
    assert {m.outcome for m in second.modules} == {"compiled"}
    assert not {m.key for m in first.modules} & {m.key for m in second.modules}
    # "0" keeps the strict flags: the same keys as unset.
    third = _build(root, "hw1/m1/q1", {**env, "METRALE_KERNEL_NO_STRICT": "0"})
    assert [m.key for m in third.modules] == [m.key for m in first.modules]
    assert {m.outcome for m in third.modules} == {"local"}


def test_path_embedding_extra_flags_make_keys_checkout_specific(tmp_path: Path) -> None:
    """-lineinfo through METRALE_EXTRA_NVCC_FLAGS embeds paths, as in [build] flags: no
    hit may carry another checkout's paths."""
    env = fake_toolchain_env(tmp_path / "bin")
    keys: dict[tuple[str, str], set[str]] = {}
    for checkout in ("a", "b"):
        root = small_tree(tmp_path / checkout / "proj")
        for extra in ("-DX=1", "-lineinfo"):
            built = _build(root, "hw1/m1/q1", {**env, "METRALE_EXTRA_NVCC_FLAGS": extra})
            keys[(checkout, extra)] = {m.key for m in built.modules}
    assert keys[("a", "-DX=1")] == keys[("b", "-DX=1")]
    assert not keys[("a", "-lineinfo")] & keys[("b", "-lineinfo")]


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_real_nvcc_strict_mode_and_extra_flags(tmp_path: Path) -> None:
    """A warning fails the strict build; METRALE_KERNEL_NO_STRICT=1 lets it through and
    METRALE_EXTRA_NVCC_FLAGS reaches the compile."""
    root = small_tree(
        tmp_path / "proj",
        {
            "kernels/hw1/m1/q1/leaf.cu": (
                'extern "C" __global__ void leaf(int* o) { int unused = 3; o[0] = VALUE; }\n'
            ),
            "kernels/hw1/common/add.cu": 'extern "C" __global__ void add() {}\n',
        },
    )
    env = dict(os.environ)
    strict = _build(root, "hw1/m1/q1", {**env, "METRALE_EXTRA_NVCC_FLAGS": "-DVALUE=1234567"})
    assert [f.module for f in strict.failures] == ["leaf"]
    assert "--Werror all-warnings" in str(strict.failures[0])
    assert '"unused" was declared but never referenced' in strict.failures[0].output
    loose = _build(
        root,
        "hw1/m1/q1",
        {**env, "METRALE_KERNEL_NO_STRICT": "1", "METRALE_EXTRA_NVCC_FLAGS": "-DVALUE=1234567"},
    )
    assert not loose.failures
    ptx = (tmp_path / "build/hw1/m1/q1/leaf.ptx").read_text()
    assert "1234567" in ptx and ".target sm_90a" in ptx


@_needs_no_system_install
def test_scale_compiler_is_picked_per_arch(tmp_path: Path) -> None:
    scale = builtin_toolchains()["scale"]
    root = scale_root(tmp_path / "scale", ("gfx1151", "gfx1100"))
    env = {"SCALE_HOME": str(root), "PATH": "", "HOME": str(tmp_path / "home")}
    found = find_toolchain(scale, env, arch="gfx1151")
    assert found.program == root / "targets/gfx1151/bin/nvcc"
    assert found.identity.startswith("fake scale version 9.9 | ")
    assert find_program(scale, env, arch="gfx1100") == root / "targets/gfx1100/bin/nvcc"
    # The dry run's include directory is a toolkit root (headers recorded below it).
    assert str(root / "targets/gfx1151/include") in found.roots
    with pytest.raises(ToolchainMissing) as err:
        find_toolchain(scale, env, arch="gfx942")
    assert str(err.value) == (
        f"toolchain 'scale' is not installed: scale at {root} has no compiler for gfx942 "
        f"(targets/gfx942/bin/nvcc); install {scale.install_hint}"
    )
    with pytest.raises(ToolchainMissing, match=r"no scale root was found \(\$SCALE_HOME, "
                       r"\$SCALE_ROOT, ~/scale\*, /opt/scale\*\); install SCALE"):  # fmt: skip
        find_toolchain(scale, {"PATH": "", "HOME": str(tmp_path / "home")}, arch="gfx1151")
    with pytest.raises(ToolchainError, match=r"picked by \[hardware\] arch"):
        find_toolchain(scale, env)
    # The task cache's stamp covers every arch's compiler of the root.
    stamp = toolchain_stamp(scale, env)
    assert stamp[:2] == ["found", str(root)]
    assert [arch for arch, _ in stamp[2]] == ["gfx1100", "gfx1151"]


@_needs_no_system_install
def test_scale_stamp_holds_the_identity_each_arch_s_targets_are_planned_with(
    tmp_path: Path,
) -> None:
    """Each arch's compiler path is its own probe (a clang driver finds its resources
    from the path it was called by: a symlink in another arch's directory reads that
    directory), so the task cache's stamp holds, per arch, the identity generation finds
    for that arch, also where two arches' compilers are one file."""
    scale = builtin_toolchains()["scale"]
    root = scale_root(tmp_path / "scale", ("gfx1151",))
    shared = root / "targets/gfx1100/bin/nvcc"
    shared.parent.mkdir(parents=True)
    shared.symlink_to(root / "targets/gfx1151/bin/nvcc")
    (root / "targets/gfx1100/include").mkdir()
    env = {"SCALE_HOME": str(root), "PATH": "", "HOME": str(tmp_path / "home")}
    found = {a: find_toolchain(scale, env, arch=a).identity for a in ("gfx1100", "gfx1151")}
    assert found["gfx1100"] != found["gfx1151"], "harness: the dry runs do not differ"
    stamp = toolchain_stamp(scale, env)
    assert dict((arch, identity) for arch, identity in stamp[2]) == found
    # A broken compiler of an arch no target builds is its own row: it hides no other.
    broken = root / "targets/gfx900/bin/nvcc"
    broken.parent.mkdir(parents=True)
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    rows = {row[0]: row[1:] for row in toolchain_stamp(scale, env)[2]}
    assert rows["gfx900"][0] == "error"
    assert {a: rows[a] for a in found} == {a: [i] for a, i in found.items()}


def test_scale_stamp_holds_the_arch_check_of_an_extension_that_has_one(
    tmp_path: Path,
) -> None:
    """A toolchain under ``{root}`` with an arch check skips the targets of an arch its
    compiler cannot build, as hip does: the stamp holds the verdict, so a verdict that
    changes (device libraries added, the verdicts' file deleted to check again) misses."""
    project = tmp_path / "p"
    write(
        project,
        "toolchains/scale.toml",
        '[toolchain]\nextends = "scale"\nvendors = ["amd"]\n'
        'arch_check_args = ["-DARCH={arch}", "-c", "{source}", "-o", "{output}"]\n',
    )
    scale = load_toolchains(project)["scale"]
    root = scale_root(tmp_path / "scale", ())
    marker = tmp_path / "no-device-libs"
    write(
        root,
        "targets/gfx1151/bin/nvcc",
        "#!/bin/sh\n"
        'case "$*" in *--version*) echo "scale nvcc 1"; exit 0;; *-###*) exit 0;; esac\n'
        f'[ -e {marker} ] && {{ echo "error: no device libraries" >&2; exit 1; }}\n'
        'out=""; prev=""; for a in "$@"; do [ "$prev" = -o ] && out="$a"; prev="$a"; done\n'
        'echo obj > "$out"\n',
    )
    (root / "targets/gfx1151/bin/nvcc").chmod(0o755)
    (root / "targets/gfx1151/include").mkdir(parents=True)
    env = {"SCALE_HOME": str(root), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}
    state = tmp_path / "state"
    rows = toolchain_stamp(scale, env, state_dir=state)[2]
    assert [row[0] for row in rows] == ["gfx1151"] and len(rows[0]) == 2, rows
    marker.write_text("")
    (state / "arch-checks.json").unlink()
    rows = toolchain_stamp(scale, env, state_dir=state)[2]
    assert rows == [["gfx1151", "unsupported", "error: no device libraries"]]


_STRIX = {
    "kernels/strix/HARDWARE.toml": (
        '[hardware]\nvendor = "amd"\narch = "gfx1151"\n'
        '[build]\nextra_nvcc_flags = ["--fmad=false", "-DTQ_PLUS_SIGNS"]\n'
    ),
    "kernels/strix/common/KERNEL.toml": '[build]\nextra_nvcc_flags = ["-DHDIM=128"]\n',
    "kernels/strix/common/util.cuh": "#pragma once\n#define MASK 0xffffffffu\n",
    "kernels/strix/common/norm.cu": (
        '#include "util.cuh"\n'
        'extern "C" __global__ void norm() { __shfl_sync(0xffffffffu, 1, 0); }\n'
    ),
    "kernels/strix/m/MODEL.toml": "[model]\n",
    "kernels/strix/m/q/KERNEL.toml": '[build]\nextra_nvcc_flags = ["-ffp-contract=off"]\n',
    "kernels/strix/m/q/gemv.cu": (
        '#include "../../common/util.cuh"\nextern "C" __global__ void gemv() {}\n'
    ),
}


def test_scale_build_command_lines_and_cache(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    for rel, text in _STRIX.items():
        write(root, rel, text)
    sc = scale_root(tmp_path / "scale")
    log = tmp_path / "scale.log"
    env = {"SCALE_HOME": str(sc), "PATH": "", "HOME": str(tmp_path / "home"), "FAKE_LOG": str(log)}
    kernels = _tree_digest(root / "kernels")
    result = _build(root, "strix/m/q", env)
    assert not result.failures, result.failure_text()
    program = str(sc / "targets/gfx1151/bin/nvcc")
    lines = {Path(e["argv"][e["argv"].index("-o") - 1]).name: _normalise(e["argv"], e)
             for e in logged(log)}  # fmt: skip
    flags = ["--fmad=false", "-DTQ_PLUS_SIGNS", "-DHDIM=128", "-ffp-contract=off"]
    assert lines == {
        "gemv.cu": [program, "--cuda-device-only", "-c", "-O3", *flags, "-I.", "gemv.cu",
                    "-o", "<tmp>/gemv.o", "-MD", "-MF", "<tmp>/deps.d"],
        "norm.cu": [program, "--cuda-device-only", "-c", "-O3", *flags, "-I.", "norm.cu",
                    "-o", "<tmp>/norm.o", "-MD", "-MF", "<tmp>/deps.d"],
    }  # fmt: skip
    # The sources as they are: no mirror for SCALE.
    norm = next(e for e in logged(log) if "norm.cu" in e["argv"])
    assert "__shfl_sync(0xffffffffu, 1, 0)" in norm["read"]["norm.cu"]
    out = tmp_path / "build/strix/m/q"
    assert sorted(p.name for p in out.glob("*.o")) == ["gemv.o", "norm.o"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["toolchain"]["name"] == "scale"
    assert manifest["toolchain"]["identity"].startswith("fake scale version 9.9 | ")
    assert _tree_digest(root / "kernels") == kernels
    # A second run: every module from the cache, nothing compiled.
    log.unlink()
    again = _build(root, "strix/m/q", env)
    assert {m.outcome for m in again.modules} == {"local"} and not logged(log)


def test_sample_strix_hip_target_builds_through_the_mirror(tmp_path: Path) -> None:
    root = _sample(tmp_path)
    compat = write(
        root, "hip_compat/hip/hip_runtime.h", "// compat hip_runtime.h v1\n"
    ).parent.parent
    write(root, "hip_compat/cuda_bf16.h", "// compat cuda_bf16.h\n")
    hipcc = fake_compiler(tmp_path / "rocm/bin/hipcc", "hipcc")
    log = tmp_path / "hip.log"
    env = {"METRALE_HIPCC": str(hipcc), "PATH": "", "FAKE_LOG": str(log)}
    kernels = _tree_digest(root / "kernels")
    result = _build(root, "strix-hip/llama3-8b/bf16", env, hip_compat_dir="hip_compat")
    assert not result.failures, result.failure_text()
    entries = {Path(e["argv"][e["argv"].index("-o") - 1]).name: e for e in logged(log)}
    assert sorted(entries) == ["residual_add.cu", "rmsnorm.cu", "rope.cu", "silu_mul.cu"]
    rms = entries["rmsnorm.cu"]
    # The compat directory relative to the compile's cwd, as every path but the program.
    compat_rel = os.path.relpath(compat, rms["cwd"])
    assert _normalise(rms["argv"], rms) == [
        str(hipcc), "-x", "hip", "--genco", "--offload-arch=gfx1151", "-O3", f"-I{compat_rel}",
        "-include", "hip/hip_runtime.h", "-I.", f"../../{MIRROR_DIR}/llama3-8b/bf16/rmsnorm.cu",
        "-o", "<tmp>/rmsnorm.co", "-MD", "-MF", "<tmp>/deps.d",
    ]  # fmt: skip
    assert rms["cwd"] == str(tmp_path / "build/stage/strix-hip/llama3-8b/bf16/llama3-8b/bf16")
    # What hipcc was handed: the compat header, the mirrored source and header.
    read = rms["read"]
    assert read[f"{compat_rel}/hip/hip_runtime.h"] == "// compat hip_runtime.h v1\n"
    mirrored_util = read[f"../../{MIRROR_DIR}/llama3-8b/bf16/bf16_util.cuh"]
    original = (REPO / "kernels/gb10/common/bf16_util.cuh").read_text()
    assert "__shfl_xor_sync(0xffffffffu, (v), (m))" in original
    assert mirrored_util == original.replace(
        "__shfl_xor_sync(0xffffffffu, (v), (m))", "__shfl_xor_sync(0xffffffffULL, (v), (m))"
    )
    assert (
        read[f"../../{MIRROR_DIR}/llama3-8b/bf16/rmsnorm.cu"]
        == (REPO / "kernels/gb10/common/rmsnorm.cu").read_text()
    )
    # kernels/ is never modified; the artefacts are code objects.
    assert _tree_digest(root / "kernels") == kernels
    out = tmp_path / "build/strix-hip/llama3-8b/bf16"
    assert sorted(p.name for p in out.glob("*.co")) == [
        "residual_add.co", "rmsnorm.co", "rope.co", "silu_mul.co",
    ]  # fmt: skip
    assert (out / "rmsnorm.co").read_text().startswith("fake hipcc output\n")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["toolchain"]["name"] == "hip"
    assert " | hip mirror v1 | compat {root}/hip_compat " in manifest["toolchain"]["identity"]

    # Rebuilt: all from the cache (the mirror's reads map back to the staged files).
    log.unlink()
    again = _build(root, "strix-hip/llama3-8b/bf16", env, hip_compat_dir="hip_compat")
    assert {m.outcome for m in again.modules} == {"local"} and not logged(log)
    # An edited compat file is key material: every module recompiles.
    write(root, "hip_compat/hip/hip_runtime.h", "// compat hip_runtime.h v2\n")
    edited = _build(root, "strix-hip/llama3-8b/bf16", env, hip_compat_dir="hip_compat")
    assert {m.outcome for m in edited.modules} == {"compiled"}
    assert not {m.key for m in again.modules} & {m.key for m in edited.modules}
    # ... and so is a new one (it could shadow a toolkit header).
    write(root, "hip_compat/cuda_fp16.h", "// new\n")
    added = _build(root, "strix-hip/llama3-8b/bf16", env, hip_compat_dir="hip_compat")
    assert {m.outcome for m in added.modules} == {"compiled"}


def test_hip_flags_mirror_and_unmirrored_subdirectories(tmp_path: Path) -> None:
    """--fmad translated, no extra_hip_flags; the leaf's and common's files mirrored, a
    subdirectory's header read from the stage as it is (as the reference reads it)."""
    root = tmp_path / "proj"
    for rel, text in _HIP.items():
        write(root, rel, text)
    hipcc = fake_compiler(tmp_path / "rocm/bin/hipcc", "hipcc")
    log = tmp_path / "hip.log"
    env = {"METRALE_HIPCC": str(hipcc), "PATH": "", "FAKE_LOG": str(log)}
    result = _build(root, "amd/m/q", env)
    assert not result.failures, result.failure_text()
    (entry,) = logged(log)
    assert _normalise(entry["argv"], entry) == [
        str(hipcc), "-x", "hip", "--genco", "--offload-arch=gfx1201", "-O3",
        "-include", "hip/hip_runtime.h",
        "-ffp-contract=off", "-DHDIM=128", "-ffp-contract=fast",
        "-I.", f"../../{MIRROR_DIR}/m/q/k.cu", "-o", "<tmp>/k.co", "-MD", "-MF", "<tmp>/deps.d",
    ]  # fmt: skip
    read = entry["read"]
    toolkit = str(tmp_path / "rocm/include/hip/hip_runtime.h")
    mirror = f"../../{MIRROR_DIR}/m/q"
    assert sorted(read) == sorted([
        toolkit, f"{mirror}/k.cu", f"{mirror}/../../common/reduce.cuh", "./vendor/sub.cuh",
    ])  # fmt: skip
    assert read[f"{mirror}/k.cu"] == _HIP["kernels/amd/m/q/k.cu"].replace(
        "0xffffffff,", "0xffffffffULL,"
    )
    assert read[f"{mirror}/../../common/reduce.cuh"] == (
        "#pragma once\n"
        "__device__ float red(float v) {\n"
        "    unsigned long long mask = __activemask();  // unsigned int stays in this comment\n"
        "    unsigned int lanes = 32;\n"
        "    return __shfl_down_sync(mask, v, 1) + __shfl_up_sync(0xFFFFFFFFULL, v, 1)\n"
        "        + __ballot_sync(0x0000ffffLL, v > 0);\n"
        "}\n"
    )
    assert read["./vendor/sub.cuh"] == _HIP["kernels/amd/m/q/vendor/sub.cuh"]
    # The mirror holds the leaf's and common's kernel files, nothing of subdirectories.
    stage = tmp_path / "build/stage/amd/m/q"
    mirrored = sorted(p.relative_to(stage / MIRROR_DIR).as_posix()
                      for p in (stage / MIRROR_DIR).rglob("*") if p.is_file())  # fmt: skip
    assert mirrored == [".mirrored.json", "common/reduce.cuh", "m/q/k.cu"]
    # The cache entry records the staged files the mirror was made from, and the
    # toolkit header below the dry run's include directory.
    (module,) = result.modules
    hit = make_cache(make_config(root, tmp_path / "cache")).get(module.key)
    assert hit is not None
    assert [tuple(i[:2]) for i in hit.meta["inputs"]] == [
        ("stage", "../../common/reduce.cuh"), ("stage", "k.cu"), ("stage", "vendor/sub.cuh"),
        ("toolkit0", "hip/hip_runtime.h"),
    ]  # fmt: skip
    plan = plan_target(
        root, discover(root, Target.parse("amd/m/q")), load_toolchains(root), identity="i"
    )
    assert plan.modules[0].argv == (
        "hipcc", "-x", "hip", "--genco", "--offload-arch=gfx1201", "-O3",
        "-include", "hip/hip_runtime.h",
        "-ffp-contract=off", "-DHDIM=128", "-ffp-contract=fast",
        "-I.", f"../../{MIRROR_DIR}/m/q/k.cu", "-o", "k.co",
    )  # fmt: skip
    assert plan.flags == ("--fmad=false", "-DHDIM=128", "-ffp-contract=off", "--fmad=true",
                          "--fmad=maybe")  # fmt: skip
    # An edit of a mirrored file reaches the next compile; a stale mirror file is removed.
    write(
        root,
        "kernels/amd/common/reduce.cuh",
        "#pragma once\n__device__ float red(float v) { return v; }\n",
    )
    write(root, "kernels/amd/common/extra.cuh", "// new header\n")
    log.unlink()
    assert not _build(root, "amd/m/q", env).failures
    (entry,) = logged(log)
    assert "return v;" in entry["read"][f"{mirror}/../../common/reduce.cuh"]
    (root / "kernels/amd/common/extra.cuh").unlink()
    write(root, "kernels/amd/m/q/k.cu", _HIP["kernels/amd/m/q/k.cu"] + "// v2\n")
    assert not _build(root, "amd/m/q", env).failures
    assert not (stage / MIRROR_DIR / "common/extra.cuh").exists()


# ------------------------------------------------------------------------------ Metal


def test_sample_metal_target_builds_in_two_steps(tmp_path: Path) -> None:
    root = _sample(tmp_path)
    xcrun = fake_compiler(tmp_path / "xcode/bin/xcrun", "xcrun")
    log = tmp_path / "metal.log"
    env = {"PATH": str(xcrun.parent), "FAKE_LOG": str(log)}
    result = _build(root, "metal/llama3-8b/bf16", env)
    assert not result.failures, result.failure_text()
    steps = [(e["tool"], _normalise(e["argv"], e)) for e in logged(log)]
    rms = [argv for tool, argv in steps if any("rmsnorm" in a for a in argv)]
    assert rms == [
        [
            str(xcrun), "-sdk", "macosx", "metal", "-std=metal3.1", "-c", "-O3",
            "-std=metal3.1", "-I.", "rmsnorm.metal", "-o", "<tmp>/rmsnorm.air",
            "-MD", "-MF", "<tmp>/deps.d",
        ],
        [str(xcrun), "-sdk", "macosx", "metallib", "<tmp>/rmsnorm.air", "-o",
         "<tmp>/rmsnorm.metallib"],
    ]  # fmt: skip
    # The modules compile in parallel; each one's two steps run in order.
    for stem in ("rmsnorm", "silu_mul"):
        mine = [tool for tool, argv in steps if any(stem in a for a in argv)]
        assert mine == ["metal", "metallib"], steps
    out = tmp_path / "build/metal/llama3-8b/bf16"
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".metallib") == [
        "rmsnorm.metallib", "silu_mul.metallib",
    ]  # fmt: skip
    assert (out / "rmsnorm.metallib").read_text().startswith("metallib\nfake metal output\n")
    # The key's argv is both steps, with machine-independent names.
    plan = plan_target(
        root, discover(root, Target.parse("metal/llama3-8b/bf16")), load_toolchains(root),
        identity="x",
    )  # fmt: skip
    rms_plan = next(m for m in plan.modules if m.stem == "rmsnorm")
    assert rms_plan.argv == (
        "xcrun", "-sdk", "macosx", "metal", "-std=metal3.1", "-c", "-O3", "-std=metal3.1", "-I.",
        "rmsnorm.metal", "-o", "rmsnorm.air",
        "&&", "xcrun", "-sdk", "macosx", "metallib", "rmsnorm.air", "-o", "rmsnorm.metallib",
    )  # fmt: skip
    log.unlink()
    again = _build(root, "metal/llama3-8b/bf16", env)
    assert {m.outcome for m in again.modules} == {"local"} and not logged(log)


def test_metal_step_failures_are_compile_errors(tmp_path: Path) -> None:
    root = _sample(tmp_path)
    write(root, "kernels/metal/common/rmsnorm.metal", "#error broken\n")
    xcrun = fake_compiler(tmp_path / "xcode/bin/xcrun", "xcrun")
    env = {"PATH": str(xcrun.parent), "FAKE_LOG": str(tmp_path / "log")}
    result = _build(root, "metal/llama3-8b/bf16", env)
    (failure,) = result.failures
    assert failure.module == "rmsnorm" and failure.returncode == 1
    assert failure.source == "kernels/metal/common/rmsnorm.metal"
    assert " metal -std=metal3.1 -c -O3 " in str(failure)


def test_clang_dry_run_identity_is_stable_and_sees_through(tmp_path: Path) -> None:
    hip = builtin_toolchains()["hip"]
    hipcc = fake_compiler(tmp_path / "rocm/bin/hipcc", "hipcc")
    env = {"PATH": ""}
    first = probe_toolchain(hip, hipcc, env, arch="gfx1151").identity
    # The dry run's temporary names are random: normalised away.
    assert probe_toolchain(hip, hipcc, env, arch="gfx1151").identity == first
    assert first.startswith("fake hipcc version 9.9 | ")
    assert (
        probe_toolchain(hip, hipcc, {**env, "FAKE_DRYRUN": "-DWRAPPED"}, arch="gfx1151").identity
        != first
    )
    assert probe_toolchain(hip, hipcc, env, arch="gfx1100").identity != first
    # The real compiler the dry run names is hashed by content.
    (hipcc.parent / "clang-99").write_text("fake clang binary v2\n")
    assert probe_toolchain(hip, hipcc, env, arch="gfx1151").identity != first


def test_a_compiler_without_dry_run_says_how_to_go_on(tmp_path: Path) -> None:
    hip = builtin_toolchains()["hip"]
    hipcc = _script(
        tmp_path / "bin/hipcc",
        f"#!{sys.executable}\nimport sys\n"
        "if '--version' in sys.argv: print('hipcc 1'); sys.exit(0)\n"
        "sys.exit('unknown option -###')\n",
    )
    with pytest.raises(ToolchainError) as err:
        probe_toolchain(hip, hipcc, {"PATH": ""}, arch="gfx1151")
    text = str(err.value)
    assert text.startswith("toolchain 'hip': dryrun_args: the dry-run probe failed")
    assert 'set dryrun_args = [] in a toolchains/hip.toml that extends "hip"' in text


def _counting(program: Path, log: Path) -> Path:
    """Wrap ``program`` so that every run of it (probes included) adds a line to ``log``."""
    real = program.with_name(program.name + ".real")
    program.rename(real)
    program.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec "{real}" "$@"\n')
    program.chmod(0o755)
    return log


def test_scale_stamp_runs_only_the_compilers_of_the_arches_its_targets_build_for(
    tmp_path: Path,
) -> None:
    """With the targets' arches known, a SCALE root's other compilers (an arch with no
    target, the real tree's gfx1201) are not run, and an arch without a compiler is a
    row of its own; without them (the first run) every compiler is stamped."""
    scale = builtin_toolchains()["scale"]
    root = scale_root(tmp_path / "scale", ("gfx1151", "gfx1201"))
    runs = _counting(root / "targets/gfx1201/bin/nvcc", tmp_path / "gfx1201.log")
    env = {"SCALE_HOME": str(root), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}
    every = toolchain_stamp(scale, env)[2]
    assert [row[0] for row in every] == ["gfx1151", "gfx1201"] and runs.exists()
    runs.unlink()
    assert toolchain_stamp(scale, env, arches=["gfx1151"])[2] == [every[0]]
    assert toolchain_stamp(scale, env, arches=["gfx942", "gfx1151"])[2] == [
        every[0],
        ["gfx942", "absent"],
    ]
    assert not runs.exists()


def test_a_scale_compiler_no_target_uses_changes_no_task(tmp_path: Path) -> None:
    """The task cache keys the compilers of the arches the targets build for: another
    arch's compiler changing stays a hit and is never run; the used one's misses."""
    from metrale_orch.tasks.specs import cached_build_specs

    root = tmp_path / "proj"
    for rel, text in _STRIX.items():
        write(root, rel, text)
    write(root, "dodo.py", "from metrale_orch.dodo import *  # noqa: F403\n")
    sc = scale_root(tmp_path / "scale", ("gfx1151", "gfx1201"))
    runs = _counting(sc / "targets/gfx1201/bin/nvcc", tmp_path / "gfx1201.log")
    env = {
        "SCALE_HOME": str(sc),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "FAKE_LOG": str(tmp_path / "scale.log"),
        "METRALE_ORCH_LOCAL_CACHE": str(tmp_path / "cache"),
    }
    assert cached_build_specs(root, env)[1] == "no cache file"
    assert cached_build_specs(root, env)[1] == "hit"
    assert not runs.exists()  # never run: no target builds for gfx1201
    real = sc / "targets/gfx1201/bin/nvcc.real"
    real.write_text(real.read_text() + "\n# rebuilt\n")
    assert cached_build_specs(root, env)[1] == "hit"
    used = sc / "targets/gfx1151/bin/nvcc"
    used.write_text(used.read_text() + "\n# rebuilt\n")
    assert cached_build_specs(root, env)[1] == "no cache file"
    assert not runs.exists()
