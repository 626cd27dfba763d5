"""Memory-aware admission (issue 38, item 2): each compile's peak memory is measured and
kept beside its time; the local executor starts a compile only while the running ones'
predicted peaks and its own fit the budget, never stalls, admits a compile with no
history by ``jobs`` alone, and runs one killed for memory once more, alone.

These are the tests of this topic that start processes; the others are in
``tests/unit/executor/test_memory.py``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from metrale_orch.executor import Action, LocalExecutor
from metrale_orch.proc import ProcessError
from metrale_orch.steps.times import TIMES
from tests.support.executor import MIB, run_action, run_actions
from tests.support.project import doit

#: A compiler stand-in: logs "start"/"end" with wall-clock ns and its label in $LOG,
#: holds $1 MiB resident, waits until $BARRIER actions have started (when set), sleeps
#: $2 s. KILL=once kills itself with SIGKILL the first time ($KILL_MARK marks it),
#: KILL=always every time.
HOG = """\
import os, signal, sys, time
mb, seconds, label = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
log = os.environ["LOG"]
def note(kind):
    with open(log, "a") as fh:
        fh.write(f"{kind} {time.time_ns()} {label}\\n")
note("start")
held = bytearray(mb * 1024 * 1024)
for page in range(0, len(held), 4096):
    held[page] = 1
kill, mark = os.environ.get("KILL", ""), os.environ.get("KILL_MARK", "")
if kill == "always" or (kill == "once" and not os.path.exists(mark)):
    open(mark, "w").close() if mark else None
    note("end")
    os.kill(os.getpid(), signal.SIGKILL)
barrier = int(os.environ.get("BARRIER", "0") or 0)
deadline = time.time() + 20
while barrier and time.time() < deadline:
    if open(log).read().count("start ") >= barrier:
        break
    time.sleep(0.01)
else:
    if barrier:
        sys.exit("the others never started beside it")
