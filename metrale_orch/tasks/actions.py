"""The actions of the doit tasks: module-level functions with string arguments.

doit runs these in its own process (``-n 1``) or in worker processes
(``-n N -P process``); everything they need is re-derived from their string
arguments, so a task pickles under fork, spawn and forkserver alike. They are
the doit-side wrapper of the build steps; a build's own work (the one broad
``except`` for package errors, the per-process build log and cache, the small
JSON-ready value the reporter aggregates) is :mod:`metrale_orch.tasks.building`'s.

What the actions of a run share lives on its :class:`~metrale_orch.tasks.run.Run`
(:func:`~metrale_orch.tasks.doit_api.current_run`); Ctrl-C and SIGTERM stop the run's
compiles at once (:func:`install_sigterm_handler`).

Deferred imports: doit imports this module on every invocation (the task dicts
name its functions), and a no-op run calls none of them; so each action imports
what it runs when it runs: the build (:mod:`metrale_orch.tasks.building`: the build
step, the cache, the tree package, the build log), the whole-tree check and the
release gate's coverage.
"""

from __future__ import annotations

import _thread
import contextlib
import multiprocessing
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from doit.exceptions import TaskFailed

from metrale_orch.errors import Interrupted, MetraleError, printable
from metrale_orch.paths import BUILD_TASK, compdb_part
from metrale_orch.tasks.doit_api import current_run
from metrale_orch.tasks.outcomes import BuildFailed
from metrale_orch.tasks.run import Run
from metrale_orch.tasks.values import BuildValues, SummaryValues

__all__ = [
    "build_action",
    "check_action",
    "clean_action",
    "coverage_action",
    "default_target_threads",
    "error_action",
    "install_sigterm_handler",
    "progress_counts",
    "skip_action",
    "stop_builds",
    "stop_requested",
    "wait_for_builds",
]

#: Most targets doit runs at once by default with remote execution.
REMOTE_TARGET_THREADS = 32


def progress_counts() -> tuple[dict[str, float], int]:
    """The live module counts of this process's build sessions, added up, and the compiles
    they may run at once (for the progress line)."""
    total: dict[str, float] = {}
    jobs = 0
    for session in current_run().sessions():
        jobs = max(jobs, session.executor.jobs)
        for name, value in session.progress.snapshot().items():
            total[name] = total.get(name, 0) + value
        total["in_flight"] = total.get("in_flight", 0) + session.executor.running
        memory = getattr(session.executor, "memory", None)  # a local executor's, if any
        if isinstance(memory, tuple):
            total["memory"] = total.get("memory", 0) + memory[0]
            total["memory_budget"] = max(total.get("memory_budget", 0), memory[1])
    return total, jobs


def wait_for_builds(timeout: float) -> bool:
    """Wait until no build action runs in this process (after :func:`stop_builds`, so
    a target thread installing its outputs finishes that, or stops, before the
    process exits); True when none runs."""
    return current_run().wait_for_builds(timeout)


def stop_builds() -> None:
    """Stop every compile this process runs and refuse the rest (Ctrl-C, SIGTERM)."""
    for session in current_run().sessions():
        session.stop()


# ------------------------------------------------------------------------------ signals

#: Seconds a stopped run may take to hand doit every result before the signal is raised
#: in doit's loop anyway (a task that does not watch the stop, such as a long smoke test).
STOP_GRACE = 5.0


def stop_requested() -> int:
    """The signal that stopped this process's run, or 0."""
    return current_run().stop.signum


def _sigterm(signum: int, frame: FrameType | None) -> None:
    stop = current_run().stop
    first = not stop.signum
    stop.signum = stop.signum or signum
    stop_builds()
    if stop.owner != os.getpid():
        # A worker process of doit's (or no run at all): end what runs here now; a
        # repeat (Ctrl-C reaches the whole group, and the loop forwards) changes nothing.
        if first:
            raise Interrupted(signum)
        return
    if not first:
        raise Interrupted(signum)  # a second Ctrl-C: stop waiting
    # The loop's process: do not raise here, where doit waits for its workers' results
    # (a result queued but not yet read would be lost, and with it a finished target's
    # record). The stopped compiles end their targets at once as "stopped"; doit reads
    # every result, saves the finished ones and ends the run (the reporter then exits
    # 128 + signum). Worker processes are told too, as a SIGTERM sent to this process
    # alone does not reach them.
    for child in multiprocessing.active_children():
        with contextlib.suppress(OSError):
            os.kill(child.pid or 0, signum)
    stop.timer = threading.Timer(STOP_GRACE, _thread.interrupt_main, (signum,))
    stop.timer.daemon = True
    stop.timer.start()


