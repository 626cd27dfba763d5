"""Many actions' small requests go in few calls: the first at once, those made while it
is in flight together in the next; a call's failure is each of its requests'."""

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


def test_requests_made_during_a_call_go_together_in_the_next() -> None:
    async def main() -> list[dict[str, int]]:
        rec = Recorder()
        send = Coalesced(rec.send)
        first = asyncio.ensure_future(send({"a": 1}))
        await settle()
        assert rec.calls == [{"a": 1}]  # sent at once: no timer
        later = [asyncio.ensure_future(send({k: 2})) for k in "bcd"]
        await settle()
        assert len(rec.calls) == 1  # they wait for the call in flight
        rec.gate.set()
        await asyncio.gather(first, *later)
        return rec.calls

    assert asyncio.run(main()) == [{"a": 1}, {"b": 2, "c": 2, "d": 2}]


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
