"""Many actions' small requests go in few calls: those made in one turn of the loop
together at the next, none waiting for a call in flight; a call's failure is each of its
requests'."""

from __future__ import annotations

import asyncio

import pytest

from metrale_orch.remote.coalesce import Coalesced


class Recorder:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[dict[str, int]] = []
        self.fail = fail
        self.gate = asyncio.Event()

    async def send(self, items: dict[str, int]) -> None:
        self.calls.append(dict(items))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail


async def settle() -> None:
    """A few turns of the loop: a request's call starts within them (no timer)."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_requests_of_one_turn_go_together_and_none_waits_for_a_call_in_flight() -> None:
    async def main() -> list[dict[str, int]]:
        rec = Recorder()
        send = Coalesced(rec.send)
        first = [asyncio.ensure_future(send({k: 1})) for k in "ab"]  # one turn
        await settle()
        assert rec.calls == [{"a": 1, "b": 1}]  # sent at the next turn: no timer
        later = asyncio.ensure_future(send({"c": 2}))
        await settle()
        assert len(rec.calls) == 2  # not held back by the call in flight
        rec.gate.set()
        await asyncio.gather(*first, later)
        return rec.calls

    assert asyncio.run(main()) == [{"a": 1, "b": 1}, {"c": 2}]


def test_a_failed_call_fails_each_of_its_requests_and_not_the_next() -> None:
    async def main() -> None:
        rec = Recorder(fail=OSError("gone"))
        send = Coalesced(rec.send)
        both = [asyncio.ensure_future(send({k: 1})) for k in "ab"]
        await settle()
        rec.gate.set()
        results = await asyncio.gather(*both, return_exceptions=True)
        assert [str(r) for r in results] == ["gone", "gone"]
        rec.fail = None
        await send({"c": 1})

    asyncio.run(main())


def test_a_cancelled_request_leaves_the_call_to_the_others() -> None:
    async def main() -> int:
        rec = Recorder()
        send = Coalesced(rec.send)
        blocker = asyncio.ensure_future(send({"a": 1}))
        await settle()
        gone, kept = asyncio.ensure_future(send({"b": 1})), asyncio.ensure_future(send({"c": 1}))
        await settle()
        gone.cancel()
        rec.gate.set()
        await asyncio.gather(blocker, kept)
        with pytest.raises(asyncio.CancelledError):
            await gone
        return len(rec.calls)

    assert asyncio.run(main()) == 2
