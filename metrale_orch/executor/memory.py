"""Memory-aware admission: the predicted peaks of running compiles kept within a budget.

Each compile's peak memory (its process tree's largest resident set, from ``wait4``)
is kept beside its compile time (:mod:`metrale_orch.steps.times`); the next build
predicts it from there. :class:`MemoryBudget` is the admission rule (pure): a compile
starts only while the predicted peaks of the running ones plus its own fit the budget
(the ``memory`` setting, else ``MemAvailable`` when the build starts). A compile with
no prediction is admitted by ``jobs`` alone, as before there was any history; one
predicted over the whole budget runs when nothing else does, so a build never stalls.
A compile the kernel killed (SIGKILL, the out-of-memory killer's signal) runs again
once, alone: nothing else starts while it runs.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["KILLED_FOR_MEMORY", "MemoryBudget", "available_memory"]

#: How an error says that a compile was killed for memory.
KILLED_FOR_MEMORY = "killed for memory"

_MEMINFO = Path("/proc/meminfo")


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


def available_memory(meminfo: Path = _MEMINFO) -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; 0 (no limit) where it cannot be read."""
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
