"""Blocking calls under a deadline: one daemon worker thread, abandoned if a call overruns.

The remote tier (:mod:`metrale_orch.cache.bucket`) runs every blocking fsspec call, and
opening the filesystem, through :class:`DeadlineWorker`. A call that runs past its
deadline raises :class:`TimeoutError`; its thread is left to finish (never joined) and
the next call starts a fresh one, so a hung request costs one deadline, not the run.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import TypeVar, cast

__all__ = ["DeadlineWorker"]

T = TypeVar("T")

#: A blocking call and the future that receives its result.
_Job = tuple[Callable[[], object], concurrent.futures.Future[object]]


class DeadlineWorker:
    """One daemon thread running blocking calls; abandoned (never joined) if a call overruns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        fut: concurrent.futures.Future[object] = concurrent.futures.Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_work, args=(self._jobs,), name="metrale-cache-io", daemon=True
                )
                self._thread.start()
            jobs = self._jobs
            jobs.put((fn, fut))
        try:
            return cast(T, fut.result(timeout))  # the future holds what fn returned
        except concurrent.futures.TimeoutError:
            with self._lock:
                if self._jobs is jobs:  # the thread is stuck: leave it, start afresh next time
                    fut.cancel()
                    jobs.put((_stop, concurrent.futures.Future()))
                    self._jobs = queue.SimpleQueue()
                    self._thread = None
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def close(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._jobs.put((_stop, concurrent.futures.Future()))
                self._thread = None


class _Stop(Exception):
    pass


def _stop() -> None:
    raise _Stop


def _work(
    jobs: queue.SimpleQueue[_Job],
) -> None:
    while True:
        fn, fut = jobs.get()
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(fn())
        except _Stop:
            fut.set_result(None)
            return
        except BaseException as exc:
            fut.set_exception(exc)
