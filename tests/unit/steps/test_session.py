"""The build session's scheduling of module pipelines (metrale_orch.steps.session)."""

from __future__ import annotations

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
    release = threading.Event()
    order: list[str] = []

    def owner() -> str:
        release.wait(5)
        order.append("owner")
        return "built"

    def waiter() -> str:
        order.append("waiter")
        return "verified"

    first = session.submit_pipeline("k", owner)
    second = session.submit_pipeline("k", waiter)
    other = session.submit_pipeline("other", lambda: "free")
    assert other.result(5) == "free"  # another key does not wait
    assert not second.done()  # queued behind its owner, holding no thread
    release.set()
    assert (first.result(5), second.result(5)) == ("built", "verified")
    assert order == ["owner", "waiter"]


def test_quick_pipelines_of_one_key_never_deadlock(session: BuildSession) -> None:
    """A pipeline that ends before its callback is attached (a memo or cache hit) must not
    run the callback under the session's lock (it did: the warm build hung)."""
    futures = [session.submit_pipeline("k", lambda i=i: i) for i in range(200)]
    assert [f.result(10) for f in futures] == list(range(200))


def test_an_owners_failure_is_not_the_waiters(session: BuildSession) -> None:
    def owner() -> str:
        raise RuntimeError("compile failed")

    first = session.submit_pipeline("k", owner)
    second = session.submit_pipeline("k", lambda: "compiled itself")
    with pytest.raises(RuntimeError):
        first.result(5)
    assert second.result(5) == "compiled itself"
