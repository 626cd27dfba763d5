"""The doit reporter of ``metrale_orch.dodo``: progress, failures, one summary line.

Build tasks (``build:…``) are shown as ``[ i/n] build:<target>`` when they
start; up-to-date ones are counted silently. A failure prints its one-line
message (the compiler's output for compile errors). At the end:

    build: 3 built, 2 from cache, 995 up to date, 4 skipped, 1 failed in 1.2 s
    skipped 4 targets: toolchain 'metal' is not installed: ... (apple/*)
    cache: <the cache's own summary line>

Each build task returns a small value (``outcome``, module outcomes, this
task's cache statistics, cache warnings); the reporter adds the statistics up,
prints each distinct cache warning once and writes them to
``<build_dir>/cache-stats.json``. Other tasks (``check``, ``smoke:…``) are
reported as doit's console reporter does.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from doit.reporter import ConsoleReporter

__all__ = ["STATS_NAME", "BuildReporter", "format_summary"]

_BASE = "build:"

#: File name, under the build directory, of the run's aggregated cache statistics.
STATS_NAME = "cache-stats.json"


def format_summary(counts: dict[str, int], seconds: float) -> str:
    """The final summary line (pure)."""
    parts = [
        f"{counts.get('built', 0)} built",
        f"{counts.get('cached', 0)} from cache",
        f"{counts.get('uptodate', 0)} up to date",
        f"{counts.get('skipped', 0)} skipped",
        f"{counts.get('failed', 0)} failed",
    ]
    return f"build: {', '.join(parts)} in {seconds:.1f} s"


def _is_build(task: Any) -> bool:
    return str(task.name).startswith(_BASE)


def _kind(task: Any) -> str:
    meta = getattr(task, "meta", None) or {}
    return str(meta.get("metrale_orch", "build"))


class BuildReporter(ConsoleReporter):  # type: ignore[misc]
    """doit reporter; see the module docstring."""

    desc = "metrale-orch: progress and one summary line"

    def __init__(self, outstream: Any, options: Any) -> None:
        super().__init__(outstream, options)
        self._start = time.perf_counter()
        self._total = 0
        self._started = 0
        self._counts: dict[str, int] = {}
        self._skipped: dict[str, list[str]] = {}
        self._stats: list[dict[str, Any]] = []
        self._warnings: list[str] = []
        self._failed_names: list[str] = []
        self._any_build = False
        self._ran = False

    # -- doit's interface -----------------------------------------------------------------------

    def initialize(self, tasks: Any, selected_tasks: Any) -> None:
        self._start = time.perf_counter()
        selected = set(selected_tasks or ())
        names = set()
        for name in selected:
            if name.startswith(_BASE):
                names.add(name)
            elif name in tasks:
                names.update(
                    dep for dep in getattr(tasks[name], "task_dep", ()) if dep.startswith(_BASE)
                )
        self._total = len(names)

    def execute_task(self, task: Any) -> None:
        if _is_build(task):
            self._any_build = True
            if _kind(task) != "build":
                return  # skips and tree errors report at the end / as FAILED
            self._ran = True
            self._started += 1
            width = len(str(max(self._total, self._started)))
            total = max(self._total, self._started)
            self.write(f"[{self._started:>{width}}/{total}] {task.name}\n")
        elif task.actions and not task.name.startswith("_") and task.name != "build":
            self.write(f".  {task.title()}\n")

    def skip_uptodate(self, task: Any) -> None:
        if _is_build(task):
            self._any_build = True
            self._bump("uptodate")
        elif task.name != "build" and not task.name.startswith("_"):
            self.write(f"-- {task.title()}\n")

    def add_success(self, task: Any) -> None:
        if not _is_build(task):
            return
        self._any_build = True
        values = dict(getattr(task, "values", None) or {})
        outcome = str(values.get("outcome", "built"))
        if outcome == "skipped":
            reason = str(values.get("skipped", "skipped"))
            self._skipped.setdefault(reason, []).append(task.name[len(_BASE) :])
            self._bump("skipped")
        else:
            self._bump("cached" if outcome == "cached" else "built")
        self._take(values)

    def add_failure(self, task: Any, fail: Any) -> None:
        if task.name == "build":
            # The group fails because sub-tasks did; they were reported already.
            self.failures.append({"task": task, "exception": fail})
            return
        if not _is_build(task):
            super().add_failure(task, fail)
            return
        self._any_build = True
        self._ran = self._ran or _kind(task) == "build"
        self._bump("failed")
        self._failed_names.append(task.name)
        self._take(dict(getattr(fail, "values", None) or {}))
        message = str(getattr(fail, "message", "") or fail)
        traceback = "".join(getattr(fail, "traceback", "") or "")
        if not message.startswith(_BASE):
            message = f"{task.name}: {message}"
        self.write(f"FAILED {message.rstrip()}\n")
        if traceback and not isinstance(fail, _build_failed_type()):
            self.write(traceback)
        self.failures.append({"task": task, "exception": fail})

    def complete_run(self) -> None:
        if self.runtime_errors:
            self.write("#" * 40 + "\n")
            self.write("Execution aborted.\n")
            self.write("\n".join(self.runtime_errors))
            self.write("\n")
        if not self._any_build:
            return
        seconds = time.perf_counter() - self._start
        self.write(format_summary(self._counts, seconds) + "\n")
        for reason, targets in sorted(self._skipped.items()):
            self.write(f"skipped {len(targets)} target(s): {reason} ({_brief(targets)})\n")
        for warning in self._warnings:
            self.write(f"warning: {warning}\n")
        if self._ran:  # a no-op run leaves the last build's statistics in place
            self._write_stats()

    # -- helpers ----------------------------------------------------------------------------------

    def _bump(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    def _take(self, values: dict[str, Any]) -> None:
        stats = values.get("cache")
        if isinstance(stats, dict) and stats:
            self._stats.append(stats)
        for warning in values.get("warnings", ()) or ():
            if warning not in self._warnings:
                self._warnings.append(str(warning))

    def _write_stats(self) -> None:
        """Aggregate the cache statistics, print their line, write cache-stats.json."""
        try:
            from metrale_orch import cache as cache_mod
            from metrale_orch.config import load_config
        except ImportError:
            return
        try:
            config = load_config(Path.cwd(), os.environ)
            total = cache_mod.CacheStats()
            for item in self._stats:
                total = total + cache_mod.CacheStats.from_dict(item)
            line = total.summary_line()
            if line:
                self.write(f"{line}\n")
            cache_mod.write_stats(config.build_dir / STATS_NAME, total)
        except Exception as exc:  # the summary must never fail the run
            sys.stderr.write(f"warning: could not write cache statistics: {exc}\n")


def _brief(targets: list[str]) -> str:
    shown = sorted(targets)
    if len(shown) <= 3:
        return ", ".join(shown)
    return f"{', '.join(shown[:3])}, … {len(shown) - 3} more"


def _build_failed_type() -> type:
    from metrale_orch._actions import BuildFailed

    return BuildFailed
