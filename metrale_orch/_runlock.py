"""One build per project at a time (SPEC 3.1), like cargo's lock on its build directory.

A run of ``doit`` that executes tasks holds an exclusive lock on
``<build_dir>/.lock`` (the ``filelock`` package: ``flock`` on POSIX, released
by the kernel when the process dies) from before its first up-to-date check to
the end of the run. A second build in the same project prints one line naming
the holder and waits, then runs against the state the first one saved. Views
that only read (``doit list``, ``metrale-orch status``/``why``/``rdeps``) never
take it. Workers of one run (``-n N``) share their parent's lock.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["HOLDER_NAME", "LOCK_NAME", "BuildLock"]

#: The lock file and the note naming its holder, under the build directory.
LOCK_NAME = ".lock"
HOLDER_NAME = ".lock.holder"


class BuildLock:
    """The project's build lock (see the module docstring); not reentrant across calls."""

    def __init__(self, build_dir: Path) -> None:
        self.build_dir = Path(build_dir)
        self._lock = FileLock(self.build_dir / LOCK_NAME, thread_local=False)
        self._holder = self.build_dir / HOLDER_NAME
        self._note = ""

    @property
    def held(self) -> bool:
        return bool(self._lock.is_locked)

    def acquire(self, say: Callable[[str], None]) -> None:
        """Take the lock, first saying (once) who holds it when another build does.

        Raises ``OSError`` when the build directory cannot hold a lock file.
        """
        self.build_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            say(
                f"metrale-orch: waiting for the build lock {self.build_dir / LOCK_NAME}: "
                f"another build of this project is running ({self.holder()})"
            )
            self._lock.acquire()
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "?"
        self._note = f"pid {os.getpid()}, `{command}`, since {time.strftime('%H:%M:%S')}"
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
        if not self._lock.is_locked:
            return
        with contextlib.suppress(OSError):
            if self._holder.read_text(encoding="utf-8").strip() == self._note:
                self._holder.unlink()
        self._lock.release(force=True)
