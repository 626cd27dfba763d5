"""The doit integration: real ``python -m doit`` runs in temporary projects.

Real nvcc builds the main scenario (parallel process workers, no-op, fresh
checkout, a second checkout served from the shared local cache). A recording
fake compiler drives the precision scenarios (which targets run, which modules
compile) so they stay fast.

The tests of this topic that run in-process are in ``tests/unit/tasks/test_dodo.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

from metrale_orch.tasks.checker import (
    TaskDataCodec,
)
from tests.support.project import (
    DoitRun,
    doit,
    fake_compiles,
    make_project,
    project_env,
    started_targets,
    terminate_after,
)

NVIDIA = ("gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w4", "hopper/qwen/w8")
HAS_NVCC = shutil.which("nvcc") is not None and shutil.which("gcc") is not None


def summary(run: DoitRun) -> str:
    lines = [ln for ln in run.out.splitlines() if ln.startswith("build: ")]
    assert lines, run.text
    return lines[-1]


def counts(run: DoitRun) -> dict[str, int]:
    """{'built': n, 'from cache': n, 'up to date': n, 'skipped': n, 'failed': n}."""
    text = summary(run).removeprefix("build: ").split(" in ")[0]
    out = {}
    for part in text.split(", "):
        n, label = part.split(" ", 1)
        out[label] = int(n)
    return out


def touch_all(root: Path, delta: int = 1000) -> int:
    """Give every input a new mtime, same bytes (a fresh checkout); returns the count."""
    n = 0
    for path in (root / "kernels").rglob("*"):
        if path.is_file():
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns + delta * 10**9, st.st_mtime_ns + delta * 10**9))
            n += 1
    return n


def saved_states(root: Path) -> dict[str, dict[str, list[object]]]:
    """task -> {dep: state} from the project's .doit.db (plain sqlite, read-only)."""
    con = sqlite3.connect(root / ".doit.db")
    try:
        rows = con.execute("select task_id, task_data from doit").fetchall()
    finally:
        con.close()
    out = {}
    for task_id, data in rows:
        doc = TaskDataCodec().decode(data)
        out[task_id] = {k: v for k, v in doc.items() if k.startswith("kernels/")}
    return out


def check_artefacts(build: Path) -> int:
    """Every manifest names artefacts that exist with its hashes; no temp file anywhere."""
    n = 0
    for manifest in build.glob("*/*/*/manifest.json"):
        doc = json.loads(manifest.read_text())
        for mod in doc["modules"]:
            data = (manifest.parent / mod["artefact"]).read_bytes()
            assert xxhash.xxh3_128_hexdigest(data) == mod["xxh3"], manifest
        n += 1
    for path in build.rglob("*"):
        if path.is_file() and path.parent.name != ".state" and path.name.startswith("."):
            assert not path.name.endswith(".tmp"), path
    return n


