"""The one door to subprocesses.

Every program the package runs (compilers, version probes) goes through
:func:`run_process`: an argv list (never a shell), an explicit working
directory and environment, a deadline. A failure to start, a timeout or a
non-zero exit raises :class:`ProcessError` carrying the argv, the exit code and
the tail of the program's output, so callers can report it without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.errors import MetraleError

__all__ = [
    "Completed",
    "Measured",
    "ProcessError",
    "decode_output",
    "finished",
    "format_argv",
    "peak_is_the_child_s",
    "reap",
    "run_process",
    "start_process",
    "timed_out",
    "wait_process",
]

#: Characters of output kept in a ProcessError's ``tail``.
TAIL_CHARS = 4000


def format_argv(argv: Sequence[str]) -> str:
    """The argv as one shell-quoted line, for logs and error messages."""
    return shlex.join(argv)


@dataclass(frozen=True, slots=True, kw_only=True)
class Completed:
    """A finished process: its argv, exit code, decoded output and run time."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    #: Where it ran, when an executor could have sent it elsewhere: "" (here), "remote",
    #: "remote (action cache)", or "local: <why it did not run remotely>".
    where: str = ""
    #: A remote engine's stages of it: name -> (start, end) in ``time.time()`` seconds.
    stages: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    #: Its peak memory in bytes (:attr:`Measured.peak`; 0: not measured).
    memory: int = 0
    #: Where its peak was not known, what it was at most (:attr:`Measured.bound`; 0: none).
    memory_bound: int = 0


class ProcessError(MetraleError):
    """A program could not be started, timed out, or exited non-zero.

    ``returncode`` is None when the program never ran to an exit (not found,
    not executable, timed out). ``output`` is the whole stdout + stderr,
    ``tail`` its last :data:`TAIL_CHARS` characters.
    """

    exit_code = 1

    def __init__(
        self,
        argv: Sequence[str],
        returncode: int | None,
        *,
        output: str = "",
        reason: str = "",
    ) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.output = output
        self.tail = output[-TAIL_CHARS:]
        self.reason = reason or f"exited with status {returncode}"
        message = f"{format_argv(self.argv)}: {self.reason}"
        if self.tail.strip():
            message += "\n" + self.tail.rstrip()
        super().__init__(message)


