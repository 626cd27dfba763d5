"""Toolchains: definitions, overrides, selection, discovery, identity probing."""

from __future__ import annotations

import dataclasses
import json
import sys
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
    probe_toolchain,
)
from metrale_orch.toolchain.stamps import toolchain_stamps
from metrale_orch.tree import Hardware
from tests.support.build import fake_toolchain_env, write


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


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(0o755)
    return path


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


def test_a_new_build_directory_takes_the_toolkit_hashes_from_the_users_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh state directory (a new clone, ``rm -rf build``) reads no binary the
    user's ``toolchain-hashes.json`` holds by the same stamp; a changed binary is read."""
    from metrale_orch import fsutil
    from metrale_orch.toolchain import probe as probe_mod

    env = fake_toolchain_env(tmp_path / "bin")
    # A binary changed within the racy window of its reading is not remembered ...
    probe_toolchain(
        builtin_toolchains()["nvcc"], tmp_path / "bin/nvcc", env, state_dir=tmp_path / "z"
    )
    assert not (tmp_path / ".cache/metrale-orch-probes/toolchain-hashes.json").exists()
    assert not (tmp_path / "z/file-hashes.json").exists()
    # ... the rest of this test trusts every stamp at once.
    monkeypatch.setattr(fsutil, "RACY_NS", 0)
    nvcc = builtin_toolchains()["nvcc"]
    program = tmp_path / "bin/nvcc"
    read: list[str] = []
    real_hash = probe_mod.file_hash

    def counting(path: str) -> str:
        read.append(path)
        return real_hash(path)

    monkeypatch.setattr(probe_mod, "file_hash", counting)
    first = probe_toolchain(nvcc, program, env, state_dir=tmp_path / "a").identity
    assert str(program.resolve()) in read
    shared = json.loads((tmp_path / ".cache/metrale-orch-probes/toolchain-hashes.json").read_text())
    assert str(program.resolve()) in shared
    read.clear()
    assert probe_toolchain(nvcc, program, env, state_dir=tmp_path / "b").identity == first
    assert read == []  # every hash from the user's file
    assert str(program.resolve()) in json.loads((tmp_path / "b/file-hashes.json").read_text())
    # The same bytes written again: another stamp, read again (and the same identity).
    program.write_bytes(program.read_bytes())
    assert probe_toolchain(nvcc, program, env, state_dir=tmp_path / "c").identity == first
    assert read == [str(program.resolve())]
    # Other bytes: another identity, read again.
    program.write_text(program.read_text() + "\n# another build of it\n")
    read.clear()
    other = probe_toolchain(nvcc, program, env, state_dir=tmp_path / "d").identity
    assert other != first and read == [str(program.resolve())]
    # A damaged file is only a miss.
    (tmp_path / ".cache/metrale-orch-probes/toolchain-hashes.json").write_text("{")
    assert probe_toolchain(nvcc, program, env, state_dir=tmp_path / "e").identity == other


def test_probe_runs_once_per_run_and_sees_every_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metrale_orch import fsutil

    monkeypatch.setattr(fsutil, "RACY_NS", 0)  # the fakes were just written: trust them
    env = fake_toolchain_env(tmp_path / "bin")
    nvcc = builtin_toolchains()["nvcc"]
    program = tmp_path / "bin/nvcc"
    state = tmp_path / "state"
    run = ProbeMemo()
    ident = probe_toolchain(nvcc, program, env, state_dir=state, memo=run).identity
    assert "Cuda compilation tools, release 99.0" in ident
    assert "host: gcc (Fake) 12.2.0" in ident
    assert "Copyright" not in ident
    # Only the binaries' content hashes are remembered across processes.
    hashes = json.loads((state / "file-hashes.json").read_text())
    assert str(program.resolve()) in hashes
    # Within a run the probe is not repeated ...
    env["FAKE_NVCC_VERSION"] = "-changed"
    assert probe_toolchain(nvcc, program, env, state_dir=state, memo=run).identity == ident
    # ... but a new run probes again: the fakes were just written, so no record of this
    # probe was kept (tests/test_probe_records.py: what a settled record spares).
    assert not list((state / "probes").glob("*.json"))
    changed = probe_toolchain(nvcc, program, env, state_dir=state, memo=ProbeMemo()).identity
    assert changed != ident and "release 99.0-changed" in changed
    # What the dry run shows (e.g. a flag a wrapper adds) is part of the identity.
    dry = probe_toolchain(nvcc, program, {**env, "FAKE_NVCC_DRYRUN": "-DWRAPPED=1"}).identity
    assert dry != changed
    # So is the host compiler's content, with the same --version output.
    gcc = tmp_path / "bin/gcc"
    gcc.write_text(gcc.read_text() + "# a wrapper that adds -DX\n")
    assert probe_toolchain(nvcc, program, env).identity != changed
    # A keyed environment variable (NVCC_*, CPATH ...) too.
    assert (
        probe_toolchain(nvcc, program, {**env, "CPATH": "/x"}).identity
        != probe_toolchain(nvcc, program, env).identity
    )


