"""The doit private API ``metrale_orch.tasks.doit_api`` relies on is still there.

Each check names the attribute or parameter a doit upgrade removed or changed, so
an upgrade fails here, by name, instead of deep inside a build or ``metrale-orch
status``.

The tests of this topic that start processes are in
``tests/scenarios/tasks/test_doit_api.py``.
"""

from __future__ import annotations

import inspect
import sqlite3
from pathlib import Path

import doit
import pytest
from doit.dependency import Dependency, DependencyStatus, SqliteDB
from doit.doit_cmd import DoitConfig, DoitMain
from doit.reporter import ConsoleReporter
from doit.task import Task

from metrale_orch.tasks import doit_api
from metrale_orch.tasks.checker import ContentChecker, TaskDataCodec


def _params(func: object) -> list[str]:
    assert callable(func)
    return list(inspect.signature(func).parameters)


def _require(obj: object, *names: str) -> None:
    missing = [name for name in names if not hasattr(obj, name)]
    assert not missing, f"doit changed: {type(obj).__name__} has no {', '.join(missing)}"


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (Dependency.__init__, ["self", "db_class", "backend_name", "checker_cls", "codec_cls"]),
        (Dependency.get_status, ["self", "task", "tasks_dict", "get_log"]),
        (Dependency.get_values, ["self", "task_name"]),
        (SqliteDB.get, ["self", "task_id", "dependency"]),
        (SqliteDB.set, ["self", "task_id", "dependency", "value"]),
        (SqliteDB.in_, ["self", "task_id"]),
        (ContentChecker.check_modified, ["self", "file_path", "file_stat", "state"]),
        (ContentChecker.get_state, ["self", "dep", "current_state"]),
        (ConsoleReporter.__init__, ["self", "outstream", "options"]),
        (DoitConfig.loads, ["self", "config_filenames"]),
        (DoitMain.__init__, ["self", "task_loader", "config_filenames", "extra_config"]),
        (DoitMain.run, ["self", "all_args"]),
    ],
    ids=lambda v: getattr(v, "__qualname__", ""),
)
def test_signatures_the_adapter_calls(func: object, expected: list[str]) -> None:
    got = _params(func)
    missing = [p for p in expected if p not in got]
    assert not missing, f"doit changed: {getattr(func, '__qualname__', func)} lacks {missing}"


def test_dependency_private_members(tmp_path: Path) -> None:
    with doit_api.open_dependency(
        tmp_path / "db", checker_cls=ContentChecker, codec_cls=TaskDataCodec
    ) as dep:
        _require(dep, "_get", "_set", "_in", "backend", "checker", "get_status", "get_values")
        _require(dep.backend, "_conn")
        _require(dep.backend._conn, "close")
        assert isinstance(dep.checker, ContentChecker), "doit changed: checker_cls is ignored"
        doit_api.store_state(dep, "t", "a.cu", [1, 2, "x"])
        assert doit_api.stored_state(dep, "t", "a.cu") == [1, 2, "x"]
        assert doit_api.has_record(dep, "t") and not doit_api.has_record(dep, "u")
    # Closed without a dump: nothing was written.
    with doit_api.open_dependency(
        tmp_path / "db", checker_cls=ContentChecker, codec_cls=TaskDataCodec
    ) as dep:
        assert not doit_api.has_record(dep, "t")


def test_ignore_mark(tmp_path: Path) -> None:
    """`doit ignore`'s mark as the adapter reads it, and the trap it steps around: doit's
    sqlite backend caches an empty record for any task it is asked about."""
    db = tmp_path / "db"
    task = doit_api.make_task({"name": "build:h/m/q", "actions": [], "uptodate": [False]})
    with doit_api.open_dependency(db, checker_cls=ContentChecker, codec_cls=TaskDataCodec) as dep:
        _require(dep, "ignore", "status_is_ignore", "remove")
        assert not doit_api.is_ignored(dep, task)
        assert not doit_api.has_record(dep, task.name), "is_ignored made up a record"
        dep.ignore(task)
        assert doit_api.is_ignored(dep, task)
        dep.backend.dump()  # what `doit ignore` does when it ends
    with doit_api.open_dependency(db, checker_cls=ContentChecker, codec_cls=TaskDataCodec) as dep:
        assert doit_api.is_ignored(dep, task) and doit_api.has_record(dep, task.name)
        assert doit_api.stored_state(dep, task.name, "ignore:") == "1"


