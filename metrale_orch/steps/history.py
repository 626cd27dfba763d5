"""The build history: what the last builds did, for ``metrale-orch profile`` to look back on.

``<build_dir>/profile.json`` holds the last build that ran something, whatever it did: a
build the cache served leaves a profile with no compiles. Every build that runs something
also adds a :class:`BuildRecord` to ``<build_dir>/.state/profile-history.json``
(:func:`~metrale_orch.paths.profile_history`): its ordinal (``build #12``), when it
ended, what doit was asked (its selection) and the summary of its profile
(:func:`~metrale_orch.steps.profile.summarize_profile`, the :data:`KEPT_COMPILES`
slowest compiles).

Invariants: the file is bounded: the last :data:`KEEP` builds, and the newest one that
compiled when none of those did (so the last compiles are never forgotten while one is
kept), under :data:`MAX_BYTES`; it is written atomically, as deterministic JSON (sorted
keys, one build a line, oldest first). Reading trusts nothing: a regular file only (a
FIFO is never waited on, a link never followed), its size bounded, strict JSON (no NaN,
no nesting past what Python parses), every field checked; anything else is one
:class:`~metrale_orch.steps.errors.HistoryError` naming the file and the entry, and
the next build that runs something starts a new history in its place.
"""

from __future__ import annotations

import errno
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.canonical import canonical_lines
from metrale_orch.fsutil import write_atomic
from metrale_orch.ownership import read_regular
from metrale_orch.steps.errors import HistoryError
from metrale_orch.steps.profile import ProfileSummary, read_at, summarize_profile

__all__ = [
    "KEEP",
    "KEPT_COMPILES",
    "MAX_BYTES",
    "BuildRecord",
    "add_record",
    "decode_history",
    "encode_history",
    "last_compiling",
    "new_record",
    "read_history",
    "record_build",
]

#: How many builds the history keeps (and the newest that compiled, when older).
KEEP = 20
#: How many of a build's slowest compiles its record keeps.
KEPT_COMPILES = 50
#: The largest history read: ~40 times what :data:`KEEP` records of
#: :data:`KEPT_COMPILES` compiles take; anything larger is not one this package wrote.
MAX_BYTES = 4 * 2**20
SCHEMA = 1

#: When a build ended: UTC, to the second (``2026-12-06T07:00:40Z``).
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildRecord:
    """One build of the history: its ordinal (1, 2, ... over the history's life), when it
    ended (UTC, :data:`_STAMP`), doit's words (its selection: task names and wildcards,
    none for the default tasks) and the summary of its profile."""

    build: int
    finished: str
    words: tuple[str, ...]
    summary: ProfileSummary

    def to_dict(self) -> dict[str, object]:
        return {
            "build": self.build,
            "finished": self.finished,
            "words": list(self.words),
            "summary": self.summary.to_dict(),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> BuildRecord:
        """The inverse of :meth:`to_dict`; raises ``ValueError`` naming the bad field."""
        build, finished, words = doc.get("build"), doc.get("finished"), doc.get("words")
        if not isinstance(build, int) or isinstance(build, bool) or build < 1:
            raise ValueError(f"build: expected a build number, 1 or more, got {build!r:.40}")
        if not isinstance(finished, str) or not _STAMP.fullmatch(finished):
            raise ValueError(f"finished: expected a UTC time, got {finished!r:.40}")
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ValueError(f"words: expected a list of text, got {words!r:.40}")
        summary = read_at("summary", ProfileSummary.from_dict, doc.get("summary"))
        return cls(build=build, finished=finished, words=tuple(words), summary=summary)


def new_record(
    history: Sequence[BuildRecord],
    events: Sequence[Mapping[str, object]],
    *,
    finished_ns: int,
    words: Sequence[str],
) -> BuildRecord:
    """The record of a build whose profile holds ``events``, ended at ``finished_ns``
    (``time.time_ns()``), next after ``history`` (pure)."""
    return BuildRecord(
        build=history[-1].build + 1 if history else 1,
        finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(finished_ns // 10**9)),
        words=tuple(words),
        summary=summarize_profile(events, top=KEPT_COMPILES),
    )


def add_record(
    history: Sequence[BuildRecord], record: BuildRecord, *, keep: int = KEEP
) -> tuple[BuildRecord, ...]:
    """``history`` with ``record`` last, bounded (pure): the last ``keep`` builds, and
    before them the newest that compiled when none of those did."""
    builds = [*history, record]
    kept = builds[-max(1, keep) :]
    if last_compiling(kept) is None:
        earlier = last_compiling(builds[: -len(kept)])
        if earlier is not None:
            kept.insert(0, earlier)
    return tuple(kept)


def last_compiling(history: Sequence[BuildRecord]) -> BuildRecord | None:
    """The newest build of ``history`` that ran a compile (compiled or failed), or None
    (pure)."""
    return next((r for r in reversed(history) if r.summary.compiles), None)


def encode_history(history: Sequence[BuildRecord]) -> bytes:
    """The bytes of the history file: sorted keys, one build a line, oldest first (pure)."""
    lines = ",\n".join(canonical_lines(r.to_dict() for r in history))
    return f'{{"schema":{SCHEMA},"builds":[\n{lines}\n]}}\n'.encode()


def decode_history(data: bytes) -> tuple[BuildRecord, ...]:
    """The builds of a history file's bytes (pure). Raises ``ValueError`` saying what
    is wrong, and where (``builds[3].summary.targets: ...``)."""
    try:
        doc = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("not JSON: nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"not a build history of schema {SCHEMA}")
    builds = doc.get("builds")
    if not isinstance(builds, list):
        raise ValueError("builds: expected a list")
    history: list[BuildRecord] = []
    for i, item in enumerate(builds):
        record = read_at(f"builds[{i}]", BuildRecord.from_dict, item)
        if history and record.build <= history[-1].build:
            raise ValueError(f"builds[{i}].build: {record.build} is not after {history[-1].build}")
        history.append(record)
    return tuple(history)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def read_history(path: Path, name: str) -> tuple[BuildRecord, ...]:
    """The builds kept at ``path`` (``()`` when there is no history yet); ``name`` is how
    messages call the file. Raises :class:`~metrale_orch.steps.errors.HistoryError`."""
    try:
        data = read_regular(path, follow=False, most=MAX_BYTES + 1)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            why = "a symbolic link"
        elif exc.errno == errno.EINVAL:  # read_regular's "not a regular file"
            why = str(exc.strerror)
        else:
            why = f"cannot read it: {exc.strerror}"
        raise HistoryError(name, why) from None
    if len(data) > MAX_BYTES:
        raise HistoryError(name, f"larger than {MAX_BYTES // 2**20} MiB")
    try:
        return decode_history(data)
    except ValueError as exc:
        raise HistoryError(name, str(exc)) from None


def record_build(
    path: Path,
    events: Sequence[Mapping[str, object]],
    *,
    words: Sequence[str],
    name: str,
) -> HistoryError | None:
    """Add the build whose profile holds ``events`` to the history at ``path``, now.
    A history that cannot be read is replaced by one of this build alone: the error
    that said why is returned (None otherwise). Raises ``OSError`` when it cannot be
    written."""
    damaged = None
    try:
        history = read_history(path, name)
    except HistoryError as exc:
        history, damaged = (), exc
    record = new_record(history, events, finished_ns=time.time_ns(), words=words)
    write_atomic(path, encode_history(add_record(history, record)))
    return damaged