def _wrapper(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.nvcc
def test_real_nvcc_seen_through_a_wrapper(tmp_path: Path) -> None:
    """A wrapper ``nvcc`` whose bytes never change but whose real compiler (picked by an
    environment variable, like asdf/pyenv shims) or added flags do: the identity moves."""
    import os
    import shutil

    real = shutil.which("nvcc")
    assert real is not None
    nvcc = builtin_toolchains()["nvcc"]
    wrapper = _wrapper(tmp_path / "w/nvcc", f'exec {real} ${{METRALE_TEST_WRAP_FLAGS:-}} "$@"\n')
    env = dict(os.environ)
    base = find_toolchain(nvcc, env, site_dirs=[])
    assert base.roots and all(Path(r).is_absolute() for r in base.roots)
    plain = probe_toolchain(nvcc, wrapper, env).identity
    flagged = probe_toolchain(
        nvcc, wrapper, {**env, "METRALE_TEST_WRAP_FLAGS": "-DWRAPPED=1"}
    ).identity
    assert plain != flagged
    assert probe_toolchain(nvcc, wrapper, env).identity == plain  # deterministic


def test_probe_failure_is_a_toolchain_error(tmp_path: Path) -> None:
    env = fake_toolchain_env(tmp_path / "bin")
    bad = _exe(tmp_path / "bin/nvcc")
    bad.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    with pytest.raises(ToolchainError, match=r"version probe failed.*exited with status 3"):
        probe_toolchain(builtin_toolchains()["nvcc"], bad, env)


def test_host_compiler_from_nvcc_ccbin_file_or_directory(tmp_path: Path) -> None:
    env = fake_toolchain_env(tmp_path / "bin")
    nvcc = builtin_toolchains()["nvcc"]
    other = _exe(tmp_path / "gcc13/gcc")
    other.write_text("#!/bin/sh\necho 'gcc (Other) 13.1.0'\n")
    for ccbin in (str(other), str(other.parent)):
        ident = probe_toolchain(nvcc, tmp_path / "bin/nvcc", {**env, "NVCC_CCBIN": ccbin}).identity
        assert " | host: gcc (Other) 13.1.0 | " in ident


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


def test_every_toolchain_is_probed_at_the_same_time(tmp_path: Path) -> None:
    """The stamps of a run's toolchains are probed together, not one after another
    (the no-op build waited for their sum): the probes' version runs overlap."""
    log = tmp_path / "probes.log"
    env = fake_toolchain_env(tmp_path / "bin")
    slow = tmp_path / "bin/slowcc"
    slow.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        f"log = open({str(log)!r}, 'a')\n"
        "log.write(f'start {os.getpid()} {time.time()}\\n'); log.flush()\n"
        "time.sleep(0.5)\n"
        "log.write(f'end {os.getpid()} {time.time()}\\n'); log.close()\n"
        "print('slowcc 1.0')\n"
    )
    slow.chmod(0o755)
    base = builtin_toolchains()["nvcc"]
    tcs = {
        f"slow{i}": dataclasses.replace(
            base,
            name=f"slow{i}",
            program="slowcc",
            dryrun_args=(),
            host_compiler="",
            host_compiler_env="",
            program_env=(),
            program_paths=(),
            version_args=(f"-v{i}",),
        )
        for i in range(3)
    }
    stamps = toolchain_stamps(tcs, env, memo=ProbeMemo())
    assert sorted(stamps) == ["slow0", "slow1", "slow2"]
    assert all(s[0] == "found" for s in stamps.values()), stamps
    events = [line.split() for line in log.read_text().splitlines()]
    starts = sorted(float(t) for kind, _, t in events if kind == "start")
    ends = sorted(float(t) for kind, _, t in events if kind == "end")
    assert len(starts) == 3
    assert starts[-1] < ends[0], "the probes ran one after another"
