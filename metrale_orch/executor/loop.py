"""The event loop that owns a build process's actions in flight.

:class:`ActionLoop` is one asyncio event loop on a thread of its own, started with the
first coroutine it is given. Module pipelines run on it as coroutines: one waiting for a
compile slot, a compiler (reaped through a pidfd, :func:`~metrale_orch.executor.reaping.reap`) or a
remote engine holds no thread, so a thousand actions in flight cost a thousand small
objects, not a thousand threads handing the interpreter lock to each other on every
system call. Work that would hold the loop (a cache lookup or store: file and network
I/O) goes to a small fixed pool of threads (:meth:`ActionLoop.offload`), which is also the
loop's default executor. doit's own threads (a target each) hand coroutines to it with
:meth:`ActionLoop.submit` and wait on the futures it returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["ActionLoop", "offload"]

T = TypeVar("T")

#: Seconds the tasks still on a closing loop get to end, and again once cancelled.
CLOSE_GRACE = 1.0


class ActionLoop:
    """One event loop on a thread of its own, and ``workers`` threads for work that must
    leave it (see the module docstring). Thread-safe; nothing starts before
    :meth:`submit` is first called."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now if it was not)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the action loop is closed")
            if self._loop is None:
                self._start()
            assert self._loop is not None
            return self._loop

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.workers, thread_name_prefix="metrale-work"
        )
        loop.set_default_executor(self._pool)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="metrale-loop", daemon=True)
        self._thread.start()
        ready.wait()
        self._loop = loop

    def submit(
        self, coro: Coroutine[Any, Any, T], context: contextvars.Context | None = None
    ) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop as a task in ``context`` (a copy of the caller's when
        None: the cache's per-task statistics follow it); its outcome on the future."""
        loop = self.loop
        ctx = contextvars.copy_context() if context is None else context
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            if not future.set_running_or_notify_cancel():
                coro.close()
                return
            task = loop.create_task(coro, context=ctx)
            task.add_done_callback(lambda t: _settle(t, future))

        loop.call_soon_threadsafe(start)
        return future

    def call(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` on the loop soon (from any thread); nothing when it is not running."""
        with self._lock:
            loop = None if self._closed else self._loop
        if loop is not None:
            loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        """Stop the loop once what is on it ended: the tasks still there get
        :data:`CLOSE_GRACE` seconds (a channel's close handed over just before), then are
        cancelled and awaited, so none is destroyed pending; then its pool. Later submits
        fail."""
        with self._lock:
            self._closed = True
            loop, thread, pool = self._loop, self._thread, self._pool
            self._loop = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(lambda: loop.create_task(_wind_down(loop)))
        if threading.current_thread() is not thread:
            thread.join(timeout=CLOSE_GRACE + 5)
            if not thread.is_alive():
                loop.close()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


async def _wind_down(loop: asyncio.AbstractEventLoop) -> None:
    """End the loop's other tasks (see :meth:`ActionLoop.close`), then stop it."""
    try:
        others = asyncio.all_tasks(loop) - {asyncio.current_task()}
        if others:
            _done, pending = await asyncio.wait(others, timeout=CLOSE_GRACE)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=CLOSE_GRACE)
    finally:
        loop.stop()


async def offload(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on the running loop's pool, in the calling task's context."""
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(None, ctx.run, fn, *args)


def _settle(task: asyncio.Task[T], future: concurrent.futures.Future[T]) -> None:
    if task.cancelled():
        future.set_exception(concurrent.futures.CancelledError())
    elif (exc := task.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(task.result())
