"""Waiting for a compiler on the event loop: its output read and its exit reaped by the loop.

Python 3.11's asyncio child watchers hold a thread per child or reap with ``waitpid``, which
loses ``wait4``'s ``ru_maxrss`` that memory admission needs. :func:`reap` watches a process
started by :func:`~metrale_orch.proc.start_process` with the loop itself: its two pipes, and a
pidfd that becomes readable when it exits; then ``wait4`` reaps it with its peak memory
(:meth:`~metrale_orch.proc.Measured.reap_now`). No thread waits for it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from metrale_orch.proc import Measured

__all__ = ["DRAIN_SECONDS", "reap"]

#: Seconds to read what a killed process printed: a process it started in a session of
#: its own (a daemon) may hold its pipes open forever.
DRAIN_SECONDS = 5.0


async def reap(
    proc: Measured, *, timeout: float | None, kill: Callable[[], None]
) -> tuple[bytes, bytes, bool]:
    """Read ``proc``'s output to its end and reap it on the running event loop, holding no
    thread: its pipes and a pidfd (which becomes readable when it exits) are watched by
    the loop, and ``wait4`` reaps it with its peak memory (:meth:`Measured.reap_now`).
    Returns (stdout, stderr, timed out). Past ``timeout`` seconds ``kill()`` is called
    (the caller kills the process group), and what it printed is read for at most
    :data:`DRAIN_SECONDS` more: a daemon it started may hold its pipes open forever."""
    loop = asyncio.get_running_loop()
    watch = _Reaping(proc, loop)
    expired: list[bool] = []

    def expire() -> None:
        expired.append(True)
        kill()
        loop.call_later(DRAIN_SECONDS, watch.abandon)

    timer = loop.call_later(timeout, expire) if timeout is not None else None
    try:
        await watch.done
    finally:
        if timer is not None:
            timer.cancel()
        watch.abandon()
        if proc.returncode is None:  # cancelled: never leave it running, nor a zombie
            kill()
            await loop.run_in_executor(None, proc.wait)
        watch.abandon(final=True)
    return bytes(watch.out), bytes(watch.err), bool(expired)


class _Reaping:
    """The loop's watch over one process: its two pipes to their end, its exit."""

    def __init__(self, proc: Measured, loop: asyncio.AbstractEventLoop) -> None:
        self.proc, self.loop = proc, loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.out, self.err = bytearray(), bytearray()
        self._fds: dict[int, bytearray] = {}
        for pipe, buf in ((proc.stdout, self.out), (proc.stderr, self.err)):
            if pipe is not None:
                fd = pipe.fileno()
                os.set_blocking(fd, False)
                self._fds[fd] = buf
                loop.add_reader(fd, self._read, fd)
        self._pidfd = -1
        try:
            self._pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # no pidfd here: a pool thread waits for it
            self._wait_in_pool()
        else:
            loop.add_reader(self._pidfd, self._exited)
        self._check()

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._fds[fd] += data
            return
        self.loop.remove_reader(fd)
        del self._fds[fd]
        self._check()

    def _exited(self) -> None:
        reaped = self.proc.reap_now()
        self._close_pidfd()
        if reaped:
            self._check()
        else:  # reaped by no one yet (a wait() elsewhere holds it): a pool thread waits
            self._wait_in_pool()

    def _wait_in_pool(self) -> None:
        done = self.loop.run_in_executor(None, self.proc.wait)
        done.add_done_callback(lambda _f: self._check())

    def _close_pidfd(self) -> None:
        if self._pidfd >= 0:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1

    def _check(self) -> None:
        if not self._fds and self.proc.returncode is not None and not self.done.done():
            self.done.set_result(None)

    def abandon(self, final: bool = False) -> None:
        """Stop reading (its pipes closed, whoever still holds them), and, once it exited
        or when ``final``, watching its exit."""
        for fd in list(self._fds):
            self.loop.remove_reader(fd)
        self._fds.clear()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        if self.proc.returncode is None and self._pidfd >= 0 and not final:
            return  # still running: its exit still resolves the wait
        self._close_pidfd()
        self._check()
