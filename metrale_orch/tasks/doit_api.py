"""The one door to doit's private API.

Everything the package needs from doit beyond its documented extension points
(``check_file_uptodate``, ``codec_cls``, ``reporter``, ``uptodate`` objects,
task dicts) goes through here: a task's stored per-file state
(``Dependency._get``/``_set``), whether a task has a record (``Dependency._in``),
whether ``doit ignore`` marked it (``Dependency.status_is_ignore``: the mark is the
record's ``"ignore:"`` key, and doit's sqlite backend writes it *in place of* the
record, so an ignored task keeps no saved state at all), and closing the sqlite
backend without doit's final dump (``SqliteDB._conn``).
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
from doit import Globals
from doit.dependency import Dependency, SqliteDB
from doit.task import Task, dict_to_task

__all__ = [
    "Dependency",
    "Task",
    "doit_version",
    "has_record",
    "is_ignored",
    "make_task",
    "open_dependency",
    "running_backend",
    "store_state",
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


def is_ignored(dep: Dependency, task: Task) -> bool:
    """Whether ``doit ignore`` marked ``task``: ``doit build`` then skips it (``!!``) until
    ``doit forget`` drops the mark (with the rest of the record).

    Asks :func:`has_record` first: doit's sqlite backend caches an empty record for any
    task it is asked about, and ``has_record`` then answers True for a task with none.
    """
    return has_record(dep, task.name) and bool(dep.status_is_ignore(task))


def running_backend() -> object:
    """The database backend of the doit command running in this process, or None before
    doit opens it (``doit.Globals.dep_manager``, doit's public accessor)."""
    dep = Globals.dep_manager
    return None if dep is None else dep.backend


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
