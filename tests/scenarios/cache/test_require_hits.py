"""``require_hits``: a build that may only take modules from the cache (a smoke job on a GPU
runner, after a CPU runner's build job filled the shared cache).

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/cache/test_require_hits.py``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.support.project import (
    DoitRun,
    doit,
    fake_compiles,
    make_project,
    project_env,
    started_targets,
)

HAS_NVCC = shutil.which("nvcc") is not None and shutil.which("gcc") is not None
#: hopper's modules: (target, module, source).
HOPPER_MODULES = (
    ("hopper/qwen/w4", "add", "kernels/hopper/common/add.cu"),
    ("hopper/qwen/w4", "scale", "kernels/hopper/qwen/w4/scale.cu"),
    ("hopper/qwen/w8", "add", "kernels/hopper/common/add.cu"),
    ("hopper/qwen/w8", "mul", "kernels/hopper/qwen/w8/mul.cu"),
)
REFUSED = re.compile(
    r"^(?:FAILED build:\S+: )?(\S+): module (\S+) \((\S+)\): NOT COMPILED: require_hits is "
    r"set and the shared cache did not have key ([0-9a-f]{32}): no entry; asked (.+?)\. "
    r"The build job for this hardware must run first and share the cache",
    re.MULTILINE,
)


def refusals(run: DoitRun) -> dict[tuple[str, str, str], str]:
    """(target, module, source) -> key, from the refusal lines of a run."""
    return {m.group(1, 2, 3): m.group(4) for m in REFUSED.finditer(run.out)}


def summary(run: DoitRun) -> str:
    (line,) = [ln for ln in run.out.splitlines() if ln.startswith("build: ")]
    return line


def runner_env(tmp: Path, name: str, shared: Path) -> dict[str, str]:
    """A CI runner's environment: its own local cache, the team's shared remote."""
    env = project_env(tmp / name)
    env["METRALE_ORCH_CACHE"] = shared.as_uri()
    return env


def artefacts(build: Path) -> list[str]:
    return sorted(p.relative_to(build).as_posix() for p in build.rglob("*.ptx"))


def stored(cache: Path) -> list[Path]:
    """The files of a cache directory but its key locks (the objects it holds)."""
    return sorted(p for p in cache.rglob("*") if p.is_file() and p.suffix != ".lock")


def manifests(build: Path) -> dict[str, dict[str, str]]:
    """target -> {module: outcome} of every manifest under ``build``."""
    out = {}
    for path in sorted(build.glob("*/*/*/manifest.json")):
        doc = json.loads(path.read_text())
        out[doc["target"]] = {m["name"]: m["outcome"] for m in doc["modules"]}
    return out


# ------------------------------------------------------------------------------ real nvcc


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc and gcc are needed on PATH")
def test_smoke_runner_takes_hits_only_and_fails_loudly_on_a_cold_cache(tmp_path: Path) -> None:
    shared = tmp_path / "shared-cache"
    cpu, gpu = make_project(tmp_path / "cpu"), make_project(tmp_path / "gpu")
    cpu_env = runner_env(tmp_path, "cpu-runner", shared)
    gpu_env = {**runner_env(tmp_path, "gpu-runner", shared), "METRALE_ORCH_REQUIRE_HITS": "true"}

    # The smoke job ran before any build job filled the cache: it compiles nothing.
    cold = doit(gpu, ["smoke:hopper"], gpu_env)
    assert cold.returncode == 1, cold.text
    refused = refusals(cold)
    assert sorted(refused) == list(HOPPER_MODULES), cold.out
    assert "the local cache and the remote file://" in cold.out
    assert refused[HOPPER_MODULES[0]] == refused[HOPPER_MODULES[2]]  # one key, both targets
    assert summary(cold).startswith("build: 0 built, 0 from cache, 0 up to date, 0 skipped, 2 ")
    assert (
        "require_hits: 4 module(s) of 2 target(s) not in the shared cache, NOT compiled "
        "(hopper/qwen/w4, hopper/qwen/w8): the build job for this hardware must run first"
    ) in cold.out
    assert "Traceback" not in cold.text
    assert artefacts(gpu / "build") == [] and manifests(gpu / "build") == {}
    stats = json.loads((gpu / "build/cache-stats.json").read_text())
    assert (stats["misses"], stats["puts"]) == (4, 0)  # add: looked up by both
    assert stored(shared) == [] and stored(tmp_path / "gpu-runner/local-cache") == []

    # The build job (a CPU runner) compiles with real nvcc and fills the shared cache.
    build = doit(cpu, ["build:hopper/*"], cpu_env)
    assert build.returncode == 0, build.text
    outcomes = [m for ms in manifests(cpu / "build").values() for m in ms.values()]
    assert sorted(outcomes) == ["compiled", "compiled", "compiled", "local"]  # add: once
    assert len(stored(shared)) == 3
    # The refusals named the very keys the build job published.
    for (target, module, _source), key in refused.items():
        doc = json.loads((cpu / "build" / target / "manifest.json").read_text())
        assert {m["name"]: m["key"] for m in doc["modules"]}[module] == key

    # The smoke job again: every module from the shared cache, nothing compiled, smoke runs.
    warm = doit(gpu, ["smoke:hopper"], gpu_env)
    assert warm.returncode == 0, warm.text
    assert summary(warm).startswith("build: 0 built, 2 from cache, 0 up to date, 0 skipped, 0 ")
    assert "require_hits:" not in warm.out and "NOT COMPILED" not in warm.out
    assert "smoke hopper: " in warm.out
    got = manifests(gpu / "build")
    assert {t: sorted(ms) for t, ms in got.items()} == {
        "hopper/qwen/w4": ["add", "scale"],
        "hopper/qwen/w8": ["add", "mul"],
    }
    # From the shared remote; add once, the other target then from this run's copy.
    assert sorted(o for ms in got.values() for o in ms.values()) == [
        "local",
        "remote",
        "remote",
        "remote",
    ]
    for rel in artefacts(cpu / "build"):
        assert (gpu / "build" / rel).read_bytes() == (cpu / "build" / rel).read_bytes()

    # A source the build job never saw (the GPU runner's checkout is ahead): that module is
    # refused and its target fails; a failed build installs nothing, so the last good build
    # stays whole (its manifest vouches for its artefacts) and the target stays stale.
    w4 = gpu / "build/hopper/qwen/w4"
    good = {p.name: p.read_bytes() for p in w4.iterdir()}
    scale = gpu / "kernels/hopper/qwen/w4/scale.cu"
    scale.write_text(scale.read_text() + "// not built by the build job\n")
    ahead = doit(gpu, ["build:hopper/*"], gpu_env)
    assert ahead.returncode == 1, ahead.text
    assert sorted(refusals(ahead)) == [HOPPER_MODULES[1]]
    assert started_targets(ahead) == ["hopper/qwen/w4"]
    assert {p.name: p.read_bytes() for p in w4.iterdir()} == good
    assert "manifest.json" in good and "scale.ptx" in good
    assert (gpu / "build/hopper/qwen/w8/manifest.json").exists()
    assert started_targets(doit(gpu, ["build:hopper/*"], gpu_env)) == ["hopper/qwen/w4"]


# ------------------------------------------------------------------------------ fake compiler


def test_a_refused_miss_runs_no_compiler_and_unset_compiles_again(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    strict = {**env, "METRALE_ORCH_REQUIRE_HITS": "1"}
    cold = doit(root, ["build:gb10/*"], strict)
    assert cold.returncode == 1, cold.text
    assert fake_compiles(tmp_path) == []
    assert {(t, m) for t, m, _s in refusals(cold)} == {
        ("gb10/qwen/w4", "add"),
        ("gb10/qwen/w4", "extra"),
        ("gb10/qwen/w4", "scale"),
        ("gb10/qwen/w8", "add"),
        ("gb10/qwen/w8", "extra"),
        ("gb10/qwen/w8", "mul"),
    }
    assert "no remote cache is set (METRALE_ORCH_CACHE)" in cold.out
    assert "require_hits: 6 module(s) of 2 target(s)" in cold.out

    # The same run without it compiles, and then require_hits passes on the hits.
    assert doit(root, ["build:gb10/*"], env).returncode == 0
    assert len(fake_compiles(tmp_path)) == 4
    # Switching it on makes no target stale (an execution setting).
    same = doit(root, ["build:gb10/*"], strict)
    assert same.returncode == 0 and started_targets(same) == [], same.text
    shutil.rmtree(root / "build")
    (root / ".doit.db").unlink()
    warm = doit(root, ["build:gb10/*"], strict)
    assert warm.returncode == 0, warm.text
    assert fake_compiles(tmp_path) == []
    assert "from cache" in summary(warm) and "NOT COMPILED" not in warm.out


def test_cache_off_is_said_in_the_refusal(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    env = {**env, "METRALE_ORCH_REQUIRE_HITS": "true", "METRALE_ORCH_CACHE_MODE": "off"}
    run = doit(root, ["build:hopper/qwen/w8"], env)
    assert run.returncode == 1, run.text
    assert "asked no tier, as cache_mode is off" in run.out
    assert fake_compiles(tmp_path) == []
