"""Content-based up-to-date checks for doit: an xxh3 file checker and the signature check.

:class:`ContentChecker` is what ``DOIT_CONFIG["check_file_uptodate"]`` names.
A file dependency's saved state is a :data:`~metrale_orch.fsutil.FileState`,
``[mtime_ns, size, xxh3_64 hex, change_ns, inode]``:

- other size: changed, no read;
- mtime, change time and inode as saved, the change time settled when saved
  (:func:`~metrale_orch.fsutil.unchanged_since`): unchanged, no read;
- anything else (an edit whose mtime was set back, a touch, a fresh checkout, a
  state saved within the racy window, an older three-field state): the bytes
  decide. Same bytes count as unchanged **and the saved state is refreshed**
  with the new stat, so a fresh checkout (every stat new, every byte the same)
  costs one hashing pass, then no-ops. doit's own md5 checker re-hashes such
  files on every run, forever, because doit saves file states only when a task
  runs.

doit calls ``check_modified(path, stat, state)`` without saying for which task,
so the refresh needs the task: :class:`SignatureCheck` (an ``uptodate`` entry
of every build task, evaluated by doit just before the task's file
dependencies) binds the checker to the task being checked. A refresh is
written only when the state doit handed over is, by identity, the one stored
in that task's record, so a stale binding can never write into another task.
The installed outputs and the files read beyond the task's file dependencies
(``outputs``, ``external`` of the task's :class:`~metrale_orch.tasks.values.BuildRecord`)
follow the same rule,
and :class:`SignatureCheck` refreshes their records the same way.

Within one doit invocation each path is stat-ed and hashed at most once across
all tasks (a build's inputs do not change while it runs; if one does, the
memoised older state is what gets saved, which errs towards rebuilding).

The invariant: a saved state ``(m, s, h, c, i)`` means "the task last succeeded
with content ``h``"; a refresh only ever pairs ``h`` with a newer stat whose
bytes hash to ``h``.
"""

from __future__ import annotations

import inspect
import json
import marshal
import os
import time
from array import array
from collections.abc import Callable, Mapping, Sequence

from doit.dependency import FileChangedChecker, UptodateCalculator

from metrale_orch.canonical import canonical_json
from metrale_orch.fsutil import (
    FileState,
    bytes_digest,
    bytes_hash,
    file_digest,
    file_hash,
    file_state,
    settled_change,
    unchanged_since,
)
from metrale_orch.tasks.doit_api import (
    Dependency,
    Task,
    store_state,
    store_values,
    stored_state,
    stored_values,
)
from metrale_orch.tasks.values import BuildRecord, persisted, pop_inputs, refreshed_record

__all__ = [
    "ContentChecker",
    "SignatureCheck",
    "TaskDataCodec",
    "check_external",
    "check_outputs",
    "encode_outputs",
    "file_digest",
    "result_digest",
    "stale_external",
    "stale_outputs",
]

#: The saved state of a file that changed while the build that read it ran (less its
#: digest): its size never matches, so the next run sees it changed.
_CHANGED_DURING_BUILD = (0, -1)
#: doit's record keys that hold a task's values (saved values, the action's result).
_VALUE_RECORDS = ("_values_:", "result:")


#: Prefix of a dict result's digest (:func:`result_digest`).
_RESULT_TAG = "xxh3-128:"


def result_digest(result: Mapping[str, object]) -> str:
    """What a task's dict result is saved as (pure): xxh3-128 of its canonical JSON
    (:func:`~metrale_orch.canonical.canonical_json`), its profile spans left out
    (:func:`~metrale_orch.tasks.values.persisted`)."""
    text = canonical_json(persisted(result))
    return _RESULT_TAG + bytes_hash(text.encode("utf-8"))


#: Prefix of a task record written by :class:`TaskDataCodec` (a JSON record starts with "{").
_MARSHAL_TAG = "\x00m4:"


class TaskDataCodec:
    """doit's codec for a task's record in the database: ``marshal`` instead of JSON.

    doit decodes every task's record (its file states and values) on every
    invocation; ``marshal`` decodes the same data about three times faster, which
    a no-op build of a large tree feels (~30 ms at 1000 targets). The record is
    plain data (strings, numbers, lists, tuples, dicts), stored as text (doit's
    sqlite backend decodes the column as UTF-8). A record written by JSON (an older
    database) is still read; one that cannot be decoded reads as empty, so its task
    runs again. A build's profile spans are left out
    (:func:`~metrale_orch.tasks.values.persisted`).
    """

    def encode(self, data: dict[str, object] | list[object]) -> str:
        # doit's sqlite backend registers this as the adapter of every list and dict.
        record = data
        if isinstance(data, dict):
            record = dict(data)
            for name in _VALUE_RECORDS:
                values = record.get(name)
                if isinstance(values, dict):
                    record[name] = persisted(values)
        return _MARSHAL_TAG + marshal.dumps(record, 4).decode("latin-1")

    def decode(self, text: str) -> object:
        try:
            if text.startswith(_MARSHAL_TAG):
                return marshal.loads(text[len(_MARSHAL_TAG) :].encode("latin-1"))
            return json.loads(text)
        except (ValueError, EOFError, TypeError, UnicodeError):
            return {}


