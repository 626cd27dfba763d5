"""The build session's scheduling of module pipelines (metrale_orch.steps.session)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from metrale_orch.executor import LocalExecutor
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


def test_targets_are_prepared_one_at_a_time(session: BuildSession) -> None:
    """Preparation is Python work: a second target's waits for the first's to end, so the
    loop's thread contends with one preparer for the interpreter, not with one per CPU."""
    inside = threading.Event()
    leave = threading.Event()
    entered: list[str] = []

    def prepare(name: str) -> None:
        with session.preparing():
            entered.append(name)
            inside.set()
            leave.wait(5)

    first = threading.Thread(target=prepare, args=("first",))
    first.start()
    assert inside.wait(5)
    second = threading.Thread(target=prepare, args=("second",))
    second.start()
    second.join(0.2)
    assert entered == ["first"]  # the second waits for the slot
    leave.set()
    first.join(5)
    second.join(5)
    assert entered == ["first", "second"]
