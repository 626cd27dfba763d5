"""Content-based up-to-date checks for doit: an xxh3 file checker and the signature check.

:class:`ContentChecker` is what ``DOIT_CONFIG["check_file_uptodate"]`` names.
A file dependency's saved state is ``[mtime_ns, size, xxh3_64 hex]``:

- same mtime and size: unchanged, no read;
- other size: changed, no read;
- same size, other mtime: the bytes decide. Same bytes count as unchanged
  **and the saved state is refreshed** with the new mtime, so a fresh checkout
  (every mtime new, every byte the same) costs one hashing pass, then no-ops.
  doit's own md5 checker re-hashes such files on every run, forever, because
  doit saves file states only when a task runs.

doit calls ``check_modified(path, stat, state)`` without saying for which task,
so the refresh needs the task: :class:`SignatureCheck` (an ``uptodate`` entry
of every build task, evaluated by doit just before the task's file
dependencies) binds the checker to the task being checked. A refresh is
written only when the state doit handed over is, by identity, the one stored
in that task's record, so a stale binding can never write into another task.

Within one doit invocation each path is stat-ed and hashed at most once across
all tasks (a build's inputs do not change while it runs; if one does, the
memoised older state is what gets saved, which errs towards rebuilding).

The invariant: a saved state ``(m, s, h)`` means "the task last succeeded with
content ``h``"; a refresh only ever pairs ``h`` with a newer ``(m, s)`` whose
bytes hash to ``h``.
"""

from __future__ import annotations

import inspect
import json
import marshal
import os
from array import array
from collections.abc import Callable, Mapping, Sequence

import xxhash
from doit.dependency import FileChangedChecker, UptodateCalculator

from metrale_orch.fsutil import file_digest, file_hash
from metrale_orch.tasks.doit_api import Dependency, Task, store_state, stored_state

__all__ = [
    "EXTERNAL_KEY",
    "INPUTS_KEY",
    "OUTPUTS_KEY",
    "PROFILE_KEY",
    "SIGNATURE_KEY",
    "ContentChecker",
    "SignatureCheck",
    "TaskDataCodec",
    "encode_outputs",
    "file_digest",
    "signature_parts",
    "stale_external",
    "stale_outputs",
]

#: Key of the per-part signature digests in a task's saved values.
SIGNATURE_KEY = "signature"
#: Key of a build's values: file dependency -> xxh3-64 of the content the build used
#: (consumed when the task's state is saved; never stored).
INPUTS_KEY = "inputs"
#: Key of a build's saved values: the installed files (:func:`encode_outputs`).
OUTPUTS_KEY = "outputs"
#: Key of a build's saved values: file read outside the tree, the toolkit and the
#: system directories -> [mtime_ns, size, xxh3-128] (absent when there is none).
EXTERNAL_KEY = "external"
#: The saved state of a file that changed while the build that read it ran: its size
#: never matches, so the next run sees it changed.
_CHANGED_DURING_BUILD = (0, -1)
#: Key of a build's values: its profile spans (``Span.to_dict()`` each), for the
#: reporter's ``profile.json``. They travel with the values from the worker but are
#: never stored: :class:`TaskDataCodec` drops them, so no later run decodes them.
PROFILE_KEY = "profile"
#: doit's record keys that hold a task's values (saved values, the action's result).
_VALUE_RECORDS = ("_values_:", "result:")


def signature_parts(signature: Mapping[str, object]) -> dict[str, str]:
    """One short digest per top-level part of a plan's signature (pure).

    Each part is encoded as canonical JSON (sorted keys, no spaces; values that
    JSON cannot hold are encoded by ``str``), so equal signatures give equal
    digests in every process and checkout.
    """
    out: dict[str, str] = {}
    for key in sorted(signature):
        text = json.dumps(
            signature[key], sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=True
        )
        out[str(key)] = xxhash.xxh3_64_hexdigest(text.encode("utf-8"))
    return out


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
    runs again. A build's profile spans (:data:`PROFILE_KEY`) are left out.
    """

    def encode(self, data: dict[str, object] | list[object]) -> str:
        # doit's sqlite backend registers this as the adapter of every list and dict.
        record = data
        if isinstance(data, dict):
            record = dict(data)
            for name in _VALUE_RECORDS:
                values = record.get(name)
                if isinstance(values, dict) and PROFILE_KEY in values:
                    record[name] = {k: v for k, v in values.items() if k != PROFILE_KEY}
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
        self._digests: dict[str, tuple[int, int, str]] = {}
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
        if type(state) is list and len(state) == 3:
            # What doit hands over (a JSON list): the common case, tested without isinstance.
            mtime_ns, size, digest = state
        elif isinstance(state, tuple) and len(state) == 3:
            mtime_ns, size, digest = state
        else:
            return True
        if file_stat.st_size != size:
            return True
        if file_stat.st_mtime_ns == mtime_ns:
            return False
        try:
            current = self._digest(file_path, file_stat)
        except OSError:
            return True
        if current != digest:
            return True
        self._refresh(file_path, state, [file_stat.st_mtime_ns, size, digest])
        return False

    def get_state(self, dep: str, current_state: object) -> list[object] | None:
        expected = self._expected.get(dep)
        if expected is not None:
            return self._compiled_state(dep, expected)
        st = self.info(dep)
        if (
            isinstance(current_state, list | tuple)
            and len(current_state) == 3
            and current_state[0] == st.st_mtime_ns
            and current_state[1] == st.st_size
        ):
            return None
        return [st.st_mtime_ns, st.st_size, self._digest(dep, st)]

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
            current = self._digest(dep, st) if expected else ""
        except OSError:
            current = ""
        if expected and current == expected:
            return [st.st_mtime_ns, st.st_size, expected]
        return [*_CHANGED_DURING_BUILD, expected]

    # -- binding (see SignatureCheck) -----------------------------------------------------------

    def bind(self, dep_manager: Dependency, task_name: str) -> None:
        """Say which task's file dependencies doit is about to check."""
        self._dep = dep_manager
        self._task = task_name

    def _refresh(self, file_path: str, old: object, new: list[object]) -> None:
        dep, task = self._dep, self._task
        if dep is None or task is None:
            return
        # Only when doit handed us the very state stored for the bound task.
        if stored_state(dep, task, file_path) is not old:
            return
        store_state(dep, task, file_path, new)
        self.refreshed += 1

    def _digest(self, file_path: str, st: os.stat_result) -> str:
        memo = self._digests.get(file_path)
        if memo is not None and memo[0] == st.st_mtime_ns and memo[1] == st.st_size:
            return memo[2]
        digest = file_digest(file_path)
        self.hashed += 1
        self._digests[file_path] = (st.st_mtime_ns, st.st_size, digest)
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
        if values.get(SIGNATURE_KEY) != self.parts:
            return False
        self.stale_outputs = tuple(stale_outputs(values.get(OUTPUTS_KEY)))
        self.stale_external = tuple(stale_external(values.get(EXTERNAL_KEY)))
        return not (self.stale_outputs or self.stale_external)

    def saved_values(self) -> dict[str, object]:
        """What the task saves on success (doit calls this via ``value_savers``, just
        before it saves the task's file states): hands the build's input digests to
        the checker (they are not stored) and keeps the signature."""
        task = self._task
        values = getattr(task, "values", None)
        inputs = values.pop(INPUTS_KEY, None) if isinstance(values, dict) else None
        checker = getattr(self._dep_manager, "checker", None)
        if isinstance(checker, ContentChecker):
            checker.expect(inputs if isinstance(inputs, Mapping) else {})
        return {SIGNATURE_KEY: dict(self.parts)}


