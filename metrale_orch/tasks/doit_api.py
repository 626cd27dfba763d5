"""The one door to doit's private API.

Everything the package needs from doit beyond its documented extension points
(``check_file_uptodate``, ``codec_cls``, ``reporter``, ``uptodate`` objects,
task dicts) goes through here: a task's stored per-file state
(``Dependency._get``/``_set``), whether a task has a record (``Dependency._in``),
whether ``doit ignore`` marked it (``Dependency.status_is_ignore``: the mark is the
record's ``"ignore:"`` key, and doit's sqlite backend writes it *in place of* the
record, so an ignored task keeps no saved state at all), and closing the sqlite
backend without doit's final dump (``SqliteDB._conn``), and doit's reader of its
configuration files (``doit_cmd.DoitConfig.loads``), doit's lookup of its plugins'
entry points (``plugin.entry_points_impl``: :func:`plugins_looked_up_once`, for the edit
loop's repeated runs), and, for a plain ``doit`` without
the package's task loader, what the command loading the tasks was asked (the ``args`` of
``DoitCmdBase.execute``'s frame: :func:`_frame_selection`). :class:`SavedOnceSqliteDB`
is doit's sqlite backend with every write held for the final save (its
``_cache``, ``_dirty`` and ``_conn``); :mod:`metrale_orch.tasks.database` builds
the package's backend on it. Every record of the sqlite database (its ``doit``
table) is read for ``doit dumpdb``.
``tests/test_doit_api.py`` checks each attribute and signature used, so a doit
upgrade that moves one fails there, by name, rather than deep in a build.

doit ships no type information: its objects are typed by their doit classes,
which mypy sees as ``Any`` (the honest exception to concrete types).

It also holds the package's one piece of module-level state on the doit side: the
:class:`~metrale_orch.tasks.run.Run` of this process (:func:`current_run`), begun when
doit loads the tasks (:func:`loading_run`); a process that runs doit again gets a new one,
so nothing of a run reaches the next. What doit was asked comes by doit's
documented door when the package's task loader (:mod:`metrale_orch.tasks.loader`) loads
the tasks (:func:`tell_selection`); a plain ``doit`` with the one-line dodo file and no
loader configured tells nothing, and only then is it read from doit's frame
(:func:`_frame_selection`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import doit
from doit import Globals
from doit import plugin as doit_plugin
from doit.cmd_base import DoitCmdBase
from doit.dependency import DatabaseException, Dependency, SqliteDB
from doit.doit_cmd import DoitConfig
from doit.loader import TASK_STRING, task_params
from doit.task import Task, dict_to_task

from metrale_orch.graph.selection import Selection
from metrale_orch.tasks.run import Run

if TYPE_CHECKING:
    from metrale_orch.executor.loop import ActionLoop

__all__ = [
    "CHECKER_RECORD",
    "FAILED_RECORD",
    "VALUES_RECORD",
    "DatabaseException",
    "Dependency",
    "SavedOnceSqliteDB",
    "Task",
    "current_run",
    "doit_version",
    "guessed_selection",
    "has_record",
    "is_ignored",
    "last_run_failed",
    "loader_present",
    "loading_run",
    "make_task",
    "new_run",
    "open_dependency",
    "plugins_looked_up_once",
    "read_config_file",
    "running_backend",
    "store_state",
    "store_values",
    "stored_records",
    "stored_state",
    "stored_values",
    "task_creators",
    "tell_loader_present",
    "tell_selection",
]


def doit_version() -> str:
    """doit's version as text (part of the task cache's key)."""
    return str(doit.__version__)


def stored_state(dep: Dependency, task: str, path: str) -> object:
    """The state saved for ``path`` in ``task``'s record (the very object doit holds)."""
    return dep._get(task, path)


def store_state(dep: Dependency, task: str, path: str, state: object) -> None:
    """Replace the state saved for ``path`` in ``task``'s record (written when doit dumps)."""
    dep._set(task, path, state)


#: doit's record key of a task's saved values (what ``Dependency.get_values`` reads).
VALUES_RECORD = "_values_:"


def stored_values(dep: Dependency, task: str) -> object:
    """The values saved in ``task``'s record (the very object doit holds), or None."""
    return dep._get(task, VALUES_RECORD)


