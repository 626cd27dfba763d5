"""HIP for real: Debian's hipcc 5.2 (clang 15) builds a gfx90a target through doit.

What runs for real, with the hipcc installed on the machine (CI installs it, see
``.ci/run``; elsewhere these tests skip with the reason when it is absent):

- a small tree with a HIP target at gfx90a (an arch clang 15 builds) and one at
  gfx1151 (Strix Halo, unknown to clang 15), built by ``doit build``: the command
  line SPEC 3.3 gives, with ``HIP_PLATFORM=amd`` set by the toolchain whatever the
  shell says; the dependency list recorded; the code object installed and read by
  the smoke static check; gfx1151 skipped with clang's own reason, and a failure
  when named; a second run a no-op (the probed identity is the same in every
  process);
- the arch check remembered per compiler and arch in the build's state directory;
- the AMDGPU code-object reader on hipcc's own output.

The toolchain keys (``env_set``, ``arch_check_args``), the arch check's logic and the
``extra_hip_flags`` warning are also tested with fakes, so they run everywhere.

The tests of this topic that run in-process are in ``tests/unit/toolchain/test_hip.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale_orch.smoke import (
    DeviceInfo,
    DeviceStatus,
    inspect_artefact,
    run_smoke,
    static_problems,
)
from metrale_orch.smoke.amdgpu import (
    BUNDLE_MAGIC,
    is_code_object,
    parse_code_object,
)
from metrale_orch.smoke.elf import ElfError
from metrale_orch.steps.errors import ToolchainError
from metrale_orch.toolchain import archcheck
from metrale_orch.toolchain.archcheck import (
    ARCH_CHECKS,
    arch_problem,
    find_toolchain_for_arch,
    first_error_line,
    probe_for_arch,
)
from metrale_orch.toolchain.argv import (
    toolchain_environ,
)
from metrale_orch.toolchain.definitions import builtin_toolchains
from metrale_orch.toolchain.errors import ArchUnsupported
from metrale_orch.toolchain.probe import ProbeMemo, probe_toolchain
from tests.support.build import make_cache, make_config, write
from tests.support.project import doit, project_env
from tests.support.toolchain import _WARP, FILES

# ------------------------------------------------------------------------------ hipcc


def _installed_hipcc() -> Path | None:
    for candidate in (os.environ.get("METRALE_HIPCC"), "/opt/rocm/bin/hipcc"):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    found = shutil.which("hipcc")
    return Path(found) if found else None


@pytest.fixture
def hipcc() -> Path:
    """The installed hipcc; without one a skip, except on CI (``CI`` set), where
    ``.ci/run`` installs it: there its absence is a failure."""
    found = _installed_hipcc()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("hipcc is not installed, and CI must build HIP for real (.ci/run)")
        pytest.skip("hipcc is not installed (Debian: apt-get install hipcc)")
    return found


def _project(tmp_path: Path, hipcc: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "proj"
    for rel, text in FILES.items():
        write(root, rel, text)
    env = project_env(tmp_path)
    env["METRALE_HIPCC"] = str(hipcc)
    # A shell left on the NVIDIA platform: the toolchain overrides it, with a warning.
    env["HIP_PLATFORM"] = "nvidia"
    return root, env


def _compile_line(log: str, module: str) -> list[str]:
    """The argv the build log shows for ``module``'s compile, after ``(cd <dir> &&)``."""
    marker = f": compile {module}: (cd "
    line = next(ln for ln in log.splitlines() if marker in ln)
    return line.split("&&) ", 1)[1].split()


