"""The files a build run leaves for the next run and for people, written at its end
(only after a run that ran something: a no-op leaves the last build's in place and costs
nothing for them): the kept compile times (:mod:`metrale_orch.steps.times`, the next
run's order and ETA), ``profile.json`` and the build history
(:mod:`metrale_orch.steps.trace`, :mod:`metrale_orch.steps.history`), and
``compile_commands.json`` (:mod:`metrale_orch.steps.compdb`).

:func:`write_run_files` writes them for a run from what its reporter gathered (one
:class:`RunTotals`); the reporter only hands them over. A file that cannot be
written is one warning line naming it and why, and never fails the run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch import cache as cache_mod
from metrale_orch.errors import MetraleError, printable
from metrale_orch.fsutil import write_atomic
from metrale_orch.paths import (
    COMPDB_NAME,
    PROFILE_HISTORY_NAME,
    PROFILE_NAME,
    STATE_DIR,
    STATS_NAME,
    profile_history,
    root_relative,
)
from metrale_orch.steps import times as kept
from metrale_orch.steps.compdb import stored_targets, write_database_from_parts
from metrale_orch.steps.history import record_build
from metrale_orch.steps.trace import TraceEvents
from metrale_orch.tasks.report_lines import remote_totals
from metrale_orch.tree import LayoutError, Target, walk

if TYPE_CHECKING:
    from metrale_orch.tasks.run import Run

__all__ = [
    "RunCompiles",
    "RunTotals",
    "warn",
    "warn_unwritten",
    "write_compdb",
    "write_profile",
    "write_run_files",
    "write_stats",
    "write_times",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTotals:
    """What a run's reporter gathered from its targets' values, for the files."""

    #: Each target's nonzero cache counters.
    stats: tuple[Mapping[str, object], ...]
    #: Where the compile actions ran, added up (remote execution).
    remote: Mapping[str, object]
    #: Every target's profile spans, and their trace events (made as they arrived).
    spans: tuple[Mapping[str, object], ...]
    trace: TraceEvents
    #: Every target of the tree (empty: a scoped run, which forgets no kept time).
    alive: frozenset[str]
    #: The targets of the run's build tasks, and whether the run was scoped to some.
    built: tuple[str, ...]
    scoped: bool


def write_run_files(run: Run, totals: RunTotals, say: Callable[[str], None]) -> None:
    """Write the files of a run that ran something (module docstring); ``say`` prints a
    line (the cache line, a warning about the kept times)."""
    write_stats(run, totals.stats, totals.remote, say)
    write_profile(run, totals.trace)
    write_times(run, totals.spans, totals.alive, say)
    write_compdb(run, totals.built, totals.scoped)


def write_stats(
    run: Run,
    stats: Iterable[Mapping[str, object]],
    remote: Mapping[str, object],
    say: Callable[[str], None],
) -> None:
    """Add up the targets' cache statistics (and the remote counts), print their line
    with ``say``, write cache-stats.json."""
    path = Path(STATS_NAME)
    try:
        config = run.config()
        path = config.build_dir / STATS_NAME
        total = cache_mod.CacheStats()
        for item in stats:
            total = total + cache_mod.CacheStats.from_dict(item)
        executed, cached, here = remote_totals(remote)
        total.remote_executed += executed
        total.action_cache_hits += cached
        total.ran_here += here
        line = total.summary_line()
        if line:
            say(f"{line}\n")
        cache_mod.write_stats(path, total)
    except Exception as exc:  # the summary must never fail the run
        warn_unwritten("the cache statistics", path, exc)


def write_times(
    run: Run,
    spans: Iterable[Mapping[str, object]],
    alive: frozenset[str],
    say: Callable[[str], None],
) -> None:
    """Merge the compile times of the run's ``spans`` into the kept ones (the next run's
    order); ``alive`` is every target of the tree (empty: a scoped run, which forgets none),
    ``say`` prints a line."""

    compiles = RunCompiles.of(spans)
    state = Path(STATE_DIR)
    try:
        state = run.config().build_dir / STATE_DIR
        old = kept.read_times(state)
        problems = kept.kept_problems(state)  # only an ordering: warned of, then rewritten
        for problem in problems:
            say(f"warning: {problem}\n")
        # A module another target compiled (or an earlier run did) costs the same here.
        known = {**old.by_key(), **compiles.compiled}
        seen: dict[str, set[str]] = {}
        for target, module, _key in compiles.keyed:
            seen.setdefault(target, set()).add(module)
        merged = kept.merge_compiles(
            old,
            [(t, m, k, known[k]) for t, m, k in compiles.keyed if k in known],
            seen=seen,
            alive=set(alive) or None,
            peaks=kept.peaks_of(old, compiles.keyed, compiles.measured, compiles.bounds),
        )
        if merged != old or problems:
            kept.write_times(state, merged)
    except (MetraleError, OSError) as exc:  # only an ordering: never fails the run
        warn_unwritten("the compile times", state, exc)


def write_profile(run: Run, trace: TraceEvents) -> None:
    """Write every span of this run to profile.json, atomically (Chrome trace events),
    and add the run to the build history (:mod:`metrale_orch.steps.history`)."""

    doc, data = trace.document(main_pid=os.getpid())
    path = Path(PROFILE_NAME)
    try:
        config = run.config()
        path = config.build_dir / PROFILE_NAME
        write_atomic(path, data)
    except (MetraleError, OSError) as exc:  # the profile must never fail the run
        warn_unwritten("the build profile", path, exc)
    events = doc["traceEvents"]
    _write_history(run, events if isinstance(events, list) else [])


def _write_history(run: Run, events: list[dict[str, object]]) -> None:
    """Add this run to the build history; a damaged one is replaced, and said."""

    path = Path(PROFILE_HISTORY_NAME)
    try:
        build_dir = run.config().build_dir
        path = profile_history(build_dir)
        words = run.selection.words if run.selection is not None else ()
        name = root_relative(path, run.root)
        damaged = record_build(path, events, words=words, name=name)
        if damaged is not None:
            warn(f"{name}: {damaged.problem}: replaced by a new history")
    except (MetraleError, OSError) as exc:  # the history must never fail the run
        warn_unwritten("the build history", path, exc)


def write_compdb(run: Run, built: Iterable[str], scoped: bool) -> None:
    """Merge the parts of every buildable target of the tree (selected or not, built
    now or before) into compile_commands.json (:mod:`metrale_orch.steps.compdb`). A
    run scoped to some targets (:mod:`~metrale_orch.graph.scope`) generated no other:
    it takes the parts on disk of the tree's other targets (as walked now; a part of
    a target the tree lost is never merged)."""

    path = Path(COMPDB_NAME)
    try:
        config = run.config()
        path = config.build_dir / COMPDB_NAME
        targets = [Target.parse(name) for name in built]
        if scoped:
            with contextlib.suppress(LayoutError):  # a tree that fails to walk: none
                tree = set(walk(config.root))
                stored = {t for t in stored_targets(config.build_dir) if t in tree}
                targets = sorted(set(targets) | stored, key=str)
        write_database_from_parts(config.root, config.build_dir, targets)
    except (MetraleError, OSError, ValueError) as exc:  # never fails the run
        warn_unwritten("the compilation database", path, exc)


def warn_unwritten(what: str, path: Path, exc: BaseException) -> None:
    """One stderr line for a file of the run's report that could not be written: which,
    where, and why (an ``OSError``'s own words, e.g. "No space left on device")."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    warn(f"could not write {what} {path}: {reason}")


def warn(text: str) -> None:
    """``warning: text`` on the process's own stderr: doit's target threads each swap
    ``sys.stderr`` for a capturing writer around their actions and restore what they
    found, so after two ran at once it is left as one of those, and lost."""
    stream = sys.__stderr__ or sys.stderr
    stream.write(printable(f"warning: {text}") + "\n")
    stream.flush()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompiles:
    """What a run's spans say of its compiles, by cache key (for the kept times)."""

    #: ``(target, module, key)`` of every module keyed in the run.
    keyed: tuple[tuple[str, str, str], ...]
    #: The compiler's seconds of each key compiled.
    compiled: Mapping[str, float]
    #: The compiler's peak memory, where measured.
    measured: Mapping[str, int]
    #: Where the peak was not known: the most it can have been.
    bounds: Mapping[str, int]

    @classmethod
    def of(cls, spans: Iterable[Mapping[str, object]]) -> RunCompiles:
        keyed: list[tuple[str, str, str]] = []
        compiled: dict[str, float] = {}
        measured: dict[str, int] = {}
        bounds: dict[str, int] = {}
        for item in spans:
            target, module = str(item.get("target", "")), str(item.get("module", ""))
            args = item.get("args")
            if not target or not module or not isinstance(args, dict):
                continue
            key, step = args.get("key"), item.get("step")
            if not isinstance(key, str):
                continue
            if step == "key":
                keyed.append((target, module, key))
            elif step == "compile" and args.get("outcome") == "compiled":
                seconds = args.get("seconds")
                if isinstance(seconds, int | float):
                    compiled[key] = float(seconds)
                memory, bound = args.get("memory"), args.get("memory_bound")
                if isinstance(memory, int) and memory > 0:
                    measured[key] = memory
                elif isinstance(bound, int) and bound > 0:
                    bounds[key] = bound
        return cls(keyed=tuple(keyed), compiled=compiled, measured=measured, bounds=bounds)
