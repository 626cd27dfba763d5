"""The kept compile times (metrale_orch.steps.times): longest work first, across runs.

These are the tests of this topic that start processes; the others are in
``tests/unit/steps/test_times.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from metrale_orch.steps.times import (
    TARGET_TIMES,
    TIMES,
    read_times,
)
from tests.support.project import DoitRun, doit

STATE = Path("build/.state")
NVIDIA = ("gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w4", "hopper/qwen/w8")


def _started(run: DoitRun) -> list[str]:
    return [
        line.split("] build:", 1)[1].strip()
        for line in run.out.splitlines()
        if line.startswith("[") and "] build:" in line
    ]


def test_doit_starts_the_longest_targets_first_and_hits_keep_the_times(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    first = doit(root, ["-n", "1", "build"], env)
    assert first.returncode == 0, first.text
    # Nothing known yet: the targets with the most files first (gb10 inherits hopper's).
    assert _started(first)[:2] == ["gb10/qwen/w4", "gb10/qwen/w8"]
    times = read_times(root / STATE)
    assert sorted(times.modules) == list(NVIDIA)
    for target in NVIDIA:
        manifest = json.loads((root / "build" / target / "manifest.json").read_text())
        assert {m: k for m, (k, _s) in times.modules[target].items()} == {
            m["name"]: m["key"] for m in manifest["modules"]
        }
    kept = (root / STATE / TIMES).read_bytes()
    # Say the last build found hopper/qwen/w8 longest, then gb10/qwen/w4.
    seconds = {"hopper/qwen/w8": 9.0, "gb10/qwen/w4": 5.0, "hopper/qwen/w4": 3.0, "gb10/qwen/w8": 1}
    (root / STATE / TARGET_TIMES).write_text(json.dumps({"schema": 1, "targets": seconds}))
    forgot = doit(root, ["forget", "build"], env)
    assert forgot.returncode == 0, forgot.text
    again = doit(root, ["-n", "1", "build"], env)
    assert again.returncode == 0, again.text
    assert _started(again) == ["hopper/qwen/w8", "gb10/qwen/w4", "hopper/qwen/w4", "gb10/qwen/w8"]
    # Every module was a cache hit: the times of the compiles stay as they were.
    assert (root / STATE / TIMES).read_bytes() == kept


def test_a_run_of_some_targets_keeps_every_other_targets_times(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    """A run naming targets knows only those (graph/scope.py): it records their compiles
    and drops no other target's times; a run of the whole tree drops a removed one's."""
    root, env = fake_project
    assert doit(root, ["build"], env).returncode == 0
    (root / "kernels/hopper/qwen/w8/mul.cu").write_text(
        'extern "C" __global__ void mul_k2(float* out) { out[0] = 3.0f; }\n'
    )
    run = doit(root, ["build:hopper/qwen/w8"], env)
    assert run.returncode == 0 and "1 built" in run.out, run.text
    times = read_times(root / STATE)
    assert sorted(times.modules) == list(NVIDIA)
    manifest = json.loads((root / "build/hopper/qwen/w8/manifest.json").read_text())
    assert {m: k for m, (k, _s) in times.modules["hopper/qwen/w8"].items()} == {
        m["name"]: m["key"] for m in manifest["modules"]
    }
    # The whole tree, after a target is gone: its times go with it.
    shutil.rmtree(root / "kernels/gb10/qwen")
    (root / "kernels/hopper/qwen/w4/scale.cu").write_text(
        'extern "C" __global__ void scale_k2(float* out) { out[0] = 4.0f; }\n'
    )
    assert doit(root, ["build"], env).returncode == 0
    assert sorted(read_times(root / STATE).modules) == ["hopper/qwen/w4", "hopper/qwen/w8"]
