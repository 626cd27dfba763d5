"""Thousands of remote actions in flight on one event loop (issue 45): the client holds no
thread per action, so the process's threads stay bounded however many are in flight.

The stand-in engine runs in a process of its own, so this process's threads are the
client's (and pytest's) alone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
from pathlib import Path

from metrale_orch.executor.action import RemoteForm
from metrale_orch.executor.reapi import ReapiBackend
from metrale_orch.remote import AsyncRemoteClient
from metrale_orch.remote.loop import POOL_THREADS
from tests.support.reapi_load import run_all, stage_forms
from tests.support.reapi_standin import standin_process

#: Actions sent at once, and the threads the client may add to this process's.
ACTIONS = 3000
MORE_THREADS = 32


def threads() -> tuple[int, int]:
    """This process's threads: Python's count and the kernel's (grpc's own threads too)."""
    found = re.search(r"^Threads:\s+(\d+)", Path("/proc/self/status").read_text(), re.M)
    return threading.active_count(), int(found.group(1)) if found else 0


async def run_sampled(url: str, forms: list[RemoteForm]) -> tuple[int, int]:
    """Every action at once on this loop (the build's: a small default pool): the most
    threads seen while they ran."""
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(POOL_THREADS)
    )
    backend = ReapiBackend(AsyncRemoteClient(url, streams=ACTIONS))
    peak = threads()
    running = True

    async def sample() -> None:
        nonlocal peak
        while running:
            now = threads()
            peak = (max(peak[0], now[0]), max(peak[1], now[1]))
            await asyncio.sleep(0.02)

    sampler = asyncio.ensure_future(sample())
    try:
        runs = await run_all(backend, forms)
    finally:
        running = False
        await sampler
        await backend.client.aclose()
    assert all(r.returncode == 0 for r in runs)
    assert all(
        f.outputs and set(r.outputs) == set(f.outputs.values())
        for f, r in zip(forms, runs, strict=True)
    )
    return peak


def test_thousands_of_actions_in_flight_hold_a_bounded_number_of_threads(tmp_path: Path) -> None:
    forms = stage_forms(tmp_path, ACTIONS, headers=4)
    python, kernel = threads()
    with standin_process(workers=ACTIONS, seconds=3.0) as engine:
        peak = asyncio.run(run_sampled(engine.url, forms))
    assert engine.executed == ACTIONS
    # Execute and the outputs' read per action; the actions' own blobs go many to a call.
    assert engine.calls <= 2.5 * ACTIONS, engine.calls
    assert engine.peak >= ACTIONS // 2, engine.peak  # thousands were in flight at once
    assert peak[0] - python <= MORE_THREADS, (python, peak)
    assert peak[1] - kernel <= MORE_THREADS, (kernel, peak)
