"""The actions of the doit tasks: module-level functions with string arguments.

doit runs these in its own process (``-n 1``) or in worker processes
(``-n N -P process``); everything they need is re-derived from their string
arguments, so a task pickles under fork, spawn and forkserver alike. They are
the doit-side wrapper of the build steps: the one broad ``except`` for package
errors (turned into a one-line ``TaskFailed``), the per-process build log and
cache, and a small JSON-ready value per task that the reporter aggregates.

What the actions of a run share lives on its :class:`~metrale_orch.tasks.run.Run`
(:func:`~metrale_orch.tasks.doit_api.current_run`): the configuration, the opened cache
(a remote tier's circuit breaker and connections live once per worker rather than once
per target), the build session (:class:`~metrale_orch.steps.session.BuildSession`: the
executor that runs at most ``jobs`` compiles at once, the artefacts already obtained),
which every target built by this process shares, and the stop state: Ctrl-C and SIGTERM
stop the session's compiles at once (:func:`install_sigterm_handler`).

Deferred imports: doit imports this module on every invocation (the task dicts
name its functions), and a no-op run calls none of them; so the build step, the
cache, the tree package, the log handler and the whole-tree check are imported by
the action that runs them (:func:`_build_step`, :func:`_parse_target`,
:func:`configure_build_log`, :func:`check_action`, :func:`coverage_action`), and nowhere
else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING

from doit.exceptions import TaskFailed

from metrale_orch.config import Config
from metrale_orch.errors import Interrupted, MetraleError, printable
from metrale_orch.paths import BUILD_TASK, LOG_NAME, compdb_part
from metrale_orch.tasks.checker import (
    EXTERNAL_KEY,
    INPUTS_KEY,
    OUTPUTS_KEY,
    PROFILE_KEY,
    encode_outputs,
)
from metrale_orch.tasks.doit_api import current_run
from metrale_orch.tasks.run import RUN_ENV, Run

if TYPE_CHECKING:
    from metrale_orch.cache import Cache, CacheStats
    from metrale_orch.steps.results import TargetResult
    from metrale_orch.steps.session import BuildSession
    from metrale_orch.steps.times import CompileTimes
    from metrale_orch.tree import Target

__all__ = [
    "LOG_NAME",
    "REFUSED_KEY",
    "RUN_ENV",
    "BuildFailed",
    "build_action",
    "check_action",
    "clean_action",
    "configure_build_log",
    "default_target_threads",
    "error_action",
    "flush_build_log",
    "install_sigterm_handler",
    "progress_counts",
    "skip_action",
    "stop_builds",
    "stop_requested",
    "wait_for_builds",
]

_log = logging.getLogger("metrale_orch.steps")

#: Most targets doit runs at once by default with remote execution.
REMOTE_TARGET_THREADS = 32

#: The value key of a target's modules that ``require_hits`` did not compile (a count).
REFUSED_KEY = "refused"

#: The values of a target that a stopped run did not build.
STOPPED: dict[str, object] = {"outcome": "stopped"}


class BuildFailed(TaskFailed):  # type: ignore[misc]
    """A ``TaskFailed`` that also carries the task's values (cache statistics, outcome).

    doit saves no values for a failed task; the reporter reads them from here.
    """

    def __init__(self, msg: str, values: dict[str, object] | None = None) -> None:
        super().__init__(msg)
        self.values = dict(values or {})


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
    import multiprocessing

    for child in multiprocessing.active_children():
        with contextlib.suppress(OSError):
            os.kill(child.pid or 0, signum)
    import _thread

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


# ------------------------------------------------------------------------------ logging


def configure_build_log(build_dir: Path, *, max_bytes: int, backups: int) -> logging.Logger:
    """Attach the shared rotating build log to the package logger (idempotent per process;
    :mod:`metrale_orch.tasks.buildlog`, imported here: a no-op run never logs)."""
    from metrale_orch.tasks import buildlog

    return buildlog.configure_build_log(build_dir, max_bytes=max_bytes, backups=backups)


def flush_build_log() -> None:
    """Wait until this process's build-log records so far are in the file."""
    buildlog = sys.modules.get("metrale_orch.tasks.buildlog")
    if buildlog is not None:
        buildlog.flush_build_log()


# ------------------------------------------------------------------------------ actions


def _build_step() -> tuple[ModuleType, ModuleType]:
    """The build step and the cache (:mod:`metrale_orch.steps.target`,
    :mod:`metrale_orch.cache`), imported when a build runs (see the module docstring)."""
    from metrale_orch import cache
    from metrale_orch.steps import target as build

    return build, cache


