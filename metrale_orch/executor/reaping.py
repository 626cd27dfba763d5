"""Waiting for a compiler on the event loop: its exit reaped there, its output read from files.

Python 3.11's asyncio child watchers hold a thread per child or reap with ``waitpid``, which
loses ``wait4``'s ``ru_maxrss`` that memory admission needs. :func:`reap` watches a process
started by :func:`~metrale_orch.proc.start_process` with the loop itself: a pidfd that
becomes readable when it exits; then ``wait4`` reaps it with its peak memory
(:meth:`~metrale_orch.proc.Measured.reap_now`). No thread waits for it.

Its output goes to two anonymous files (:class:`OutputFiles`), read once it exited: the
loop watches one descriptor per compile instead of three, and a process the compiler left
running (a cache daemon in a session of its own) that keeps them open delays nothing.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import tempfile
from collections.abc import Callable

from metrale_orch.proc import Measured

__all__ = ["OutputFiles", "reap"]


class OutputFiles:
    """Two anonymous files for a process's standard output and standard error (memory
    files where the system has them), opened to append: a tool that opens ``/dev/stderr``
    again to append (``>>``) adds to what was written, as to a pipe. One that opens it
    again to replace it (``>``) empties it: with a pipe its earlier lines would have stayed
    (Bazel's action output files behave the same). Raises OSError when they cannot be made."""

    __slots__ = ("fds",)

    def __init__(self) -> None:
        out = _anonymous()
        try:
            err = _anonymous()
        except BaseException:
            os.close(out)
            raise
        self.fds = (out, err)

    def read(self) -> tuple[bytes, bytes]:
        """What was written to each (stdout, stderr)."""
        out, err = self.fds
        return _whole(out), _whole(err)

    def close(self) -> None:
        for fd in self.fds:
            if fd >= 0:
                os.close(fd)
        self.fds = (-1, -1)


def _anonymous() -> int:
    try:
        fd = os.memfd_create("metrale-output", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # no memory files here: a temporary file, unlinked
        fd, name = tempfile.mkstemp(prefix="metrale-output-")
        os.unlink(name)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, os.O_APPEND)  # a new file has no other status flag
    except BaseException:
        os.close(fd)
        raise
    return fd


def _whole(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    if not size:
        return b""
    parts, got = [], 0
    while got < size:
        part = os.pread(fd, size - got, got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


async def reap(proc: Measured, *, timeout: float | None, kill: Callable[[], None]) -> bool:
    """Reap ``proc`` on the running event loop, holding no thread: a pidfd (which becomes
    readable when it exits) is watched by the loop, and ``wait4`` reaps it with its peak
    memory (:meth:`Measured.reap_now`). Past ``timeout`` seconds ``kill()`` is called (the
    caller kills the process group). Returns whether it timed out."""
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def check() -> None:
        if proc.returncode is not None and not exited.done():
            exited.set_result(None)

    def wait_in_pool() -> None:
        loop.run_in_executor(None, proc.wait).add_done_callback(lambda _f: check())

    pidfd = -1

    def forget_pidfd() -> None:
        nonlocal pidfd
        if pidfd >= 0:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            pidfd = -1

    def on_exit() -> None:
        forget_pidfd()
        if proc.reap_now():
            check()
        else:  # reaped by no one yet (a wait() elsewhere holds it): a pool thread waits
            wait_in_pool()

    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here: a pool thread waits for it
        wait_in_pool()
    else:
        loop.add_reader(pidfd, on_exit)
    expired: list[bool] = []

    def expire() -> None:
        expired.append(True)
        kill()

    timer = loop.call_later(timeout, expire) if timeout is not None else None
    try:
        check()
        await exited
    finally:
        if timer is not None:
            timer.cancel()
        forget_pidfd()
        if proc.returncode is None:  # cancelled: never leave it running, nor a zombie
            kill()
            await loop.run_in_executor(None, proc.wait)
    return bool(expired)
