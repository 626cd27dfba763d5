"""Memory-aware admission (issue 38, item 2): each compile's peak memory is measured and
kept beside its time; the local executor starts a compile only while the running ones'
predicted peaks and its own fit the budget, never stalls, admits a compile with no
history by ``jobs`` alone, and runs one killed for memory once more, alone.

The tests of this topic that start processes are in
``tests/scenarios/executor/test_memory.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metrale_orch import proc
from metrale_orch.config import ConfigError, load_config
from metrale_orch.executor import PrioritySlots
from metrale_orch.executor.memory import MemoryBudget, available_memory
from metrale_orch.proc import peak_is_the_child_s
from metrale_orch.steps.profile import Span
from metrale_orch.steps.times import TIMES, CompileTimes, merge_compiles, read_times, write_times
from metrale_orch.tasks.progress import progress_text
from tests.support.executor import MIB
from tests.support.steps import trace_of

# -- the rule, alone ------------------------------------------------------------------------


def test_the_budget_admits_what_fits_never_stalls_and_knows_no_history() -> None:
    budget = MemoryBudget(250)
    assert budget.fits(1000)  # nothing runs: even one over the whole budget starts
    budget.take(100)
    assert budget.fits(150) and not budget.fits(151)
    assert budget.fits(0)  # no prediction: admitted by jobs alone, as before any history
    budget.take(150)
    assert not budget.fits(1) and budget.fits(0)
    assert (budget.in_use, budget.running) == (250, 2)
    budget.give(100)
    budget.give(150)
    assert (budget.in_use, budget.running) == (0, 0)
    unlimited = MemoryBudget(0)
    unlimited.take(10**12)
    assert unlimited.fits(10**12)


def test_a_compile_run_alone_starts_when_nothing_runs_and_lets_nothing_beside_it() -> None:
    budget = MemoryBudget(250)
    budget.take(10)
    assert not budget.fits(10, alone=True)
    budget.give(10)
    assert budget.fits(10, alone=True)
    budget.take(10, alone=True)
    assert not budget.fits(0) and not budget.fits(1)
    budget.give(10, alone=True)
    assert budget.fits(1)


def test_memavailable_is_read_in_bytes(tmp_path: Path) -> None:
    meminfo = tmp_path / "proc" / "meminfo"  # available_memory takes the root (issue 43)
    meminfo.parent.mkdir()
    meminfo.write_text("MemTotal:  32000000 kB\nMemFree: 1 kB\nMemAvailable:   2048 kB\n")
    assert available_memory(tmp_path) == 2048 * 1024
    meminfo.write_text("MemTotal:  32000000 kB\n")
    assert available_memory(tmp_path) == 0  # unknown: no limit
    assert available_memory(tmp_path / "missing") == 0


def test_priority_slots_keep_the_holders_predictions_within_the_budget() -> None:
    """Every holder sees the predictions in use within the budget, except while one
    predicted over the whole budget holds a slot alone."""
    slots = PrioritySlots(4, memory=250)
    seen: list[tuple[int, int]] = []

    async def hold(memory: int) -> None:
        async with slots.slot(0.0, memory) as got:
            assert got
            in_use, _budget = slots.memory
            seen.append((memory, in_use))
            await asyncio.sleep(0.01)

    sizes = [100, 100, 100, 60, 60, 400, 100, 0, 0, 150, 90, 100]

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(hold(m) for m in sizes)), 20)

    asyncio.run(main())
    assert sorted(m for m, _ in seen) == sorted(sizes)  # every one ran
    for memory, in_use in seen:
        assert in_use <= 250 or memory == in_use == 400, seen
    assert slots.memory == (0, 250)


def test_the_first_in_line_waits_for_memory_rather_than_be_overtaken() -> None:
    slots = PrioritySlots(3, memory=100)
    order: list[str] = []

    async def take(name: str, expected: float, memory: int) -> None:
        async with slots.slot(expected, memory) as got:
            assert got
            order.append(name)

    async def main() -> None:
        held = slots.slot(0.0, 60)
        assert await held.__aenter__()
        first = asyncio.create_task(take("large", 5.0, 60))  # 60 + 60 > 100: waits
        await asyncio.sleep(0)
        second = asyncio.create_task(take("small", 1.0, 10))  # would fit, but waits
        await asyncio.sleep(0)
        assert len(slots._waiting) == 2
        # The small one would fit beside the holder, but the large one is first in line.
        assert order == [] and slots.memory == (60, 100)
        await held.__aexit__(None, None, None)  # both start now: 60 + 10 fit
        await asyncio.wait_for(asyncio.gather(first, second), 10)

    asyncio.run(main())
    assert sorted(order) == ["large", "small"]


# -- kept, configured, shown ----------------------------------------------------------------


def test_peaks_are_kept_beside_the_times_and_an_old_file_still_reads(tmp_path: Path) -> None:
    old = CompileTimes({"t": {"m": ("k1", 1.0), "n": ("k2", 2.0)}}, {"t": {"m": 5 * MIB}})
    new = merge_compiles(
        old,
        [("t", "n", "k3", 2.5), ("u", "m", "k1", 1.0)],
        seen={"t": {"m", "n"}},
        peaks=[("t", "n", 7 * MIB), ("u", "m", 5 * MIB)],
    )
    assert new.peaks == {"t": {"m": 5 * MIB, "n": 7 * MIB}, "u": {"m": 5 * MIB}}
    assert new.peak_by_key() == {"k1": 5 * MIB, "k3": 7 * MIB}
    assert new.peak_by_module()[("t", "n")] == 7 * MIB
    # A module gone from its target takes its peak with it.
    assert merge_compiles(new, [], seen={"t": {"n"}}).peaks["t"] == {"n": 7 * MIB}
    write_times(tmp_path, new)
    assert read_times(tmp_path) == new
    (tmp_path / TIMES).write_text('{"schema": 1, "modules": {"t": {"m": ["k", 1.5]}}}')
    assert read_times(tmp_path) == CompileTimes({"t": {"m": ("k", 1.5)}})


def test_the_memory_setting_takes_sizes(tmp_path: Path) -> None:
    assert load_config(tmp_path, environ={}).memory == 0  # MemAvailable at the start
    env = {"METRALE_ORCH_MEMORY": "16G"}
    assert load_config(tmp_path, environ=env).memory == 16 * 1024**3
    (tmp_path / "pyproject.toml").write_text('[tool.metrale-orch]\nmemory = "1.5G"\n')
    assert load_config(tmp_path, environ={}).memory == 1536 * MIB
    (tmp_path / "pyproject.toml").write_text('[tool.metrale-orch]\nmemory = "lots"\n')
    with pytest.raises(ConfigError, match="memory: must be a number of bytes"):
        load_config(tmp_path, environ={})


def test_the_live_line_and_the_profile_show_memory_in_use() -> None:
    counts = {"done": 1, "total": 4, "in_flight": 2, "memory": 3 * 2**30, "memory_budget": 2**34}
    assert "2 in flight · 3.0/16.0 GiB · " in progress_text(counts, 1.0, None)
    assert "GiB" not in progress_text({"done": 1, "total": 4}, 1.0, None)
    spans = [
        Span(step="compile", target="t", module=m, start_ns=s, end_ns=e, pid=1, tid=t, args=a)
        for m, s, e, t, a in (
            ("a", 0, 4_000_000, 2, {"seconds": 0.003, "memory": 100 * MIB}),
            ("b", 0, 3_000_000, 3, {"seconds": 0.001, "memory": 50 * MIB}),
        )
    ]
    events = trace_of(spans, origin_ns=0, main_pid=1)[0]["traceEvents"]
    assert isinstance(events, list)
    track = [(e["ts"], e["args"]["MiB"]) for e in events if e["ph"] == "C"]
    # a's compiler ran 1-4 ms, b's 2-3 ms (each span's end less its seconds).
    assert track == [(1000, 100.0), (2000, 150.0), (3000, 100.0), (4000, 0.0)]


def test_a_child_peak_just_above_the_parent_s_is_what_it_inherited() -> None:
    """A child that only inherited this process's memory was once reported ~10 % above
    this process's high-water mark (Linux sums per-thread, per-CPU counters lazily): that is
    not the child's peak; a peak well above it is."""
    own = 300 * MIB
    assert not peak_is_the_child_s(own, own)
    assert not peak_is_the_child_s(322 * MIB, own)  # the CI worker's reading
    assert peak_is_the_child_s(400 * MIB, own)
    assert peak_is_the_child_s(60 * MIB, 20 * MIB)  # a small parent: 32 MiB of slack


def test_the_parent_s_mark_is_read_only_when_the_last_one_read_does_not_settle_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The high-water mark only grows: a peak under the bar of the mark last read is not
    the child's, without reading the mark again (three system calls on the event loop)."""
    marks = iter([300 * MIB, 500 * MIB])
    reads: list[int] = []

    def own_high_water() -> int:
        reads.append(1)
        return next(marks)

    monkeypatch.setattr(proc, "_own_high_water", own_high_water)
    monkeypatch.setattr(proc, "_HIGH_WATER", [0])
    assert not proc._peak_is_the_child_s(300 * MIB)  # read: 300 MiB, not the child's
    assert not proc._peak_is_the_child_s(320 * MIB)  # under the last bar: not read again
    assert len(reads) == 1
    assert not proc._peak_is_the_child_s(400 * MIB)  # above it: read again, 500 MiB now
    assert len(reads) == 2
    assert not proc._peak_is_the_child_s(450 * MIB)
    assert len(reads) == 2