def _parse_target(name: str) -> Target:
    """``name`` as a :class:`~metrale_orch.tree.Target`; the tree package is imported
    here, by a build that runs, never by a no-op (see the module docstring)."""
    from metrale_orch.tree import Target

    return Target.parse(name)


def _cache(run: Run, config: Config, cache_mod: ModuleType) -> Cache:
    key = (
        "cache",
        str(config.root),
        config.cache,
        config.cache_mode,
        str(config.local_cache),
        config.cache_trusted_keys,
        config.cache_signing_key,
    )
    return run.cache(key, lambda: cache_mod.open_cache(cache_mod.CacheSettings.from_config(config)))


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


def _session(run: Run, config: Config, build_dir: Path) -> BuildSession:
    """The run's build session for ``config`` (made on first use): its compiles are
    ordered by the kept compile times (:mod:`metrale_orch.steps.times`), longest first."""
    from metrale_orch.paths import STATE_DIR
    from metrale_orch.steps.session import BuildSession  # see the module docstring
    from metrale_orch.steps.times import read_times

    def make() -> BuildSession:
        times = read_times(build_dir / STATE_DIR)
        if config.remote_executor:
            return _remote_session(run, config, build_dir, times)
        return BuildSession.local(
            jobs=config.jobs,
            build_dir=build_dir,
            expected=times.by_key(),
            by_module=times.by_module(),
            peaks=times.peak_by_module(),
            memory=config.memory,
            probes=run.probes,
            run=os.environ.get(RUN_ENV, ""),
        )

    return run.session((str(build_dir), config.jobs, config.remote_executor), make)


def _remote_session(
    run: Run,
    config: Config,
    build_dir: Path,
    times: CompileTimes,
) -> BuildSession:
    """A session whose compiles go to ``config.remote_executor`` (raises the one-line
    error of a missing ``remote`` extra)."""
    from metrale_orch.executor.offload import RemoteExecutor
    from metrale_orch.executor.reapi import open_backend
    from metrale_orch.steps.session import BuildSession, local_executor

    executor = RemoteExecutor(
        open_backend(config),
        local_executor(config.jobs, build_dir, config.memory),
        remote_jobs=config.remote_jobs,
        strict=config.remote_strict,
    )
    return BuildSession(
        executor,
        expected=times.by_key(),
        by_module=times.by_module(),
        peaks=times.peak_by_module(),
        remote=True,
        container_image=config.remote_container_image,
        probes=run.probes,
        run=os.environ.get(RUN_ENV, ""),
    )


def _remote_counts(session: BuildSession, target: str) -> dict[str, object]:
    """Where this target's compile actions ran (empty without remote execution)."""
    counts = getattr(session.executor, "counts", None)
    if not callable(counts):
        return {}
    found = counts(target).to_dict()
    return found if isinstance(found, dict) else {}


def summarise_result(result: TargetResult) -> dict[str, object]:
    """The small JSON value a build task saves and the reporter aggregates (pure).

    ``outcome``: ``built`` (at least one module compiled in this run, by this target or
    by another that shared it), ``cached`` (every module restored from a cache, by this
    target or by another that shared it), ``failed``. ``modules``: how many were
    compiled, local or remote hits, ``shared`` (another target of the run obtained
    them: never counted as hits), failed.
    """
    counts: dict[str, int] = {}
    for m in result.modules:
        name = "shared" if m.shared else str(m.outcome) or "unknown"
        counts[name] = counts.get(name, 0) + 1
    if result.failed:
        outcome = "failed"
    elif result.modules and all(
        m.outcome in ("local", "remote") and m.shared != "compiled" for m in result.modules
    ):
        outcome = "cached"
    else:
        outcome = "built"
    return {"outcome": outcome, "modules": dict(sorted(counts.items()))}


def build_action(root: str, target: str) -> dict[str, object] | TaskFailed:
    """Build one target (doit action). Package errors become one-line failures.

    The values carry this target's own cache statistics (exact under threads:
    :meth:`metrale_orch.cache.Cache.track`), the content of the inputs it built
    from (consumed by the checker when doit saves the task's state), the
    states of the files it installed (checked by the next run) and its profile
    spans (written to ``profile.json`` by the reporter, never stored).
    """
    with current_run().active():
        try:
            return _build_action(root, target)
        finally:
            flush_build_log()  # the target's lines are in the log when doit reports it


