"""Memory-aware admission: the predicted peaks of running compiles kept within a budget.

Each compile's peak memory (its process tree's largest resident set, from ``wait4``)
is kept beside its compile time (:mod:`metrale_orch.steps.times`); the next build
predicts it from there. :class:`MemoryBudget` is the admission rule (pure): a compile
starts only while the predicted peaks of the running ones plus its own fit the budget
(the ``memory`` setting, else when the build starts ``MemAvailable``, or less where this
process's cgroup, or one above it, limits memory: a container's ``/proc/meminfo`` shows
the host's). A compile with
no prediction is admitted by ``jobs`` alone, as before there was any history; one
predicted over the whole budget runs when nothing else does, so a build never stalls.
A compile the kernel killed (SIGKILL, the out-of-memory killer's signal) runs again
once, alone: nothing else starts while it runs. The killer takes the largest process,
under nvcc its ``cicc`` or ``ptxas``, not the driver: a compiler that says a tool it ran
died so (exit status 137, or nvcc's "died due to signal 9") counts as killed too
(:func:`killed_for_memory`).
"""

from __future__ import annotations

import signal
from pathlib import Path, PurePosixPath

__all__ = ["KILLED_FOR_MEMORY", "MemoryBudget", "available_memory", "killed_for_memory"]

#: How an error says that a compile was killed for memory.
KILLED_FOR_MEMORY = "killed for memory"

#: What nvcc prints when a tool it ran was killed by SIGKILL.
_CHILD_KILLED = "died due to signal 9"


class MemoryBudget:
    """The admission rule's state: the running compiles, the sum of their predicted
    peaks, and whether one of them runs alone (pure; the caller holds a lock).

    ``budget`` is in bytes; 0 means no limit (admission by ``jobs`` alone)."""

    __slots__ = ("alone", "budget", "in_use", "running")

    def __init__(self, budget: int) -> None:
        self.budget = max(0, budget)
        #: The predicted peaks of the running compiles, added up (bytes).
        self.in_use = 0
        self.running = 0
        self.alone = False

    def fits(self, peak: int, alone: bool = False) -> bool:
        """Whether a compile predicted to peak at ``peak`` bytes (0: unknown) may start
        now; ``alone``: only when nothing runs."""
        if self.running == 0:
            return True  # never stall: whatever it needs, it runs when nothing else does
        if self.alone or alone:
            return False
        if peak <= 0 or self.budget <= 0:
            return True
        return self.in_use + peak <= self.budget

    def take(self, peak: int, alone: bool = False) -> None:
        """A compile admitted by :meth:`fits` starts."""
        self.running += 1
        self.in_use += max(0, peak)
        self.alone = self.alone or alone

    def give(self, peak: int, alone: bool = False) -> None:
        """A compile that :meth:`take` counted ended."""
        self.running -= 1
        self.in_use -= max(0, peak)
        if alone:
            self.alone = False


def killed_for_memory(returncode: int, output: str) -> bool:
    """Whether a compile that ended with ``returncode``, having printed ``output``, was
    killed by SIGKILL, itself or a tool it ran (pure): its own death, a driver's exit
    status 128 + 9 (a shell's, nvcc's), or nvcc's word that a tool "died due to signal 9"."""
    if returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return True
    return returncode != 0 and _CHILD_KILLED in output


def available_memory(root: Path = Path("/")) -> int:
    """The memory a build may use, in bytes (I/O): ``MemAvailable`` of ``/proc/meminfo``,
    or less where this process's cgroup (v2) or one above it has a ``memory.max``; 0 (no
    limit) where none can be read. ``root``: where ``/proc`` and ``/sys`` are (tests)."""
    found = (_mem_available(root / "proc" / "meminfo"), *_cgroup_limits(root))
    return min((n for n in found if n > 0), default=0)


def _mem_available(meminfo: Path) -> int:
    """``MemAvailable`` of ``meminfo`` in bytes; 0 where it cannot be read."""
    try:
        text = meminfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return 0
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            words = rest.split()
            if words and words[0].isdigit():
                return int(words[0]) * 1024 if words[1:] == ["kB"] else int(words[0])
    return 0


def _cgroup_limits(root: Path) -> list[int]:
    """The ``memory.max`` in bytes of this process's cgroup v2 and each one above it that
    has a limit (``/proc/self/cgroup``'s ``0::/path`` under ``/sys/fs/cgroup``)."""
    try:
        text = (root / "proc" / "self" / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    paths = [line[3:] for line in text.splitlines() if line.startswith("0::/")]
    if not paths:
        return []
    parts = PurePosixPath(paths[0]).parts[1:]
    if ".." in parts:  # outside this namespace's hierarchy: only its root is seen
        parts = ()
    top = root / "sys" / "fs" / "cgroup"
    limits = []
    for depth in range(len(parts), -1, -1):
        try:
            value = top.joinpath(*parts[:depth], "memory.max").read_text(encoding="ascii")
        except (OSError, UnicodeError):
            continue
        if value.strip().isdigit():  # "max": no limit there
            limits.append(int(value.strip()))
    return limits
