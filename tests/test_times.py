"""The kept compile times (metrale_orch.steps.times): longest work first, across runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from metrale_orch.executor import LocalExecutor
from metrale_orch.steps.session import BuildSession
from metrale_orch.steps.times import (
    TARGET_TIMES,
    TIMES,
    CompileTimes,
    longest_first,
    merge_compiles,
    read_target_seconds,
    read_times,
    write_times,
)
from tests.support.project import DoitRun, doit

STATE = Path("build/.state")
NVIDIA = ("gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w4", "hopper/qwen/w8")


def test_merge_keeps_what_did_not_compile_and_drops_what_is_gone() -> None:
    old = CompileTimes(
        {
            "a": {"m1": ("k1", 2.0), "m2": ("k2", 3.0), "gone": ("k9", 1.0)},
            "b": {"m1": ("k1", 2.0)},
            "removed": {"x": ("kx", 5.0)},
        }
    )
    new = merge_compiles(
        old,
        [("a", "m1", "k1b", 4.0), ("c", "n", "kn", 1.5)],
        seen={"a": {"m1", "m2"}},
        alive={"a", "b", "c"},
    )
    # A hit (a/m2, b/m1) keeps its last compile's time; an edited module takes the new one.
    assert new.modules == {
        "a": {"m1": ("k1b", 4.0), "m2": ("k2", 3.0)},
        "b": {"m1": ("k1", 2.0)},
        "c": {"n": ("kn", 1.5)},
    }
    assert new.target_seconds() == {"a": 7.0, "b": 2.0, "c": 1.5}
    assert new.by_key() == {"k1b": 4.0, "k2": 3.0, "k1": 2.0, "kn": 1.5}
    assert new.by_module()[("a", "m2")] == 3.0


def test_files_round_trip_sorted_and_garbage_reads_as_nothing(tmp_path: Path) -> None:
    times = CompileTimes({"z": {"b": ("k2", 1.0), "a": ("k1", 0.25)}, "y": {"m": ("k3", 2.0)}})
    write_times(tmp_path, times)
    assert read_times(tmp_path) == times
    assert read_target_seconds(tmp_path) == {"y": 2.0, "z": 1.25}
    text = (tmp_path / TIMES).read_text()
    assert text.index('"y"') < text.index('"z"') and text.index('"a"') < text.index('"b"')
    for garbage in ("{", "[]", '{"schema": 99, "modules": {}}', '{"schema": 1, "modules": 3}'):
        (tmp_path / TIMES).write_text(garbage)
        (tmp_path / TARGET_TIMES).write_text(garbage)
        assert read_times(tmp_path) == CompileTimes()
        assert read_target_seconds(tmp_path) == {}
    (tmp_path / TIMES).write_text('{"schema": 1, "modules": {"t": {"m": ["k", true], "n": ["k"]}}}')
    assert read_times(tmp_path) == CompileTimes()


def test_longest_first_puts_new_targets_first_then_by_seconds() -> None:
    names = ["a", "b", "c", "d", "e"]
    seconds = {"a": 1.0, "b": 9.0, "c": 9.0, "d": 3.0}
    assert longest_first(names, seconds, {"e": 1, "a": 50}) == ["e", "b", "c", "d", "a"]
    # Nothing known (a first build): the largest targets first, ties by name.
    assert longest_first(names, {}, {"c": 5, "a": 5, "e": 9}) == ["e", "a", "c", "b", "d"]


def test_a_module_whose_key_changed_keeps_its_last_time() -> None:
    session = BuildSession(
        LocalExecutor(1), expected={"k1": 4.0}, by_module={("t", "m"): 2.5, ("t", "n"): 1.0}
    )
    try:
        assert session.expected_seconds("k1", "t", "n") == 4.0  # by key first
        assert session.expected_seconds("edited", "t", "m") == 2.5
        assert session.expected_seconds("new", "t", "new") == 0.0
    finally:
        session.close()


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
    """A run naming targets knows only those (tasks/scope.py): it records their compiles
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
