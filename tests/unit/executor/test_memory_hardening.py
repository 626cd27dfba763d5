"""Memory-aware admission as the out-of-memory killer and containers really behave (issue
43, B1).

The kernel kills the largest process, which under nvcc is ``cicc`` or ``ptxas``: nvcc then
exits 137 (or says a tool "died due to signal 9"), and that compile is run again alone.
The default budget reads the cgroup's ``memory.max`` (a container's ``/proc/meminfo`` is
the host's). A one-off huge peak no longer keeps its module serial forever: a later
compile whose peak ``wait4`` could not tell apart from the build's own still bounds it.

The tests of this topic that start processes are in
``tests/scenarios/executor/test_memory_hardening.py``.
"""

from __future__ import annotations

from pathlib import Path

from metrale_orch.executor import memory
from metrale_orch.steps import times
from metrale_orch.steps.times import CompileTimes
from tests.support.executor import GIB


def test_what_counts_as_killed_for_memory() -> None:
    assert memory.killed_for_memory(-9, "") and memory.killed_for_memory(137, "")
    assert memory.killed_for_memory(1, "nvcc error   : 'ptxas' died due to signal 9 (Kill signal)")
    assert not memory.killed_for_memory(1, "error: expected ';'")
    assert not memory.killed_for_memory(0, "died due to signal 9")
    assert not memory.killed_for_memory(-15, "")


def _root(tmp_path: Path, cgroup: str, limits: dict[str, str]) -> Path:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")
    (tmp_path / "proc" / "self" / "cgroup").write_text(cgroup)
    for rel, value in limits.items():
        path = tmp_path / "sys" / "fs" / "cgroup" / rel / "memory.max"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return tmp_path


def test_the_default_budget_is_the_cgroups_memory_max_where_smaller(tmp_path: Path) -> None:
    # A container limited to 4 GiB on a host with 32 GiB available: the limit is on a
    # cgroup above this process's.
    root = _root(
        tmp_path / "a",
        "0::/system.slice/ci.service/build\n",
        {
            ".": "max",
            "system.slice": "max",
            "system.slice/ci.service": str(4 * GIB),
            "system.slice/ci.service/build": "max",
        },
    )
    assert memory.available_memory(root) == 4 * GIB
    # In a cgroup namespace the container's cgroup is the root it sees.
    root = _root(tmp_path / "b", "0::/\n", {".": str(2 * GIB)})
    assert memory.available_memory(root) == 2 * GIB
    # A limit above what is available, or none (cgroup v1 only): MemAvailable.
    root = _root(tmp_path / "c", "0::/x\n", {"x": str(64 * GIB)})
    assert memory.available_memory(root) == 32 * GIB
    root = _root(tmp_path / "d", "12:memory:/docker/abc\n", {})
    assert memory.available_memory(root) == 32 * GIB


def test_a_bound_replaces_a_larger_kept_peak_and_never_invents_one() -> None:
    old = CompileTimes(
        {"t": {"m": ("k1", 1.0), "n": ("k2", 1.0), "o": ("k3", 1.0)}},
        {"t": {"m": 900 * GIB, "n": GIB}},
    )
    keyed = [("t", "m", "k1"), ("t", "n", "k2"), ("t", "o", "k3"), ("t", "m2", "k9")]
    got = times.peaks_of(old, keyed, measured={}, bounds={"k1": 2 * GIB, "k2": 3 * GIB, "k3": GIB})
    # m: capped at its bound; n: already below; o: unknown stays unknown; m2: nothing.
    assert got == [("t", "m", 2 * GIB), ("t", "n", GIB)]
    # A measurement is the measurement.
    assert times.peaks_of(old, keyed[:1], measured={"k1": 5}, bounds={"k1": 9}) == [("t", "m", 5)]
