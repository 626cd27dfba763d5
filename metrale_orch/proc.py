"""The one door to subprocesses.

Every program the package runs (compilers, version probes) goes through
:func:`run_process`: an argv list (never a shell), an explicit working
directory and environment, a deadline. A failure to start, a timeout or a
non-zero exit raises :class:`ProcessError` carrying the argv, the exit code and
the tail of the program's output, so callers can report it without a traceback.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
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
    #: Output files an executor brought back in memory instead of writing them (a remote
    #: run's), by the local path the action names for each; the others are on disk.
    outputs: Mapping[Path, bytes] = field(default_factory=dict)


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
            known = _peak_is_the_child_s(peak)
            self.peak, self.bound = (peak, 0) if known else (0, peak)
        return (pid, status)

    def reap_now(self) -> bool:
        """Reap the process if it has exited (``wait4`` without blocking, keeping its
        peak), setting ``returncode``; whether it is reaped. For an event loop told by a
        pidfd that it exited (:func:`~metrale_orch.executor.reaping.reap`)."""
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


#: This process's high-water mark when :func:`_peak_is_the_child_s` last read it.
_HIGH_WATER = [0]


def _peak_is_the_child_s(peak: int) -> bool:
    """:func:`peak_is_the_child_s` against this process's high-water mark, read only when
    the one last read does not settle it: the mark only grows, and the bar with it, so a
    peak at or under the last bar is not the child's (most compilers of a build whose
    children are small: their peak is what they inherited). Reading it is three system
    calls on the event loop that reaps the child."""
    if not peak_is_the_child_s(peak, _HIGH_WATER[0]):
        return False
    _HIGH_WATER[0] = _own_high_water()
    return peak_is_the_child_s(peak, _HIGH_WATER[0])


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
    output: tuple[int, int] | None = None,
) -> tuple[list[str], Measured]:
    """Start ``argv`` (no standard input, output piped, or written to the two descriptors
    ``output``; with ``new_session`` in a process group of its own) and return its argv as
    text with the process. Raises :class:`ProcessError` when it cannot be started."""
    args = [str(a) for a in argv]
    out, err = output or (subprocess.PIPE, subprocess.PIPE)
    try:
        proc = Measured(
            args,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=new_session,
        )
    except FileNotFoundError:
        raise ProcessError(args, None, reason="program not found") from None
    except PermissionError:
        raise ProcessError(args, None, reason="program is not executable") from None
    except NotADirectoryError:
        raise ProcessError(args, None, reason=f"working directory {cwd} is not usable") from None
    return args, proc


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
