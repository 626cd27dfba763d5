"""The build profile's file: a run's spans as the trace-event document of ``profile.json``.

:class:`TraceEvents` makes the document of a run's :class:`~metrale_orch.steps.profile.Span`
s and its bytes (sorted keys, one event per line) as the spans arrive: the reporter gives
it each target's spans as the target ends, while the build still runs, so the end of a
big build (tens of thousands of spans) only sorts and joins lines already made.

The events' order: metadata by pid and tid, then spans by start, pid, tid, name, the longer
first (an enclosing span before its first step), then the memory counter track by time;
so equal spans give equal bytes. Process and thread names: doit's own process is ``doit``,
the others ``worker 1``, ``worker 2``, … in the order they started work; a process's first
thread is ``main``, the others ``thread 1``, ``thread 2``, … likewise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from metrale_orch.canonical import canonical_encoder, canonical_json, canonical_lines
from metrale_orch.steps.profile import PROFILE_VERSION, Span, compile_seconds

__all__ = ["TraceEvents"]

#: The counter track of the compiles' peak memory, and its unit.
_MEMORY_TRACK = "memory in use"
_MIB = 1024 * 1024

Event = dict[str, object]


class TraceEvents:
    """A run's trace events, each made and encoded as its target's spans arrive (see the
    module docstring). Not thread-safe: the reporter's thread adds them."""

    def __init__(self, origin_ns: int) -> None:
        self.origin_ns = origin_ns
        self._encode = canonical_encoder().encode
        self._events: list[Event] = []
        self._lines: list[str] = []

    def add(self, spans: Iterable[Mapping[str, object]]) -> None:
        """Take spans as they travel (``Span.to_dict()`` each); others are left out."""
        for item in spans:
            try:
                event = Span.from_dict(item).to_event(self.origin_ns)
            except ValueError:  # not from this package's actions
                continue
            self._events.append(event)
            self._lines.append(self._encode(event))

    def document(self, main_pid: int) -> tuple[dict[str, object], bytes]:
        """The trace-event document of the spans added, and its bytes; ``main_pid`` is
        doit's own process (see the module docstring)."""
        order = _order(self._events)
        events = [self._events[i] for i in order]
        meta, memory = _names(events, main_pid), _memory_track(events, main_pid)
        lines = [
            *canonical_lines(meta),
            *(self._lines[i] for i in order),
            *canonical_lines(memory),
        ]
        doc = _document([*meta, *events, *memory])
        return doc, _encode(doc, lines)


def _order(events: Sequence[Event]) -> list[int]:
    """The events' indices by start, pid, tid, name, the longer first: sorted by the last
    key first, as a stable sort keeps what it does not order."""
    order = sorted(range(len(events)), key=lambda i: cast(int, events[i]["dur"]), reverse=True)
    order.sort(key=lambda i: _start_key(events[i]))
    return order


def _start_key(event: Event) -> tuple[object, object, object, object]:
    return event["ts"], event["pid"], event["tid"], event["name"]


def _names(events: Sequence[Event], main_pid: int) -> list[Event]:
    """The metadata events naming each process and thread of ``events`` (in order)."""
    processes: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for pid, tid in dict.fromkeys((e["pid"], e["tid"]) for e in events):  # as first seen
        assert isinstance(pid, int) and isinstance(tid, int)
        if pid not in processes:
            workers = sum(1 for p in processes if p != main_pid)
            processes[pid] = "doit" if pid == main_pid else f"worker {workers + 1}"
        others = sum(1 for p, t in threads if p == pid and t != p)
        threads[pid, tid] = "main" if tid == pid else f"thread {others + 1}"
    meta: list[Event] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}
        for pid, name in sorted(processes.items())
    ]
    meta += [
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        for (pid, tid), name in sorted(threads.items())
    ]
    return meta


def _document(events: list[Event]) -> dict[str, object]:
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "metrale-orch", "version": PROFILE_VERSION},
    }


def _encode(doc: Mapping[str, object], lines: Sequence[str]) -> bytes:
    """The bytes of ``doc`` whose events' canonical lines are ``lines``."""
    head = {k: v for k, v in sorted(doc.items()) if k != "traceEvents"}
    body = ",\n".join(lines)
    start = canonical_json(head)[:-1]
    sep = "," if head else ""
    return f'{start}{sep}"traceEvents":[\n{body}\n]}}\n'.encode()


def _memory_track(events: Sequence[Mapping[str, object]], pid: int) -> list[Event]:
    """Counter events (MiB) of the peak memory of the compilers running at each moment:
    each ``compile`` event with a ``memory`` arg counts over its compiler's own time
    (the end of the span less its ``seconds``), sorted by time (pure)."""
    changes: dict[int, int] = {}
    for event in events:
        args = event.get("args")
        if event.get("cat") != "compile" or not isinstance(args, Mapping):
            continue
        memory = _count(args.get("memory", 0))
        if memory > 0:
            end = _count(event["ts"]) + _count(event["dur"])
            start = max(_count(event["ts"]), end - round(compile_seconds(event) * 1e6))
            changes[start] = changes.get(start, 0) + memory
            changes[end] = changes.get(end, 0) - memory
    track, total = [], 0
    for ts, change in sorted(changes.items()):
        total += change
        track.append(
            {
                "name": _MEMORY_TRACK,
                "ph": "C",
                "ts": ts,
                "pid": pid,
                "tid": 0,
                "args": {"MiB": round(total / _MIB, 1)},
            }
        )
    return track


def _count(value: object) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0