def store_values(dep: Dependency, task: str, values: dict[str, object]) -> None:
    """Replace the values saved in ``task``'s record (written when doit dumps)."""
    dep._set(task, VALUES_RECORD, values)


#: doit's record key naming the file checker of a record; doit writes it only when it
#: saves a task's success.
CHECKER_RECORD = "checker:"
#: The key this package adds to a task's record when doit's runner drops it for a failure
#: that left the installed files intact (:mod:`metrale_orch.tasks.database`).
FAILED_RECORD = "failed:"


def last_run_failed(dep: Dependency, task: str) -> bool:
    """Whether ``task``'s record is its last good build's, kept through a failed run."""
    return bool(dep._get(task, FAILED_RECORD))


def has_record(dep: Dependency, task: str) -> bool:
    """Whether doit's database holds a record of ``task`` (it ran successfully once)."""
    return bool(dep._in(task))


def is_ignored(dep: Dependency, task: Task) -> bool:
    """Whether ``doit ignore`` marked ``task``: ``doit build`` then skips it (``!!``) until
    ``doit forget`` drops the mark (with the rest of the record).

    Asks :func:`has_record` first: doit's sqlite backend caches an empty record for any
    task it is asked about, and ``has_record`` then answers True for a task with none.
    """
    return has_record(dep, task.name) and bool(dep.status_is_ignore(task))


def read_config_file(name: str) -> None:
    """Read doit's configuration file ``name`` (``pyproject.toml`` or ``doit.cfg``,
    relative to the working directory: doit tells ``[tool.doit]`` apart by that exact
    name) with doit's own reader; raises whatever that reader raises."""
    DoitConfig().loads([name])


@contextmanager
def plugins_looked_up_once() -> Iterator[None]:
    """Within the block, doit looks up each group of its plugins' entry points once, not
    three groups per command (``importlib.metadata`` reads every installed distribution's
    metadata: 30-40 ms a run in a full environment). For the edit loop, which runs doit
    in one process cycle after cycle; a package installed meanwhile is not seen by it."""
    original = doit_plugin.entry_points_impl
    found: dict[str, tuple[EntryPoint, ...]] = {}

    def looked_up(*, group: str) -> tuple[EntryPoint, ...]:
        if group not in found:
            found[group] = tuple(entry_points(group=group))
        return found[group]

    def impl() -> Callable[..., tuple[EntryPoint, ...]]:
        return looked_up

    doit_plugin.entry_points_impl = impl
    try:
        yield
    finally:
        doit_plugin.entry_points_impl = original


def running_backend() -> object:
    """The database backend of the doit command running in this process, or None before
    doit opens it (``doit.Globals.dep_manager``, doit's public accessor)."""
    dep = Globals.dep_manager
    return None if dep is None else dep.backend


# ------------------------------------------------------------------------------ the run

#: This process's run (see the module docstring): the one reference the package keeps at
#: module level, as doit hands its reporter, its actions and a dodo file's task creators
#: nothing of the project. What a run was told (its selection, whether the package's
#: loader loads its tasks) lives on the run itself, so each run starts clean.
_CURRENT: list[Run] = []


def current_run() -> Run:
    """This process's run (made on first need: a worker process doit spawned, a view)."""
    if not _CURRENT:
        _CURRENT.append(Run(Path.cwd(), os.environ))
    return _CURRENT[0]


def new_run(
    root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    loop: ActionLoop | None = None,
) -> Run:
    """Begin a new run in this process, the last one's sessions closed (a warm process
    running doit again, tests); ``loop``: the event loop its sessions are lent (a watch's,
    kept across its runs)."""
    if _CURRENT:
        _CURRENT.pop().close()
    run = Run(
        Path.cwd() if root is None else root,
        os.environ if environ is None else environ,
        loop=loop,
    )
    _CURRENT.append(run)
    return run


def _next_run() -> Run:
    """The run whose tasks doit loads next: the current one while its load has not
    begun (it was made while the dodo file was imported, or by the loader), else a new
    one (doit runs again in this process)."""
    run = current_run()
    return new_run() if run.loading else run


