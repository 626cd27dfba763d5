"""Helpers the tests of the executor area share, the in-process ones (``tests/unit/executor/``)
and the ones that start processes (``tests/scenarios/executor/``) alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from metrale_orch.executor import Action, Executor
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
