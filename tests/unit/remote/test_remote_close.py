"""Closing a client's channels and its loop leaves no coroutine unawaited (a CI flake:
``coroutine 'ChannelPool.close' was never awaited``, raised by a later test's garbage
collection). A close handed from another thread to a loop that stops in the same turn,
a client closed from one thread while another closes its loop thread, a loop thread
closed from its own callback: each ends with every coroutine run or closed, and the loop
closed."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import warnings
from collections.abc import Callable, Iterator

import pytest

from metrale_orch.remote import RemoteClient, RemoteUnavailable
from metrale_orch.remote.loop import LoopThread
from metrale_orch.remote.rpc import Rpc
from tests.support.servers import refused_endpoint

ROUNDS = 100


def grpc_refused() -> str:
    """A grpc:// URL where nothing listens (a channel connects only when a call needs it)."""
    return "grpc://" + refused_endpoint().split("://", 1)[1]


@contextlib.contextmanager
def unawaited() -> Iterator[list[str]]:
    """The "never awaited" warnings raised in the block, garbage collected at its end."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found: list[str] = []
        yield found
        gc.collect()
    found += [str(w.message) for w in caught if "never awaited" in str(w.message)]


def bound_rpc(loop: asyncio.AbstractEventLoop, run: threading.Thread) -> Rpc:
    """An endpoint whose channels are opened on ``loop`` (run by the started ``run``)."""
    rpc = Rpc(grpc_refused(), instance="", headers={}, ca_file=None)

    async def bind() -> None:
        rpc.calls()

    asyncio.run_coroutine_threadsafe(bind(), loop).result(timeout=10)
    return rpc


def at_once(*calls: Callable[[], object]) -> None:
    """Each of ``calls`` on a thread of its own, released together; returns when all ended."""
    start = threading.Barrier(len(calls))

    def call(fn: Callable[[], object]) -> None:
        start.wait()
        fn()

    threads = [threading.Thread(target=call, args=(fn,)) for fn in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_a_close_handed_to_a_loop_stopping_in_that_turn_leaves_nothing_unawaited() -> None:
    """The build's stop path: ``close()`` from another thread, then the loop's owner stops
    it and closes it without another turn; the stop lands in the turn that starts the
    channels' close."""
    with unawaited() as found:
        for _ in range(5):
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever)
            thread.start()
            rpc = bound_rpc(loop, thread)
            gate = threading.Event()
            loop.call_soon_threadsafe(gate.wait)  # the loop is busy: what follows queues up
            rpc.close()
            loop.call_soon_threadsafe(loop.stop)
            gate.set()
            thread.join()
            loop.close()  # its owner runs it no more
            del rpc, loop
    assert found == []


def test_a_client_closed_while_its_loop_thread_closes_leaves_nothing_unawaited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One thread closes the client's channels while another closes the client."""
    url = grpc_refused()
    with unawaited() as found:
        for _ in range(ROUNDS):
            client = RemoteClient(url, timeout=5)
            with pytest.raises(RemoteUnavailable):
                client.capabilities()  # the channels are open, on the loop thread's loop
            at_once(client.aio.close, client.close)
            del client
    assert found == []
    assert not [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]


@pytest.mark.parametrize("channels_first", [False, True])
def test_a_loop_thread_closed_from_its_own_callback_ends_closed(channels_first: bool) -> None:
    """Its thread ends the loop once the callback returned (after the channels' close when
    it is handed one)."""
    thread = LoopThread("test-close")
    loop = thread.loop
    rpc = Rpc(grpc_refused(), instance="", headers={}, ca_file=None)

    async def close_here() -> None:
        rpc.calls()
        if channels_first:
            thread.close(rpc.aclose)
        else:
            rpc.close()
            thread.close()

    with unawaited() as found:
        thread.run(close_here())
        for _ in range(500):  # 5 s at most
            if loop.is_closed():
                break
            threading.Event().wait(0.01)
        assert loop.is_closed()
        assert not thread.started
    assert found == []
