"""A private event loop on a thread of its own, for callers without a loop of their own.

The REAPI client is one implementation, on ``grpc.aio`` (coroutines on an event loop); a
synchronous caller (``metrale-orch remote check``, the REAPI cache tier, ``why-miss``)
hands its coroutines to a :class:`LoopThread`, which runs them on its loop and waits.
The loop and its thread start on first use and end with :meth:`LoopThread.close`; the
loop's default executor (where hashing and file work leave the loop) is a small fixed
pool. A loop thread belongs to the process that started it: in a fork (doit's ``-P process``
workers) the first use starts one of the child's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
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
            if self._pid != os.getpid():
                self._loop, self._thread, self._pid = None, None, os.getpid()
            if self._loop is None:
                loop = asyncio.new_event_loop()
                loop.set_default_executor(
                    concurrent.futures.ThreadPoolExecutor(self.pool, f"{self.name}-pool")
                )
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    @property
    def started(self) -> bool:
        with self._lock:
            return self._loop is not None

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; cancelling the future cancels it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (or its exception)."""
        return self.submit(coro).result()

    def close(self) -> None:
        """Stop the loop and its thread, cancel what is left on it, and close the loop."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        if thread is threading.current_thread():  # closed from one of its own callbacks
            loop.call_soon(loop.stop)
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        for task in asyncio.all_tasks(loop):  # callers gone: end what they left
            task.cancel()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
