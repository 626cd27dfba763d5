"""The one door to subprocesses.

Every program the package runs (compilers, version probes) goes through
:func:`run_process`: an argv list (never a shell), an explicit working
directory and environment, a deadline. A failure to start, a timeout or a
non-zero exit raises :class:`ProcessError` carrying the argv, the exit code and
the tail of the program's output, so callers can report it without a traceback.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.errors import MetraleError

__all__ = ["Completed", "ProcessError", "decode_output", "format_argv", "run_process"]

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
    args = [str(a) for a in argv]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            args,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise ProcessError(args, None, reason="program not found") from None
    except PermissionError:
        raise ProcessError(args, None, reason="program is not executable") from None
    except NotADirectoryError:
        raise ProcessError(args, None, reason=f"working directory {cwd} is not usable") from None
    except subprocess.TimeoutExpired as exc:
        output = decode_output(exc.stdout) + decode_output(exc.stderr)
        raise ProcessError(
            args, None, output=output, reason=f"timed out after {timeout:g} s"
        ) from None
    seconds = time.perf_counter() - start
    stdout, stderr = decode_output(proc.stdout), decode_output(proc.stderr)
    if proc.returncode != 0:
        raise ProcessError(args, proc.returncode, output=stdout + stderr)
    return Completed(
        argv=tuple(args),
        returncode=proc.returncode,
        stdout=stdout,
        stderr=stderr,
        seconds=seconds,
    )


def decode_output(data: bytes | str | None) -> str:
    """A process's output as text (invalid UTF-8 replaced)."""
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="replace")
