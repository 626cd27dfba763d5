"""The build action's work: one target built in this process, its value for doit.

Imported by :func:`metrale_orch.tasks.actions.build_action` when the first build runs
(the one deferred import of the build step: a no-op run never loads the compile step,
the cache or the tree package). What the targets of a run share lives on its
:class:`~metrale_orch.tasks.run.Run`: the configuration, the opened cache (a remote
tier's circuit breaker and connections live once per worker rather than once per
target) and the build session (:class:`~metrale_orch.steps.session.BuildSession`: the
executor that runs at most ``jobs`` compiles at once, the artefacts already obtained).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from doit.exceptions import TaskFailed

from metrale_orch import cache as cache_mod
from metrale_orch.config import Config
from metrale_orch.errors import MetraleError
from metrale_orch.executor import ActionStopped
from metrale_orch.executor.offload import RemoteExecutor
from metrale_orch.executor.reapi import ReapiBackend, open_backend
from metrale_orch.extras import ExtraMissing
from metrale_orch.paths import BUILD_TASK, STATE_DIR
from metrale_orch.steps import target as build
from metrale_orch.steps.results import TargetResult
from metrale_orch.steps.session import BuildSession, local_executor
from metrale_orch.steps.times import CompileTimes, read_times
from metrale_orch.tasks.checker import encode_outputs
from metrale_orch.tasks.doit_api import current_run
from metrale_orch.tasks.outcomes import (
    BuildFailed,
    failure_text,
    nonzero_counters,
    summarise_result,
)
from metrale_orch.tasks.run import RUN_ENV, Run
from metrale_orch.tasks.values import BuildValues
from metrale_orch.tree import Target

__all__ = ["build_target_action"]

_log = logging.getLogger("metrale_orch.steps")


def build_target_action(root: str, target: str) -> dict[str, object] | TaskFailed:
    """Build one target; package errors become one-line failures (see
    :func:`~metrale_orch.tasks.actions.build_action`)."""
    try:
        return _build(root, target)
    finally:
        current_run().log.flush()  # the target's lines are in the log when doit reports it


def _build(root: str, target: str) -> dict[str, object] | TaskFailed:
    stats = cache_mod.CacheStats()
    run = current_run()
    if run.stop.signum:  # doit's `--continue` goes on handing out targets
        not_started = BuildValues(outcome="stopped")
        return BuildFailed(f"{BUILD_TASK}:{target}: not started: the run was stopped", not_started)
    try:
        config = run.config(Path(root))
        log = run.log.open(
            config.build_dir, max_bytes=config.log_max_bytes, backups=config.log_backups
        )
        cache = _cache(run, config)
        session = _session(run, config, Path(config.build_dir))
        with cache.track() as stats:
            result: TargetResult = build.build_target(
                Path(root),
                Target.parse(target),
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
        stopped = bool(run.stop.signum) and isinstance(exc, ActionStopped)
        failed = BuildValues(
            outcome="stopped" if stopped else "failed",
            cache=nonzero_counters(stats),
            exit_code=exc.exit_code,
        )
        return BuildFailed(f"{BUILD_TASK}:{target}: {exc}", failed)
    warnings = [*result.warnings, *cache.warnings(), *session.warnings]
    values = _result_values(result, stats, remote, warnings)
    if result.failed:
        return BuildFailed(failure_text(target, result), values)
    return values.to_values()


def _result_values(
    result: TargetResult,
    stats: cache_mod.CacheStats,
    remote: dict[str, object],
    warnings: Sequence[object],
) -> BuildValues:
    """The values of a target that was built (pure; see :class:`BuildValues`)."""
    outcome, modules = summarise_result(result)
    return BuildValues(
        outcome=outcome,
        modules=modules,
        seconds=round(result.seconds, 3),
        cache=nonzero_counters(stats),
        remote=remote or None,
        inputs=dict(result.inputs),
        outputs=tuple(encode_outputs(result.outputs)),
        plan=result.plan_record,
        external={k: list(v) for k, v in result.external.items()} or None,
        profile=tuple(span.to_dict() for span in result.spans),
        refused=len(result.refused) or None,  # require_hits: counted in the run's summary
        warnings=tuple(sorted({str(w) for w in warnings})) or None,
    )


def _cache(run: Run, config: Config) -> cache_mod.Cache:
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


def _session(run: Run, config: Config, build_dir: Path) -> BuildSession:
    """The run's build session for ``config`` (made on first use): its compiles are
    ordered by the kept compile times (:mod:`metrale_orch.steps.times`), longest first,
    and admitted by their kept peak memory."""

    def make() -> BuildSession:
        times = read_times(build_dir / STATE_DIR)
        if not config.remote_executor:
            return _local_session(run, config, build_dir, times)
        try:
            backend = open_backend(config)
        except ExtraMissing as exc:
            if config.remote_strict:  # CI asked for remote execution: exit 2, one line
                raise
            session = _local_session(run, config, build_dir, times)
            session.warnings = (f"{exc}; compiling here",)
            return session
        return _remote_session(run, config, build_dir, times, backend)

    return run.session((str(build_dir), config.jobs, config.remote_executor), make)


def _local_session(run: Run, config: Config, build_dir: Path, times: CompileTimes) -> BuildSession:
    """A session whose compiles run on this machine."""
    return BuildSession.local(
        jobs=config.jobs,
        build_dir=build_dir,
        expected=times.by_key(),
        by_module=times.by_module(),
        peaks=times.peak_by_module(),
        memory=config.memory,
        probes=run.probes,
        run=os.environ.get(RUN_ENV, ""),
        loop=run.loop,
    )


def _remote_session(
    run: Run, config: Config, build_dir: Path, times: CompileTimes, backend: ReapiBackend
) -> BuildSession:
    """A session whose compiles go to ``config.remote_executor`` through ``backend``."""
    executor = RemoteExecutor(
        backend,
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
        loop=run.loop,
    )


def _remote_counts(session: BuildSession, target: str) -> dict[str, object]:
    """Where this target's compile actions ran (empty without remote execution)."""
    counts = getattr(session.executor, "counts", None)
    if not callable(counts):
        return {}
    found = counts(target).to_dict()
    return found if isinstance(found, dict) else {}