# ------------------------------------------------------------------------------ real nvcc


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc and gcc are needed on PATH")
def test_real_nvcc_parallel_build_noop_fresh_checkout_and_second_checkout(tmp_path: Path) -> None:
    root = make_project(tmp_path / "one")
    env = project_env(tmp_path)

    first = doit(root, ["-n", "2", "-P", "process", "build"], env)
    assert first.returncode == 0, first.text
    assert counts(first) == {
        "built": 4, "from cache": 0, "up to date": 0, "skipped": 1, "failed": 0
    }  # fmt: skip
    assert "skipped 1 target(s): toolchain 'metal' is not installed" in first.out
    assert started_targets(first) == sorted(NVIDIA)
    assert check_artefacts(root / "build") == 4
    ptx = (root / "build/gb10/qwen/w4/scale.ptx").read_text()
    assert ".target sm_121f" in ptx and ".entry scale_k" in ptx
    log = (root / "build/metrale-orch.log").read_text()
    assert "nvcc" in log
    stats = json.loads((root / "build/cache-stats.json").read_text())
    assert stats["misses"] >= 7 and stats["puts"] >= 7

    noop = doit(root, [], env)
    assert noop.returncode == 0, noop.text
    assert counts(noop)["up to date"] == 4 and started_targets(noop) == []

    # A fresh checkout: every mtime new, same bytes. One pass refreshes, then no-ops.
    assert touch_all(root) > 10
    fresh = doit(root, ["build"], env)
    assert fresh.returncode == 0, fresh.text
    assert counts(fresh)["up to date"] == 4 and started_targets(fresh) == []
    for task, states in saved_states(root).items():
        for rel, state in states.items():
            assert state[0] == (root / rel).stat().st_mtime_ns, (task, rel)

    # A second checkout elsewhere shares the local cache: nothing compiles.
    two = tmp_path / "two"
    shutil.copytree(root / "kernels", two / "kernels")
    shutil.copy(root / "dodo.py", two / "dodo.py")
    second = doit(two, ["build"], env)
    assert second.returncode == 0, second.text
    assert counts(second)["from cache"] == 4 and counts(second)["built"] == 0
    for manifest in (two / "build").glob("*/*/*/manifest.json"):
        outcomes = {m["outcome"] for m in json.loads(manifest.read_text())["modules"]}
        assert outcomes == {"local"}, manifest
    assert check_artefacts(two / "build") == 4
    assert (two / "build/hopper/qwen/w4/scale.ptx").read_bytes() == (
        root / "build/hopper/qwen/w4/scale.ptx"
    ).read_bytes()


# ------------------------------------------------------------------------------ fake compiler


def run_ok(root: Path, env: dict[str, str], *args: str) -> DoitRun:
    run = doit(root, list(args) or ["build"], env)
    assert run.returncode == 0, run.text
    return run


