"""The build session's scheduling of module pipelines (metrale_orch.steps.session)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from metrale_orch.executor import LocalExecutor
from metrale_orch.steps import session as session_module
from metrale_orch.steps.session import BuildSession


@pytest.fixture
def session() -> Iterator[BuildSession]:
    made = BuildSession(LocalExecutor(2))
    try:
        yield made
    finally:
        made.close()


def test_a_pipeline_of_a_key_in_flight_starts_after_its_owner(session: BuildSession) -> None:
    """Two pipelines of one key take turns (the memo's claim), holding no thread while
    they wait; another key does not wait."""
    release = threading.Event()
    order: list[str] = []

    async def owner() -> str:
        async with session.memo.claim("k"):
            while not release.is_set():
                await asyncio.sleep(0.001)
            order.append("owner")
            return "built"

    async def waiter() -> str:
        async with session.memo.claim("k"):
            order.append("waiter")
            return "verified"

    async def free() -> str:
        async with session.memo.claim("other"):
            return "free"

    before = threading.active_count()
    first = session.submit(owner())
    second = session.submit(waiter())
    other = session.submit(free())
    assert other.result(5) == "free"  # another key does not wait
    assert not second.done()  # behind its owner
    assert threading.active_count() <= before + 1  # the loop's: none waits in a thread
    release.set()
    assert (first.result(5), second.result(5)) == ("built", "verified")
    assert order == ["owner", "waiter"]


def test_many_pipelines_of_one_key_end_in_turn(session: BuildSession) -> None:
    async def quick(i: int) -> int:
        async with session.memo.claim("k"):
            return i

    futures = [session.submit(quick(i)) for i in range(200)]
    assert [f.result(10) for f in futures] == list(range(200))


def test_an_owners_failure_is_not_the_waiters(session: BuildSession) -> None:
    async def owner() -> str:
        async with session.memo.claim("k"):
            raise RuntimeError("compile failed")

    async def waiter() -> str:
        async with session.memo.claim("k"):
            return "compiled itself"

    first = session.submit(owner())
    second = session.submit(waiter())
    with pytest.raises(RuntimeError):
        first.result(5)
    assert second.result(5) == "compiled itself"


def _inside_at_once(session: BuildSession) -> int:
    """How many of two threads preparing a target are inside the slot at once."""
    inside, most = [0], [0]
    lock, both, leave = threading.Lock(), threading.Barrier(2, timeout=0.5), threading.Event()

    def prepare() -> None:
        with session.preparing():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            with contextlib.suppress(threading.BrokenBarrierError):
                both.wait()  # the two meet here only when both hold a slot
            leave.wait(5)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=prepare) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.7)
    leave.set()
    for t in threads:
        t.join(5)
    return most[0]


def test_targets_are_prepared_side_by_side_until_a_compile_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One per CPU before any compile (a build of cache hits overlaps their file work);
    one at a time once compiles run: the loop's thread that watches them then contends
    with one preparer for the interpreter, not with one per CPU."""
    monkeypatch.setattr(session_module, "default_jobs", lambda: 2)
    made = BuildSession(LocalExecutor(2))
    try:
        assert _inside_at_once(made) == 2
        made.compiled = True
        assert _inside_at_once(made) == 1
    finally:
        made.close()