time.sleep(seconds)
note("end")
"""


def hog(
    tmp_path: Path,
    label: str,
    mb: int = 1,
    seconds: float = 0.1,
    env: Mapping[str, object] | None = None,
    **kw: object,
) -> Action:
    """An action running :data:`HOG` (``kw``: more of the action's fields)."""
    script = tmp_path / "hog.py"
    if not script.exists():
        script.write_text(HOG)
    environ = {"PATH": os.environ["PATH"], "LOG": str(tmp_path / "log")}
    environ.update({k: str(v) for k, v in (env or {}).items()})
    return Action(
        argv=(sys.executable, str(script), str(mb), str(seconds), label),
        cwd=tmp_path,
        env=environ,
        label=label,
        **kw,  # type: ignore[arg-type]
    )


def intervals(log: Path) -> list[tuple[int, int, str]]:
    """(start ns, end ns, label) of every run the log recorded, in order of start."""
    starts: dict[str, list[int]] = {}
    out = []
    for line in log.read_text().splitlines():
        kind, ns, label = line.split(" ", 2)
        if kind == "start":
            starts.setdefault(label, []).append(int(ns))
        else:
            out.append((starts[label].pop(0), int(ns), label))
    return sorted(out)


def most_at_once(runs: list[tuple[int, int, str]], weight: dict[str, int]) -> int:
    """The largest sum of ``weight`` over the runs overlapping at one moment."""
    events = sorted([(s, 1, lab) for s, _e, lab in runs] + [(e, 0, lab) for _s, e, lab in runs])
    now = most = 0
    for _ns, starts, label in events:  # an end sorts before a start at the same ns
        now += weight[label] if starts else -weight[label]
        most = max(most, now)
    return most


# -- the executor, with a compiler that takes memory ----------------------------------------


def test_predictions_below_jobs_times_the_peak_hold_the_sum_within_the_budget(
    tmp_path: Path,
) -> None:
    executor = LocalExecutor(4, memory=250 * MIB)
    actions = [hog(tmp_path, f"a{i}", mb=20, memory=100 * MIB) for i in range(6)]
    done = run_actions(executor, actions)
    assert all(d.returncode == 0 for d in done)
    runs = intervals(tmp_path / "log")
    assert len(runs) == 6
    assert most_at_once(runs, {f"a{i}": 100 * MIB for i in range(6)}) <= 250 * MIB
    # Below this process's own peak a compile's peak is not known (proc.Measured): 0.
    assert [d.memory for d in done] == [0] * 6


def test_a_compile_above_this_process_s_peak_is_measured(tmp_path: Path) -> None:
    # wait4 reports at least the parent's own peak (a child starts from its memory), so
    # only a compile that takes more is measured: its largest resident set.
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # MiB (Linux: KiB)
    mb = own + 64
    done = run_action(LocalExecutor(1), hog(tmp_path, "big", mb=mb))
    assert done.returncode == 0
    assert mb * MIB < done.memory < (mb + 100) * MIB, (mb, done.memory)


def test_with_no_history_compiles_are_admitted_by_jobs_alone(tmp_path: Path) -> None:
    # A budget of one byte, but no prediction: all four must run at once (each waits
    # until the four have started, and fails if they never do).
    executor = LocalExecutor(4, memory=1)
    actions = [hog(tmp_path, f"n{i}", env={"BARRIER": 4}) for i in range(4)]
    done = run_actions(executor, actions)
    assert all(d.returncode == 0 for d in done)
    assert executor.peak == 4


def test_a_compile_predicted_over_the_whole_budget_still_runs_alone(tmp_path: Path) -> None:
    executor = LocalExecutor(3, memory=100 * MIB)
    weights = {"big": 500 * MIB, **{f"s{i}": 40 * MIB for i in range(3)}}
    actions = [hog(tmp_path, label, memory=w) for label, w in weights.items()]
    done = run_actions(executor, actions)
    assert all(d.returncode == 0 for d in done)
    runs = intervals(tmp_path / "log")
    (big,) = [r for r in runs if r[2] == "big"]
    assert not [r for r in runs if r[2] != "big" and r[0] < big[1] and big[0] < r[1]], runs


def test_a_compile_killed_for_memory_runs_again_alone_once(tmp_path: Path) -> None:
    executor = LocalExecutor(3)
    env = {"KILL": "once", "KILL_MARK": str(tmp_path / "killed")}
    actions = [hog(tmp_path, "oom", env=env, expected=9.0)]
    actions += [hog(tmp_path, f"o{i}", seconds=0.3) for i in range(3)]
    done = run_actions(executor, actions)
    assert all(d.returncode == 0 for d in done)
    runs = intervals(tmp_path / "log")
    _killed, retried = [r for r in runs if r[2] == "oom"]
    others = [r for r in runs if r[2] != "oom"]
    # The retry started after everything else ended: nothing ran beside it.
    assert all(end <= retried[0] for _s, end, _l in others), runs


def test_a_compile_killed_again_alone_is_reported_as_killed_for_memory(tmp_path: Path) -> None:
    executor = LocalExecutor(2)
    with pytest.raises(ProcessError, match="killed for memory") as got:
        run_action(executor, hog(tmp_path, "oom", env={"KILL": "always"}))
    assert got.value.returncode == -9
    assert [r[2] for r in intervals(tmp_path / "log")] == ["oom", "oom"]  # tried twice
    # A compile this executor kills for its timeout is no memory kill: reported once.
    with pytest.raises(ProcessError, match="timed out") as late:
        run_action(executor, hog(tmp_path, "slow", seconds=30, timeout=0.5))
    assert "memory" not in str(late.value)


# -- a build, as doit runs it ----------------------------------------------------------------


def _timeline(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, module) of each compile the fake compiler recorded."""
    started: dict[str, int] = {}
    runs = []
    for line in path.read_text().splitlines():
        kind, ns, pid, source = line.split(" ", 3)
        if kind == "start":
            started[pid] = int(ns)
        else:
            runs.append((started.pop(pid), int(ns), source.rsplit(".", 1)[0]))
    return sorted(runs)


def test_a_second_cold_build_keeps_the_recorded_peaks_within_the_memory_setting(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    # Larger than the doit process itself: below that, wait4 cannot tell (proc.Measured).
    env = {**env, "FAKECC_ALLOC_MB": "200", "FAKECC_DELAY": "0.2", "METRALE_ORCH_JOBS": "3"}
    env["METRALE_ORCH_CACHE_MODE"] = "off"
    # No history: a budget of one byte changes nothing, every compile is admitted by jobs.
    first = doit(root, ["build"], {**env, "METRALE_ORCH_MEMORY": "1"})
    assert first.returncode == 0, first.text
    kept = json.loads((root / "build/.state" / TIMES).read_text())
    peaks = kept["memory"]
    assert sorted(peaks) == ["gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w4", "hopper/qwen/w8"]
    peak = max(p for mods in peaks.values() for p in mods.values())
    assert all(200 * MIB < p < 400 * MIB for mods in peaks.values() for p in mods.values())
    # Below jobs x the peak: two at once fit, three do not.
    budget = 2 * peak + peak // 4
    assert doit(root, ["forget", "build"], env).returncode == 0
    times = tmp_path / "times"
    limited = {**env, "METRALE_ORCH_MEMORY": str(budget), "FAKECC_TIMES": str(times)}
    again = doit(root, ["build"], limited)
    assert again.returncode == 0, again.text
    runs = _timeline(times)
    assert len(runs) == 7, runs  # every distinct compile, again
    # Each compile weighs its prediction: its module's kept peak (the larger where two
    # hardware compile a module of one name).
    weight: dict[str, int] = {}
    for mods in peaks.values():
        for module, p in mods.items():
            weight[module] = max(weight.get(module, 0), p)
    assert most_at_once(runs, weight) <= budget
    profile = json.loads((root / "build/profile.json").read_text())["traceEvents"]
    assert any(e["ph"] == "C" and e["name"] == "memory in use" for e in profile)