def loading_run() -> Run:
    """The run whose tasks doit loads now (the dodo file's ``task_build`` asks); its
    selection is what the task loader told, else what doit's frame shows (plain
    ``doit``, no loader), else unknown."""
    run = _next_run()
    run.loading = True
    if not run.loader:
        run.selection = _frame_selection()
    return run


def tell_selection(command: str, words: list[str], namespace: object) -> Selection:
    """What the package's task loader was asked (doit's ``load_tasks(cmd, pos_args)``),
    for the load it is about to start; that selection."""
    creators = task_creators(namespace) if isinstance(namespace, dict) else None
    told = Selection(command=command, words=tuple(str(w) for w in words), creators=creators)
    run = _next_run()
    run.loader, run.selection = True, told
    return told


def tell_loader_present() -> None:
    """The package's task loader loads the next run's tasks: it tells the selection when
    doit hands it over, after the dodo file is imported."""
    _next_run().loader = True


def loader_present() -> bool:
    """Whether the package's task loader loads this process's tasks."""
    return current_run().loader


def task_creators(namespace: Mapping[str, object]) -> tuple[object, ...]:
    """The task creators of a dodo namespace as doit's loader picks them: its ``task_*``
    functions and the objects with ``create_doit_tasks``."""
    creators: list[object] = []
    for name, ref in namespace.items():
        if ref is task_params:
            continue
        if name.startswith(TASK_STRING) and (inspect.isfunction(ref) or inspect.ismethod(ref)):
            creators.append(ref)
        elif hasattr(ref, "create_doit_tasks"):
            creators.append(ref.create_doit_tasks)
    return tuple(creators)


#: The code of the method every doit command that loads tasks runs them from: its
#: frame holds the command (``self``) and its task selection (``args``).
_EXECUTE_CODE = DoitCmdBase.execute.__code__


def _frame_selection() -> Selection | None:
    """What the doit command loading this process's tasks was asked, read from the frame
    of ``DoitCmdBase.execute`` (which imports the dodo file and calls the task creators),
    or None (no doit command on the stack: doit's API, a test calling the creators).

    Only for a plain ``doit`` without the package's loader: doit hands neither to any
    extension point a one-line dodo file sees. The task creators are None while the dodo
    file is still being imported (doit reads its namespace after)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code is not _EXECUTE_CODE:
        frame = frame.f_back
    if frame is None:
        return None
    command, args = frame.f_locals.get("self"), frame.f_locals.get("args")
    if command is None or not isinstance(args, list):
        return None
    namespace = getattr(getattr(command, "loader", None), "namespace", None)
    return Selection(
        command=str(getattr(command, "name", "") or ""),
        words=tuple(str(a) for a in args),
        creators=task_creators(namespace) if isinstance(namespace, dict) else None,
    )


def guessed_selection() -> Selection | None:
    """What this run was asked, while the dodo file is imported: unknown (None) when the
    package's loader will tell it, else what doit's frame shows."""
    return None if loader_present() else _frame_selection()


def make_task(task: dict[str, object]) -> Task:
    """doit's ``Task`` of a task dict, as doit's loader makes it."""
    return dict_to_task(task)


@contextmanager
def open_dependency(db: Path, *, checker_cls: type, codec_cls: type) -> Iterator[Dependency]:
    """doit's ``Dependency`` over the sqlite database ``db``, for reading: closed without
    doit's dump, so nothing is ever written."""
    dep = Dependency(SqliteDB, str(db), checker_cls=checker_cls, codec_cls=codec_cls)
    try:
        yield dep
    finally:
        dep.backend._conn.close()


