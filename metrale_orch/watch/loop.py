"""The edit loop: build the selection once, then rebuild what each burst of changes reaches.

Every cycle is doit's own run of the package's task loader in this process
(:func:`~metrale_orch.tasks.launch.run_doit_again`), as ``metrale-orch doit build`` runs
it: keys, cache, install, manifests and doit's records are the build's, so a ``doit
build`` afterwards has nothing to do. Between cycles the run stays warm (its
configuration, toolchain probes, build sessions, opened cache) unless the settings or a
toolchain definition changed; doit loads the tasks through the task cache, which
regenerates only when the graph changed. The build lock is held by each cycle's run
alone, so a ``doit build`` started while the loop waits runs at once.

The watcher (:mod:`~metrale_orch.watch.watcher`) runs on a loop thread and hands bursts
over a queue; each is confirmed by content (:class:`~metrale_orch.watch.changes.FileTable`)
before anything builds, and the whole watched set is rescanned by content after the first
build, whenever the watcher asks, and every :data:`IDLE_RESCAN_S` seconds without events.
After a cycle the static smoke checks of each target it built run (numbers too with
``smoke``, where a device is present). Only the caller prints: each cycle is one
:class:`CycleReport` handed to ``say``.
"""

from __future__ import annotations

import gc
import io
import os
import queue
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.config import Config
from metrale_orch.errors import MetraleError, UsageError
from metrale_orch.executor.loop import ActionLoop
from metrale_orch.graph.generate import GENERATION
from metrale_orch.graph.scope import build_scope
from metrale_orch.smoke import DeviceStatus, SmokeReport, probe_device, run_smoke
from metrale_orch.steps.session import LOOP_WORKERS
from metrale_orch.tasks.creators import cached_tasks
from metrale_orch.tasks.doit_api import current_run, plugins_looked_up_once
from metrale_orch.tasks.launch import run_doit_again
from metrale_orch.watch.changes import Changes, FileTable, watched_roots
from metrale_orch.watch.cycle import TargetOutcome, cycle_words, needs_fresh_run, read_report
from metrale_orch.watch.watcher import Burst, WatchTiming, watching

__all__ = ["IDLE_RESCAN_S", "CycleReport", "WatchOptions", "next_changes", "run_watch"]

#: Seconds without events after which the watched set is rescanned by content anyway.
IDLE_RESCAN_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchOptions:
    """What ``metrale-orch watch`` was asked."""

    #: The doit words of the selection (``build:<pattern>`` each, or ``build``).
    words: tuple[str, ...]
    #: Stop after the first cycle.
    once: bool = False
    #: Run the numeric smoke cases too (where a device is present).
    numeric: bool = False
    timing: WatchTiming = field(default_factory=WatchTiming)


@dataclass(frozen=True, slots=True, kw_only=True)
class CycleReport:
    """What one cycle did."""

    number: int
    #: What started it (empty for the first build).
    changes: Changes
    #: The targets it finished or failed.
    targets: tuple[TargetOutcome, ...]
    seconds: float
    #: doit's exit status of the cycle.
    status: int
    #: Whether the tasks were loaded for the whole selection (a graph change, the first).
    whole: bool
    #: The smoke summary lines and failures of the targets it built.
    smoke: tuple[str, ...] = ()
    #: The build's closing line when the run was stopped (Ctrl-C, SIGTERM), else "".
    stopped: str = ""


