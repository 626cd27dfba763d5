"""The files a build run leaves for the next ones, written by the reporter at its end
(:class:`~metrale_orch.tasks.reporter.BuildReporter`) from its spans: the kept compile
times (``<build_dir>/.state/compile-times.json``, the next run's order, memory admission
and ETA: :mod:`metrale_orch.steps.times`), ``<build_dir>/profile.json`` and the build
history (:mod:`metrale_orch.steps.history`).

Each is an aid, never a result: one that cannot be written is one ``warning:`` line naming
it and why (:func:`warn_unwritten`), and the run goes on. On a start-up path (every doit run
imports the reporter): the build steps are imported only when a run that built writes them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.errors import MetraleError, printable
from metrale_orch.fsutil import write_atomic
from metrale_orch.paths import (
    BUILD_TASK,
    PROFILE_HISTORY_NAME,
    PROFILE_NAME,
    STATE_DIR,
    profile_history,
    root_relative,
)
from metrale_orch.tasks.doit_api import current_run

__all__ = [
    "expected_target_seconds",
    "warn",
    "warn_unwritten",
    "write_profile",
    "write_times",
]

_BASE = BUILD_TASK + ":"


def write_times(
    spans: Sequence[Mapping[str, object]], alive: set[str], say: Callable[[str], None]
) -> None:
    """Merge the compile times of a run's ``spans`` into the kept ones (the next run's
    order); ``alive``: the tree's targets (empty: keep every other target's); ``say``
    shows a line of the run's report."""
    from metrale_orch.steps.times import (
        kept_problems,
        merge_compiles,
        peaks_of,
        read_times,
        write_times,
    )

    run = _RunCompiles.of(spans)
    state = Path(STATE_DIR)
    try:
        state = current_run().config().build_dir / STATE_DIR
        old = read_times(state)
        problems = kept_problems(state)  # only an ordering: warned of, then rewritten
        for problem in problems:
            say(f"warning: {problem}\n")
        # A module another target compiled (or an earlier run did) costs the same here.
        known = {**old.by_key(), **run.compiled}
        seen: dict[str, set[str]] = {}
        for target, module, _key in run.keyed:
            seen.setdefault(target, set()).add(module)
        compiles = [(t, m, k, known[k]) for t, m, k in run.keyed if k in known]
        merged = merge_compiles(
            old,
            compiles,
            seen=seen,
            alive=alive or None,
            peaks=peaks_of(old, run.keyed, run.measured, run.bounds),
        )
        if merged != old or problems:
            write_times(state, merged)
    except (MetraleError, OSError) as exc:  # only an ordering: never fails the run
        warn_unwritten("the compile times", state, exc)


def write_profile(spans: Iterable[Mapping[str, object]], origin_ns: int) -> None:
    """Write every span of a run that started at ``origin_ns`` to profile.json, atomically
    (Chrome trace events), and add the run to the build history
    (:mod:`metrale_orch.steps.history`)."""
    from metrale_orch.steps.profile import Span, encode_profile, trace_document

    parsed = []
    for item in spans:
        try:
            parsed.append(Span.from_dict(item))
        except ValueError:  # not from this package's actions: leave it out
            continue
    doc = trace_document(parsed, origin_ns=origin_ns, main_pid=os.getpid())
    path = Path(PROFILE_NAME)
    try:
        config = current_run().config()
        path = config.build_dir / PROFILE_NAME
        write_atomic(path, encode_profile(doc))
    except (MetraleError, OSError) as exc:  # the profile must never fail the run
        warn_unwritten("the build profile", path, exc)
    events = doc["traceEvents"]
    _write_history(events if isinstance(events, list) else [])


def _write_history(events: list[dict[str, object]]) -> None:
    """Add this run to the build history; a damaged one is replaced, and said."""
    from metrale_orch.steps.history import record_build

    path = Path(PROFILE_HISTORY_NAME)
    try:
        run = current_run()
        build_dir = run.config().build_dir
        path = profile_history(build_dir)
        words = run.selection.words if run.selection is not None else ()
        name = root_relative(path, run.root)
        damaged = record_build(path, events, words=words, name=name)
        if damaged is not None:
            warn(f"{name}: {damaged.problem}: replaced by a new history")
    except (MetraleError, OSError) as exc:  # the history must never fail the run
        warn_unwritten("the build history", path, exc)


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


def expected_target_seconds() -> dict[str, float]:
    """``build:<target>`` -> the kept compile seconds of its modules' last compiles
    (:mod:`metrale_orch.steps.times`), for the ETA; {} when none are kept. Not the last
    profile's: a build the cache served compiled nothing, and its profile says so."""
    from metrale_orch.steps.times import read_kept_seconds

    try:
        build_dir = current_run().config().build_dir
    except MetraleError:
        return {}
    return {f"{_BASE}{target}": s for target, s in read_kept_seconds(build_dir).items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class _RunCompiles:
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
    def of(cls, spans: Iterable[Mapping[str, object]]) -> _RunCompiles:
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