class ContentChecker(FileChangedChecker):  # type: ignore[misc]
    """doit file checker on (mtime_ns, size, xxh3); see the module docstring."""

    CheckerError = OSError

    def __init__(self) -> None:
        #: What the build being saved used (see :meth:`expect`).
        self._expected: dict[str, str] = {}
        self._stats: dict[str, os.stat_result] = {}
        self._failed: dict[str, OSError] = {}
        self._digests: dict[str, tuple[tuple[int, int, int, int], str]] = {}
        self._dep: Dependency | None = None
        self._task: str | None = None
        #: Number of saved states refreshed in this invocation (for tests/benchmarks).
        self.refreshed = 0
        #: Number of files hashed in this invocation.
        self.hashed = 0

    # -- doit's interface ---------------------------------------------------------------------

    def exists(self, file_path: str) -> bool:
        return os.path.exists(file_path)

    def info(self, file_path: str) -> os.stat_result:
        # doit calls this once per edge (~45 000 at 1000 targets): the hit path is one lookup.
        try:
            return self._stats[file_path]
        except KeyError:
            pass
        failed = self._failed.get(file_path)
        if failed is not None:
            raise failed
        try:
            st = os.stat(file_path)
        except OSError as exc:
            self._failed[file_path] = exc
            raise
        self._stats[file_path] = st
        return st

    def check_modified(self, file_path: str, file_stat: os.stat_result, state: object) -> bool:
        if type(state) is list and len(state) == 5:
            # What doit hands over (a decoded list): the common case, tested without isinstance.
            if file_stat.st_size != state[1]:
                return True
            if (
                file_stat.st_mtime_ns == state[0]
                and file_stat.st_ctime_ns == state[3]
                and file_stat.st_ino == state[4]
                and state[3]
            ):
                return False
            digest = state[2]
        elif isinstance(state, list | tuple) and len(state) in (3, 5):
            # A tuple, or an older three-field state: never trusted by its stat alone.
            if file_stat.st_size != state[1]:
                return True
            if unchanged_since(file_stat, state):
                return False
            digest = state[2]
        else:
            return True
        try:
            current = self._digest(file_path, file_stat)
        except OSError:
            return True
        if current != digest:
            return True
        self._refresh(file_path, state, file_state(file_stat, str(digest), time.time_ns()))
        return False

    def get_state(self, dep: str, current_state: object) -> list[object] | None:
        expected = self._expected.get(dep)
        if expected is not None:
            return self._compiled_state(dep, expected)
        st = self.info(dep)
        if unchanged_since(st, current_state):
            return None
        return list(file_state(st, self._digest(dep, st), time.time_ns()))

    # -- the saved state is what was built ----------------------------------------------------

    def expect(self, inputs: Mapping[str, object]) -> None:
        """Say what the build about to be saved used: file dependency -> xxh3-64 of the
        content it compiled ("" when the file changed while it ran). doit saves a
        task's file states after its action, so an edit made during the build would
        otherwise be recorded as built; :meth:`get_state` records what was built."""
        self._expected = {str(k): str(v) for k, v in inputs.items()}

    def _compiled_state(self, dep: str, expected: str) -> list[object]:
        try:
            st = os.stat(dep)
            taken = time.time_ns()
            current = self._digest(dep, st) if expected else ""
        except OSError:
            current = ""
        if expected and current == expected:
            return list(file_state(st, expected, taken))
        return [*_CHANGED_DURING_BUILD, expected, 0, 0]

    # -- binding (see SignatureCheck) -----------------------------------------------------------

    def bind(self, dep_manager: Dependency, task_name: str) -> None:
        """Say which task's file dependencies doit is about to check."""
        self._dep = dep_manager
        self._task = task_name

    def _refresh(self, file_path: str, old: object, new: FileState) -> None:
        dep, task = self._dep, self._task
        if dep is None or task is None:
            return
        # Only when doit handed us the very state stored for the bound task.
        if stored_state(dep, task, file_path) is not old:
            return
        store_state(dep, task, file_path, new)
        self.refreshed += 1

    def _digest(self, file_path: str, st: os.stat_result) -> str:
        stamp = (st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino)
        memo = self._digests.get(file_path)
        if memo is not None and memo[0] == stamp:
            return memo[1]
        digest = file_digest(file_path)
        self.hashed += 1
        self._digests[file_path] = (stamp, digest)
        return digest