class SavedOnceSqliteDB(SqliteDB):  # type: ignore[misc]
    """doit's ``SqliteDB`` with every write held for :meth:`dump`.

    doit deletes records at once (a failed task's, ``doit forget``'s) inside the
    transaction its dump commits anyway; here deletes wait too, reads see them
    (:meth:`get`, :meth:`in_`), and :meth:`dump` writes deletes and records in one
    transaction, sorted, that commits whole or is rolled back whole (the
    ``sqlite3.Error`` is raised), then closes the database.

    Reads: every record is read in one query on the first question about any task
    (none for ``doit list``), as the bytes stored (:data:`_SQLITE_RAW_RECORDS`), and a
    record is decoded by the codec on first :meth:`get` of its task, exactly as doit's
    converter would (UTF-8, then the codec); one never asked for is never decoded. doit
    asks one query per task instead, through a row factory and a converter per row. The
    records are those of the database at that first question; writes still touch only
    the records this command changed, so runs one after another (or side by side) see
    each other's saves as with doit's backend.
    """

    # SqliteDB's state (doit ships no types): each task's record, the tasks changed.
    _cache: dict[str, dict[str, object]]
    _dirty: set[str]
    _conn: sqlite3.Connection

    def __init__(self, name: str, codec: object, *, module_name: str | None = None) -> None:
        self._removed: set[str] = set()
        self._clear = False
        super().__init__(name, codec, module_name=module_name)
        #: Each stored record not yet decoded (moved to ``_cache`` when first read); read
        #: on the first question (``doit list`` asks none).
        self._undecoded: dict[str, bytes] | None = None

    @property
    def _raw(self) -> dict[str, bytes]:
        if self._undecoded is None:
            self._undecoded = _raw_records(self._conn)
        return self._undecoded

    @_raw.setter
    def _raw(self, value: dict[str, bytes]) -> None:
        self._undecoded = value

    def pending(self) -> int:
        """How many task records the next :meth:`dump` changes."""
        return len(self._dirty | self._removed) + (1 if self._clear else 0)

    def _record(self, task_id: str) -> dict[str, object]:
        """``task_id``'s record, decoded on first need; like doit's backend, an empty
        one is kept for a task without a record (so :meth:`in_` then answers True)."""
        record = self._cache.get(task_id)
        if record is None:
            raw = self._raw.pop(task_id, None)
            record = {} if raw is None else self.codec.decode(raw.decode("utf-8"))
            self._cache[task_id] = record
        return record

    def get(self, task_id: str, dependency: str) -> object:
        if task_id not in self._cache and (self._clear or task_id in self._removed):
            return None
        return self._record(task_id).get(dependency, None)

    def in_(self, task_id: str) -> bool:
        if task_id in self._cache:
            return True
        if self._clear or task_id in self._removed:
            return False
        return task_id in self._raw

    def remove(self, task_id: str) -> None:
        self._cache.pop(task_id, None)
        self._raw.pop(task_id, None)
        self._dirty.discard(task_id)
        self._removed.add(task_id)

    def remove_all(self) -> None:
        self._cache = {}
        self._raw = {}
        self._dirty = set()
        self._removed = set()
        self._clear = True

    def dump(self) -> None:
        conn = self._conn
        try:
            if self._clear:
                conn.execute("delete from doit")
            for task_id in sorted(self._removed):
                conn.execute("delete from doit where task_id=?", (task_id,))
            for task_id in sorted(self._dirty):
                record = self.codec.encode(self._cache[task_id])
                conn.execute("insert or replace into doit values (?,?)", (task_id, record))
            conn.commit()
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.rollback()
            raise
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            self._dirty, self._removed, self._clear = set(), set(), False


#: The table and columns doit's sqlite backend keeps its records in (``SqliteDB``).
_SQLITE_RECORDS = "select task_id, task_data from doit order by task_id"
#: Every record as the bytes stored: an expression column has no declared type, so
#: doit's ``json`` converter (which decodes) is not applied.
_SQLITE_RAW_RECORDS = "select task_id, cast(task_data as blob) from doit"


def _raw_records(conn: sqlite3.Connection) -> dict[str, bytes]:
    """task -> its stored record, undecoded (one query; doit's row factory left out)."""
    cursor = conn.cursor()
    cursor.row_factory = None
    try:
        rows = cursor.execute(_SQLITE_RAW_RECORDS)
        return {str(task): bytes(data or b"") for task, data in rows}
    finally:
        cursor.close()


def stored_records(dep: Dependency) -> list[tuple[str, object]]:
    """Every task's record in the sqlite database ``dep`` reads (from
    :func:`open_dependency`), decoded by its codec, sorted by task name."""
    rows = dep.backend._conn.execute(_SQLITE_RECORDS).fetchall()
    return [(str(row["task_id"]), row["task_data"]) for row in rows]
