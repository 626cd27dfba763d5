"""The local executor: at most ``jobs`` actions at once (threads and processes), longest
first, failures reported, and ``stop`` ends whole process groups at once.

The tests of this topic that run in-process are in ``tests/unit/executor/test_executor.py``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from metrale_orch.executor import Action, ActionStopped, LocalExecutor
from metrale_orch.executor.loop import ActionLoop
from metrale_orch.executor.slots import MachineSlots
from metrale_orch.proc import ProcessError
from tests.support.executor import run_action, run_actions

#: An action that records its start and end (wall-clock ns) in $LOG and sleeps $1 s.
RECORDER = """#!/bin/sh
echo "start $(date +%s%N) $2" >> "$LOG"
sleep "$1"
echo "end $(date +%s%N) $2" >> "$LOG"
"""


def recorder(tmp_path: Path) -> Path:
    """The recorder script under ``tmp_path``, written once and by a rename: processes
    making actions at the same time never rewrite a script another one is executing
    (which failed with "Text file busy")."""
    path = tmp_path / "bin" / "rec"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".rec.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(RECORDER)
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path


def max_overlap(log: Path) -> int:
    """The most actions of ``log`` running at one time."""
    events = []
    for line in log.read_text().splitlines():
        kind, stamp, _label = line.split(" ", 2)
        events.append((int(stamp), 0 if kind == "end" else 1))
    running = peak = 0
    for _stamp, starts in sorted(events):
        running += 1 if starts else -1
        peak = max(peak, running)
    return peak


def action(tmp_path: Path, seconds: float, label: str, **kw: object) -> Action:
    env = {"PATH": os.environ["PATH"], "LOG": str(tmp_path / "log")}
    return Action(
        argv=(str(recorder(tmp_path)), str(seconds), label),
        cwd=tmp_path,
        env=env,
        label=label,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_never_more_than_jobs_actions_at_once(tmp_path: Path, jobs: int) -> None:
    executor = LocalExecutor(jobs)
    done = run_actions(executor, [action(tmp_path, 0.15, f"a{i}") for i in range(8)])
    assert all(d.returncode == 0 for d in done)
    assert max_overlap(tmp_path / "log") == jobs
    assert executor.peak == jobs


def _run_in_process(slot_dir: str, tmp: str, n: int, tag: str) -> None:
    executor = LocalExecutor(2, slot_dir=Path(slot_dir))
    run_actions(executor, [action(Path(tmp), 0.2, f"{tag}{i}") for i in range(n)])


def test_processes_sharing_the_slot_directory_share_the_budget(tmp_path: Path) -> None:
    """Three processes with ``jobs = 2`` each, one slot directory: two at once, in all."""
    recorder(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_run_in_process, args=(str(tmp_path / "slots"), str(tmp_path), 3, t))
        for t in "abc"
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len((tmp_path / "log").read_text().splitlines()) == 18
    assert max_overlap(tmp_path / "log") == 2


def test_a_killed_holder_never_leaks_a_slot(tmp_path: Path) -> None:
    """A process killed while it holds a slot: the kernel frees it (flock)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time;fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT);"
            "fcntl.flock(fd,fcntl.LOCK_EX);print('held',flush=True);time.sleep(60)",
            str(tmp_path / "slots" / "slot-0"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    (tmp_path / "slots").mkdir(exist_ok=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        executor = LocalExecutor(1, slot_dir=tmp_path / "slots")
        loop = ActionLoop(1)
        result = loop.submit(executor.run(action(tmp_path, 0, "x")))
        time.sleep(0.3)
        assert not result.done(), "ran while the only slot was held"
        holder.kill()
        assert result.result(10).returncode == 0
        loop.close()
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def test_a_failing_action_raises_with_its_output_and_others_go_on(tmp_path: Path) -> None:
    executor = LocalExecutor(2)
    bad = Action(argv=("sh", "-c", "echo broken >&2; exit 3"), cwd=tmp_path, env=dict(os.environ))
    with pytest.raises(ProcessError) as info:
        run_action(executor, bad)
    assert info.value.returncode == 3 and "broken" in info.value.output
    assert run_action(executor, action(tmp_path, 0, "ok")).returncode == 0
    slow = Action(argv=("sleep", "30"), cwd=tmp_path, env=dict(os.environ), timeout=0.3)
    with pytest.raises(ProcessError, match=r"timed out after 0\.3 s"):
        run_action(executor, slow)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: only its parent has not reaped it yet.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_stop_ends_every_action_and_its_children_at_once(tmp_path: Path) -> None:
    """Each action starts a child of its own (as nvcc starts cicc and ptxas); stop ends
    both, for every action in flight, and refuses the waiting ones."""
    executor = LocalExecutor(2)
    pids = tmp_path / "pids"
    script = f'sleep 60 & echo $$ $! >> {pids}; trap "" TERM; wait'
    loop = ActionLoop(1)
    futures = [
        loop.submit(
            executor.run(Action(argv=("sh", "-c", script), cwd=tmp_path, env=dict(os.environ)))
        )
        for _ in range(3)
    ]
    deadline = time.monotonic() + 10
    while (not pids.exists() or len(pids.read_text().split()) < 4) and time.monotonic() < deadline:
        time.sleep(0.02)
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 4, "two actions (shell and child) should be running"
    begin = time.monotonic()
    executor.stop()
    errors = [f.exception(10) for f in futures]
    assert time.monotonic() - begin < 5
    assert all(isinstance(e, ActionStopped) for e in errors), errors
    assert not [pid for pid in started if _alive(pid)]
    with pytest.raises(ActionStopped):
        run_action(executor, action(tmp_path, 0, "late"))
    loop.close()


def test_each_action_runs_in_a_process_group_of_its_own(tmp_path: Path) -> None:
    """So a terminal's Ctrl-C reaches the build only, and stop() can end the group."""
    executor = LocalExecutor(1)
    done = run_action(
        executor,
        Action(
            argv=("sh", "-c", "cut -d' ' -f5 /proc/$$/stat"), cwd=tmp_path, env=dict(os.environ)
        ),
    )
    assert int(done.stdout.split()[0]) != os.getpgid(0)


def test_an_action_ends_when_its_process_exits_though_a_child_keeps_its_output(
    tmp_path: Path,
) -> None:
    """A compiler that leaves a process behind holding its output (a cache daemon) ends
    when it exits, with what both printed by then, apart: its output is read from files
    once it exited, not from pipes to their end."""
    executor = LocalExecutor(1)
    script = "echo out; echo err >&2; sleep 30 & echo $! > pid"
    begin = time.monotonic()
    done = run_action(
        executor, Action(argv=("sh", "-c", script), cwd=tmp_path, env=dict(os.environ))
    )
    took = time.monotonic() - begin
    left = int((tmp_path / "pid").read_text())
    try:
        assert (done.stdout, done.stderr) == ("out\n", "err\n")
        assert took < 10, took
        assert _alive(left)  # still holding the output files: not waited for
    finally:
        os.kill(left, 9)


def test_a_tool_that_appends_to_dev_stderr_adds_to_the_output(tmp_path: Path) -> None:
    """Its output files are opened to append: what a tool writes by opening
    ``/dev/stderr`` again (``>>``) lands after what came before, and nothing overwrites it."""
    script = "echo a >&2; echo b >>/dev/stderr; echo c >&2; echo d; echo e >>/dev/stdout"
    done = run_action(
        LocalExecutor(1), Action(argv=("sh", "-c", script), cwd=tmp_path, env=dict(os.environ))
    )
    assert (done.stdout, done.stderr) == ("d\ne\n", "a\nb\nc\n")


def test_a_forked_child_takes_no_slot_its_parent_holds(tmp_path: Path) -> None:
    """The slot files stay open, and a forked child inherits their descriptors: through
    one, a lock its parent holds would be taken again at once. The child opens its own."""
    slots = MachineSlots(tmp_path / "slots", 1)

    async def take(stop_after: float) -> bool:
        stopped = threading.Event()
        asyncio.get_running_loop().call_later(stop_after, stopped.set)
        async with slots.slot(stopped) as got:
            return got

    assert asyncio.run(take(5.0))  # the slot file is open from now on
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: once the parent holds the slot, it must wait, then give up
        try:
            os.read(ready_r, 1)
            code = 1 if asyncio.run(take(0.5)) else 0
        except BaseException:
            code = 2
        os._exit(code)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        async def hold() -> None:
            async with slots.slot(threading.Event()) as got:
                assert got
                held.set()
                await asyncio.to_thread(release.wait, 30)

        asyncio.run(hold())

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        os.write(ready_w, b"x")
        _pid, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join(10)
        os.close(ready_r)
        os.close(ready_w)
    assert os.waitstatus_to_exitcode(status) == 0
    assert asyncio.run(take(5.0))  # released: taken at once
