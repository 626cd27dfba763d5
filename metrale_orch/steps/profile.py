"""The build profile: where a build's time went, as Chrome trace events.

:func:`~metrale_orch.steps.target.build_target` records one :class:`Span` per
step of a target (``build`` around ``plan``, ``stage``, then per module
``key``, ``lookup``, ``compile``, ``store``, and ``install``) through a
:class:`SpanRecorder`; the spans travel with the doit task's values to the
reporter, which writes them all (:mod:`metrale_orch.steps.trace`) to
``<build_dir>/profile.json``: the trace-event format
Perfetto and ``chrome://tracing`` open (complete events ``"ph": "X"``, times in
microseconds, plus ``"M"`` events naming each worker process and thread). A
``compile`` span holds the module's wait for an executor slot before its compiler
started: its args say how long each took (``seconds``: the compiler's own, ``wait``:
the slot's), and :func:`summarize_profile` counts them apart; its ``memory`` is the
compiler's measured peak in bytes, and a counter track (``"ph": "C"``, ``memory in
use``) adds up the peaks of the compiles running at each moment.
:func:`read_profile` and :func:`summarize_profile` read it back for
``metrale-orch profile``.

Invariants: times come from the wall clock (``time.time_ns``), so spans from
different worker processes line up; a span names its target and module, never
a path; the file's events are sorted (metadata by pid and tid, then spans by
start, pid, tid, name), so equal spans give equal bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal, TypeVar, get_args

from metrale_orch.steps.errors import ProfileError, ProfileMissing

__all__ = [
    "PROFILE_VERSION",
    "CompileTime",
    "ProfileSummary",
    "Span",
    "SpanArgs",
    "SpanRecorder",
    "Step",
    "compile_seconds",
    "read_at",
    "read_profile",
    "summarize_profile",
]

#: A step of a target's build: the whole target (``build``) and what it is made of.
Step = Literal["build", "plan", "stage", "key", "lookup", "compile", "remote", "store", "install"]
#: What a span's ``args`` hold: the outcome, byte counts, the cache key.
ArgValue = str | int | float
#: The args of a span being recorded (:meth:`SpanRecorder.span`).
SpanArgs = dict[str, ArgValue]

T = TypeVar("T")
_STEPS: frozenset[str] = frozenset(get_args(Step))
#: The types of an arg value (:data:`ArgValue`), as ``isinstance`` checks them fastest.
_ARGS = (str, int, float)
#: A ``lookup`` span's ``source`` when another target of the run obtained the artefact.
_SHARED_SOURCES = ("memo", "run")
#: ``otherData.version`` of the file; bumped when the events' meaning changes.
PROFILE_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One step of one target's build, on the worker (process, thread) that ran it.

    ``module`` is "" for a step of the whole target. ``args`` hold the outcome
    (``lookup``: local, remote or miss, with its ``source``: ``cache``, or ``memo`` /
    ``run`` for an artefact another target of the run obtained; ``compile``: compiled
    or failed, the compiler's ``seconds`` and the ``wait`` for a slot; ``build``: built,
    cached or failed) and the bytes moved.
    """

    step: Step
    target: str
    module: str = ""
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    args: Mapping[str, ArgValue] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def name(self) -> str:
        """The event's name: ``compile rmsnorm``, ``build hopper/qwen3-8b/bf16``."""
        return f"{self.step} {self.module or self.target}"

    def to_dict(self) -> dict[str, object]:
        """The span as plain data (how it travels from a worker to the reporter)."""
        return {
            "step": self.step,
            "target": self.target,
            "module": self.module,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "pid": self.pid,
            "tid": self.tid,
            "args": dict(sorted(self.args.items())),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> Span:
        """The inverse of :meth:`to_dict`; raises ``ValueError`` for anything else."""
        step, args = doc.get("step"), doc.get("args", {})
        if step not in _STEPS or not isinstance(args, Mapping):
            raise ValueError(f"not a span: {doc!r}")
        return cls(
            step=step,  # type: ignore[arg-type]  # checked against Step above
            target=_str(doc, "target"),
            module=_str(doc, "module"),
            start_ns=_int(doc, "start_ns"),
            end_ns=_int(doc, "end_ns"),
            pid=_int(doc, "pid"),
            tid=_int(doc, "tid"),
            args=MappingProxyType({str(k): v for k, v in args.items() if isinstance(v, _ARGS)}),
        )

    def to_event(self, origin_ns: int) -> dict[str, object]:
        """The complete (``"ph": "X"``) trace event, in microseconds since ``origin_ns``.

        Start and end are each floored to a microsecond, so a span inside another
        stays inside it in the file.
        """
        ts = max(0, self.start_ns - origin_ns) // 1000
        end = max(0, self.end_ns - origin_ns) // 1000
        args: dict[str, object] = {"target": self.target}
        if self.module:
            args["module"] = self.module
        args.update(self.args)  # unsorted: the file's encoding sorts every key
        return {
            "name": self.name,
            "cat": self.step,
            "ph": "X",
            "ts": ts,
            "dur": max(0, end - ts),
            "pid": self.pid,
            "tid": self.tid,
            "args": args,
        }


class SpanRecorder:
    """Collects one target's spans, on this process and thread (a builder, not a value)."""

    __slots__ = ("_spans", "pid", "target", "tid")

    def __init__(self, target: str) -> None:
        self.target = target
        self.pid = os.getpid()
        self.tid = threading.get_native_id()
        self._spans: list[Span] = []

    def add(self, step: Step, start_ns: int, *, module: str = "", **args: ArgValue) -> None:
        """Record ``step`` as running from ``start_ns`` (``time.time_ns()``) until now, on
        the calling thread's lane (a target's modules run on several threads at once)."""
        self.add_between(step, start_ns, time.time_ns(), module=module, **args)

    def add_between(
        self, step: Step, start_ns: int, end_ns: int, *, module: str = "", **args: ArgValue
    ) -> None:
        """Record ``step`` as running from ``start_ns`` to ``end_ns`` (a remote engine's
        times, as it reported them), on the calling thread's lane."""
        self._spans.append(
            Span(
                step=step,
                target=self.target,
                module=module,
                start_ns=start_ns,
                end_ns=end_ns,
                pid=self.pid,
                tid=threading.get_native_id(),
                args=MappingProxyType(args),
            )
        )

    @contextlib.contextmanager
    def span(self, step: Step, *, module: str = "", **args: ArgValue) -> Iterator[SpanArgs]:
        """Record ``step`` for the ``with`` block; the yielded dict's items (e.g. an
        outcome known only at the end) go into the span's args. Recorded when the block
        raises too."""
        start = time.time_ns()
        extra: SpanArgs = dict(args)
        try:
            yield extra
        finally:
            self.add(step, start, module=module, **extra)

    @property
    def spans(self) -> tuple[Span, ...]:
        return tuple(self._spans)


# ------------------------------------------------------------------------------ the file


def read_profile(path: Path) -> list[dict[str, object]]:
    """The trace events of ``profile.json`` at ``path``.

    Raises :class:`~metrale_orch.steps.errors.ProfileMissing` when there is none
    and :class:`~metrale_orch.steps.errors.ProfileError` when it is not one.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileMissing(str(path)) from None
    except (OSError, UnicodeError) as exc:
        raise ProfileError(str(path), f"cannot read it: {exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ProfileError(str(path), f"not JSON: {exc}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ProfileError(str(path), "no traceEvents list")
    return events


@dataclass(frozen=True, slots=True, kw_only=True)
class CompileTime:
    """One compile of the profile: which module of which target, how long its compiler ran
    (:func:`compile_seconds`), how long it waited for a slot first, how it ended."""

    target: str
    module: str
    seconds: float
    outcome: str
    wait: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """The compile as plain data (a build history's record)."""
        return {
            "target": self.target,
            "module": self.module,
            "seconds": round(self.seconds, 6),
            "outcome": self.outcome,
            "wait": round(self.wait, 6),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> CompileTime:
        """The inverse of :meth:`to_dict`; raises ``ValueError`` naming the bad field."""
        return cls(
            target=_str(doc, "target"),
            module=_str(doc, "module"),
            seconds=_seconds(doc, "seconds"),
            outcome=_str(doc, "outcome"),
            wait=_seconds(doc, "wait"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSummary:
    """What ``metrale-orch profile`` shows (:func:`summarize_profile`)."""

    #: The slowest compiles by the compiler's own time, slowest first.
    slowest: tuple[CompileTime, ...]
    #: Targets built (``build`` spans) and the worker threads they ran on.
    targets: int
    workers: int
    #: From the run's start to the end of its last span.
    wall_seconds: float
    #: Module outcomes: compiled and failed (``compile`` spans), local and remote hits
    #: (``lookup`` spans that a cache tier answered).
    outcomes: Mapping[str, int]
    #: Seconds spent in each step, all workers added up: ``compile`` is the compilers'
    #: own time (never more than jobs x wall), ``wait`` the compiles' waits for a slot
    #: (part of their spans, counted apart).
    steps: Mapping[str, float]
    #: Bytes compiled and bytes restored from a cache.
    compiled_bytes: int
    restored_bytes: int
    #: Lookups another target of the run answered (``lookup`` spans from its memo or
    #: from a cache entry this run stored): neither hits nor compiles.
    shared: int = 0

    def to_dict(self) -> dict[str, object]:
        """The summary as plain data (a build history's record; :meth:`from_dict`)."""
        return {
            "slowest": [c.to_dict() for c in self.slowest],
            "targets": self.targets,
            "workers": self.workers,
            "wall_seconds": round(self.wall_seconds, 6),
            "outcomes": dict(sorted(self.outcomes.items())),
            "steps": {k: round(v, 6) for k, v in sorted(self.steps.items())},
            "compiled_bytes": self.compiled_bytes,
            "restored_bytes": self.restored_bytes,
            "shared": self.shared,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> ProfileSummary:
        """The inverse of :meth:`to_dict`; raises ``ValueError`` naming the bad field
        (``slowest[2].seconds: ...``): a number must be finite and not negative."""
        listed = doc.get("slowest")
        if not isinstance(listed, list):
            raise ValueError(f"slowest: expected a list, got {_shown(listed)}")
        slowest = [read_at(f"slowest[{i}]", CompileTime.from_dict, c) for i, c in enumerate(listed)]
        steps = _table(doc, "steps", _seconds)
        return cls(
            slowest=tuple(slowest),
            targets=_count(doc, "targets"),
            workers=_count(doc, "workers"),
            wall_seconds=_seconds(doc, "wall_seconds"),
            outcomes=MappingProxyType(_table(doc, "outcomes", _count)),
            steps=MappingProxyType(dict(sorted(steps.items(), key=lambda kv: (-kv[1], kv[0])))),
            compiled_bytes=_count(doc, "compiled_bytes"),
            restored_bytes=_count(doc, "restored_bytes"),
            shared=_count(doc, "shared"),
        )

    @property
    def compiles(self) -> int:
        """The compiles the build ran, compiled or failed."""
        return self.outcomes.get("compiled", 0) + self.outcomes.get("failed", 0)


def summarize_profile(events: Sequence[Mapping[str, object]], *, top: int = 10) -> ProfileSummary:
    """The slowest ``top`` compiles (by the compiler's own time) and the totals of a
    profile's events (pure).

    Ties are broken by target then module, so the listing is deterministic.
    """
    compiles: list[CompileTime] = []
    outcomes = {"compiled": 0, "local": 0, "remote": 0, "failed": 0}
    steps: dict[str, float] = {}
    workers: set[tuple[int, int]] = set()
    targets = compiled_bytes = restored_bytes = shared = 0
    end_us = 0
    for event in events:
        if event.get("ph") != "X":
            continue
        step = str(event.get("cat", ""))
        dur = _num(event.get("dur", 0))
        end_us = max(end_us, _num(event.get("ts", 0)) + dur)
        args = event.get("args")
        args = args if isinstance(args, Mapping) else {}
        outcome = str(args.get("outcome", ""))
        # A compile span holds its wait for a slot: the step's time is the compiler's.
        took = compile_seconds(event) if step == "compile" else dur / 1e6
        steps[step] = steps.get(step, 0.0) + took
        if step == "build":
            targets += 1
            workers.add((_num(event.get("pid", 0)), _num(event.get("tid", 0))))
        elif step == "compile":
            waited = _seconds_arg(args, "wait")
            if waited:
                steps["wait"] = steps.get("wait", 0.0) + waited
            compiles.append(
                CompileTime(
                    target=str(args.get("target", "")),
                    module=str(args.get("module", "")),
                    seconds=took,
                    outcome=outcome,
                    wait=waited,
                )
            )
            if outcome in outcomes:
                outcomes[outcome] += 1
            compiled_bytes += _num(args.get("bytes", 0))
        elif step == "lookup" and args.get("source") in _SHARED_SOURCES:
            shared += 1
        elif step == "lookup" and outcome in ("local", "remote"):
            outcomes[outcome] += 1
            restored_bytes += _num(args.get("bytes", 0))
    compiles.sort(key=lambda c: (-c.seconds, c.target, c.module))
    return ProfileSummary(
        slowest=tuple(compiles[: max(0, top)]),
        targets=targets,
        workers=len(workers),
        wall_seconds=end_us / 1e6,
        outcomes=MappingProxyType(outcomes),
        steps=MappingProxyType(dict(sorted(steps.items(), key=lambda kv: (-kv[1], kv[0])))),
        compiled_bytes=compiled_bytes,
        restored_bytes=restored_bytes,
        shared=shared,
    )


def _str(doc: Mapping[str, object], key: str) -> str:
    value = doc.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected text, got {_shown(value)}")
    return value


def _int(doc: Mapping[str, object], key: str) -> int:
    value = doc.get(key)
    if type(value) is not int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{key}: expected an integer, got {_shown(value)}")
    return value


def _count(doc: Mapping[str, object], key: str) -> int:
    """A count or a byte size: an integer, not negative."""
    value = _int(doc, key)
    if value < 0:
        raise ValueError(f"{key}: expected 0 or more, got {value}")
    return value


def _seconds(doc: Mapping[str, object], key: str) -> float:
    """Seconds: a finite number, not negative."""
    value = doc.get(key)
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{key}: expected seconds (a number, 0 or more), got {_shown(value)}")
    return float(value)


def read_at(where: str, read: Callable[[Mapping[str, object]], T], doc: object) -> T:
    """``read(doc)``, for the object found at ``where`` in a file (``slowest[2]``): a
    ``ValueError`` it raises, or ``doc`` not being an object, names ``where`` first
    (``slowest[2].seconds: ...``) (pure)."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected an object, got {_shown(doc)}")
    try:
        return read(doc)
    except ValueError as exc:
        raise ValueError(f"{where}.{exc}") from None


def _table(
    doc: Mapping[str, object], key: str, read: Callable[[Mapping[str, object], str], T]
) -> dict[str, T]:
    """The object at ``key``, each value read by ``read`` (``key.name: ...`` when bad)."""
    value = doc.get(key)
    if not isinstance(value, dict):
        raise ValueError(f"{key}: expected an object, got {_shown(value)}")
    try:
        return {str(name): read(value, name) for name in value}
    except ValueError as exc:
        raise ValueError(f"{key}.{exc}") from None


def _shown(value: object) -> str:
    """A value as an error message quotes it: its ``repr``, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _num(value: object) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def compile_seconds(event: Mapping[str, object]) -> float:
    """How long a ``compile`` event's compiler ran: its ``seconds`` arg (the span also
    holds the wait for an executor slot), else the span's duration (older profiles, and a
    compile that failed)."""
    args = event.get("args")
    seconds = args.get("seconds") if isinstance(args, Mapping) else None
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return float(seconds)
    return _num(event.get("dur", 0)) / 1e6


def _seconds_arg(args: Mapping[str, object], name: str) -> float:
    value = args.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return 0.0