def test_rebuild_precision(fake_project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = fake_project
    k = root / "kernels"
    first = run_ok(root, env)
    assert started_targets(first) == sorted(NVIDIA)
    # add.cu is shared by both models of each arch: compiled once per arch.
    assert fake_compiles(tmp_path) == [
        "sm_121f add.cu", "sm_121f extra.cu", "sm_121f mul.cu", "sm_121f scale.cu",
        "sm_90a add.cu", "sm_90a mul.cu", "sm_90a scale.cu",
    ]  # fmt: skip

    def step(expect_targets: list[str], expect_compiles: list[str]) -> DoitRun:
        run = run_ok(root, env)
        assert started_targets(run) == sorted(expect_targets), run.text
        assert fake_compiles(tmp_path) == sorted(expect_compiles), run.text
        return run

    # Touch without change: nothing.
    touch_all(root, 5)
    step([], [])
    # A leaf: its target and the overlay inheriting that leaf.
    (k / "hopper/qwen/w4/scale.cu").write_text(
        (k / "hopper/qwen/w4/scale.cu").read_text() + "// edit\n"
    )
    step(["hopper/qwen/w4", "gb10/qwen/w4"], ["sm_90a scale.cu", "sm_121f scale.cu"])
    # A common header: every target reading it; only modules including it compile.
    (k / "hopper/common/util.cuh").write_text("#pragma once\n#define UTIL_SCALE 3.0f\n")
    step(
        list(NVIDIA),
        ["sm_90a add.cu", "sm_90a scale.cu", "sm_121f add.cu", "sm_121f scale.cu"],
    )
    # An overlay's own common file: that overlay only.
    (k / "gb10/common/extra.cu").write_text((k / "gb10/common/extra.cu").read_text() + "//\n")
    step(["gb10/qwen/w4", "gb10/qwen/w8"], ["sm_121f extra.cu"])
    # Add a file: the targets whose layout gains it.
    (k / "hopper/qwen/w8/new.cu").write_text('extern "C" __global__ void new_k() {}\n')
    step(["hopper/qwen/w8", "gb10/qwen/w8"], ["sm_90a new.cu", "sm_121f new.cu"])
    # Remove it again: same targets, nothing to compile (the cache has the rest).
    (k / "hopper/qwen/w8/new.cu").unlink()
    step(["hopper/qwen/w8", "gb10/qwen/w8"], [])
    # A flag of one hardware: its targets, every module recompiled once.
    hw = k / "gb10/HARDWARE.toml"
    hw.write_text(hw.read_text() + '\n[build]\nextra_nvcc_flags = ["-DGB=1"]\n')
    step(
        ["gb10/qwen/w4", "gb10/qwen/w8"],
        ["sm_121f add.cu", "sm_121f extra.cu", "sm_121f mul.cu", "sm_121f scale.cu"],
    )
    # A [defaults] value: re-baked, nothing recompiled. gb10 reads hopper's manifest too.
    hw = k / "hopper/HARDWARE.toml"
    hw.write_text(hw.read_text().replace("lm_head_batchm_max = 8", "lm_head_batchm_max = 4"))
    step(list(NVIDIA), [])
    # hopper bakes its new value; gb10 declares no [defaults] and keeps the lever's default.
    for hw_name, value in (("hopper", 4), ("gb10", 8)):
        baked = json.loads((root / f"build/{hw_name}/qwen/w8/target_defaults.json").read_text())
        assert (baked["hw"], baked["lm_head_batchm_max"]) == (hw_name, value)


def test_tree_error_fails_only_its_targets_then_shadow_declared(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    k = root / "kernels"
    run_ok(root, env)
    fake_compiles(tmp_path)
    # An undeclared leaf-over-common shadow breaks hopper/qwen/w8 and gb10/qwen/w8.
    (k / "hopper/qwen/w8/add.cu").write_text('extern "C" __global__ void add_leaf() {}\n')
    bad = doit(root, ["build"], env)
    # 2, not 1: doit counts the group `build` as an error (UnmetDependency) then.
    assert bad.returncode == 2, bad.text
    assert "UnmetDependency" not in bad.text
    failed = sorted(ln for ln in bad.out.splitlines() if ln.startswith("FAILED "))
    assert [ln.split(":", 2)[1] for ln in failed] == ["gb10/qwen/w8", "hopper/qwen/w8"]
    assert all("shadow" in ln for ln in failed), failed
    assert "Traceback" not in bad.text
    assert counts(bad) == {
        "built": 0, "from cache": 0, "up to date": 2, "skipped": 1, "failed": 2
    }  # fmt: skip
    # `doit list --status` (no --all) lists every target with its state.
    listing = doit(root, ["list", "--status"], env)
    assert listing.returncode == 0, listing.text
    for target in NVIDIA:
        assert f"build:{target}" in listing.out
    # Declaring it rebuilds exactly those two, compiling the leaf add.cu per arch.
    (k / "hopper/qwen/w8/KERNEL.toml").write_text('[shadow]\nadd = "leaf variant"\n')
    good = run_ok(root, env)
    assert started_targets(good) == ["gb10/qwen/w8", "hopper/qwen/w8"]
    assert fake_compiles(tmp_path) == ["sm_121f add.cu", "sm_90a add.cu"]
    manifest = json.loads((root / "build/hopper/qwen/w8/manifest.json").read_text())
    assert manifest["shadows"] and manifest["shadows"][0]["reason"] == "leaf variant"


def test_missing_toolchain_broad_skips_explicit_fails(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    broad = doit(root, ["build:apple/*"], env)
    assert broad.returncode == 0, broad.text
    assert counts(broad)["skipped"] == 1
    assert "toolchain 'metal' is not installed" in broad.out
    explicit = doit(root, ["build:apple/llama/f16"], env)
    assert explicit.returncode == 1, explicit.text
    assert "FAILED build:apple/llama/f16: toolchain 'metal' is not installed" in explicit.out
    assert "install" in explicit.out and "Traceback" not in explicit.text


def test_compile_error_fails_its_target_others_build(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    (root / "kernels/hopper/qwen/w8/mul.cu").write_text("#error broken\n")
    run = doit(root, ["-n", "2", "-P", "process", "build:hopper/*"], env)
    assert run.returncode == 1, run.text
    assert started_targets(run) == ["hopper/qwen/w4", "hopper/qwen/w8"]
    assert "FAILED build:hopper/qwen/w8" in run.out and "forced failure" in run.out
    assert (root / "build/hopper/qwen/w4/manifest.json").is_file()
    assert not (root / "build/hopper/qwen/w8/manifest.json").exists()
    assert counts(run)["failed"] == 1 and counts(run)["built"] == 1


def test_parallel_process_workers_clean_and_forget(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    run = run_ok(root, env, "-n", "2", "-P", "process", "build")
    assert started_targets(run) == sorted(NVIDIA)
    assert check_artefacts(root / "build") == 4
    assert len(fake_compiles(tmp_path)) >= 7
    noop = run_ok(root, env, "-n", "2", "-P", "process", "build")
    assert started_targets(noop) == []

    cleaned = run_ok(root, env, "clean", "build:hopper/qwen/w4")
    assert not (root / "build/hopper/qwen/w4").exists(), cleaned.text
    assert (root / "build/hopper/qwen/w8/manifest.json").is_file()
    again = run_ok(root, env)
    assert started_targets(again) == ["hopper/qwen/w4"]
    assert fake_compiles(tmp_path) == []  # restored from the local cache

    run_ok(root, env, "forget", "build:gb10/qwen/w8")
    after = run_ok(root, env)
    assert started_targets(after) == ["gb10/qwen/w8"]


@pytest.mark.parametrize("mode", [[], ["-n", "2", "-P", "process"]])
def test_one_run_probes_each_toolchain_once(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path, mode: list[str]
) -> None:
    """Task generation and the builds of one run share the run's probes (the session
    holds them): a cold build and a no-op each run the compiler's version probe once."""
    root, env = fake_project
    probes = tmp_path / "probes.log"
    env = {**env, "FAKECC_PROBES": str(probes)}
    run_ok(root, env, *mode)
    assert len(probes.read_text().splitlines()) == 1
    probes.unlink()
    assert started_targets(run_ok(root, env, *mode)) == []
    assert len(probes.read_text().splitlines()) == 1  # probed again: a new run


def test_sigterm_keeps_finished_targets(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    env = {**env, "FAKECC_DELAY": "0.4"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "doit", "build"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = root / "build/gb10/qwen/w4/manifest.json"  # the first build task in order
    terminate_after(proc, first)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, out + err
    assert first.is_file()
    check_artefacts(root / "build")
    done = sorted(str(p.parent.relative_to(root / "build")) for p in
                  (root / "build").glob("*/*/*/manifest.json"))  # fmt: skip
    assert 1 <= len(done) < 4, out
    # Finished work was saved: the first signal stops the compiles and lets doit collect
    # every target's result, so each target whose manifest landed (the one the signal
    # followed at once included) is recorded, and the next run builds only the rest.
    listed = doit(root, ["list", "--status"], env)
    recorded = {ln.split()[1].removeprefix("build:") for ln in listed.out.splitlines()
                if ln.startswith("U build:")}  # fmt: skip
    assert recorded == set(done), listed.text
    assert "FAILED" not in out, out  # the stopped targets are the stop, not failures
    assert out.rstrip().endswith(
        f"interrupted; {len(done)} {'target' if len(done) == 1 else 'targets'} finished and kept"
    ), out
    rest = run_ok(root, env)
    assert started_targets(rest) == sorted(set(NVIDIA) - recorded)


#: What a no-op never needs (task generation, the build step, the cache): none is imported.
NOOP_UNNEEDED = (
    "metrale_orch.tree",
    "metrale_orch.graph.generate",
    "metrale_orch.steps.target",
    "metrale_orch.steps.pipeline",
    "metrale_orch.steps.tree_reach",
    "metrale_orch.steps.plan",
    "metrale_orch.steps.plan_values",
    "metrale_orch.steps.signature",
    "metrale_orch.cache",
)

#: Run doit's main in this process (argv: the file to write the modules to, then doit's),
#: then write the package's loaded modules there as JSON: a file, not stdout, which doit
#: may be capturing for a task's thread when the run ends (the reporter may end it with
#: SystemExit).
_RUN_AND_LIST = (
    "import json, sys\n"
    "from doit.doit_cmd import DoitMain\n"
    "out = sys.argv[1]\n"
    "sys.argv = ['doit', *sys.argv[2:]]\n"
    "try:\n"
    "    rc = DoitMain().run(sys.argv[1:])\n"
    "finally:\n"
    "    loaded = sorted(m for m in sys.modules if m.startswith('metrale'))\n"
    "    with open(out, 'w') as fh:\n"
    "        json.dump(loaded, fh)\n"
    "sys.exit(rc)\n"
)


def _unneeded(modules: list[str]) -> list[str]:
    """Those of ``modules`` that are (or are inside) one of :data:`NOOP_UNNEEDED`."""
    return [m for m in modules if any(m == u or m.startswith(u + ".") for u in NOOP_UNNEEDED)]


def test_importing_dodo_loads_no_tree_generation_or_cache(tmp_path: Path) -> None:
    """doit imports the dodo module on every invocation: in a fresh process that import
    loads none of the tree package, task generation, the build step or the cache."""
    code = (
        "import json, sys, metrale_orch.dodo\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('metrale'))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    modules = json.loads(proc.stdout.splitlines()[-1])
    assert "metrale_orch.dodo" in modules
    assert _unneeded(modules) == []


def test_a_noop_build_loads_no_tree_generation_or_cache(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """A no-op ``doit build`` answered by the task cache imports none of them either (a
    first run, which generates and builds, does: the check sees them)."""
    root, env = fake_project

    def modules_of_run() -> list[str]:
        listed = tmp_path / "modules.json"
        listed.unlink(missing_ok=True)
        proc = subprocess.run(
            [sys.executable, "-c", _RUN_AND_LIST, str(listed), "build"],
            cwd=root, env=env, capture_output=True, text=True, check=False, timeout=240,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return list(json.loads(listed.read_text()))

    assert set(NOOP_UNNEEDED) <= set(modules_of_run())  # generated and built
    assert _unneeded(modules_of_run()) == []


_RUN_THEN_EXIT = (
    "import atexit, gc, os, sys\n"
    "from doit.doit_cmd import DoitMain\n"
    "def said(what):\n"
    "    os.write(1, f'{what} {gc.get_freeze_count()}\\n'.encode())  # past doit's capture\n"
    "atexit.register(said, 'frozen at exit')  # registered first: runs last\n"
    "rc = DoitMain().run(['build'])\n"
    "kept = [[i] for i in range(100_000)]  # alive until the process ends\n"
    "said('frozen after the run')\n"
    "sys.exit(rc)\n"
)


def test_what_a_build_leaves_is_frozen_when_the_process_exits(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    """The interpreter's last collections pass over what the build made (frozen at exit,
    not walked: a big build's process ended 0.4-0.55 s after doit returned); before the
    exit nothing more is frozen, so a process that goes on collects its garbage."""
    counts = {
        line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1])
        for line in _frozen_lines(fake_project, _RUN_THEN_EXIT)
    }
    assert counts["frozen at exit"] >= counts["frozen after the run"] + 100_000


def _frozen_lines(project: tuple[Path, dict[str, str]], code: str) -> list[str]:
    """The ``frozen ...`` lines ``python -c code`` printed in the project (it must exit 0)."""
    root, env = project
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root, env=env, capture_output=True, text=True, check=False, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if line.startswith("frozen ")]


_RUN_AGAIN_AND_AGAIN = (
    "import gc, io, pathlib\n"
    "from metrale_orch.tasks.launch import run_doit, run_doit_again\n"
    "run_doit(['build'], io.StringIO())\n"
    "leaf = sorted(pathlib.Path('kernels').rglob('*.cu'))[0]\n"
    "for i in range(4):\n"
    "    leaf.write_text(leaf.read_text() + f'// edit {i}\\n')\n"
    "    run_doit_again(['build'], io.StringIO(), fresh=False)\n"
    "    print('frozen', gc.get_freeze_count(), flush=True)\n"
)


def test_a_process_that_builds_again_freezes_only_its_first_tasks(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    """The edit loop's process generates the tasks on every cycle: frozen each time, each
    cycle's garbage cycles were kept for good (the count grew ~700 objects a cycle)."""
    frozen = [int(line.split()[1]) for line in _frozen_lines(fake_project, _RUN_AGAIN_AND_AGAIN)]
    assert len(frozen) == 4
    assert len(set(frozen)) == 1, frozen