class SignatureCheck(UptodateCalculator):  # type: ignore[misc]
    """``uptodate`` entry: is the plan's signature the one of the last successful run?

    Like ``doit.tools.config_changed``, but saves one digest per signature part
    (so ``metrale-orch why`` can name the parts that changed), and binds the
    :class:`ContentChecker` to the task doit checks next. Not pickled: doit drops
    ``uptodate`` when it sends tasks to process workers.
    """

    #: What doit's ``inspect.signature`` call (per task, per run) would work out from
    #: ``__call__``, given up front: ``inspect`` honours ``__signature__`` first.
    __signature__ = inspect.Signature(
        [
            inspect.Parameter("task", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("values", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ]
    )

    def __init__(self, parts: Mapping[str, str]) -> None:
        super().__init__()
        self.parts = dict(sorted(parts.items()))
        self._dep_manager: Dependency | None = None
        self._task: Task | None = None
        #: Installed files found missing or altered by the last call (for ``why``).
        self.stale_outputs: tuple[str, ...] = ()
        #: Files read outside the tree found changed by the last call (for ``why``).
        self.stale_external: tuple[str, ...] = ()

    def setup(self, dep_manager: Dependency, tasks_dict: Mapping[str, Task]) -> None:
        super().setup(dep_manager, tasks_dict)
        self._dep_manager = dep_manager

    def __call__(self, task: Task, values: Mapping[str, object]) -> bool:
        checker = getattr(self._dep_manager, "checker", None)
        if isinstance(checker, ContentChecker):
            checker.bind(self._dep_manager, task.name)
        self._task = task
        task.value_savers.append(self.saved_values)
        record = BuildRecord.from_values(values)
        if record.signature != self.parts:
            return False
        outputs, fresh_outputs = check_outputs(record.outputs)
        external, fresh_external = check_external(record.external)
        self.stale_outputs, self.stale_external = tuple(outputs), tuple(external)
        if self.stale_outputs or self.stale_external:
            return False
        if fresh_outputs is not None or fresh_external is not None:
            self._refresh_values(task.name, values, fresh_outputs, fresh_external)
        return True

    def _refresh_values(
        self,
        task: str,
        values: Mapping[str, object],
        outputs: list[str] | None,
        external: Mapping[str, FileState] | None,
    ) -> None:
        """Save the records of installed and external files with the stats they were just
        proven by content to go with, so the next run trusts them by stat; only when
        ``values`` is, by identity, the record stored for ``task``."""
        dep = self._dep_manager
        if dep is None or stored_values(dep, task) is not values:
            return
        store_values(dep, task, refreshed_record(values, outputs, external))

    def saved_values(self) -> dict[str, object]:
        """What the task saves on success (doit calls this via ``value_savers``, just
        before it saves the task's file states): hands the build's input digests to
        the checker (they are not stored) and keeps the signature."""
        inputs = pop_inputs(getattr(self._task, "values", None))
        checker = getattr(self._dep_manager, "checker", None)
        if isinstance(checker, ContentChecker):
            checker.expect(inputs)
        return BuildRecord(signature=dict(self.parts)).to_values()


def encode_outputs(states: Mapping[str, Sequence[int | str]]) -> list[str]:
    """The ``outputs`` record of installed files (path -> a
    :data:`~metrale_orch.fsutil.FileState` with an xxh3-64 digest, all in one directory):
    ``[fingerprint, directory + "/", names, states]``, the last two ``\0``-joined. doit
    decodes every task's values on every run, and a few strings decode far faster than
    a mapping of lists."""
    paths = sorted(states)
    # The common directory (of the parents: one path's commonpath would be itself).
    prefix = os.path.commonpath([os.path.dirname(p) or "." for p in paths]) + "/" if paths else ""
    names = [p[len(prefix) :] for p in paths]
    if any("/" in n for n in names):  # not one directory: keep whole paths
        prefix, names = "", paths
    rows = [_state_row(states[p]) for p in paths]
    return [
        _fingerprint([(r[0], r[1], r[3], r[4]) for r in rows]),
        prefix,
        "\0".join(names),
        "\0".join(" ".join(str(x) for x in r) for r in rows),
    ]


def _state_row(state: Sequence[int | str]) -> tuple[int, int, str, int, int]:
    """A saved state as ``(mtime_ns, size, digest, change_ns, inode)``; an older
    three-field state gets change time 0 (never trusted by its stat)."""
    if len(state) == 5:
        return int(state[0]), int(state[1]), str(state[2]), int(state[3]), int(state[4])
    return int(state[0]), int(state[1]), str(state[2]), 0, 0


def _fingerprint(stamps: Sequence[tuple[int, int, int, int]]) -> str:
    flat = array("q", [x for stamp in stamps for x in stamp])
    return bytes_digest(flat.tobytes())


def _settled_fingerprint(stats: Sequence[os.stat_result], taken_ns: int) -> str:
    return _fingerprint(
        [(st.st_mtime_ns, st.st_size, settled_change(st, taken_ns), st.st_ino) for st in stats]
    )


def check_outputs(saved: object) -> tuple[list[str], list[str] | None]:
    """The installed files of a build record (``outputs``, :func:`encode_outputs`) that
    are missing or no longer hold what was installed (sorted), and, when every file
    still holds it but some could not be trusted by their stat alone, the record
    refreshed with their current stats (else None).

    The no-op path costs one ``stat`` per file and one hash of the stamps; only when
    the fingerprint differs is each file compared, by content where its stat does not
    prove it unchanged. A record of another shape (a build saved before outputs were
    recorded) counts as one stale output.
    """
    if not (isinstance(saved, list | tuple) and len(saved) == 4):
        return ["(no record of the installed files)"], None
    if not all(isinstance(x, str) for x in saved):
        return ["(no record of the installed files)"], None
    fingerprint, prefix, names, states = saved
    if not names:
        return [], None
    paths = [prefix + n for n in names.split("\0")]
    try:
        stats = [os.stat(p) for p in paths]
    except OSError:
        stats = []
    if stats and _settled_fingerprint(stats, time.time_ns()) == fingerprint:
        return [], None
    stale: list[str] = []
    fresh: dict[str, FileState] = {}
    for path, state in zip(paths, states.split("\0"), strict=False):
        parts = state.split(" ")
        try:
            st = os.stat(path)
        except OSError:
            stale.append(path)
            continue
        row = [int(x) if i != 2 else x for i, x in enumerate(parts)] if len(parts) in (3, 5) else []
        if row and st.st_size == row[1] and not unchanged_since(st, row):
            taken = time.time_ns()
            if _digest_or_empty(file_digest, path) != row[2]:
                row = []
            else:
                row = file_state(st, str(row[2]), taken)
        if not row or st.st_size != row[1]:
            stale.append(path)
            continue
        fresh[path] = row
    if stale:
        return sorted(stale), None
    refreshed = encode_outputs(fresh)
    return [], (refreshed if refreshed != list(saved) else None)


def stale_outputs(saved: object) -> list[str]:
    """The installed files of an ``outputs`` record that are missing or no longer hold
    what was installed, sorted (:func:`check_outputs`, without the refresh)."""
    return check_outputs(saved)[0]


def _digest_or_empty(digest_of: Callable[[str], str], path: str) -> str:
    try:
        return digest_of(path)
    except OSError:
        return ""


def check_external(saved: object) -> tuple[list[str], dict[str, FileState] | None]:
    """The files of a build's ``external`` record (path -> a
    :data:`~metrale_orch.fsutil.FileState` with an xxh3-128 digest) that changed since the
    build read them (sorted), and, when none did but some could not be trusted by their
    stat alone, the record refreshed with their current stats (else None)."""
    if not isinstance(saved, Mapping):
        return [], None
    stale: list[str] = []
    fresh: dict[str, FileState] = {}
    refreshed = False
    for path, state in saved.items():
        if not (isinstance(state, list) and len(state) in (3, 5)):
            stale.append(str(path))
            continue
        try:
            st = os.stat(path)
        except OSError:
            stale.append(str(path))
            continue
        if unchanged_since(st, state):
            fresh[str(path)] = state
            continue
        taken = time.time_ns()
        if st.st_size != state[1] or _digest_or_empty(file_hash, path) != state[2]:
            stale.append(str(path))
            continue
        fresh[str(path)] = file_state(st, str(state[2]), taken)
        refreshed = refreshed or fresh[str(path)] != state
    if stale:
        return sorted(stale), None
    return [], (dict(sorted(fresh.items())) if refreshed else None)


def stale_external(saved: object) -> list[str]:
    """The files of an ``external`` record that changed since the build read them,
    sorted (:func:`check_external`, without the refresh)."""
    return check_external(saved)[0]
