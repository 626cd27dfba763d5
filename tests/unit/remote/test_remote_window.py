"""How many actions go out at once follows the engine's queue (issue 45, item 4): REAPI
reports no worker count, so ``remote_jobs`` is the most, and the window backs off while
actions wait long for a worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from metrale_orch.executor import Action, LocalExecutor, RemoteForm
from metrale_orch.executor.offload import QUEUE_LONG, START, RemoteExecutor, RemoteRun, Window
from tests.support.executor import run_actions


class Engine:
    """A backend with ``workers`` workers taking actions in arrival order: an action waits
    for one (its "queued" stage), runs ``seconds`` (its "executing" stage); counts how many
    it holds at once."""

    endpoint = "grpc://engine:1"

    def __init__(self, workers: int, seconds: float) -> None:
        self.workers = workers
        self.seconds = seconds
        self.held = 0
        self.peaks: list[int] = []
        #: Made on the loop that runs the actions (an asyncio semaphore belongs to one).
        self._slots: asyncio.Semaphore | None = None

    async def run(
        self,
        form: RemoteForm,
        *,
        timeout: float,
        started: Callable[[float], None] | None = None,
    ) -> RemoteRun:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        self.held += 1
        self.peaks.append(self.held)
        try:
            queued = time.time()
            async with self._slots:  # first come, first served
                start = time.time()
                if started is not None:
                    started(start - queued)
                await asyncio.sleep(self.seconds)
                end = time.time()
            stages = {"queued": (queued, start), "executing": (start, end)}
            return RemoteRun(
                returncode=0, stdout="", stderr="", seconds=end - queued, stages=stages
            )
        finally:
            self.held -= 1

    def close(self) -> None:
        pass


def _action(tmp_path: Path) -> Action:
    form = RemoteForm(
        root=tmp_path,
        files={},
        cwd=".",
        argv=("/bin/true",),
        env={},
        outputs={},
        platform={},
    )
    return Action(argv=("/bin/true",), cwd=tmp_path, remote=form, owner="t")


def test_the_window_backs_off_while_actions_queue_at_the_engine(tmp_path: Path) -> None:
    engine = Engine(workers=3, seconds=0.2)
    ex = RemoteExecutor(engine, LocalExecutor(1), remote_jobs=12)
    run_actions(ex, [_action(tmp_path) for _ in range(60)])
    engine.close()
    assert max(engine.peaks[:12]) == 12  # remote_jobs (below START) at first
    late = engine.peaks[40:]
    assert max(late) <= 8, engine.peaks  # backed off: fewer waiting at the engine
    assert ex.window.limit < 12


def test_the_window_grows_back_while_actions_hardly_wait() -> None:
    window = Window(10)
    long_wait = {"queued": (0.0, QUEUE_LONG * 2), "executing": (QUEUE_LONG * 2, QUEUE_LONG * 3)}
    window.ended(long_wait)
    assert window.limit == 7
    window.ended(long_wait)  # within one window of the last back-off: held
    assert window.limit == 7
    for _ in range(5):
        window.ended({"queued": (0.0, 0.01), "executing": (0.01, 1.0)})
    assert window.limit == 10  # up to remote_jobs, never past it
    window.ended({})  # no stage times (a cache hit): room, never past remote_jobs
    assert window.limit == 10


def test_the_window_starts_small_and_doubles_while_workers_take_actions_at_once() -> None:
    """An engine serving each call on a thread of a small pool (BuildGrid: 64) is not
    flooded with Execute streams before it shows room; a free farm gets them fast."""
    window = Window(1024)
    assert window.limit == START
    for _ in range(START):
        window.started(0.01)  # taken at once: room for one more each
    assert window.limit == 2 * START
    window.started(QUEUE_LONG)  # taken after a wait: no more room
    assert window.limit == 2 * START


def test_a_free_engine_gets_remote_jobs_in_flight_soon(tmp_path: Path) -> None:
    engine = Engine(workers=200, seconds=0.3)
    ex = RemoteExecutor(engine, LocalExecutor(1), remote_jobs=200)
    run_actions(ex, [_action(tmp_path) for _ in range(600)])
    assert max(engine.peaks[:START]) <= START  # it started small
    assert max(engine.peaks) == 200, max(engine.peaks)  # and reached remote_jobs
