"""The one door to doit's private API.

Everything the package needs from doit beyond its documented extension points
(``check_file_uptodate``, ``codec_cls``, ``reporter``, ``uptodate`` objects,
task dicts) goes through here: a task's stored per-file state
(``Dependency._get``/``_set``), whether a task has a record (``Dependency._in``),
closing the sqlite backend without doit's final dump (``SqliteDB._conn``), and
every record of the sqlite database (its ``doit`` table, for ``doit dumpdb``).
``tests/test_doit_api.py`` checks each attribute and signature used, so a doit
upgrade that moves one fails there, by name, rather than deep in a build.

doit ships no type information: its objects are typed by their doit classes,
which mypy sees as ``Any`` (the honest exception to concrete types).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import doit
from doit.dependency import Dependency, SqliteDB
from doit.task import Task, dict_to_task

__all__ = [
    "Dependency",
    "Task",
    "doit_version",
    "has_record",
    "make_task",
    "open_dependency",
    "store_state",
    "stored_records",
    "stored_state",
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


def has_record(dep: Dependency, task: str) -> bool:
    """Whether doit's database holds a record of ``task`` (it ran successfully once)."""
    return bool(dep._in(task))


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


#: The table and columns doit's sqlite backend keeps its records in (``SqliteDB``).
_SQLITE_RECORDS = "select task_id, task_data from doit order by task_id"


def stored_records(dep: Dependency) -> list[tuple[str, object]]:
    """Every task's record in the sqlite database ``dep`` reads (from
    :func:`open_dependency`), decoded by its codec, sorted by task name."""
    rows = dep.backend._conn.execute(_SQLITE_RECORDS).fetchall()
    return [(str(row["task_id"]), row["task_data"]) for row in rows]
