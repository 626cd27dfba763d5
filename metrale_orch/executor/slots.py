"""Slots that bound how many actions run at once: in this process, and on this machine.

:class:`PrioritySlots` hands ``jobs`` slots to the threads of one process, the
waiting action with the longest expected time first (ties in arrival order), and
only while its predicted peak memory fits
(:class:`~metrale_orch.executor.memory.MemoryBudget`): the first in line waits for
memory rather than be overtaken, so a large compile is never starved by smaller ones.

:class:`MachineSlots` is the jobserver shared by every process of one build
(doit's ``-P process`` workers): ``jobs`` slot files under the build's state
directory, each held with an exclusive ``flock`` while an action runs. The
kernel releases a lock when its process dies, so a killed worker never leaks a
slot (the tokens of a make-style pipe jobserver are lost with their holder).
A slot file is used only when it is a regular file the user owns, in a directory the
user owns, opened without following a link (a planted link would make a root build
create a file elsewhere); otherwise the in-process bound is all there is.
Within one process the priority slots are taken first, so a process never holds
more machine slots than it has actions running.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import itertools
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from metrale_orch.executor.memory import MemoryBudget
from metrale_orch.ownership import not_own

#: A slot file: created if missing, never through a link, never waited on (a FIFO).
_SLOT_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK

__all__ = ["MachineSlots", "PrioritySlots"]


class _Waiter:
    """One thread waiting for a slot: woken alone, when the slot is handed to it."""

    __slots__ = ("alone", "event", "granted", "memory")

    def __init__(self, memory: int, alone: bool) -> None:
        self.event = threading.Event()
        self.granted = False
        self.memory = memory
        self.alone = alone


class PrioritySlots:
    """``jobs`` slots for the threads of this process (see the module docstring), within
    ``memory`` bytes of predicted peaks (0: no limit).

    A released slot is handed straight to the first waiter in line, and only that
    thread wakes (hundreds of module pipelines may wait at once)."""

    def __init__(self, jobs: int, memory: int = 0) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {jobs}")
        self.jobs = jobs
        self._free = jobs
        self._memory = MemoryBudget(memory)
        self._lock = threading.Lock()
        self._waiting: list[tuple[float, int, _Waiter]] = []
        self._order = itertools.count()
        self._closed = False

    @property
    def memory(self) -> tuple[int, int]:
        """The predicted peaks of the slots' holders added up, and the budget (bytes)."""
        with self._lock:
            return self._memory.in_use, self._memory.budget

    @contextlib.contextmanager
    def slot(self, expected: float, memory: int = 0, alone: bool = False) -> Iterator[bool]:
        """Hold a slot for the ``with`` block; yields False (and holds none) once closed.
        ``memory``: the predicted peak in bytes (0: unknown); ``alone``: start only when
        no other slot is held, and let none be taken meanwhile."""
        got = self._acquire(expected, memory, alone)
        try:
            yield got
        finally:
            if got:
                self._release(memory, alone)

    def close(self) -> None:
        """Wake every waiter with no slot; later callers get none."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
        for _exp, _n, waiter in waiting:
            waiter.event.set()

    def _acquire(self, expected: float, memory: int, alone: bool) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._free and not self._waiting and self._memory.fits(memory, alone):
                self._free -= 1
                self._memory.take(memory, alone)
                return True
            waiter = _Waiter(memory, alone)
            heapq.heappush(self._waiting, (-float(expected), next(self._order), waiter))
            granted = self._admit()
        for other in granted:
            other.event.set()
        waiter.event.wait()
        return waiter.granted

    def _release(self, memory: int, alone: bool) -> None:
        with self._lock:
            self._free += 1
            self._memory.give(memory, alone)
            granted = self._admit()
        for waiter in granted:
            waiter.event.set()

    def _admit(self) -> list[_Waiter]:
        """Grant slots to the waiters in line while a slot is free and the first one's
        memory fits (the lock held); returns them, to be woken outside the lock."""
        granted = []
        while self._waiting and self._free:
            waiter = self._waiting[0][2]
            if not self._memory.fits(waiter.memory, waiter.alone):
                break
            heapq.heappop(self._waiting)
            self._free -= 1
            self._memory.take(waiter.memory, waiter.alone)
            waiter.granted = True
            granted.append(waiter)
        return granted


class MachineSlots:
    """``jobs`` flock-held slot files in ``directory`` (see the module docstring)."""

    #: Seconds between tries while every slot is held by another process.
    POLL = 0.005

    def __init__(self, directory: Path, jobs: int) -> None:
        self.directory = Path(directory)
        self.jobs = jobs
        #: The slot indices this process holds now (its own never need a try) and where
        #: the next search starts (a released slot is the likeliest free one).
        self._lock = threading.Lock()
        self._held: set[int] = set()
        self._next = os.getpid() % jobs

    @contextlib.contextmanager
    def slot(self, stopped: threading.Event) -> Iterator[bool]:
        """Hold one slot file for the ``with`` block and yield True; yield False (holding
        none) when ``stopped`` is set while waiting. Where the directory cannot be
        written, yields True holding none: the in-process bound is all there is."""
        got = self._acquire(stopped)
        try:
            yield got is not None
        finally:
            if got is not None and got[0] >= 0:
                index, fd = got
                with self._lock:
                    self._held.discard(index)
                    self._next = index
                os.close(fd)  # closing the descriptor releases the lock

    def _candidates(self) -> list[int]:
        """Every slot index no thread of this process holds, from the likeliest free one on
        (the priority slots let at most ``jobs`` threads in: one is always left)."""
        with self._lock:
            start = self._next
            order = [(start + i) % self.jobs for i in range(self.jobs)]
            return [i for i in order if i not in self._held]

    def _acquire(self, stopped: threading.Event) -> tuple[int, int] | None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            st = os.lstat(self.directory)
        except OSError:
            return (-1, -1)
        if not stat.S_ISDIR(st.st_mode) or not_own(st, directory=True):
            return (-1, -1)
        delay = self.POLL
        while not stopped.is_set():
            for index in self._candidates():
                with self._lock:
                    if index in self._held:  # another thread of ours took it meanwhile
                        continue
                    self._held.add(index)
                got = self._try(index)
                if got is not None and got[0] >= 0:
                    return got
                with self._lock:
                    self._held.discard(index)
                if got is not None:  # the slot files cannot be used
                    return got
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return None

    def _try(self, index: int) -> tuple[int, int] | None:
        """Slot ``index`` locked (index, fd), None when another process holds it, or
        (-1, -1) when the slot file cannot be used (the in-process bound is all there is)."""
        path = self.directory / f"slot-{index}"
        try:
            fd = os.open(path, _SLOT_FLAGS, 0o600)
        except OSError:
            return (-1, -1)
        st = os.fstat(fd)
        # Only its owner matters: no byte of it is read.
        if not stat.S_ISREG(st.st_mode) or not_own(st, directory=True):
            os.close(fd)
            return (-1, -1)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:
            os.close(fd)
            return (-1, -1)
        return (index, fd)