def encode_outputs(states: Mapping[str, Sequence[int | str]]) -> list[str]:
    """The ``OUTPUTS_KEY`` record of installed files (path -> ``[mtime_ns, size,
    xxh3-64]``, all in one directory): ``[fingerprint, directory + "/", names,
    states]``, the last two ``\0``-joined. doit decodes every task's values on every
    run, and a few strings decode far faster than a mapping of lists."""
    paths = sorted(states)
    prefix = os.path.commonpath(paths) + "/" if paths else ""
    names = [p[len(prefix) :] for p in paths]
    if any("/" in n for n in names):  # not one directory: keep whole paths
        prefix, names = "", paths
    stamps = [(int(states[p][0]), int(states[p][1])) for p in paths]
    return [
        _fingerprint(stamps),
        prefix,
        "\0".join(names),
        "\0".join(f"{states[p][0]} {states[p][1]} {states[p][2]}" for p in paths),
    ]


def _fingerprint(stamps: Sequence[tuple[int, int]]) -> str:
    flat = array("q", [x for stamp in stamps for x in stamp])
    return xxhash.xxh3_64_hexdigest(flat.tobytes())


def stale_outputs(saved: object) -> list[str]:
    """The installed files of a build record (``OUTPUTS_KEY``, :func:`encode_outputs`) that
    are missing or no longer hold what was installed, sorted.

    The no-op path costs one ``stat`` per file and one hash of the stamps; only when
    the fingerprint differs is each file compared, by content where only its mtime
    moved. A record of another shape (a build saved before outputs were recorded)
    counts as one stale output.
    """
    if not (isinstance(saved, list) and len(saved) == 4 and all(isinstance(x, str) for x in saved)):
        return ["(no record of the installed files)"]
    fingerprint, prefix, names, states = saved
    if not names:
        return []
    paths = [prefix + n for n in names.split("\0")]
    try:
        stats = [os.stat(p) for p in paths]
    except OSError:
        stats = []
    if stats and _fingerprint([(st.st_mtime_ns, st.st_size) for st in stats]) == fingerprint:
        return []
    stale: list[str] = []
    for path, state in zip(paths, states.split("\0"), strict=False):
        parts = state.split(" ")
        try:
            st = os.stat(path)
        except OSError:
            stale.append(path)
            continue
        same_stamp = len(parts) == 3 and st.st_size == int(parts[1])
        if same_stamp and st.st_mtime_ns != int(parts[0]):
            same_stamp = _digest_or_empty(file_digest, path) == parts[2]
        if not same_stamp:
            stale.append(path)
    return sorted(stale)


def _digest_or_empty(digest_of: Callable[[str], str], path: str) -> str:
    try:
        return digest_of(path)
    except OSError:
        return ""


def stale_external(saved: object) -> list[str]:
    """The files of a build's ``EXTERNAL_KEY`` record (path -> ``[mtime_ns, size,
    xxh3-128]``) that changed since the build read them, sorted."""
    if not isinstance(saved, Mapping):
        return []
    stale: list[str] = []
    for path, state in saved.items():
        if not (isinstance(state, list) and len(state) == 3):
            stale.append(str(path))
            continue
        try:
            st = os.stat(path)
        except OSError:
            stale.append(str(path))
            continue
        if st.st_mtime_ns == state[0] and st.st_size == state[1]:
            continue
        if st.st_size != state[1] or _digest_or_empty(file_hash, path) != state[2]:
            stale.append(str(path))
    return sorted(stale)
