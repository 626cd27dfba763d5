"""One build per project at a time (SPEC 3.1), like cargo's lock on its build directory.

A run of ``doit`` that executes tasks holds an exclusive ``flock`` on
``<build_dir>/.lock`` (released by the kernel when the process dies, so a killed
build never leaves a stale lock) from before its first up-to-date check to the
end of the run. The ``filelock`` package does the same but costs 14-20 ms of
imports on every invocation, several percent of a no-op build; this module is
the few lines it takes on POSIX. A second build in the same project prints one line naming
the holder and waits, then runs against the state the first one saved. Views
that only read (``doit list``, ``metrale-orch status``/``why``/``rdeps``) never
take it. Workers of one run (``-n N``) share their parent's lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from metrale_orch.errors import printable

__all__ = ["HOLDER_NAME", "LOCK_NAME", "BuildLock"]

#: The lock file and the note naming its holder, under the build directory.
LOCK_NAME = ".lock"
HOLDER_NAME = ".lock.holder"


class BuildLock:
    """The project's build lock (see the module docstring); not reentrant across calls."""

    def __init__(self, build_dir: Path) -> None:
        self.build_dir = Path(build_dir)
        self._fd: int | None = None
        self._holder = self.build_dir / HOLDER_NAME
        self._note = ""

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, say: Callable[[str], None]) -> None:
        """Take the lock, first saying (once) who holds it when another build does.

        Raises ``OSError`` when the build directory cannot hold a lock file.
        """
        if self._fd is not None:
            return
        self.build_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.build_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(
                    f"metrale-orch: waiting for the build lock {self.build_dir / LOCK_NAME}: "
                    f"another build of this project is running ({self.holder()})"
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "?"
        # printable: an argument that is no UTF-8 (a file name's bytes) is shown as \xNN.
        self._note = printable(f"pid {os.getpid()}, `{command}`, since {time.strftime('%H:%M:%S')}")
        with contextlib.suppress(OSError):
            self._holder.write_text(self._note + "\n", encoding="utf-8")

    def holder(self) -> str:
        """What the holder wrote about itself ("unknown holder" when nothing readable)."""
        try:
            text = self._holder.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            text = ""
        return text or "unknown holder"

    def release(self) -> None:
        """Let the next build in (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if self._holder.read_text(encoding="utf-8").strip() == self._note:
                self._holder.unlink()
        os.close(fd)  # closing the descriptor releases the flock
