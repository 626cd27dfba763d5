"""The watcher hands over bursts of paths and asks for a rescan when it cannot be trusted;
the loop confirms bursts by content and rescans when idle."""

from __future__ import annotations

import asyncio
import os
import queue
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import watchfiles

from metrale_orch.watch import watcher
from metrale_orch.watch.changes import Changes, FileTable, watched_roots
from metrale_orch.watch.loop import next_changes
from metrale_orch.watch.watcher import Burst, WatchTiming, watch_tree

ROOTS = ("kernels", "pyproject.toml", "toolchains")


def _tree(root: Path) -> Path:
    (root / "kernels/hw/m/q").mkdir(parents=True)
    (root / "kernels/hw/m/q/a.cu").write_text("a\n")
    return root


async def _first_bursts(root: Path, act: object, count: int, step_ms: int = 10) -> list[Burst]:
    """Watch ``root``, call ``act`` once the watch runs, return the first ``count`` bursts."""
    got: list[Burst] = []
    stop = asyncio.Event()

    def put(burst: Burst) -> None:
        got.append(burst)
        if len(got) >= count:
            stop.set()

    task = asyncio.ensure_future(watch_tree(root, ROOTS, put, stop, WatchTiming(step_ms=step_ms)))
    await asyncio.sleep(0.3)  # the watch is set up
    assert callable(act)
    act()
    await asyncio.wait_for(task, 10)
    return got


def test_an_atomic_save_is_one_burst_naming_the_source(tmp_path: Path) -> None:
    root = _tree(tmp_path)

    def save() -> None:
        tmp = root / "kernels/hw/m/q/.a.cu.tmp"
        tmp.write_text("b\n")
        os.replace(tmp, root / "kernels/hw/m/q/a.cu")

    (burst,) = asyncio.run(_first_bursts(root, save, 1))
    assert "kernels/hw/m/q/a.cu" in burst.paths and not burst.rescan


def test_a_failing_watcher_asks_for_a_rescan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path)

    async def broken(*_paths: object, **_options: object) -> AsyncIterator[object]:
        raise RuntimeError("inotify queue overflow")
        yield  # an async generator, as watchfiles.awatch is

    monkeypatch.setattr(watchfiles, "awatch", broken)
    got = asyncio.run(_first_bursts(root, lambda: None, 1))
    assert got == [Burst(rescan=True)]


def test_a_burst_too_large_for_an_edit_is_a_rescan(tmp_path: Path) -> None:
    root = _tree(tmp_path)

    def switch() -> None:
        for i in range(watcher.MAX_PATHS + 50):
            (root / f"kernels/hw/m/q/g{i}.cuh").write_text("x\n")

    (burst,) = asyncio.run(_first_bursts(root, switch, 1, step_ms=300))  # one batch
    assert burst.rescan and len(burst.paths) > watcher.MAX_PATHS


def test_idle_time_rescans_what_no_event_named(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    table = FileTable(root, watched_roots(root))
    (root / "kernels/hw/m/q/a.cu").write_text("changed\n")
    bursts: queue.Queue[Burst] = queue.Queue()
    assert next_changes(table, bursts, 0.05) == Changes(changed=("kernels/hw/m/q/a.cu",))
    bursts.put(Burst(paths=frozenset({"kernels/hw/m/q/a.cu"})))  # the same bytes: no change
    (root / "kernels/hw/m/q/b.cu").write_text("new\n")
    assert next_changes(table, bursts, 0.05) == Changes(added=("kernels/hw/m/q/b.cu",))
