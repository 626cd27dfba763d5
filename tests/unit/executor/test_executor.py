"""The local executor: at most ``jobs`` actions at once (threads and processes), longest
first, failures reported, and ``stop`` ends whole process groups at once.

These are the tests of this topic that run in-process; the others are in
``tests/scenarios/executor/test_executor.py``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from metrale_orch.executor import PrioritySlots


def _turns(waiting: list[tuple[str, float]], cancel: str = "") -> list[str]:
    """The order in which ``waiting`` (name, expected seconds) get the one slot of a
    :class:`PrioritySlots`, all in line behind a first holder; ``cancel``: the one
    cancelled while in line."""

    async def main() -> list[str]:
        slots = PrioritySlots(1)
        order: list[str] = []
        gate = asyncio.Event()

        async def take(name: str, expected: float) -> None:
            async with slots.slot(expected):
                order.append(name)
                if name == "first":
                    await gate.wait()

        first = asyncio.create_task(take("first", 0))
        await asyncio.sleep(0)
        tasks = {name: asyncio.create_task(take(name, exp)) for name, exp in waiting}
        await asyncio.sleep(0)
        if cancel:
            tasks.pop(cancel).cancel()
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, *tasks.values()), 5)
        return order

    return asyncio.run(main())


def test_the_longest_expected_action_starts_first() -> None:
    waiting = [("short", 0.1), ("long", 9.0), ("unknown", 0.0), ("mid", 2.0)]
    assert _turns(waiting) == ["first", "long", "mid", "short", "unknown"]


def test_a_waiter_cancelled_in_line_takes_no_slot() -> None:
    """A pipeline cancelled while it waits leaves the line, and the slot goes on."""
    assert _turns([("gone", 9.0), ("kept", 1.0)], cancel="gone") == ["first", "kept"]


def test_actions_of_one_process_try_no_slot_they_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each action locks a slot file no other action of its process holds: one try each
    when no other process competes, through the slot file opened the first time (a try
    is one system call, a release another); a released slot is free for other processes."""
    import fcntl

    from metrale_orch.executor import slots as slots_module
    from metrale_orch.executor.slots import MachineSlots

    tries: list[int] = []
    opened: list[str] = []
    real_flock, real_open = fcntl.flock, os.open

    def flock(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX:
            tries.append(fd)
        real_flock(fd, op)

    def open_(path: str, *args: int) -> int:
        opened.append(os.fspath(path))
        return real_open(path, *args)

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(slots_module.os, "open", open_)
    slots = MachineSlots(tmp_path / "slots", 4)
    stopped = threading.Event()
    held: list[set[int]] = []

    async def main() -> None:
        inside = asyncio.Barrier(4)

        async def hold() -> None:
            async with slots.slot(stopped) as got:
                assert got
                await inside.wait()  # all four at once
                held.append(set(slots._held))
                await inside.wait()

        for _round in range(3):
            await asyncio.wait_for(asyncio.gather(*(hold() for _ in range(4))), 20)

    asyncio.run(main())
    assert held and all(h == {0, 1, 2, 3} for h in held)
    assert len(tries) == 12
    assert sorted(opened) == sorted(str(tmp_path / "slots" / f"slot-{i}") for i in range(4))
    assert not slots._held
    for i in range(4):  # released: another open file (another process's) locks it at once
        fd = real_open(tmp_path / "slots" / f"slot-{i}", os.O_RDWR)
        try:
            real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
