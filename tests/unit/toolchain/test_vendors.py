"""SPEC 3.3: every vendor's compiler, driven as the reference build drives it.

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/toolchain/test_vendors.py``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import xxhash

from metrale_orch.config import ConfigError, load_config
from metrale_orch.graph.generate import resolve_build_specs
from metrale_orch.steps.errors import BuildConfigError, ToolchainError
from metrale_orch.steps.hip_mirror import (
    MIRROR_DIR,
    HipCompat,
    mirror_files,
    mirror_text,
    mirrored_source,
    scan_hip_compat,
    unmirror,
    write_mirror,
)
from metrale_orch.steps.plan import plan_target
from metrale_orch.toolchain.argv import env_switches, hip_flags
from metrale_orch.toolchain.definitions import builtin_toolchains, load_toolchains
from metrale_orch.toolchain.locate import find_program, find_root
from metrale_orch.tree import Target, discover
from tests.support.build import (
    small_tree,
    write,
)
from tests.support.toolchain import (
    _HIP,
    _needs_no_system_install,
    _sample,
    fake_compiler,
    scale_root,
)


def test_nvcc_switches_are_in_the_signature_and_env(tmp_path: Path) -> None:
    root = small_tree(tmp_path)
    layout = discover(root, Target.parse("hw1/m1/q1"))
    tcs = load_toolchains(root)

    def plan(env: dict[str, str]) -> Any:
        return plan_target(root, layout, tcs, identity="id", environ=env)

    base = plan({})
    loose = plan({"METRALE_KERNEL_NO_STRICT": "1", "METRALE_EXTRA_NVCC_FLAGS": "-lineinfo"})
    assert base.signature != loose.signature
    assert dict(loose.env) == {
        "METRALE_EXTRA_NVCC_FLAGS": "-lineinfo",
        "METRALE_KERNEL_NO_STRICT": "1",
    }
    assert "--Werror" not in loose.modules[0].argv and "-lineinfo" in loose.modules[0].argv
    assert plan({"METRALE_KERNEL_NO_STRICT": ""}).signature == base.signature


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"METRALE_KERNEL_NO_STRICT": "yes"},
         "environment METRALE_KERNEL_NO_STRICT: must be 1 (drop --Werror all-warnings) or 0, "
         "got 'yes'"),
        ({"METRALE_EXTRA_NVCC_FLAGS": "-DX='a"},
         "environment METRALE_EXTRA_NVCC_FLAGS: cannot be split into flags"),
    ],
)  # fmt: skip
def test_bad_switch_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ToolchainError) as err:
        env_switches(builtin_toolchains()["nvcc"], env)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)
    # Toolchains without the switches never read them.
    assert env_switches(builtin_toolchains()["hip"], env).env == {}


# ------------------------------------------------------------------------------ SCALE


def test_scale_root_discovery(tmp_path: Path) -> None:
    scale = builtin_toolchains()["scale"]
    home = tmp_path / "home"
    older = scale_root(home / "scale-1.9")
    newer = scale_root(home / "scale-1.10")
    write(home, "scale-2.0/README", "not a root: no bin/scaleenv, no targets/\n")
    env = {"HOME": str(home), "PATH": ""}
    # ~/scale*, newest version that is a root.
    assert find_root(scale, env) == newer
    explicit = scale_root(tmp_path / "opt/sc")
    assert find_root(scale, {**env, "SCALE_ROOT": str(explicit)}) == explicit
    assert find_root(scale, {**env, "SCALE_HOME": str(older), "SCALE_ROOT": str(explicit)}) == older
    # A set but invalid root is an error naming it, even when the next one is valid.
    bad = str(home / "scale-2.0")
    for var, given in (
        ("SCALE_HOME", {"SCALE_HOME": bad, "SCALE_ROOT": str(explicit)}),
        ("SCALE_ROOT", {"SCALE_ROOT": bad}),
    ):
        with pytest.raises(ToolchainError) as err:
            find_root(scale, {**env, **given})
        assert str(err.value) == (
            f"environment {var}: '{bad}' is not a scale root (it has no bin/scaleenv); "
            "point it at the installation's root directory, or unset it"
        )
    (explicit / "targets").rename(explicit / "targets.old")
    with pytest.raises(ToolchainError, match=r"environment SCALE_HOME: .* \(it has no targets/\)"):
        find_root(scale, {**env, "SCALE_HOME": str(explicit)})
    # The globs in order: an earlier glob's root wins over a newer one of a later glob.
    write(
        tmp_path / "p",
        "toolchains/scale.toml",
        f'[toolchain]\nextends = "scale"\nvendors = ["amd"]\n'
        f'root_globs = ["{tmp_path}/a/scale*", "{tmp_path}/b/scale*"]\n',
    )
    custom = load_toolchains(tmp_path / "p")["scale"]
    a = scale_root(tmp_path / "a/scale-1.0")
    scale_root(tmp_path / "b/scale-9.0")
    assert find_root(custom, env) == a
    assert find_root(custom, {"HOME": str(tmp_path / "nobody")}) == a
    shutil.rmtree(tmp_path / "a")
    shutil.rmtree(tmp_path / "b")
    assert find_root(custom, env) is None


# ------------------------------------------------------------------------------ HIP


@_needs_no_system_install
def test_hipcc_discovery_order(tmp_path: Path) -> None:
    hip = builtin_toolchains()["hip"]
    on_path = fake_compiler(tmp_path / "path/bin/hipcc", "hipcc")
    named = fake_compiler(tmp_path / "named/bin/hipcc", "hipcc")
    env = {"PATH": str(on_path.parent)}
    assert find_program(hip, env) == on_path  # /opt/rocm/bin/hipcc is absent here
    assert find_program(hip, {**env, "METRALE_HIPCC": str(named)}) == named
    with pytest.raises(ToolchainError) as err:
        find_program(hip, {**env, "METRALE_HIPCC": str(tmp_path / "nope/hipcc")})
    assert str(err.value).startswith(
        f"environment METRALE_HIPCC: '{tmp_path / 'nope/hipcc'}' is not an executable hipcc"
    )
    # program_paths come before PATH (the built-in's is /opt/rocm/bin/hipcc).
    rocm = fake_compiler(tmp_path / "rocm/bin/hipcc", "hipcc")
    write(
        tmp_path / "p",
        "toolchains/hip.toml",
        f'[toolchain]\nextends = "hip"\nvendors = ["hip"]\nprogram_paths = ["{rocm}"]\n',
    )
    custom = load_toolchains(tmp_path / "p")["hip"]
    assert find_program(custom, env) == rocm
    assert find_program(custom, {**env, "METRALE_HIPCC": str(named)}) == named


def test_hip_flags_translate_fmad() -> None:
    assert hip_flags(
        ["--fmad=false", "-DHDIM=128", "-ffp-contract=off", "--fmad=true", "--fmad=maybe",
         "-fmad=false", "--fmadx"]
    ) == ("-ffp-contract=off", "-DHDIM=128", "-ffp-contract=fast",
          "-ffp-contract=off", "--fmadx")  # fmt: skip
    # The setting in effect is given once; a flag that may change it between keeps both.
    assert hip_flags(["--fmad=false", "-ffp-contract=off"]) == ("-ffp-contract=off",)
    assert hip_flags(["-ffp-contract=off", "-DX", "--fmad=false", "-DY"]) == (
        "-ffp-contract=off", "-DX", "-DY",
    )  # fmt: skip
    assert hip_flags(["--fmad=false", "-ffast-math", "-ffp-contract=off"]) == (
        "-ffp-contract=off", "-ffast-math", "-ffp-contract=off",
    )  # fmt: skip


def test_hip_compat_is_file_deps_and_key_material(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    for rel, text in _HIP.items():
        write(root, rel, text)
    write(root, "compat/cuda_runtime.h", "// v1\n")
    layout = discover(root, Target.parse("amd/m/q"))
    tcs = load_toolchains(root)

    def plan(compat: HipCompat | None) -> Any:
        return plan_target(root, layout, tcs, identity="hipcc 9", hip_compat=compat)

    none = plan(None)
    assert none.identity == "hipcc 9 | hip mirror v1"
    scanned = scan_hip_compat(root, root / "compat")
    assert scanned.spelled == "{root}/compat" and list(scanned.files) == ["cuda_runtime.h"]
    with_compat = plan(scanned)
    assert "compat/cuda_runtime.h" in with_compat.file_dep_rels
    assert "compat/cuda_runtime.h" not in none.file_dep_rels
    assert "-I{root}/compat" in with_compat.modules[0].argv
    assert (
        with_compat.identity == f"hipcc 9 | hip mirror v1 | compat {{root}}/compat {scanned.digest}"
    )
    assert str(tmp_path) not in json.dumps(dict(with_compat.signature))
    write(root, "compat/cuda_runtime.h", "// v2\n")
    changed = plan(scan_hip_compat(root, root / "compat"))
    assert changed.identity != with_compat.identity
    assert changed.signature != with_compat.signature
    # The switches of nvcc do not touch a HIP target.
    assert (
        plan_target(
            root, layout, tcs, identity="hipcc 9", environ={"METRALE_KERNEL_NO_STRICT": "1"}
        ).signature
        == none.signature
    )
    # A compat directory that went away fails the HIP targets, naming the setting.
    broken = scan_hip_compat(root, root / "gone")
    assert broken.problem
    with pytest.raises(BuildConfigError, match=r"^configuration: hip_compat_dir: the HIP compat"):
        plan(broken)


def test_hip_compat_dir_setting(tmp_path: Path) -> None:
    (tmp_path / "compat").mkdir()
    assert load_config(tmp_path, {}).hip_compat_dir is None
    cfg = load_config(tmp_path, {"METRALE_ORCH_HIP_COMPAT_DIR": "compat"})
    assert cfg.hip_compat_dir == tmp_path / "compat"
    assert cfg.to_dict()["hip_compat_dir"] == "compat" and cfg.sources["hip_compat_dir"] == "env"
    assert load_config(tmp_path, {"METRALE_ORCH_HIP_COMPAT_DIR": ""}).hip_compat_dir is None
    write(tmp_path, "pyproject.toml", '[tool.metrale-orch]\nhip_compat_dir = "missing"\n')
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, {})
    assert str(err.value).startswith(
        "pyproject.toml [tool.metrale-orch]: hip_compat_dir: 'missing' is not a directory"
    )
    write(tmp_path, "pyproject.toml", "[tool.metrale-orch]\nhip_compat_dir = 3\n")
    with pytest.raises(ConfigError, match="hip_compat_dir: must be a path string, got int"):
        load_config(tmp_path, {})
    (tmp_path / "pyproject.toml").unlink()
    with pytest.raises(
        ConfigError, match=r"^environment METRALE_ORCH_HIP_COMPAT_DIR: hip_compat_dir: 'nope'"
    ):
        load_config(tmp_path, {"METRALE_ORCH_HIP_COMPAT_DIR": "nope"})


# ------------------------------------------------------------------------------ skips, probes


@_needs_no_system_install
def test_skip_messages_name_the_toolkit(tmp_path: Path) -> None:
    root = _sample(tmp_path)
    write(root, "kernels/strix/HARDWARE.toml", '[hardware]\nvendor = "amd"\narch = "gfx1151"\n')
    write(root, "kernels/strix/m/MODEL.toml", "[model]\n")
    write(root, "kernels/strix/m/q/k.cu", 'extern "C" __global__ void k() {}\n')
    env = {"PATH": "", "HOME": str(tmp_path / "home")}
    specs = {s.target: s for s in resolve_build_specs(root, env)}
    skipped = {t: s.message for t, s in specs.items() if s.kind == "skip"}
    assert "SCALE (https://docs.scale-lang.com)" in skipped["strix/m/q"]
    assert "toolchain 'scale' is not installed" in skipped["strix/m/q"]
    assert "install ROCm" in skipped["strix-hip/llama3-8b/bf16"]
    assert "Xcode command line tools" in skipped["metal/llama3-8b/bf16"]


# ------------------------------------------------------------------------------ the mirror


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("__shfl_sync(0xffffffff, v, 0)", "__shfl_sync(0xffffffffULL, v, 0)"),
        ("__shfl_sync(0xffffffffu, v, 0)", "__shfl_sync(0xffffffffULL, v, 0)"),
        ("__shfl_up_sync(0xffffffffU, v, 1)", "__shfl_up_sync(0xffffffffULL, v, 1)"),
        ("__shfl_down_sync(0xFFFFFFFFul, v, 1)", "__shfl_down_sync(0xFFFFFFFFULL, v, 1)"),
        ("__shfl_xor_sync(0xffffffffl, v, 1)", "__shfl_xor_sync(0xffffffffULL, v, 1)"),
        ("__ballot_sync( 0xffffffff , p)", "__ballot_sync( 0xffffffffULL , p)"),
        ("__ballot_sync(0xffffffffLL, p)", "__ballot_sync(0xffffffffLL, p)"),
        ("__ballot_sync(0xffffffffull, p)", "__ballot_sync(0xffffffffull, p)"),
        ("__shfl_sync(0xffffffffULL, v, 0)", "__shfl_sync(0xffffffffULL, v, 0)"),
        ("__shfl_sync(mask, v, 0)", "__shfl_sync(mask, v, 0)"),
        ("__shfl_sync(4294967295u, v, 0)", "__shfl_sync(4294967295u, v, 0)"),
        ("__shfl_sync(0xff | m, v, 0)", "__shfl_sync(0xff | m, v, 0)"),
        ("__shfl_sync (0xffffffff, v, 0)", "__shfl_sync (0xffffffff, v, 0)"),
        ("my__shfl_sync(0xffffffff, v, 0)", "my__shfl_sync(0xffffffff, v, 0)"),
        ("__shfl_xor(v, 0xffffffff)", "__shfl_xor(v, 0xffffffff)"),
        ("// __shfl_sync(0xffffffff, v, 0)", "// __shfl_sync(0xffffffff, v, 0)"),
        ('puts("__shfl_sync(0xffffffff, v, 0)");', 'puts("__shfl_sync(0xffffffff, v, 0)");'),
        ("unsigned int m = __activemask();", "unsigned long long m = __activemask();"),
        ("const unsigned int m =\n  __activemask() & x;",
         "const unsigned long long m =\n  __activemask() & x;"),
        ("unsigned int a; unsigned int m = __activemask();",
         "unsigned int a; unsigned long long m = __activemask();"),
        ("{ unsigned int a = 1; }\nunsigned int b = __activemask();",
         "{ unsigned int a = 1; }\nunsigned long long b = __activemask();"),
        ("#define U unsigned int \nU m = __activemask();",
         "#define U unsigned int \nU m = __activemask();"),
        ("unsigned int m = 1; // __activemask()", "unsigned int m = 1; // __activemask()"),
        ("unsigned int m = __activemask; ", "unsigned int m = __activemask; "),
        ("unsigned int* p = f(__activemask());", "unsigned int* p = f(__activemask());"),
        ("int n = 1'000; unsigned int m = __activemask();",
         "int n = 1'000; unsigned long long m = __activemask();"),
    ],
)  # fmt: skip
def test_mirror_rules(before: str, after: str) -> None:
    assert mirror_text(before.encode()) == after.encode()


def test_mirror_keeps_other_bytes_and_selects_files() -> None:
    data = "caf\xe9 \u00e9 // not utf-8 safe? __shfl_sync(0xff, v, 0)\n".encode("latin-1")
    assert mirror_text(data) == data
    latin = b"\xff\xfe unsigned int m = __activemask();"
    assert mirror_text(latin) == b"\xff\xfe unsigned long long m = __activemask();"
    staged = ["m/q/k.cu", "m/q/h.cuh", "m/q/x.h", "m/q/sub/y.cuh", "common/c.cu", "common/v/z.h",
              "other/o.cu", "m/q/notes.md"]  # fmt: skip
    assert mirror_files(staged, "m/q") == ("common/c.cu", "m/q/h.cuh", "m/q/k.cu", "m/q/x.h")
    assert mirror_files(staged, "common") == ("common/c.cu",)
    assert mirrored_source("m/q", "k.cu") == "../../.hip/m/q/k.cu"
    assert mirrored_source("common", "c.cu") == "../.hip/common/c.cu"
    stage = "/b/stage/hw/m/q"
    cwd = f"{stage}/m/q"
    assert unmirror(
        ["../../.hip/m/q/k.cu", "../../.hip/m/q/../../common/c.cuh", "./sub/y.cuh", "/abs/x.h"],
        stage_dir=stage,
        cwd=cwd,
    ) == [f"{stage}/m/q/k.cu", f"{stage}/common/c.cuh", "./sub/y.cuh", "/abs/x.h"]
    assert not re.search(r"\s", MIRROR_DIR)


def test_write_mirror_rewrites_only_what_changed(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    files = {
        "m/q/k.cu": "int a = __shfl_sync(0xffffffffu, v, 0);\n",
        "common/c.cuh": "unsigned int m = __activemask();\n",
    }
    for rel, text in files.items():
        write(stage, rel, text)
    hashes = {rel: xxhash.xxh3_128_hexdigest(t.encode()) for rel, t in files.items()}
    write_mirror(stage, sorted(files), hashes)
    k = stage / MIRROR_DIR / "m/q/k.cu"
    assert k.read_text() == "int a = __shfl_sync(0xffffffffULL, v, 0);\n"
    before = k.stat()
    write_mirror(stage, sorted(files), hashes)  # the next module: nothing rewritten
    assert k.stat().st_ino == before.st_ino and k.stat().st_mtime_ns == before.st_mtime_ns
    # A mirror file changed behind its back is mirrored again; so is a new staged content.
    k.write_text("tampered\n")
    write_mirror(stage, sorted(files), hashes)
    assert k.read_text() == "int a = __shfl_sync(0xffffffffULL, v, 0);\n"
    write(stage, "m/q/k.cu", "int b;\n")
    write_mirror(stage, sorted(files), {**hashes, "m/q/k.cu": "new"})
    assert k.read_text() == "int b;\n"
    # A file no longer mirrored in a written directory is removed.
    write_mirror(stage, ["common/c.cuh"], hashes)
    write(stage, "m/q/j.cu", "int j;\n")
    write_mirror(stage, ["m/q/j.cu"], {"m/q/j.cu": "j"})
    assert not k.exists() and (stage / MIRROR_DIR / "m/q/j.cu").read_text() == "int j;\n"
    assert (stage / MIRROR_DIR / "common/c.cuh").read_text() == (
        "unsigned long long m = __activemask();\n"
    )
