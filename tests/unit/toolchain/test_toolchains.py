"""Toolchains: definitions, overrides, selection, discovery, identity probing.

The tests of this topic that start processes are in
``tests/scenarios/toolchain/test_toolchains.py``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from metrale_orch.steps.errors import ToolchainError, ToolchainMissing
from metrale_orch.toolchain.argv import compile_argv
from metrale_orch.toolchain.definitions import builtin_toolchains, load_toolchains, select_toolchain
from metrale_orch.toolchain.locate import find_program
from metrale_orch.toolchain.probe import (
    Probe,
    ProbeMemo,
    find_toolchain,
)
from metrale_orch.tree import Hardware
from tests.support.build import fake_toolchain_env, write
from tests.support.toolchain import _exe


def _hw(name: str = "h", vendor: str = "nvidia", doc: dict[str, object] | None = None) -> Hardware:
    return Hardware(
        name=name,
        vendor=vendor,
        arch="sm_90a",
        inherits=None,
        source_ext="metal" if vendor in ("apple", "metal") else "cu",
        path=Path(f"kernels/{name}/HARDWARE.toml"),
        doc=doc or {},
    )


_VENDORS = ("nvidia", "cuda", "amd", "rocm", "scale", "hip", "apple", "metal")


def test_builtins_cover_every_vendor_family() -> None:
    """SPEC 3.3: each vendor goes to the compiler the reference build drives."""
    tcs = builtin_toolchains()
    assert set(tcs) == {"hip", "metal", "nvcc", "scale"}
    picked = {v: select_toolchain(_hw(vendor=v), tcs).name for v in _VENDORS}
    assert picked == {
        "nvidia": "nvcc", "cuda": "nvcc",
        "amd": "scale", "rocm": "scale", "scale": "scale",
        "hip": "hip",
        "apple": "metal", "metal": "metal",
    }  # fmt: skip
    # Every vendor reads extra_nvcc_flags but Apple; there is no extra_hip_flags.
    assert {n: t.flags_key for n, t in tcs.items()} == {
        "nvcc": "extra_nvcc_flags", "scale": "extra_nvcc_flags",
        "hip": "extra_nvcc_flags", "metal": "extra_metal_flags",
    }  # fmt: skip
    assert {n: (t.output, t.extension) for n, t in tcs.items()} == {
        "nvcc": ("ptx", "ptx"), "scale": ("object", "o"),
        "hip": ("hsaco", "co"), "metal": ("metallib", "metallib"),
    }  # fmt: skip
    nvcc = tcs["nvcc"]
    assert nvcc.env_prefixes == ("NVCC_",) and "CPATH" in nvcc.env_allowlist
    assert nvcc.dryrun_args and nvcc.depfile_args
    assert nvcc.file is None


def test_nvcc_argv_shape_per_output_kind(tmp_path: Path) -> None:
    write(
        tmp_path,
        "toolchains/cubin.toml",
        '[toolchain]\nname = "c"\nextends = "nvcc"\noutput = "cubin"\n',
    )
    write(
        tmp_path,
        "toolchains/fat.toml",
        '[toolchain]\nname = "f"\nextends = "nvcc"\noutput = "fatbin"\n',
    )
    tcs = load_toolchains(tmp_path)
    flags = ["-DA", "-lineinfo"]
    common = {"arch": "sm_90a", "include": ".", "source": "x.cu"}
    # SPEC 3.3: --ptx -arch=<arch> -O3 <flags> -I<dir> --Werror all-warnings <src> -o <out>
    assert compile_argv(tcs["nvcc"], output="x.ptx", flags=flags, **common) == (
        "nvcc", "--ptx", "-arch=sm_90a", "-O3", "-DA", "-lineinfo", "-I.",
        "--Werror", "all-warnings", "x.cu", "-o", "x.ptx",
    )  # fmt: skip
    cubin = compile_argv(tcs["c"], output="x.cubin", flags=flags, **common)
    assert cubin[:3] == ("nvcc", "--cubin", "-arch=sm_90a")
    assert tcs["c"].extension == "cubin"
    fat = compile_argv(tcs["f"], program="/opt/nvcc", output="x.fatbin", flags=flags, **common)
    assert fat[:3] == ("/opt/nvcc", "--fatbin", "-gencode=arch=compute_90a,code=sm_90a")
    assert not any(a.startswith("-arch") for a in fat)


def test_project_file_overrides_and_extends(tmp_path: Path) -> None:
    write(
        tmp_path,
        "toolchains/nvcc.toml",
        '[toolchain]\nextends = "nvcc"\nvendors = ["nvidia"]\nenv_allowlist = ["X_FLAGS"]\n',
    )
    write(tmp_path, "toolchains/variant.toml", '[toolchain]\nname = "v"\nextends = "nvcc"\n')
    tcs = load_toolchains(tmp_path)
    assert tcs["nvcc"].env_allowlist == ("X_FLAGS",)
    assert tcs["nvcc"].file == tmp_path / "toolchains/nvcc.toml"
    assert tcs["nvcc"].vendors == ("nvidia",)
    # A variant does not inherit vendors: it is picked by [build] toolchain only.
    assert tcs["v"].vendors == ()
    assert tcs["v"].env_allowlist == ("X_FLAGS",)
    assert select_toolchain(_hw(vendor="nvidia"), tcs).name == "nvcc"
    picked = select_toolchain(_hw(doc={"build": {"toolchain": "v"}}), tcs)
    assert picked.name == "v"


_OK = '[toolchain]\nname = "x"\nprogram = "p"\nargv = ["{source}", "{output}"]\n'


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (_OK + "bogus = 1\n", "bogus"),
        ('[toolchain]\nname = "x"\nprogram = 3\nargv = ["{source}", "{output}"]\n', "program"),
        ('[toolchain]\nname = "x"\nprogram = "p"\nargv = ["{source}"]\n', "argv"),
        (_OK.replace('["{source}"', '["{nope}", "{source}"'), "argv[0]"),
        ('[toolchain]\nname = "x"\nextends = "nvcc"\noutput = "elf"\n', "output"),
        ('[toolchain]\nname = "x"\nextends = "missing"\n', "extends"),
        ('[toolchain]\nname = "x"\nprogram = "p"\n', "argv"),
        ('[toolchian]\nname = "x"\n', "[toolchain]"),
        ('[toolchain]\nname = "x"\nextends = "nvcc"\ndialect = "sycl"\n', "dialect"),
        ('[toolchain]\nname = "x"\nextends = "nvcc"\nlink_argv = ["{output}"]\n', "argv"),
        (
            '[toolchain]\nname = "x"\nextends = "metal"\nlink_argv = ["{output}"]\n',
            "link_argv",
        ),
        ('[toolchain]\nname = "x"\nextends = "metal"\nintermediate_extension = ""\n',
         "intermediate_extension"),
        ('[toolchain]\nname = "x"\nextends = "nvcc"\nprogram = "{root}/bin/nvcc"\n', "program"),
        ('[toolchain]\nname = "x"\nextends = "nvcc"\nprogram = "/x/{arch}/nvcc"\n', "program"),
        ('[toolchain]\nname = "x"\nextends = "scale"\nprogram = "/opt/{root}/nvcc"\n', "program"),
        ('[toolchain]\nname = "x"\nextends = "nvcc"\nprogram = "{home}/nvcc"\n', "program"),
        ('[toolchain]\nname = "x"\nextends = "nvcc"\nargv = ["a{flags}", "{source}", "{output}"]\n',
         "argv[0]"),
        ('[toolchain]\nname = "x"\nextends = "nvcc"\nstrict_args = "--Werror"\n', "strict_args"),
    ],
)  # fmt: skip
def test_bad_toolchain_file_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    write(tmp_path, "toolchains/bad.toml", text)
    with pytest.raises(ToolchainError) as err:
        load_toolchains(tmp_path)
    assert err.value.where == "toolchains/bad.toml"
    assert err.value.key == key
    assert "toolchains/bad.toml" in str(err.value)


def test_bad_toml_and_cycles(tmp_path: Path) -> None:
    write(tmp_path, "toolchains/a.toml", "[toolchain\n")
    with pytest.raises(ToolchainError, match=r"toolchains/a.toml: is not valid TOML"):
        load_toolchains(tmp_path)
    write(tmp_path, "toolchains/a.toml", '[toolchain]\nname = "a"\nextends = "b"\n')
    write(tmp_path, "toolchains/b.toml", '[toolchain]\nname = "b"\nextends = "a"\n')
    with pytest.raises(ToolchainError, match="cycle"):
        load_toolchains(tmp_path)


def test_selection_errors_name_hardware_file(tmp_path: Path) -> None:
    tcs = builtin_toolchains()
    with pytest.raises(ToolchainError) as err:
        select_toolchain(_hw(name="hx", doc={"build": {"toolchain": "nope"}}), tcs)
    assert "kernels/hx/HARDWARE.toml" in str(err.value)
    assert err.value.key == "[build] toolchain"
    assert "toolchains/nope.toml" in str(err.value)
    # A project file replacing a built-in does not inherit its vendors.
    write(tmp_path, "toolchains/scale.toml", '[toolchain]\nextends = "scale"\n')
    with pytest.raises(ToolchainError, match="no toolchain builds vendor 'amd'") as err:
        select_toolchain(_hw(name="strix", vendor="amd"), load_toolchains(tmp_path))
    assert "kernels/strix/HARDWARE.toml: [hardware] vendor:" in str(err.value)
    (tmp_path / "toolchains/scale.toml").unlink()
    write(
        tmp_path,
        "toolchains/a.toml",
        '[toolchain]\nname = "a"\nextends = "nvcc"\nvendors = ["nvidia"]\n',
    )
    write(
        tmp_path,
        "toolchains/b.toml",
        '[toolchain]\nname = "b"\nextends = "nvcc"\nvendors = ["nvidia"]\n',
    )
    with pytest.raises(ToolchainError, match="several toolchains claim vendor 'nvidia'"):
        select_toolchain(_hw(), load_toolchains(tmp_path))


def test_find_program_path_then_cuda_home_then_pip(tmp_path: Path) -> None:
    nvcc = builtin_toolchains()["nvcc"]
    on_path = _exe(tmp_path / "path/nvcc")
    home = _exe(tmp_path / "cuda/bin/nvcc")
    site = tmp_path / "venv/lib/python3.11/site-packages"
    pip = _exe(site / "nvidia/cu13/bin/nvcc")
    env = {"PATH": str(on_path.parent), "CUDA_HOME": str(tmp_path / "cuda")}
    assert find_program(nvcc, env, site_dirs=[site]) == on_path
    env["PATH"] = str(tmp_path / "empty")
    assert find_program(nvcc, env, site_dirs=[site]) == home
    del env["CUDA_HOME"]
    assert find_program(nvcc, env, site_dirs=[site]) == pip
    pip.unlink()
    old = _exe(site / "nvidia/cuda_nvcc/bin/nvcc")
    assert find_program(nvcc, env, site_dirs=[site]) == old
    old.chmod(0o644)  # not executable: not a find
    assert find_program(nvcc, env, site_dirs=[site]) is None


def test_missing_toolchain_says_what_to_install(tmp_path: Path) -> None:
    tcs = builtin_toolchains()
    env = {"PATH": str(tmp_path)}
    with pytest.raises(ToolchainMissing) as err:
        find_toolchain(tcs["nvcc"], env, site_dirs=[])
    text = str(err.value)
    assert "toolchain 'nvcc' is not installed" in text
    assert "CUDA toolkit" in text
    assert "pip install 'metrale-orch[cuda]'" in text
    with pytest.raises(ToolchainMissing, match="Xcode command line tools"):
        find_toolchain(tcs["metal"], env, site_dirs=[])
    with pytest.raises(ToolchainMissing, match="install ROCm"):
        find_toolchain(tcs["hip"], env, site_dirs=[])


def test_missing_host_compiler(tmp_path: Path) -> None:
    env = fake_toolchain_env(tmp_path / "bin")
    (tmp_path / "bin/gcc").unlink()
    with pytest.raises(ToolchainMissing, match="host compiler `gcc` was not found"):
        find_toolchain(builtin_toolchains()["nvcc"], env, site_dirs=[])


def test_a_run_probes_each_compiler_once_however_many_threads_ask() -> None:
    memo = ProbeMemo()
    calls: list[int] = []
    gate = threading.Event()

    def run() -> Probe:
        calls.append(1)
        gate.wait(5)
        return Probe(identity="x | 1")

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(memo.probe, "k", run) for _ in range(8)]
        time.sleep(0.2)  # let every thread reach the memo while the first one probes
        gate.set()
        assert {f.result().identity for f in futures} == {"x | 1"}
    assert len(calls) == 1
    assert memo.probe("k", run).identity == "x | 1" and len(calls) == 1


def test_a_failed_probe_is_not_remembered() -> None:
    memo = ProbeMemo()
    outcomes: list[Probe | Exception] = [
        ToolchainError("t", "version_args", "down"),
        Probe(identity="ok"),
    ]

    def run() -> Probe:
        got = outcomes.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    with pytest.raises(ToolchainError):
        memo.probe("k", run)
    assert memo.probe("k", run).identity == "ok"
