"""Stopping remote actions on the event loop (issue 45): cancelling the task that awaits
``ReapiBackend.run`` cancels its Execute stream at the engine and writes nothing, and
``close()`` from another thread (a build's stop path) ends the calls in flight at once."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from metrale_orch.executor.action import RemoteForm
from metrale_orch.executor.offload import RemoteUnavailable
from metrale_orch.executor.reapi import ReapiBackend
from metrale_orch.remote import AsyncRemoteClient
from tests.support.reapi_load import stage_forms
from tests.support.reapi_standin import StandIn, standin_engine

ACTIONS = 4


async def until(check: object, seconds: float = 10.0) -> None:
    """Wait (on the loop) until ``check()`` is true."""
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def written(forms: list[RemoteForm]) -> list[Path]:
    """Every file in the forms' output directories (outputs and temporary ones alike)."""
    dirs = {p.parent for f in forms for p in f.outputs.values()}
    return sorted(p for d in dirs for p in d.iterdir())


def test_a_cancelled_run_cancels_its_execute_stream_and_writes_nothing(tmp_path: Path) -> None:
    forms = stage_forms(tmp_path, ACTIONS)

    async def cancel_in_flight(engine: StandIn) -> list[BaseException | object]:
        backend = ReapiBackend(AsyncRemoteClient(engine.url))
        tasks = [asyncio.ensure_future(backend.run(f, timeout=60)) for f in forms]
        await until(lambda: engine.running == ACTIONS)  # all executing at the engine
        for task in tasks:
            task.cancel()
        got = await asyncio.gather(*tasks, return_exceptions=True)
        await until(lambda: engine.cancelled == ACTIONS)
        await backend.client.aclose()
        return got

    with standin_engine(workers=ACTIONS, seconds=60) as engine:
        start = time.monotonic()
        got = asyncio.run(cancel_in_flight(engine))
    assert all(isinstance(g, asyncio.CancelledError) for g in got), got
    assert engine.cancelled == ACTIONS and engine.executed == 0
    assert time.monotonic() - start < 10
    assert written(forms) == []


def test_close_from_another_thread_ends_the_calls_in_flight_at_once(tmp_path: Path) -> None:
    forms = stage_forms(tmp_path, ACTIONS)

    async def close_in_flight(engine: StandIn) -> list[BaseException | object]:
        backend = ReapiBackend(AsyncRemoteClient(engine.url))
        tasks = [asyncio.ensure_future(backend.run(f, timeout=60)) for f in forms]
        await until(lambda: engine.running == ACTIONS)
        closer = threading.Thread(target=backend.close)  # as a build's stop path does
        closer.start()
        got = await asyncio.gather(*tasks, return_exceptions=True)
        closer.join()
        return got

    with standin_engine(workers=ACTIONS, seconds=60) as engine:
        start = time.monotonic()
        got = asyncio.run(close_in_flight(engine))
    assert time.monotonic() - start < 10
    assert all(isinstance(g, RemoteUnavailable) for g in got), got
    assert written(forms) == []


def test_a_run_after_close_fails_as_infrastructure(tmp_path: Path) -> None:
    """A run after close() fails as infrastructure (the build falls back), never hangs."""
    (form,) = stage_forms(tmp_path, 1)

    async def after_close(engine: StandIn) -> None:
        backend = ReapiBackend(AsyncRemoteClient(engine.url))
        await backend.run(form, timeout=60)
        backend.close()
        await asyncio.sleep(0.1)  # the close runs at the loop's next turns
        with pytest.raises(RemoteUnavailable):
            await asyncio.wait_for(backend.run(form, timeout=60), 10)

    with standin_engine(workers=1, seconds=0.01) as engine:
        asyncio.run(after_close(engine))
