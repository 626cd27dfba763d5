"""Helpers the tests of the executor area share, the in-process ones (``tests/unit/executor/``)
and the ones that start processes (``tests/scenarios/executor/``) alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from metrale_orch.executor import Action, ActionStopped, Executor
from metrale_orch.executor.loop import ActionLoop
from metrale_orch.proc import Completed

MIB = 1024 * 1024


GIB = 1 << 30


def run_actions(executor: Executor, actions: Sequence[Action]) -> list[Completed]:
    """Every one of ``actions`` run at once through ``executor`` on one event loop (as a
    build's pipelines run them); raises the first one's error."""

    async def main() -> list[Completed]:
        return list(await asyncio.gather(*(executor.run(a) for a in actions)))

    return asyncio.run(main())


def run_action(executor: Executor, action: Action) -> Completed:
    """One action run through ``executor`` on an event loop of its own."""
    return run_actions(executor, [action])[0]


def stop_in_flight(
    executor: Executor, actions: Sequence[Action], started: Callable[[], bool]
) -> float:
    """Run ``actions`` on an event loop, stop ``executor`` once ``started()`` (polled, at
    most 60 s), and return the seconds from the stop until every action ended; each must
    have ended as stopped (:class:`ActionStopped`)."""
    loop = ActionLoop(2)
    futures = [loop.submit(executor.run(a)) for a in actions]
    deadline = time.monotonic() + 60
    while not started() and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    executor.stop()
    errors = [f.exception(timeout=10) for f in futures]
    took = time.monotonic() - start
    loop.close()
    assert all(isinstance(e, ActionStopped) for e in errors), errors
    return took