def test_saved_once_sqlite_relies_on_sqlitedb_state(tmp_path: Path) -> None:
    """The members :class:`doit_api.SavedOnceSqliteDB` reads and replaces, and doit's
    public accessor of the running command's database."""
    _require(doit, "Globals")
    _require(doit.Globals, "dep_manager")
    db = doit_api.SavedOnceSqliteDB(str(tmp_path / "db"), codec=TaskDataCodec())
    _require(db, "_cache", "_dirty", "_conn", "codec", "name")
    assert isinstance(db._conn, sqlite3.Connection)
    assert isinstance(db._cache, dict) and isinstance(db._dirty, set)
    db.set("t", "k", "v")
    assert db._dirty == {"t"} and db._cache == {"t": {"k": "v"}}
    db.dump()
    saved = doit.Globals.dep_manager
    try:
        doit.Globals.dep_manager = None
        assert doit_api.running_backend() is None
        with doit_api.open_dependency(
            tmp_path / "db", checker_cls=ContentChecker, codec_cls=TaskDataCodec
        ) as dep:
            doit.Globals.dep_manager = dep
            assert doit_api.running_backend() is dep.backend
    finally:
        doit.Globals.dep_manager = saved


def test_task_and_status_members() -> None:
    task = doit_api.make_task({"name": "build:h/m/q", "actions": [], "uptodate": [False]})
    assert isinstance(task, Task)
    _require(task, "name", "uptodate", "value_savers", "values", "meta", "title", "task_dep")
    status = DependencyStatus(get_log=True)
    _require(status, "status", "reasons", "get_error_message")
    _require(ConsoleReporter, "write", "add_failure", "complete_run")
    reporter = ConsoleReporter(None, {})
    _require(reporter, "failures", "runtime_errors", "outstream")
    assert doit_api.doit_version() == str(doit.__version__)  # part of the task-cache key


def test_stored_records_reads_every_task_of_doits_sqlite_table(tmp_path: Path) -> None:
    """``doit dumpdb`` lists the sqlite backend's records from its table (name, columns)."""
    dep = Dependency(SqliteDB, str(tmp_path / "db"), checker_cls=ContentChecker,
                     codec_cls=TaskDataCodec)  # fmt: skip
    dep._set("b:2", "x.cu", [1, 2, "h"])
    dep._set("a:1", "_values_:", {"outcome": "built"})
    dep.close()  # doit's own dump writes both records
    with doit_api.open_dependency(
        tmp_path / "db", checker_cls=ContentChecker, codec_cls=TaskDataCodec
    ) as dep:
        assert doit_api.stored_records(dep) == [
            ("a:1", {"_values_:": {"outcome": "built"}}),
            ("b:2", {"x.cu": [1, 2, "h"]}),
        ]


def test_doits_config_reader_and_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``metrale-orch doit`` reads doit's files with doit's reader, then runs ``DoitMain``
    (its ``BIN_NAME`` names the command in doit's messages)."""
    _require(DoitMain, "BIN_NAME", "run")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.doit.plugins]\nbogus = 1\n")
    with pytest.raises(AssertionError):  # doit's own check of a plugin type
        doit_api.read_config_file("pyproject.toml")
    (tmp_path / "pyproject.toml").write_text('[tool.doit]\nbackend = "json"\n')
    doit_api.read_config_file("pyproject.toml")