class _Loop:
    """The loop's state between cycles: the file table, the targets' file dependencies."""

    def __init__(self, root: Path, config: Config, options: WatchOptions) -> None:
        self.root = root
        self.options = options
        self.table = FileTable(root, watched_roots(root, config.hip_compat_dir))
        self.deps: dict[str, frozenset[str]] = {}
        #: How many targets the selection holds (any kind), as of the last whole cycle.
        self.selected = 0
        self.number = 0

    def cycle(
        self, changes: Changes, words: Sequence[str], *, fresh: bool, loop: ActionLoop
    ) -> CycleReport:
        """One doit run of ``words`` in this process (I/O)."""
        self.number += 1
        out = io.StringIO()
        start = time.perf_counter()
        streams = sys.stdout, sys.stderr
        try:
            status = run_doit_again(list(words), out, fresh=fresh, loop=loop)
        except SystemExit as exc:  # the reporter ends an interrupted run so
            status = int(exc.code or 0)
        finally:
            # doit's actions capture their output by replacing sys.stdout and sys.stderr,
            # and its target threads can put back another thread's capture: a process that
            # runs doit again must start each run with its own streams.
            sys.stdout, sys.stderr = streams
            # The task loader freezes what it loaded for doit's one run (gc.freeze); in a
            # process that runs doit again and again, what each run left would stay.
            gc.unfreeze()
        seconds = time.perf_counter() - start
        text = out.getvalue()
        whole = tuple(words) == self.options.words
        if whole:
            self._read_graph()
        targets = read_report(text)
        stopped = current_run().stop.signum
        return CycleReport(
            number=self.number,
            changes=changes,
            targets=targets,
            seconds=seconds,
            status=status,
            whole=whole,
            smoke=() if stopped else self._smoke(targets),
            stopped=_last_line(text, "interrupted") if stopped else "",
        )

    def _read_graph(self) -> None:
        """Each target's file dependencies, from the task cache the cycle's run filled."""
        run = current_run()
        words = self.options.words
        try:
            specs, _smoke, _how = cached_tasks(
                self.root,
                os.environ,
                words,
                lambda: GENERATION,
                run.probes,
                build_scope(words),
                run.config(),
            )
        except MetraleError:
            self.deps, self.selected = {}, 0
            return
        self.deps = {s.target: frozenset(s.file_dep) for s in specs if s.kind == "build"}
        self.selected = len(specs)

    def _smoke(self, targets: Sequence[TargetOutcome]) -> tuple[str, ...]:
        """The smoke checks of the targets built: a summary line per hardware, then each
        failure."""
        by_hw: dict[str, list[str]] = defaultdict(list)
        for t in targets:
            if t.outcome != "failed":
                by_hw[t.target.split("/", 1)[0]].append(t.target)
        lines: list[str] = []
        for hw, names in sorted(by_hw.items()):
            try:
                report = run_smoke(
                    self.root,
                    hw,
                    build_dir=current_run().config().build_dir,
                    targets=names,
                    probe=probe_device if self.options.numeric else _numbers_not_asked,
                )
            except MetraleError as exc:
                lines.append(f"smoke {hw}: {exc}")
                continue
            lines.extend(_smoke_lines(report))
        return tuple(lines)


def _numbers_not_asked() -> DeviceStatus:
    return DeviceStatus(reason="not asked: watch --smoke runs them")


def _smoke_lines(report: SmokeReport) -> list[str]:
    lines = [report.summary_line()]
    lines.extend(f"FAIL {r.target} {r.module}::{r.case}: {r.message}" for r in report.failures())
    return lines


def _last_line(text: str, prefix: str) -> str:
    found = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return found[-1] if found else ""


def run_watch(
    root: Path, config: Config, options: WatchOptions, say: Callable[[CycleReport], None]
) -> int:
    """Build ``options.words`` once, then after each burst of changes what it reaches,
    until interrupted (or after the first cycle, ``options.once``); each cycle's report to
    ``say``. Returns the status to exit with: the first cycle's with ``once``, else that
    of the stopped run (130, 143). Runs doit in the working directory, which must be
    ``root``. Raises ``ConfigError`` (a doit configuration file doit cannot read) and
    ``UsageError`` (the selection holds no target)."""
    loop = _Loop(root, config, options)
    bursts: queue.Queue[Burst] = queue.Queue()
    # One event loop for the watcher and every cycle's compiles (lent to each run).
    actions = ActionLoop(LOOP_WORKERS)
    try:
        with (
            plugins_looked_up_once(),
            watching(root, loop.table.roots, bursts.put, options.timing, actions),
        ):
            report = loop.cycle(Changes(), options.words, fresh=True, loop=actions)
            if not loop.selected and not report.targets and not report.stopped:
                raise UsageError(f"no target of the tree matches {' '.join(options.words)}")
            say(report)
            if options.once or report.stopped:
                return report.status
            pending = loop.table.rescan()  # what changed while the first build ran
            while True:
                changes = pending or next_changes(loop.table, bursts, IDLE_RESCAN_S)
                pending = Changes()
                words = cycle_words(changes, loop.deps, options.words)
                if not words:
                    continue
                fresh = needs_fresh_run(changes)
                report = loop.cycle(changes, words, fresh=fresh, loop=actions)
                say(report)
                if report.stopped:
                    return report.status
    finally:
        actions.close()


def next_changes(table: FileTable, bursts: queue.Queue[Burst], idle_s: float) -> Changes:
    """Wait for the next burst that changes some bytes, confirmed by content; after
    ``idle_s`` seconds without one, rescan everything anyway (I/O)."""
    while True:
        try:
            burst = bursts.get(timeout=idle_s)
        except queue.Empty:
            burst = Burst(rescan=True)
        paths, rescan = set(burst.paths), burst.rescan
        while True:  # every burst already waiting joins this one
            try:
                more = bursts.get_nowait()
            except queue.Empty:
                break
            paths.update(more.paths)
            rescan = rescan or more.rescan
        changes = table.rescan() if rescan else table.confirm(paths)
        if changes:
            return changes