def run_process(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> Completed:
    """Run ``argv`` to completion and return its output.

    Raises :class:`ProcessError` when the program cannot be started, runs past
    ``timeout`` seconds (it is killed), or exits with a non-zero status.
    """
    start = time.perf_counter()
    args, proc = start_process(argv, cwd=cwd, env=env)
    return wait_process(args, proc, timeout=timeout, start=start)


def wait_process(
    args: Sequence[str],
    proc: subprocess.Popen[bytes],
    *,
    timeout: float | None,
    start: float,
) -> Completed:
    """Read the output of ``proc`` (started by :func:`start_process` at ``start``, a
    ``time.perf_counter()``) to its end, as :func:`run_process` does: raises
    :class:`ProcessError` when it runs past ``timeout`` seconds from now (it is killed)
    or exits with a non-zero status."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise timed_out(args, out, err, timeout) from None
    return finished(args, proc.returncode, out, err, time.perf_counter() - start)


#: ``ru_maxrss`` is in KiB on Linux, in bytes on macOS.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


class Measured(subprocess.Popen[bytes]):
    """A process that keeps its peak memory when it is reaped: the ``ru_maxrss`` that
    ``wait4`` returns, the largest resident set of the process and of every descendant
    it waited for (a compiler driver and the tools it ran), in bytes (0 until reaped
    by ``wait``/``communicate``, and 0 when not known).

    Not known when it is no larger than this process's own peak: a child starts from
    this process's memory (fork's copy or vfork's share), and Linux records that
    memory's high-water mark in the child's ``ru_maxrss`` when it runs ``exec``, so
    ``wait4`` reports at least this process's peak whatever the compiler used. Then
    :attr:`bound` keeps what ``wait4`` reported: the compiler's peak was at most that."""

    peak = 0
    bound = 0

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        # CPython's POSIX Popen reaps its child here (wait, communicate) with waitpid;
        # wait4 does the same and also returns the child's resource usage.
        try:
            pid, status, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:  # as CPython's: reaped elsewhere, status unknown
            return (self.pid, 0)
        if pid == self.pid:
            peak = usage.ru_maxrss * _MAXRSS_UNIT
            known = peak_is_the_child_s(peak, _own_high_water())
            self.peak, self.bound = (peak, 0) if known else (0, peak)
        return (pid, status)

    def reap_now(self) -> bool:
        """Reap the process if it has exited (``wait4`` without blocking, keeping its
        peak), setting ``returncode``; whether it is reaped. For an event loop told by a
        pidfd that it exited (:func:`reap`)."""
        if self.returncode is not None:
            return True
        if not self._waitpid_lock.acquire(False):  # type: ignore[attr-defined]
            return False  # a wait() in another thread reaps it
        try:
            pid, status = self._try_wait(os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status) if status else 0
        finally:
            self._waitpid_lock.release()  # type: ignore[attr-defined]
        return self.returncode is not None


#: How far above this process's own high-water mark a child's ``ru_maxrss`` must be to
#: be the child's: a child that only inherited this process's memory was seen above it
#: once (a CI test worker: six 20 MB compiles started at once read 322 MiB each). The
#: likeliest cause: Linux keeps the memory counters per thread and per CPU and sums them
#: lazily, so the two readings are not taken of the same count.
_INHERITED_SLACK = 32 * 1024 * 1024


def peak_is_the_child_s(peak: int, own_high_water: int) -> bool:
    """Whether a child's reported peak ``peak`` is its own, not what it inherited from
    this process (whose peak is ``own_high_water``) (pure)."""
    return peak > own_high_water + max(_INHERITED_SLACK, own_high_water // 8)


def _own_high_water() -> int:
    """This process's peak resident set since it started its program, in bytes: Linux's
    ``VmHWM`` (its own ``ru_maxrss`` also holds its parent's, recorded at ``exec``)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _MAXRSS_UNIT


def start_process(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
) -> tuple[list[str], Measured]:
    """Start ``argv`` (no standard input, output piped; with ``new_session`` in a process
    group of its own) and return its argv as text with the process. Raises
    :class:`ProcessError` when it cannot be started."""
    args = [str(a) for a in argv]
    try:
        proc = Measured(
            args,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=new_session,
        )
    except FileNotFoundError:
        raise ProcessError(args, None, reason="program not found") from None
    except PermissionError:
        raise ProcessError(args, None, reason="program is not executable") from None
    except NotADirectoryError:
        raise ProcessError(args, None, reason=f"working directory {cwd} is not usable") from None
    return args, proc


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


def finished(
    args: Sequence[str],
    returncode: int,
    out: bytes | None,
    err: bytes | None,
    seconds: float,
    memory: int = 0,
    memory_bound: int = 0,
) -> Completed:
    """The :class:`Completed` of a process that exited; raises :class:`ProcessError` for a
    non-zero status."""
    stdout, stderr = decode_output(out), decode_output(err)
    if returncode != 0:
        raise ProcessError(args, returncode, output=stdout + stderr)
    return Completed(
        argv=tuple(args),
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        seconds=seconds,
        memory=memory,
        memory_bound=memory_bound,
    )


def timed_out(
    args: Sequence[str], out: bytes | None, err: bytes | None, timeout: float | None
) -> ProcessError:
    """The error of a process killed after ``timeout`` seconds, with what it printed."""
    output = decode_output(out) + decode_output(err)
    return ProcessError(args, None, output=output, reason=f"timed out after {timeout:g} s")


def decode_output(data: bytes | str | None) -> str:
    """A process's output as text (invalid UTF-8 replaced)."""
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="replace")
