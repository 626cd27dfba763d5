"""The unit tier: tests that start no process of any kind, run in-process in seconds.

Every phase of a test under ``tests/unit/`` (setup with its fixtures of every scope, the
call, teardown) runs with the doors to new processes closed
(:mod:`tests.support.spawn_guard`): a test that starts doit, a server or a compiler, real
or fake, fails with a line saying it belongs in ``tests/scenarios/``. Hooks rather than an
autouse fixture, because a module- or session-scoped fixture is set up before any
function-scoped one and would slip past it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.spawn_guard import guarded


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with guarded():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with guarded():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if nextitem is None:
        # The session's last test also tears down the session's fixtures, such as the
        # BuildGrid stack a scenario started: stopping it may start a process.
        return (yield)
    with guarded():
        return (yield)