def _build_action(root: str, target: str) -> dict[str, object] | TaskFailed:
    build, cache_mod = _build_step()
    stats: CacheStats = cache_mod.CacheStats()
    if stop_requested():  # doit's `--continue` goes on handing out targets
        return BuildFailed(f"{BUILD_TASK}:{target}: not started: the run was stopped", STOPPED)
    run = current_run()
    try:
        config = run.config(Path(root))
        log = configure_build_log(
            config.build_dir, max_bytes=config.log_max_bytes, backups=config.log_backups
        )
        cache = _cache(run, config, cache_mod)
        session = _session(run, config, Path(config.build_dir))
        with cache.track() as stats:
            result: TargetResult = build.build_target(
                Path(root),
                _parse_target(target),
                config=config,
                cache=cache,
                environ=os.environ,
                log=log.getChild("build"),
                session=session,
            )
            cache.flush()  # uploads finish before doit may end this worker
        remote = _remote_counts(session, target)
    except MetraleError as exc:
        _log.error("%s:%s: %s", BUILD_TASK, target, exc)
        from metrale_orch.executor import ActionStopped  # loaded by the build already

        stopped = bool(stop_requested()) and isinstance(exc, ActionStopped)
        failed: dict[str, object] = {
            "outcome": "stopped" if stopped else "failed",
            "cache": nonzero_counters(stats),
            "exit_code": exc.exit_code,
        }
        return BuildFailed(f"{BUILD_TASK}:{target}: {exc}", failed)
    values = summarise_result(result)
    values["seconds"] = round(result.seconds, 3)
    values["cache"] = nonzero_counters(stats)
    if remote:
        values["remote"] = remote
    values[INPUTS_KEY] = dict(result.inputs)
    values[OUTPUTS_KEY] = encode_outputs(result.outputs)
    if result.external:
        values[EXTERNAL_KEY] = {k: list(v) for k, v in result.external.items()}
    values[PROFILE_KEY] = [span.to_dict() for span in result.spans]
    if result.refused:  # require_hits: counted in the run's summary
        values[REFUSED_KEY] = len(result.refused)
    warnings = [*result.warnings, *cache.warnings()]
    if warnings:
        values["warnings"] = sorted({str(w) for w in warnings})
    if result.failed:
        return BuildFailed(_failure_text(target, result), values)
    return values


def nonzero_counters(stats: CacheStats) -> dict[str, int | float]:
    """A task's cache statistics without the zero counters: the value is saved with the
    task in doit's database and read back on every run, so it stays small
    (``CacheStats.from_dict`` reads a missing counter as 0)."""
    return {k: v for k, v in stats.to_dict().items() if v}


def _failure_text(target: str, result: TargetResult) -> str:
    describe = getattr(result, "failure_text", None)
    if callable(describe):
        return str(describe())
    errors = getattr(result, "errors", None)
    if errors:
        return f"{BUILD_TASK}:{target}: " + "\n".join(str(e) for e in errors)
    return f"{BUILD_TASK}:{target}: failed (see the build log)"


def skip_action(target: str, reason: str, explicit: bool) -> dict[str, object] | TaskFailed:
    """A target whose toolchain is missing: skipped when selected broadly, failed when named."""
    if explicit:
        return BuildFailed(
            f"{BUILD_TASK}:{target}: {reason}", {"outcome": "failed", "skipped": reason}
        )
    return {"outcome": "skipped", "skipped": reason}


def error_action(target: str, message: str) -> TaskFailed:
    """A target that does not resolve: fail with the resolver's one-line message."""
    return BuildFailed(f"{BUILD_TASK}:{target}: {message}", {"outcome": "failed"})


def clean_action(root: str, target: str) -> TaskFailed | None:
    """Remove a target's outputs (its artefact directory, its stage and its part of the
    compilation database, which the next build that runs writes without it)."""
    try:
        config = current_run().config(Path(root))
    except MetraleError as exc:
        return BuildFailed(f"clean:{target}: {exc}", {"exit_code": exc.exit_code})
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
    from metrale_orch.tasks.check import check_tree, report_lines  # see the module docstring

    try:
        report = check_tree(Path(root), os.environ)
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
    from metrale_orch.config import load_config
    from metrale_orch.gate import check_coverage  # as check_action: only this task needs it

    try:
        got = check_coverage(load_config(Path(root), os.environ), None, os.environ)
    except MetraleError as exc:
        return TaskFailed(printable(f"error: {exc}"))
    text = "\n".join(printable(line) for line in got.lines())
    return {"summary": text} if got.report.ok else TaskFailed(text)
