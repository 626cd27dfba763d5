"""HIP for real: Debian's hipcc 5.2 (clang 15) builds a gfx90a target through doit.

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/toolchain/test_hip.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.cache.objects import key_of
from metrale_orch.smoke.amdgpu import (
    AMDGPU_MACH,
    processor_of,
)
from metrale_orch.steps.errors import ToolchainError
from metrale_orch.steps.keys import module_key_parts
from metrale_orch.steps.plan import plan_target
from metrale_orch.toolchain.argv import (
    keyed_environment,
    overridden_environment,
    set_environment_line,
    toolchain_environ,
)
from metrale_orch.toolchain.definitions import builtin_toolchains, load_toolchains, parse_toolchain
from metrale_orch.tree import Target, discover, manifest_warnings
from tests.support.build import write
from tests.support.toolchain import FILES

# ------------------------------------------------------------------------------ env_set


def _hip_variant(tmp_path: Path, extra: str) -> Path:
    root = tmp_path / "p"
    for rel, text in FILES.items():
        if rel.startswith("kernels/mi200/"):
            write(root, rel, text)
    write(root, "toolchains/hip.toml", f'[toolchain]\nextends = "hip"\nvendors = ["hip"]\n{extra}')
    return root


def test_env_set_is_applied_keyed_and_wins_over_the_shell(tmp_path: Path) -> None:
    hip = builtin_toolchains()["hip"]
    assert hip.env_set == (("HCC_AMDGPU_TARGET", "gfx000"), ("HIP_PLATFORM", "amd"))
    shell = {"HIP_PLATFORM": "nvidia", "PATH": "/bin"}
    assert toolchain_environ(hip, shell) == {
        "HIP_PLATFORM": "amd",
        "HCC_AMDGPU_TARGET": "gfx000",
        "PATH": "/bin",
    }
    assert keyed_environment(hip, shell) == keyed_environment(hip, {})
    assert keyed_environment(hip, {}) == {"HCC_AMDGPU_TARGET": "gfx000", "HIP_PLATFORM": "amd"}
    assert overridden_environment(hip, {"HIP_PLATFORM": "amd"}) == []
    (line,) = overridden_environment(hip, shell)
    assert line.startswith("environment HIP_PLATFORM=nvidia is not used: toolchain 'hip' sets")
    assert set_environment_line(hip) == "HCC_AMDGPU_TARGET=gfx000 HIP_PLATFORM=amd"
    assert set_environment_line(builtin_toolchains()["nvcc"]) == ""
    # A toolchain that sets another platform keys (and signs) its targets differently.
    layout = discover(root := _hip_variant(tmp_path, ""), Target.parse("mi200/m/q"))
    amd = plan_target(root, layout, load_toolchains(root), identity="i", environ=shell)
    write(root, "toolchains/hip.toml", '[toolchain]\nextends = "hip"\nvendors = ["hip"]\n'
          'env_set = { HIP_PLATFORM = "nvidia" }\n')  # fmt: skip
    nvidia = plan_target(root, layout, load_toolchains(root), identity="i", environ={})
    assert amd.env["HIP_PLATFORM"] == "amd" and nvidia.env["HIP_PLATFORM"] == "nvidia"
    assert amd.signature["env"] != nvidia.signature["env"]
    keys = [key_of("", module_key_parts(p, p.modules[0], [], {})) for p in (amd, nvidia)]
    assert keys[0] != keys[1]


@pytest.mark.parametrize(
    ("extra", "key", "problem"),
    [
        ("env_set = 3\n", "env_set", "must be a table of strings"),
        ("env_set = { X = 1 }\n", "env_set", "must be a table of strings"),
        ('env_set = { "A-B" = "1" }\n', "env_set.A-B", "is not an environment variable name"),
        ('arch_check_args = ["-o", "{output}"]\n', "arch_check_args", "must contain {arch}"),
        ('arch_check_args = ["{flags}", "{arch}", "{source}", "{output}"]\n',
         "arch_check_args[0]", "{flags} has no value here"),
    ],
)  # fmt: skip
def test_bad_new_keys_name_the_file_and_key(
    tmp_path: Path, extra: str, key: str, problem: str
) -> None:
    root = _hip_variant(tmp_path, extra)
    with pytest.raises(ToolchainError) as err:
        load_toolchains(root)
    assert str(err.value).startswith(f"toolchains/hip.toml: {key}: ")
    assert problem in str(err.value)


def test_toolchain_dict_carries_the_new_keys() -> None:
    table = {
        "name": "x",
        "program": "x",
        "argv": ["{program}", "{source}", "-o", "{output}"],
        "env_set": {"B": "2", "A": "1"},
        "arch_check_args": ["--arch={arch}", "{source}", "-o", "{output}"],
    }
    tc = parse_toolchain(table, "toolchains/x.toml")
    assert tc.to_dict()["env_set"] == {"A": "1", "B": "2"}
    assert tc.to_dict()["arch_check_args"] == ["--arch={arch}", "{source}", "-o", "{output}"]


def test_processor_names() -> None:
    assert AMDGPU_MACH[0x03F] == "gfx90a"
    assert AMDGPU_MACH[0x04A] == "gfx1151"
    assert processor_of("gfx90a:xnack-") == "gfx90a"
    assert processor_of("amdgcn-amd-amdhsa--gfx1151") == "gfx1151"
    assert processor_of("hipv4-amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-") == "gfx90a"


# ------------------------------------------------------------------------------ warnings


def test_extra_hip_flags_is_warned_about_unless_a_toolchain_reads_it() -> None:
    doc = {"build": {"extra_nvcc_flags": [], "extra_hip_flags": ["-DX"]}}
    (line,) = manifest_warnings("kernels/amd/HARDWARE.toml", doc, "hardware")
    assert line == (
        "kernels/amd/HARDWARE.toml: [build] extra_hip_flags: no toolchain reads this key: HIP "
        "targets read `extra_nvcc_flags` (with `--fmad=false`/`true` translated to "
        "`-ffp-contract=off`/`fast`); move these flags there (the key is ignored)"
    )
    assert manifest_warnings("kernels/amd/m/q/KERNEL.toml", doc, "kernel") == [
        line.replace("kernels/amd/HARDWARE.toml", "kernels/amd/m/q/KERNEL.toml")
    ]
    assert manifest_warnings("h", doc, "hardware", build_keys=["extra_hip_flags"]) == []