def test_hip_target_builds_for_real_and_an_unknown_arch_is_skipped(
    tmp_path: Path, hipcc: Path
) -> None:
    root, env = _project(tmp_path, hipcc)
    run = doit(root, ["build"], env)
    assert run.returncode == 0, run.text
    assert "1 built, 0 from cache, 0 up to date, 1 skipped, 0 failed" in run.text
    # Skipped with clang's own reason, and a hint that matches it.
    assert (
        "skipped 1 target(s): toolchain 'hip' cannot build gfx1151: `hipcc` says: clang: "
        "error: invalid target ID 'gfx1151'" in run.text
    )
    assert "whose compiler supports gfx1151 (strix/m/q)" in run.text
    assert "dryrun_args" not in run.text
    # The shell's HIP_PLATFORM is overridden, and the tree's extra_hip_flags warned about.
    assert (
        "warning: environment HIP_PLATFORM=nvidia is not used: toolchain 'hip' sets "
        "HIP_PLATFORM=amd (env_set)" in run.text
    )
    assert (
        "warning: kernels/mi200/HARDWARE.toml: [build] extra_hip_flags: no toolchain reads "
        "this key: HIP targets read `extra_nvcc_flags`" in run.text
    )
    # SPEC 3.3's command line, in the build log with the variables the toolchain sets.
    argv = _compile_line((root / "build/metrale-orch.log").read_text(), "scale")
    tmp = next(a for a in argv if a.endswith("/scale.co")).rsplit("/", 1)[0]
    assert argv == [
        "HCC_AMDGPU_TARGET=gfx000", "HIP_PLATFORM=amd", str(hipcc),
        "-x", "hip", "--genco", "--offload-arch=gfx90a", "-O3",
        "-include", "hip/hip_runtime.h", "-ffp-contract=off", "-DSCALE=2.0f",
        "-I.", "../../.hip/m/q/scale.cu", "-o", f"{tmp}/scale.co", "-MD", "-MF", f"{tmp}/deps.d",
    ]  # fmt: skip
    _check_installed(root, tmp_path)
    # A second run is a no-op: hipcc's identity is the same in every process.
    again = doit(root, ["build"], env)
    assert "0 built, 0 from cache, 1 up to date, 1 skipped, 0 failed" in again.text, again.text
    # Named, the target hipcc cannot build fails with the same reason.
    named = doit(root, ["build:strix/m/q"], env)
    assert named.returncode != 0
    assert "toolchain 'hip' cannot build gfx1151: `hipcc` says: clang: error:" in named.text
    # The smoke task reads the code object: static check passed, numbers skipped.
    smoke = doit(root, ["smoke:mi200"], env)
    assert smoke.returncode == 0, smoke.text
    assert "smoke mi200: 1 static passed, 1 numeric skipped" in smoke.text, smoke.text
    report = (root / "build/smoke-mi200.xml").read_text()
    assert "numeric smoke skipped: gfx90a is an AMDGPU code object" in report


def _check_installed(root: Path, tmp_path: Path) -> None:
    """The manifest, the code object the smoke check reads, the inputs recorded."""
    out = root / "build/mi200/m/q"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["arch"] == "gfx90a"
    assert manifest["flags"] == ["--fmad=false", "-ffp-contract=off", "-DSCALE=2.0f"]
    (module,) = manifest["modules"]
    assert (module["artefact"], module["outcome"]) == ("scale.co", "compiled")
    info = inspect_artefact((out / "scale.co").read_bytes())
    assert (info.kind, info.arches, info.entries) == ("hsaco", ("gfx90a",), ("scale_k",))
    assert static_problems(info, "gfx90a", ["scale_k"]) == ()
    assert static_problems(info, "gfx1030", ["scale_k"]) == (
        "code object is for gfx90a, manifest arch is 'gfx1030'",
    )
    # The cache entry records what hipcc's dependency list names: the staged files the
    # mirror was made from, and hip_runtime.h of the toolkit (the -include).
    config = make_config(root, tmp_path / "local-cache")
    entry = make_cache(config).get(module["key"])
    assert entry is not None
    recorded = {tuple(i[:2]) for i in entry.meta["inputs"]}
    assert {("stage", "scale.cu"), ("stage", "../../common/warp.cuh")} <= recorded
    assert any(k.startswith("toolkit") and p == "hip/hip_runtime.h" for k, p in recorded)

    # On a machine with a CUDA device the code object is not launched there, saying why.
    def cuda_device() -> DeviceStatus:
        return DeviceStatus(device=DeviceInfo(index=0, name="NVIDIA H200", cc=(9, 0)))

    report = run_smoke(root, "mi200", probe=cuda_device)
    assert [(r.case, r.outcome) for r in report.results] == [
        ("static", "passed"),
        ("scale_64", "skipped"),
    ]
    assert report.results[1].message == (
        "numeric smoke skipped: gfx90a is an AMDGPU code object; the numeric smoke launches "
        "on CUDA devices only"
    )
    # The mirror widened the warp mask; the tree was not touched.
    mirrored = root / "build/stage/mi200/m/q/.hip/common/warp.cuh"
    assert "unsigned long long m = __activemask();" in mirrored.read_text()
    assert (root / "kernels/mi200/common/warp.cuh").read_text() == _WARP


# ------------------------------------------------------------------------------ arch check

FAKE_CHECKER = f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
if "--version" in args:
    print("fake hipcc 1 platform=" + os.environ.get("HIP_PLATFORM", "?"))
    sys.exit(0)
