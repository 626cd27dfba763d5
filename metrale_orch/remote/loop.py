"""A private event loop on a thread of its own, for callers without a loop of their own.

The REAPI client is one implementation, on ``grpc.aio`` (coroutines on an event loop); a
synchronous caller (``metrale-orch remote check``, the REAPI cache tier, ``why-miss``)
hands its coroutines to a :class:`LoopThread`, which runs them on its loop and waits.
The loop and its thread start on first use and end with :meth:`LoopThread.close`, which
runs the loop until nothing is left on it: no coroutine handed to it is dropped unawaited. The
loop's default executor (where hashing and file work leave the loop) is a small fixed
pool. A loop thread belongs to the process that started it: in a fork (doit's ``-P process``
workers) the first use starts one of the child's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["POOL_THREADS", "LoopThread"]

#: Threads of the loop's default executor (CPU work off the loop: hashing, file reads).
POOL_THREADS = 4

T = TypeVar("T")


class LoopThread:
    """An event loop running on a daemon thread named ``name`` (see the module docstring).
    Thread-safe."""

    def __init__(self, name: str, *, pool: int = POOL_THREADS) -> None:
        self.name = name
        self.pool = pool
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, started now if it is not yet (or if this process is a fork of
        the one that started it: the thread did not come along)."""
        with self._lock:
            return self._current()

    def _current(self) -> asyncio.AbstractEventLoop:
        """:attr:`loop`, the lock held."""
        if self._pid != os.getpid():
            self._loop, self._thread, self._pid = None, None, os.getpid()
        if self._loop is None:
            loop = asyncio.new_event_loop()
            loop.set_default_executor(
                concurrent.futures.ThreadPoolExecutor(self.pool, f"{self.name}-pool")
            )
            thread = threading.Thread(target=_serve, args=(loop,), name=self.name, daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    @property
    def started(self) -> bool:
        with self._lock:
            return self._loop is not None

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; cancelling the future cancels it. Handed over under
        the lock that :meth:`close` takes the loop with, so it reaches the loop before its
        stop does, and runs (or is cancelled there) rather than being dropped unawaited."""
        with self._lock:
            return asyncio.run_coroutine_threadsafe(coro, self._current())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (or its exception)."""
        return self.submit(coro).result()

    def close(self, last: Callable[[], Coroutine[Any, Any, object]] | None = None) -> None:
        """Run ``last()`` on the loop to its end (the channels' close), then stop the loop;
        its thread cancels what is left on it, runs it until that ended, and closes it.
        Returns once the loop is closed, unless called from the loop's own thread (one of
        its callbacks): then the loop stops once ``last()`` ended and this returns at once."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        if thread is threading.current_thread():
            if last is None:
                loop.stop()
            else:
                loop.create_task(last()).add_done_callback(lambda _: loop.stop())
            return
        try:
            if last is not None:
                asyncio.run_coroutine_threadsafe(last(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The loop thread: run ``loop`` until it is stopped, then end it (:func:`_end`)."""
    try:
        loop.run_forever()
    finally:
        _end(loop)


def _end(loop: asyncio.AbstractEventLoop) -> None:
    """Close a stopped ``loop`` with nothing left on it: cancel its tasks (callers gone)
    and run it until they ended, then shut its pool down; again while a turn started a
    task (a channel close another thread handed over meanwhile): a task never run would
    leave its coroutine unawaited. A callback that comes later is dropped unrun."""
    loop.run_until_complete(_cancel_all())
    loop.run_until_complete(loop.shutdown_default_executor())
    while asyncio.all_tasks(loop):
        loop.run_until_complete(_cancel_all())
    loop.close()


async def _cancel_all() -> None:
    """Cancel every other task on the running loop and wait until they ended."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
