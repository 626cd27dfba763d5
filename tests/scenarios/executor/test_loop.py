"""The action loop (issue 45): compiles in flight hold no thread each; the loop reaps them
through a pidfd and keeps what ``wait4`` says of them; a stop ends them all.

These start processes (the actions), hence here and not in ``tests/unit/executor``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from metrale_orch.executor import Action, ActionStopped, LocalExecutor
from metrale_orch.executor.loop import ActionLoop


def _sleeper(tmp_path: Path, seconds: float, label: str) -> Action:
    return Action(
        argv=("sleep", str(seconds)), cwd=tmp_path, env={"PATH": os.environ["PATH"]}, label=label
    )


def test_hundreds_of_actions_in_flight_hold_no_thread_each(tmp_path: Path) -> None:
    """400 actions at once, 200 running: the process gains the loop's thread and its fixed
    pool (which starts the compilers), no thread per action (a module pipeline held a
    thread of its own before issue 45)."""
    executor = LocalExecutor(200)
    loop = ActionLoop(2)
    before = threading.active_count()
    futures = [loop.submit(executor.run(_sleeper(tmp_path, 0.3, f"a{i}"))) for i in range(400)]
    most = 0
    while not all(f.done() for f in futures):
        most = max(most, threading.active_count())
        time.sleep(0.01)
    assert all(f.result().returncode == 0 for f in futures)
    assert executor.peak == 200
    assert most <= before + 1 + 2, f"{most} threads with 400 actions in flight (before: {before})"
    loop.close()


def test_a_stop_from_another_thread_ends_the_actions_the_loop_waits_for(tmp_path: Path) -> None:
    executor = LocalExecutor(50)
    loop = ActionLoop(2)
    futures = [loop.submit(executor.run(_sleeper(tmp_path, 60, f"s{i}"))) for i in range(80)]
    deadline = time.monotonic() + 20
    while executor.running < 50 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert executor.running == 50
    start = time.monotonic()
    executor.stop()  # SIGTERM: sleep ends at once
    errors = [f.exception(10) for f in futures]
    assert time.monotonic() - start < 5
    assert all(isinstance(e, ActionStopped) for e in errors), errors
    assert executor.running == 0
    loop.close()


def test_a_cancelled_pipeline_leaves_no_compiler_running(tmp_path: Path) -> None:
    """A task cancelled while its compiler runs (the loop closing under it) kills the
    compiler's group and reaps it: no process, no zombie."""
    executor = LocalExecutor(1)
    loop = ActionLoop(1)
    pid_file = tmp_path / "pid"
    action = Action(
        argv=("sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"),
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
    )
    future = loop.submit(executor.run(action))
    deadline = time.monotonic() + 10
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(pid_file.read_text())

    def cancel_all() -> None:
        for task in asyncio.all_tasks(loop.loop):
            task.cancel()

    loop.call(cancel_all)
    with pytest.raises(BaseException):  # noqa: B017  # the task's cancellation
        future.result(10)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{pid}"), "the compiler (or its zombie) is still there"
    loop.close()


def test_a_compiler_started_after_its_action_was_cancelled_is_killed_and_reaped(
    tmp_path: Path,
) -> None:
    """The pool starts a compiler while its action is cancelled: the start is let finish,
    and what it started is killed and reaped (no compiler left, no zombie)."""
    from metrale_orch.executor.local import _kill_started, _start

    async def main() -> int:
        loop = asyncio.get_running_loop()
        spawning = loop.run_in_executor(None, _start, _sleeper(tmp_path, 60, "late"))
        await asyncio.wait([spawning])
        _kill_started(spawning)
        proc = spawning.result()[1]
        for _ in range(200):
            if proc.returncode is not None:
                break
            await asyncio.sleep(0.02)
        return proc.pid if proc.returncode is not None else -1

    pid = asyncio.run(main())
    assert pid > 0  # reaped
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_closing_the_loop_ends_what_is_left_on_it_and_destroys_no_task_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task still on the loop when it closes: one that ends soon ends, one that would
    wait forever is cancelled (its cleanup runs); asyncio logs no task destroyed pending."""
    loop = ActionLoop(2)
    ended: list[str] = []

    async def soon() -> None:
        await asyncio.sleep(0.05)
        ended.append("soon")

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("forever")

    loop.submit(soon())
    loop.submit(forever())
    time.sleep(0.01)
    with caplog.at_level("ERROR", logger="asyncio"):
        loop.close()
    assert sorted(ended) == ["forever", "soon"]
    assert "destroyed but it is pending" not in caplog.text