refuse = os.path.join(os.path.dirname(os.path.abspath(__file__)), "refuse")
refused = open(refuse).read().split() if os.path.exists(refuse) else []
if "-###" in args:
    if os.environ.get("FAKE_PROBE_LOG"):
        with open(os.environ["FAKE_PROBE_LOG"], "a") as fh:
            fh.write(" ".join(args) + "\\n")
    if refused:
        print("refusing " + " ".join(refused))  # what a wrapper reading its file shows
    if "--offload-arch=gfx9999" in args:
        sys.exit("clang: error: invalid target ID 'gfx9999'")
    if "--offload-arch=gfx8888" in args:
        sys.exit("clang: error: unknown argument: '-###'")
    sys.exit(0)
with open(os.environ["FAKE_CHECK_LOG"], "a") as fh:
    fh.write(os.environ.get("HIP_PLATFORM", "?") + " " + " ".join(args) + "\\n")
arch = [a.split("=", 1)[1] for a in args if a.startswith("--offload-arch=")][0]
if arch == "gfx9999" or arch in refused:
    sys.stderr.write("clang: warning: something\\nclang: error: invalid target ID 'gfx9999'\\n")
    sys.exit(1)
if arch == "gfx0":
    sys.exit(0)  # writes nothing
open(args[args.index("-o") + 1], "w").write("code object")
"""


@pytest.fixture
def checker(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    program = tmp_path / "bin/hipcc"
    write(program.parent, "hipcc", FAKE_CHECKER)
    program.chmod(0o755)
    yield program, {"PATH": "", "FAKE_CHECK_LOG": str(tmp_path / "check.log")}


def _checks(tmp_path: Path) -> list[str]:
    log = tmp_path / "check.log"
    return log.read_text().splitlines() if log.exists() else []


def test_arch_check_reason_memo_and_recheck(
    tmp_path: Path, checker: tuple[Path, dict[str, str]]
) -> None:
    program, env = checker
    hip = builtin_toolchains()["hip"]
    state = tmp_path / "state"

    def problem(arch: str, identity: str = "id 1") -> str:
        return arch_problem(hip, program, env, arch=arch, identity=identity, state_dir=state)

    assert problem("gfx9999") == "clang: error: invalid target ID 'gfx9999'"
    assert problem("gfx90a") == ""
    assert problem("gfx0") == "exited 0 but wrote no metrale_arch_check.co"
    # The check ran in the toolchain's environment, as its template says.
    assert _checks(tmp_path)[1] == (
        "amd -x hip --genco --offload-arch=gfx90a -O3 metrale_arch_check.cu "
        "-o metrale_arch_check.co"
    )
    # Remembered across processes (the state file), per compiler identity and arch.
    assert len(json.loads((state / ARCH_CHECKS).read_text())) == 3
    assert problem("gfx9999") == "clang: error: invalid target ID 'gfx9999'"
    assert problem("gfx90a") == ""
    assert len(_checks(tmp_path)) == 3
    assert problem("gfx90a", identity="id 2") == ""  # another compiler: checked again
    assert len(_checks(tmp_path)) == 4
    # No state directory: no memo; no arch or no arch_check_args: no check at all.
    assert arch_problem(hip, program, env, arch="gfx90a", identity="id 1") == ""
    assert len(_checks(tmp_path)) == 5
    assert problem("") == ""
    nvcc = builtin_toolchains()["nvcc"]
    assert arch_problem(nvcc, program, env, arch="sm_90a", identity="i", state_dir=state) == ""
    assert len(_checks(tmp_path)) == 5


def test_an_arch_found_to_build_is_probed_once_while_its_probe_holds(
    tmp_path: Path, checker: tuple[Path, dict[str, str]]
) -> None:
    """A no-op build runs one dry run for an arch the compiler was found to build, not
    two: the arch's probe, whose identity was kept beside the verdict. A compiler whose
    arch probe shows another identity is checked again, and refused."""
    program, env = checker
    env = {**env, "FAKE_PROBE_LOG": str(tmp_path / "probe.log")}
    hip = builtin_toolchains()["hip"]
    state = tmp_path / "state"

    def probes() -> list[str]:
        log = tmp_path / "probe.log"
        return log.read_text().splitlines() if log.exists() else []

    def run(arch: str = "gfx90a") -> str:  # each call a new process's: a new memo
        return probe_for_arch(
            hip, program, env, arch=arch, state_dir=state, memo=ProbeMemo()
        ).identity

    first = run()
    assert len(probes()) == 2 and len(_checks(tmp_path)) == 1  # without the arch, with it
    assert run() == first
    assert probes()[2:] == [probes()[1]] and len(_checks(tmp_path)) == 1
    # The compiler now refuses the arch, and its probe shows it (a wrapper's file).
    (program.parent / "refuse").write_text("gfx90a")
    with pytest.raises(ArchUnsupported) as err:
        run()
    assert err.value.reason.startswith("clang: error: invalid target ID")
    assert len(_checks(tmp_path)) == 2
    # No state directory: nothing kept, the check runs each time; an arch-less target,
    # or a toolchain without an arch check, is its plain probe.
    (program.parent / "refuse").unlink()
    memo = ProbeMemo()
    assert probe_for_arch(hip, program, env, arch="gfx90a", memo=memo).identity == first
    assert len(_checks(tmp_path)) == 3
    plain = probe_toolchain(hip, program, env, memo=memo).identity
    assert probe_for_arch(hip, program, env, arch="", memo=memo).identity == plain
    assert len(_checks(tmp_path)) == 3


def test_an_arch_the_compiler_cannot_build_is_a_missing_toolchain(
    tmp_path: Path, checker: tuple[Path, dict[str, str]]
) -> None:
    program, env = checker
    hip = builtin_toolchains()["hip"]
    env = {**env, "METRALE_HIPCC": str(program)}
    with pytest.raises(ArchUnsupported) as err:
        find_toolchain_for_arch(hip, env, state_dir=tmp_path / "state", arch="gfx9999")
    assert str(err.value) == (
        "toolchain 'hip' cannot build gfx9999: `hipcc` says: clang: error: invalid target ID "
        "'gfx9999'; to build it, install ROCm (set METRALE_HIPCC to hipcc, install ROCm in "
        "/opt/rocm, or put hipcc on PATH) whose compiler supports gfx9999"
    )
    assert first_error_line("a\n\n b \n") == "a"
    assert first_error_line("") == ""


def test_a_failed_dry_run_hints_at_its_cause(checker: tuple[Path, dict[str, str]]) -> None:
    program, env = checker
    hip = builtin_toolchains()["hip"]
    with pytest.raises(ToolchainError) as err:
        probe_toolchain(hip, program, env, arch="gfx9999")
    assert str(err.value).endswith(
        "the compiler rejects the arch gfx9999 ([hardware] arch): install a hipcc that "
        "supports gfx9999"
    )
    with pytest.raises(ToolchainError) as err:
        probe_toolchain(hip, program, env, arch="gfx8888")
    assert str(err.value).endswith(
        "if this compiler has no dry run, set dryrun_args = [] in a toolchains/hip.toml that "
        'extends "hip"'
    )


def test_real_hipcc_arch_check_and_its_memo(
    tmp_path: Path, hipcc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hip = builtin_toolchains()["hip"]
    env = {"PATH": os.environ.get("PATH", ""), "HIP_PLATFORM": "nvidia"}
    identity = probe_toolchain(hip, hipcc, env).identity
    state = tmp_path / "state"
    assert arch_problem(hip, hipcc, env, arch="gfx90a", identity=identity, state_dir=state) == ""
    unknown = arch_problem(hip, hipcc, env, arch="gfx1151", identity=identity, state_dir=state)
    assert unknown.startswith("clang: error: invalid target ID 'gfx1151'")

    def must_not_run(*_args: object) -> str:
        raise AssertionError("the verdict is remembered")

    monkeypatch.setattr(archcheck, "run_arch_check", must_not_run)
    assert arch_problem(hip, hipcc, env, arch="gfx90a", identity=identity, state_dir=state) == ""
    assert arch_problem(hip, hipcc, env, arch="gfx1151", identity=identity, state_dir=state) == (
        unknown
    )


def test_real_hipcc_identity_is_the_same_in_every_process(hipcc: Path) -> None:
    """The dry run's random names (clang's temporary directories, ``-cuid``) and the GPUs
    of the machine (``rocm_agent_enumerator``) stay out of the identity."""
    code = (
        "import sys; from pathlib import Path\n"
        "from metrale_orch.toolchain.definitions import builtin_toolchains\n"
        "from metrale_orch.toolchain.probe import probe_toolchain\n"
        "hip = builtin_toolchains()['hip']\n"
        "env = {'PATH': '/usr/bin:/bin'}\n"
        "print(probe_toolchain(hip, Path(sys.argv[1]), env).identity)\n"
        "print(probe_toolchain(hip, Path(sys.argv[1]), env, arch='gfx90a').identity)\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(hipcc)], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert "Traceback" not in runs[0]
    assert runs[0].startswith("HIP version: ")


# ------------------------------------------------------------------------------ code objects


@pytest.fixture
def code_object(tmp_path: Path, hipcc: Path) -> bytes:
    """hipcc's ``--genco`` output for two arches (one with target-id features)."""
    src = tmp_path / "k.cu"
    src.write_text(
        'extern "C" __global__ void add_k(float* x) { x[threadIdx.x] += 1.0f; }\n'
        'extern "C" __global__ void mul_k(float* x) { x[threadIdx.x] *= 2.0f; }\n'
        "__device__ float helper(float v) { return v; }\n"
    )
    out = tmp_path / "k.co"
    env = toolchain_environ(builtin_toolchains()["hip"], os.environ)
    subprocess.run(
        [str(hipcc), "-x", "hip", "--genco", "--offload-arch=gfx90a:sramecc+:xnack-",
         "--offload-arch=gfx1030", "-O3", "-include", "hip/hip_runtime.h", str(src),
         "-o", str(out)],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    return out.read_bytes()


def test_code_object_reader_on_hipcc_output(code_object: bytes) -> None:
    assert is_code_object(code_object) and code_object.startswith(BUNDLE_MAGIC)
    info = parse_code_object(code_object)
    assert info.bundled
    by_processor = {i.processor: i for i in info.images}
    assert sorted(by_processor) == ["gfx1030", "gfx90a"]
    mi = by_processor["gfx90a"]
    assert mi.target_id == "gfx90a:sramecc+:xnack-"
    assert mi.bundle_id == "hipv4-amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"
    assert mi.metadata_target == "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"
    assert mi.code_object_version >= 4
    assert mi.kernels == ("add_k", "mul_k")  # the device function is no kernel
    assert by_processor["gfx1030"].target_id == "gfx1030"
    artefact = inspect_artefact(code_object)
    assert artefact.kind == "hsaco"
    assert static_problems(artefact, "gfx1030", ["add_k", "mul_k"]) == ()
    assert static_problems(artefact, "gfx90a:sramecc+:xnack-", ["add_k"]) == ()
    assert static_problems(artefact, "gfx90a:xnack+", []) == (
        "code object is for gfx90a:sramecc+:xnack-, manifest arch is 'gfx90a:xnack+'",
    )
    assert static_problems(artefact, "gfx90a", ["sub_k"]) == (
        "expected entry 'sub_k' is missing (entries: add_k, mul_k); declare it extern \"C\" "
        "__global__ in the module",
    )
    assert "image: gfx90a:sramecc+:xnack- (code object v" in artefact.describe()
    # The device image alone (a bare ELF) reads the same.
    bare = parse_code_object(_entry(code_object, "gfx1030"))
    assert not bare.bundled and bare.images[0].kernels == ("add_k", "mul_k")


def _entry(bundle: bytes, processor: str) -> bytes:
    (count,) = struct.unpack_from("<Q", bundle, len(BUNDLE_MAGIC))
    pos = len(BUNDLE_MAGIC) + 8
    for _ in range(count):
        offset, size, n = struct.unpack_from("<QQQ", bundle, pos)
        pos += 24
        if bundle[pos : pos + n].decode().endswith(processor):
            return bundle[offset : offset + size]
        pos += n
    raise AssertionError(processor)


def test_code_object_reader_refuses_what_it_cannot_vouch_for(code_object: bytes) -> None:
    with pytest.raises(ElfError, match="offload bundle truncated"):
        parse_code_object(code_object[: len(BUNDLE_MAGIC) + 20])
    with pytest.raises(ElfError, match="runs past the end of the file"):
        parse_code_object(code_object[:200])
    elf = _entry(code_object, "gfx1030")
    cubin_like = elf[:18] + struct.pack("<H", 190) + elf[20:]
    with pytest.raises(ElfError, match="not EM_AMDGPU"):
        parse_code_object(cubin_like)
    # The ELF flags say gfx1100 while the bundle id and the metadata say gfx1030.
    (e_flags,) = struct.unpack_from("<I", elf, 48)  # ELF64 e_flags
    relabelled = elf[:48] + struct.pack("<I", (e_flags & ~0xFF) | 0x041) + elf[52:]
    info = inspect_artefact(code_object.replace(elf, relabelled))
    assert sorted(info.arches) == ["gfx1100", "gfx90a:sramecc+:xnack-"]
    problems = static_problems(info, "gfx1030", [])
    assert len(problems) == 3
    assert problems[0].startswith("code object is for ")
    assert problems[0].endswith(", manifest arch is 'gfx1030'")
    assert (
        "image gfx1100: its bundle id names 'hipv4-amdgcn-amd-amdhsa--gfx1030', its ELF flags "
        "'gfx1100'"
    ) in problems
    assert (
        "image gfx1100: its metadata names 'amdgcn-amd-amdhsa--gfx1030', its ELF flags 'gfx1100'"
    ) in problems