def install_sigterm_handler() -> bool:
    """Make SIGTERM behave like Ctrl-C in this process, and both stop every compile in
    flight at once (whole process groups, :func:`stop_builds`) whichever thread runs
    it; returns whether it was installed.

    doit writes its dependency database only when a run ends, and the default
    SIGTERM action kills the process and loses every finished task. While doit's
    loop runs in this process, the first signal stops the builds and lets doit
    collect every result (so each target that finished is saved, whichever thread
    or worker built it); the reporter then ends the run with one line and exit
    status ``128 + signum``. A second signal, a run that does not end within
    :data:`STOP_GRACE`, or a signal outside a run raises
    :class:`~metrale_orch.errors.Interrupted` (a ``KeyboardInterrupt`` that knows
    its signal), which ends the run the same way. Only the main thread can set a
    handler; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) is not _sigterm:
            signal.signal(signum, _sigterm)
    return True


# ------------------------------------------------------------------------------ actions


def default_target_threads(run: Run) -> int:
    """How many targets doit runs at once by default: the ``jobs`` setting of the run's
    project (1 when its configuration cannot be read: the build then reports why); with
    remote execution enough to keep ``remote_jobs`` actions in flight (up to
    :data:`REMOTE_TARGET_THREADS` targets: their threads mostly wait)."""
    try:
        config = run.config()
    except MetraleError:
        return 1
    if config.remote_executor:
        return max(1, config.jobs, min(REMOTE_TARGET_THREADS, config.remote_jobs))
    return max(1, config.jobs)


def build_action(root: str, target: str) -> dict[str, object] | TaskFailed:
    """Build one target (doit action). Package errors become one-line failures.

    The values carry this target's own cache statistics (exact under threads:
    :meth:`metrale_orch.cache.Cache.track`), the content of the inputs it built
    from (consumed by the checker when doit saves the task's state), the
    states of the files it installed (checked by the next run) and its profile
    spans (written to ``profile.json`` by the reporter, never stored).
    """
    from metrale_orch.tasks.building import build_target_action  # see the module docstring

    with current_run().active():
        return build_target_action(root, target)


def skip_action(target: str, reason: str, explicit: bool) -> dict[str, object] | TaskFailed:
    """A target whose toolchain is missing: skipped when selected broadly, failed when named."""
    if explicit:
        failed = BuildValues(outcome="failed", skipped=reason)
        return BuildFailed(f"{BUILD_TASK}:{target}: {reason}", failed)
    return BuildValues(outcome="skipped", skipped=reason).to_values()


def error_action(target: str, message: str) -> TaskFailed:
    """A target that does not resolve: fail with the resolver's one-line message."""
    return BuildFailed(f"{BUILD_TASK}:{target}: {message}", BuildValues(outcome="failed"))


def clean_action(root: str, target: str) -> TaskFailed | None:
    """Remove a target's outputs (its artefact directory, its stage and its part of the
    compilation database, which the next build that runs writes without it)."""
    try:
        config = current_run().config(Path(root))
    except MetraleError as exc:
        return BuildFailed(f"clean:{target}: {exc}", BuildValues(exit_code=exc.exit_code))
    for directory in _output_dirs(config.build_dir, target):
        if directory.is_dir():
            shutil.rmtree(directory)
    parts = target.split("/")
    if len(parts) == 3:
        with contextlib.suppress(FileNotFoundError):
            compdb_part(config.build_dir, *parts).unlink()
    return None


def _output_dirs(build_dir: Path, target: str) -> list[Path]:
    parts = target.split("/")
    return [build_dir.joinpath(*parts), build_dir.joinpath("stage", *parts)]


def check_action(root: str) -> bool:
    """Validate the whole tree (``metrale-orch check``); its report is the task's output."""
    from metrale_orch.graph.check import check_tree, report_lines  # see the module docstring

    try:
        report = check_tree(Path(root), os.environ, current_run().config(Path(root)))
    except MetraleError as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
        return False
    for stream, line in report_lines(report):
        print(line, file=sys.stdout if stream == "out" else sys.stderr)
    return report.ok


def coverage_action(root: str) -> dict[str, object] | TaskFailed:
    """The release gate's coverage check of the whole build (``metrale-orch coverage``).

    Returns its report's lines as the task's ``summary`` value (the reporter prints it
    last, as smoke's) when there is no problem, else ``TaskFailed`` with them: with doit's
    thread runner, what an action prints may land in another task's captured output."""
    from metrale_orch.gate import check_coverage  # as check_action: only this task needs it

    try:
        got = check_coverage(current_run().config(Path(root)), None, os.environ)
    except MetraleError as exc:
        return TaskFailed(printable(f"error: {exc}"))
    text = "\n".join(printable(line) for line in got.lines())
    return SummaryValues(summary=text).to_values() if got.report.ok else TaskFailed(text)
