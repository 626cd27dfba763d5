"""Slots that bound how many actions run at once: in this process, and on this machine.

:class:`PrioritySlots` hands ``jobs`` slots to the actions of one process, the
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

import asyncio
import contextlib
import fcntl
import heapq
import itertools
import os
import stat
import threading
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

from metrale_orch.executor.memory import MemoryBudget
from metrale_orch.ownership import not_own

#: A slot file: created if missing, never through a link, never waited on (a FIFO).
_SLOT_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK

__all__ = ["MachineSlots", "PrioritySlots"]


class PrioritySlots:
    """``jobs`` slots for the actions of this process (see the module docstring), within
    ``memory`` bytes of predicted peaks (0: no limit). Used on one event loop: a waiter is
    a future of that loop, holding no thread.

    A released slot is handed straight to the first waiter in line, and only that one
    wakes (thousands of module pipelines may wait at once)."""

    def __init__(self, jobs: int, memory: int = 0) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {jobs}")
        self.jobs = jobs
        self._free = jobs
        self._memory = MemoryBudget(memory)
        #: (-expected, arrival, memory, alone, the waiter's future), longest first.
        self._waiting: list[tuple[float, int, int, bool, asyncio.Future[bool]]] = []
        self._order = itertools.count()
        self._closed = False

    @property
    def memory(self) -> tuple[int, int]:
        """The predicted peaks of the slots' holders added up, and the budget (bytes)."""
        return self._memory.in_use, self._memory.budget

    @contextlib.asynccontextmanager
    async def slot(
        self, expected: float, memory: int = 0, alone: bool = False
    ) -> AsyncIterator[bool]:
        """Hold a slot for the ``async with`` block; yields False (and holds none) once
        closed. ``memory``: the predicted peak in bytes (0: unknown); ``alone``: start only
        when no other slot is held, and let none be taken meanwhile."""
        got = await self._acquire(expected, memory, alone)
        try:
            yield got
        finally:
            if got:
                self._release(memory, alone)

    def close(self) -> None:
        """Wake every waiter with no slot; later callers get none (on the loop)."""
        self._closed = True
        waiting, self._waiting = self._waiting, []
        for *_rest, future in waiting:
            if not future.done():
                future.set_result(False)

    async def _acquire(self, expected: float, memory: int, alone: bool) -> bool:
        if self._closed:
            return False
        if self._free and not self._waiting and self._memory.fits(memory, alone):
            self._free -= 1
            self._memory.take(memory, alone)
            return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = (-float(expected), next(self._order), memory, alone, future)
        heapq.heappush(self._waiting, entry)
        self._admit()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.result():
                self._release(memory, alone)  # granted as it was cancelled: hand it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(entry)
                    heapq.heapify(self._waiting)
            raise

    def _release(self, memory: int, alone: bool) -> None:
        self._free += 1
        self._memory.give(memory, alone)
        self._admit()

    def _admit(self) -> None:
        """Grant slots to the waiters in line while a slot is free and the first one's
        memory fits."""
        while self._waiting and self._free:
            _exp, _n, memory, alone, future = self._waiting[0]
            if future.done():  # cancelled while waiting
                heapq.heappop(self._waiting)
                continue
            if not self._memory.fits(memory, alone):
                break
            heapq.heappop(self._waiting)
            self._free -= 1
            self._memory.take(memory, alone)
            future.set_result(True)


class MachineSlots:
    """``jobs`` flock-held slot files in ``directory`` (see the module docstring).

    A slot file this process opened stays open until the slots are collected (a build
    run's end): taking a slot is one ``flock``, giving it back another. Opening, checking
    and closing it each time was five system calls on the event loop per compile, each
    one handing the interpreter over (E3 at 64 jobs: 1.5 s of the loop's 8.5 s). So a
    slot directory removed during a run is made again by the processes that start after,
    and this run keeps the files it opened: until it ends, the two share no budget.
    A forked child closes what it inherited and opens its own: those descriptors share
    the parent's locks."""

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
        #: Each slot file opened, by index: closed with this object (not at the
        #: interpreter's exit, when the loop may still take or give back a slot).
        self._fds: dict[int, int] = {}
        weakref.finalize(self, _close_all, self._fds).atexit = False
        _ALL.add(self)

    @contextlib.asynccontextmanager
    async def slot(self, stopped: threading.Event) -> AsyncIterator[bool]:
        """Hold one slot file for the ``async with`` block and yield True; yield False
        (holding none) when ``stopped`` is set while waiting (polled: the loop waits, no
        thread does). Where the directory cannot be written, yields True holding none:
        the in-process bound is all there is."""
        got = await self._acquire(stopped)
        try:
            yield got is not None
        finally:
            if got is not None and got[0] >= 0:
                index, fd = got
                # Unlocked before another action of this process may take it: a lock taken
                # again through the same open file would succeed while still held.
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                with self._lock:
                    self._held.discard(index)
                    self._next = index

    def _candidates(self) -> list[int]:
        """Every slot index no thread of this process holds, from the likeliest free one on
        (the priority slots let at most ``jobs`` threads in: one is always left)."""
        with self._lock:
            start = self._next
            order = [(start + i) % self.jobs for i in range(self.jobs)]
            return [i for i in order if i not in self._held]

    async def _acquire(self, stopped: threading.Event) -> tuple[int, int] | None:
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
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        return None

    def _try(self, index: int) -> tuple[int, int] | None:
        """Slot ``index`` locked (index, fd), None when another process holds it, or
        (-1, -1) when the slot file cannot be used (the in-process bound is all there is)."""
        fd = self._fds.get(index)
        if fd is None:
            fd = self._open(index)
            if fd < 0:
                return (-1, -1)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        except OSError:
            return (-1, -1)
        return (index, fd)

    def _open(self, index: int) -> int:
        """Slot file ``index`` opened and kept, or -1 when it cannot be used: its directory
        or the file is not the user's own, or not what it should be (made when missing)."""
        try:
            try:
                st = os.lstat(self.directory)
            except FileNotFoundError:
                self.directory.mkdir(parents=True, exist_ok=True)
                st = os.lstat(self.directory)
            if not stat.S_ISDIR(st.st_mode) or not_own(st, directory=True):
                return -1
            fd = os.open(self.directory / f"slot-{index}", _SLOT_FLAGS, 0o600)
        except OSError:
            return -1
        st = os.fstat(fd)
        # Only its owner matters: no byte of it is read.
        if not stat.S_ISREG(st.st_mode) or not_own(st, directory=True):
            os.close(fd)
            return -1
        with self._lock:
            self._fds[index] = fd
        return fd


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


#: Every :class:`MachineSlots` of this process (a forked child forgets what they hold).
_ALL: weakref.WeakSet[MachineSlots] = weakref.WeakSet()


def _forget_in_child() -> None:
    """In a forked child: close the slot files inherited (they share the parent's locks;
    closing the child's copies leaves those held) and hold nothing."""
    for slots in list(_ALL):
        _close_all(slots._fds)
        slots._held.clear()
        slots._lock = threading.Lock()  # a thread of the parent may have held it


os.register_at_fork(after_in_child=_forget_in_child)
