"""The doit reporter of ``metrale_orch.dodo``: progress, failures, one summary line.

Build tasks (``build:…``) are shown as ``[ i/n] build:<target>`` when they
start and ``done build:<target>: built in 3.1 s (10 modules: …)`` when they finish;
up-to-date ones are counted silently, and so are those marked by ``doit
ignore`` (doit's ``!!`` lines: the group ``build`` is "ignored" too whenever one
of its targets is, which says nothing). A failure prints its one-line message
(the compiler's output for compile errors). At the end:

    build: 3 built, 2 from cache, 995 up to date, 4 skipped, 1 failed in 1.2 s
    skipped 4 target(s): toolchain 'metal' is not installed: ... (apple/*)
    cache: <the cache's own summary line>

(the skip reason cut to its first clause on a no-op run; what each count means:
docs/guarantees.md, "What the counts mean").

The words of each line are :mod:`~metrale_orch.tasks.report_lines`; how the run ends,
:mod:`~metrale_orch.tasks.run_end`.

Each build task returns a small value (:class:`~metrale_orch.tasks.values.BuildValues`:
its outcome, module outcomes, this task's cache statistics, cache warnings, its profile
spans); the reporter adds the statistics up, prints each distinct cache warning once,
and hands what it gathered to :mod:`~metrale_orch.tasks.run_files`, which writes
``<build_dir>/cache-stats.json``, ``<build_dir>/profile.json`` (every target's spans, on
the worker that ran them, as Chrome trace events: :mod:`metrale_orch.steps.trace`) and
``compile_commands.json`` (the parts every target's build wrote:
:mod:`metrale_orch.steps.compdb`); the reporter only reports. A run that built nothing (a
no-op) leaves the files of the last build that did in place, and costs nothing for them.
Other tasks (``check``, ``smoke:…``, ``coverage``) are reported as doit's console reporter
does; a passing smoke or coverage task's ``summary`` value is printed last.

doit's runner calls a project's code at the start and the end of its loop only through
the reporter (:meth:`BuildReporter.initialize`, :meth:`BuildReporter.complete_run`, last,
after saving every finished task): both are handed to the run
(:class:`~metrale_orch.tasks.run.Run`: ``begin`` takes the build lock, ``end`` releases
it, ``exit_status`` decides the status), and the reporter says how the run ended:

- stopped by Ctrl-C or SIGTERM (the runner is unwinding a ``KeyboardInterrupt``):
  one line, ``interrupted; N targets finished and kept``, and exit 130 or 143
  instead of doit's traceback (:func:`~metrale_orch.tasks.run_end.end_interrupted`);
- failed: exit 1 when every failure is a target that ran and failed (a
  compile error), 2 when one is a tree, configuration or doit error. doit
  alone would say 2 whenever the group ``build`` ran, since it counts the
  group's unmet dependencies as errors (:func:`~metrale_orch.tasks.run_end.exit_status`);
- doit's database could not be saved (a full disk): the summary, then one
  ``error:`` line naming the file and why, and at least exit 1
  (:class:`~metrale_orch.tasks.database.Database` keeps the failure for this).

A file of the run's report (``cache-stats.json``, ``profile.json``,
``compile_commands.json``) that cannot be written is one warning line naming it and
why; it never fails the run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, TextIO

from doit.exceptions import UnmetDependency
from doit.reporter import ConsoleReporter

from metrale_orch.errors import (
    Interrupted,
    MetraleError,
    printable,
)
from metrale_orch.graph.scope import selection_scope
from metrale_orch.paths import (
    BUILD_TASK,
    COVERAGE_TASK,
    SMOKE_TASK,
)
from metrale_orch.tasks.actions import progress_counts, stop_requested
from metrale_orch.tasks.database import Database
from metrale_orch.tasks.dicts import KIND
from metrale_orch.tasks.doit_api import Task, current_run, running_backend
from metrale_orch.tasks.outcomes import BuildFailed
from metrale_orch.tasks.progress import LiveLine, progress_text
from metrale_orch.tasks.report_lines import (
    add_remote_counts,
    brief,
    format_refused,
    format_remote,
    format_skipped,
    format_summary,
    format_target,
)
from metrale_orch.tasks.run_end import end_interrupted
from metrale_orch.tasks.values import BuildValues, SummaryValues

if TYPE_CHECKING:
    from metrale_orch.steps.trace import TraceEvents

__all__ = ["BuildReporter"]

_BASE = BUILD_TASK + ":"
_SMOKE_BASE = SMOKE_TASK + ":"


def _is_build(task: Task) -> bool:
    return str(task.name).startswith(_BASE)


def _kind(task: Task) -> str:
    meta = getattr(task, "meta", None) or {}
    return str(meta.get(KIND, "build"))


class BuildReporter(ConsoleReporter):  # type: ignore[misc]
    """doit reporter; see the module docstring."""

    desc = "metrale-orch: progress and one summary line"

    def __init__(self, outstream: TextIO, options: Mapping[str, object]) -> None:
        super().__init__(outstream, options)
        self._start = time.perf_counter()
        #: Time 0 of the profile: the wall clock, as the workers' spans are timed.
        self._origin_ns = time.time_ns()
        self._total = 0
        self._started = 0
        self._counts: dict[str, int] = {}
        self._skipped: dict[str, list[str]] = {}
        self._ignored: list[str] = []
        self._stats: list[dict[str, int | float]] = []
        self._spans: list[Mapping[str, object]] = []
        #: The profile's events, made as each target's spans arrive (the build still runs).
        self._trace: TraceEvents | None = None
        self._warnings: list[str] = []
        self._failed_names: list[str] = []
        self._any_build = False
        self._ran = False
        #: doit's database of this run, when it is this package's (reports a failed save).
        self._database: Database | None = None
        #: ``smoke:<hw>`` summary lines, printed last (after the build's own summary).
        self._smoke_lines: list[str] = []
        #: The live progress line on a terminal (:mod:`metrale_orch.tasks.progress`).
        self._live: LiveLine | None = None
        self._tty = _is_terminal(outstream)
        #: Kept compile seconds per target, the targets finished this run, and those
        #: the ETA counts no more (started: their modules count; up to date; ignored).
        self._expected: dict[str, float] = {}
        self._finished: set[str] = set()
        self._not_pending: set[str] = set()
        self._selected: set[str] = set()
        #: Every target the tree has (the kept compile times of the others are dropped).
        self._alive: set[str] = set()
        self._scoped = False  # a run of some build sub-tasks (graph/scope.py)
        self._count_lock = threading.Lock()
        #: Where the compile actions ran (remote execution), added up over the targets.
        self._remote: dict[str, object] = {}
        #: ``build:<target>`` -> its modules ``require_hits`` did not compile.
        self._refused: dict[str, int] = {}
        #: Every task of the run (:meth:`initialize`), selected or not.
        self._tasks: Mapping[str, Task] = {}

    # -- doit's interface -----------------------------------------------------------------------

    def initialize(self, tasks: Mapping[str, Task], selected_tasks: Iterable[str] | None) -> None:
        # doit calls this before its first up-to-date check of a run that executes
        # tasks (never for `list`/`info`): one build per project from here to the end.
        current_run().begin(lambda line: print(line, file=sys.stderr, flush=True))
        backend = running_backend()
        if isinstance(backend, Database):  # a failed final save is said with the summary
            backend.report_at_end()
            self._database = backend
        self._start = time.perf_counter()
        self._origin_ns = time.time_ns()
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
        self._selected = names
        # The tree's targets, whose kept compile times stay; a run scoped to some targets
        # knows no other (see graph/scope.py): it drops none.
        self._scoped = selection_scope(current_run().selection) is not None
        self._alive = (
            set() if self._scoped else {n[len(_BASE) :] for n in tasks if n.startswith(_BASE)}
        )
        self._tasks = tasks  # the targets whose parts make the compilation database
        if self._tty:
            self._expected = _expected_target_seconds()

    def execute_task(self, task: Task) -> None:
        if _is_build(task):
            self._any_build = True
            if _kind(task) != "build":
                return  # skips and tree errors report at the end / as FAILED
            self._ran = True
            with self._count_lock:  # doit's target threads call this at once
                self._started += 1
                started = self._started
                self._not_pending.add(task.name)
                if self._tty and self._live is None:
                    self._live = _live_line(self.outstream, self._progress_text)
            width = len(str(max(self._total, started)))
            total = max(self._total, started)
            self.write(f"[{started:>{width}}/{total}] {task.name}\n")
        elif task.actions and not task.name.startswith("_") and task.name != BUILD_TASK:
            self.write(f".  {task.title()}\n")

    def skip_uptodate(self, task: Task) -> None:
        if _is_build(task):
            self._any_build = True
            self._not_pending.add(task.name)
            self._bump("uptodate")
        elif task.name != BUILD_TASK and not task.name.startswith("_"):
            self.write(f"-- {task.title()}\n")

    def skip_ignore(self, task: Task) -> None:
        if _is_build(task):
            self._any_build = True
            self._not_pending.add(task.name)
            self._bump("ignored")
            self._ignored.append(task.name[len(_BASE) :])
        elif task.name != BUILD_TASK and not task.name.startswith("_"):
            super().skip_ignore(task)

    def add_success(self, task: Task) -> None:
        if not _is_build(task):
            # Smoke's one line (what passed, what did not), the coverage report's lines.
            if task.name.startswith(_SMOKE_BASE) or task.name == COVERAGE_TASK:
                summary = SummaryValues.from_values(getattr(task, "values", None)).summary
                if summary:
                    self._smoke_lines.append(summary)
            return
        self._any_build = True
        values = BuildValues.from_values(getattr(task, "values", None))
        outcome = values.outcome or "built"
        if outcome == "skipped":
            reason = values.skipped or "skipped"
            self._skipped.setdefault(reason, []).append(task.name[len(_BASE) :])
            self._bump("skipped")
        else:
            counted = "cached" if outcome == "cached" else "built"
            self._bump(counted)
            self._finished_line(task.name, counted, values)
        self._take(values)

    def add_failure(self, task: Task, fail: BaseException) -> None:
        if task.name == BUILD_TASK:
            # The group fails because sub-tasks did; they were reported already.
            self.failures.append({"task": task, "exception": fail})
            return
        if stop_requested() and self._consequence_of_stop(task, fail):
            self.failures.append({"task": task, "exception": fail})
            return
        if not _is_build(task):
            super().add_failure(task, fail)
            return
        self._any_build = True
        self._ran = self._ran or _kind(task) == "build"
        self._bump("failed")
        self._failed_names.append(task.name)
        values = _failed_values(fail)
        if values.refused:
            self._refused[task.name] = values.refused
        self._take(values)
        message = str(getattr(fail, "message", "") or fail)
        traceback = "".join(getattr(fail, "traceback", "") or "")
        if not message.startswith(_BASE):
            message = f"{task.name}: {message}"
        self.write(f"FAILED {message.rstrip()}\n")
        if values.modules:  # its lookups count on the cache: line
            self.write(format_target(task.name, "failed", values.modules, values.seconds) + "\n")
        if traceback and not isinstance(fail, BuildFailed):
            self.write(traceback)
        self.failures.append({"task": task, "exception": fail})

    def _consequence_of_stop(self, task: Task, fail: BaseException) -> bool:
        """Whether a failure reported after Ctrl-C or SIGTERM is only the stop itself (a
        target whose compiles were stopped, or a task left with a dependency unmet):
        said by the one closing line, not as a failure."""
        values = _failed_values(fail)
        if _is_build(task):
            self._take(BuildValues(cache=values.cache))
            return values.outcome == "stopped"
        return isinstance(fail, UnmetDependency)

    def write(self, text: str) -> None:
        # A message may name a file whose name is not UTF-8: show it, never fail on it.
        if self._live is not None:
            self._live.print(printable(text))
            return
        super().write(printable(text))

    def _finished_line(self, name: str, outcome: str, values: BuildValues) -> None:
        """One line per finished target: what the summary counts it as, its time, its
        modules' outcomes (:func:`~metrale_orch.tasks.report_lines.format_target`)."""
        self._finished.add(name)
        self.write(format_target(name, outcome, values.modules or {}, values.seconds) + "\n")

    def _progress_text(self) -> str:
        counts, jobs = progress_counts()
        elapsed = time.perf_counter() - self._start
        if not counts.get("total"):  # workers in other processes: count targets
            done = len(self._finished) + self._counts.get("failed", 0)
            counts = {"done": done, "total": self._total}
        left = float(counts.get("expected_left", 0.0))
        left += sum(
            sec
            for name, sec in self._expected.items()
            if name in self._selected
            and name not in self._finished
            and name not in self._not_pending
        )
        eta = left / max(1, jobs) if self._expected else None
        return progress_text(counts, elapsed, eta)

    def complete_run(self) -> None:
        # doit calls this from its runner's `finally`, after saving every finished task:
        # an exception being handled here is what is ending the run.
        ending = sys.exc_info()[1]
        run = current_run()
        if ending is None and run.stop.signum:  # a graceful stop: doit has every result
            ending = Interrupted(run.stop.signum)
        if self._live is not None:
            self._live.stop()
            self._live = None
        run.end(interrupted=isinstance(ending, KeyboardInterrupt))
        if isinstance(ending, KeyboardInterrupt):
            finished = self._counts.get("built", 0) + self._counts.get("cached", 0)
            end_interrupted(ending, finished, self.outstream)
        self._complete()
        if ending is not None:
            return  # another exception ends the run: doit reports it as it does
        unsaved = self._database.failure if self._database is not None else None
        status = run.exit_status(
            (
                (_kind(f["task"]) if _is_build(f["task"]) else "other", f["exception"])
                for f in self.failures
            ),
            None if unsaved is None else unsaved.exit_code,
        )
        if status is not None and not self.runtime_errors:
            raise SystemExit(status)

    def _complete(self) -> None:
        if self.runtime_errors:
            self.write("#" * 40 + "\n")
            self.write("Execution aborted.\n")
            self.write("\n".join(self.runtime_errors))
            self.write("\n")
        if self._any_build:
            self._complete_build()
        for line in self._smoke_lines:
            self.write(line + "\n")
        if self._database is not None and self._database.failure is not None:
            self.write(f"error: {self._database.failure}\n")

    def _complete_build(self) -> None:
        seconds = time.perf_counter() - self._start
        self.write(format_summary(self._counts, seconds) + "\n")
        if self._refused:
            self.write(format_refused(self._refused) + "\n")
        for reason, targets in sorted(self._skipped.items()):  # in full once, unless a no-op
            self.write(format_skipped(reason, targets, full=self._ran) + "\n")
        if self._ignored:
            self.write(
                f"ignored {len(self._ignored)} target(s) marked by `doit ignore` "
                f"({brief(self._ignored)}); `doit forget {_BASE}<target>` builds one again\n"
            )
        for warning in self._warnings:
            self.write(f"warning: {warning}\n")
        if self._remote:
            self.write(format_remote(self._remote) + "\n")
        if self._ran:  # a no-op run leaves the last build's report files in place
            self._write_files()

    # -- helpers ----------------------------------------------------------------------------------

    def _write_files(self) -> None:
        """Hand what the reporter gathered to :mod:`~metrale_orch.tasks.run_files`, which
        writes the run's files (``self.write`` prints its lines). Imported here: a no-op
        run (which writes none of them) never loads them."""
        from metrale_orch.tasks.run_files import RunTotals, write_run_files

        totals = RunTotals(
            stats=tuple(self._stats),
            remote=self._remote,
            spans=tuple(self._spans),
            trace=self._trace_events(),
            alive=frozenset(self._alive),
            built=tuple(self._built_targets()),
            scoped=self._scoped,
        )
        write_run_files(current_run(), totals, self.write)

    def _built_targets(self) -> list[str]:
        """The targets of the run's build tasks (a plan that failed is no target)."""
        return [
            name[len(_BASE) :]
            for name, task in self._tasks.items()
            if name.startswith(_BASE) and _kind(task) == "build"
        ]

    def _bump(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    def _take(self, values: BuildValues) -> None:
        if values.cache:
            self._stats.append(dict(values.cache))
        if values.remote is not None:
            add_remote_counts(self._remote, values.remote)
        for warning in values.warnings or ():
            if warning not in self._warnings:
                self._warnings.append(warning)
        if values.profile:
            self._spans.extend(values.profile)  # read, never changed: no copy
            self._trace_events().add(values.profile)

    def _trace_events(self) -> TraceEvents:
        """The run's :class:`TraceEvents` (imported on first use: a no-op run needs none)."""
        if self._trace is None:
            from metrale_orch.steps.trace import TraceEvents

            self._trace = TraceEvents(self._origin_ns)
        return self._trace


def _failed_values(fail: BaseException) -> BuildValues:
    """The values a failure carries (a target's :class:`BuildFailed`), else none."""
    return fail.values if isinstance(fail, BuildFailed) else BuildValues()


def _is_terminal(stream: TextIO) -> bool:
    """Whether the live line may be drawn on ``stream``: a terminal, not a dumb one, not
    CI (whose log viewers show every redraw)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return bool(tty) and os.environ.get("TERM", "") != "dumb" and not os.environ.get("CI")


def _live_line(stream: TextIO, sample: Callable[[], str]) -> LiveLine | None:
    try:
        line = LiveLine(stream, sample)
        line.start()
    except Exception:  # no rich, or a terminal it cannot drive: the plain lines remain
        return None
    return line


def _expected_target_seconds() -> dict[str, float]:
    """``build:<target>`` -> the kept compile seconds of its modules' last compiles
    (:mod:`metrale_orch.steps.times`), for the ETA; {} when none are kept. Not the last
    profile's: a build the cache served compiled nothing, and its profile says so."""
    from metrale_orch.steps.times import read_kept_seconds

    try:
        build_dir = current_run().config().build_dir
    except MetraleError:
        return {}
    return {f"{_BASE}{target}": s for target, s in read_kept_seconds(build_dir).items()}
