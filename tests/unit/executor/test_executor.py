"""The local executor: at most ``jobs`` actions at once (threads and processes), longest
first, failures reported, and ``stop`` ends whole process groups at once.

These are the tests of this topic that run in-process; the others are in
``tests/scenarios/executor/test_executor.py``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from metrale_orch.executor import PrioritySlots


def test_the_longest_expected_action_starts_first() -> None:
    slots = PrioritySlots(1)
    order: list[str] = []
    gate = threading.Event()

    def take(name: str, expected: float) -> None:
        with slots.slot(expected):
            order.append(name)
            if name == "first":
                gate.wait(5)

    first = threading.Thread(target=take, args=("first", 0))
    first.start()
    time.sleep(0.05)
    waiters = [
        threading.Thread(target=take, args=(name, exp))
        for name, exp in (("short", 0.1), ("long", 9.0), ("unknown", 0.0), ("mid", 2.0))
    ]
    for w in waiters:
        w.start()
        time.sleep(0.02)
    gate.set()
    for t in (first, *waiters):
        t.join(5)
    assert order == ["first", "long", "mid", "short", "unknown"]


def test_threads_of_one_process_try_no_slot_they_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each thread locks a slot file no other thread of its process holds: one try each
    when no other process competes (every try is three system calls under the GIL)."""
    import fcntl

    from metrale_orch.executor.slots import MachineSlots

    tries: list[int] = []
    real = fcntl.flock
    monkeypatch.setattr(fcntl, "flock", lambda fd, op: (tries.append(fd), real(fd, op))[1])
    slots = MachineSlots(tmp_path / "slots", 4)
    stopped = threading.Event()
    inside = threading.Barrier(4)
    held: list[set[int]] = []

    def hold() -> None:
        with slots.slot(stopped) as got:
            assert got
            inside.wait(10)  # all four at once
            held.append(set(slots._held))
            inside.wait(10)

    for _round in range(3):
        threads = [threading.Thread(target=hold) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    assert held and all(h == {0, 1, 2, 3} for h in held)
    assert len(tries) == 12
    assert not slots._held
