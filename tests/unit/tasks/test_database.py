"""doit's database as ``metrale_orch.tasks.database`` keeps it: one transaction at the end,
and a database that cannot be written is one line and exit status 1.

A full database is made without a full disk: sqlite's ``max_page_count`` caps the
file at its current size, and the next write that needs a page fails with
``SQLITE_FULL``, as on a full disk (the real full disk is
``tests/scenarios/cache/test_full_disk.py``).
"""

from __future__ import annotations

import sqlite3
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from doit.dependency import DatabaseException, JSONCodec, SqliteDB

from metrale_orch.dodo import DOIT_CONFIG
from metrale_orch.tasks.checker import TaskDataCodec
from metrale_orch.tasks.database import BACKEND, Database, DatabaseUnwritable, unwritable_reason


def _open(path: Path) -> Database:
    return Database(str(path), codec=JSONCodec())


def _records(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("select task_id, task_data from doit").fetchall())
    finally:
        conn.close()


def _saved(path: Path, records: dict[str, dict[str, object]]) -> None:
    db = _open(path)
    for task, values in records.items():
        for key, value in values.items():
            db.set(task, key, value)
    db.dump()


def _cap(db: Database) -> None:
    """No page more for ``db``: its next growing write fails with SQLITE_FULL."""
    pages = db._conn.execute("pragma page_count").fetchone()["page_count"]
    db._conn.execute(f"pragma max_page_count = {pages}")


def test_the_backend_is_registered_with_doit() -> None:
    found = [ep for ep in entry_points(group="doit.BACKEND") if ep.name == BACKEND]
    assert found, (
        f"no doit.BACKEND entry point {BACKEND!r}: the installed metadata is older than "
        "pyproject.toml (run `pip install -e .` again)"
    )
    assert found[0].load() is Database
    assert DOIT_CONFIG["backend"] == BACKEND


def test_removes_wait_for_the_save_and_reads_see_them(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _saved(path, {"a": {"x": 1}, "b": {"y": 2}, "c": {"z": 3}})
    db = _open(path)
    db.remove("a")
    assert not db.in_("a") and db.get("a", "x") is None
    assert db.in_("b") and db.get("b", "y") == 2
    assert set(_records(path)) == {"a", "b", "c"}, "a delete was written before the save"
    db.set("c", "z", 4)
    db.dump()
    assert set(_records(path)) == {"b", "c"}
    assert _open(path).get("c", "z") == 4


def test_remove_all_then_set(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _saved(path, {"a": {"x": 1}, "b": {"y": 2}})
    db = _open(path)
    db.remove_all()
    assert not db.in_("a") and db.get("b", "y") is None
    db.set("n", "k", "v")
    db.dump()
    assert set(_records(path)) == {"n"}


class _CountingCodec(TaskDataCodec):
    """The package's codec, keeping each record it decodes."""

    def __init__(self) -> None:
        self.decoded: list[object] = []

    def decode(self, text: str) -> object:
        record = super().decode(text)
        self.decoded.append(record)
        return record


def test_records_are_read_at_once_and_decoded_on_first_get_only(tmp_path: Path) -> None:
    """Opening reads every record (one query) but decodes none; a record is decoded the
    first time its task is read, once; a record never asked for is never decoded."""
    path = tmp_path / "db"
    values = {"a": {"x": [1, 2, "é\u2603"], "y": {"k": (1, None)}}, "b": {"y": 2.5}, "c": {}}
    with_codec = Database(str(path), codec=TaskDataCodec())
    for task, record in values.items():
        for key, value in record.items():
            with_codec.set(task, key, value)
    with_codec.set("c", "z", "only")
    with_codec.dump()
    codec = _CountingCodec()
    db = Database(str(path), codec=codec)
    assert codec.decoded == []
    assert db.in_("a") and db.in_("b") and db.in_("c") and not db.in_("nope")
    assert codec.decoded == []  # knowing which tasks have a record decodes nothing
    assert db.get("a", "x") == [1, 2, "é\u2603"] and db.get("a", "y") == {"k": (1, None)}
    assert db.get("a", "missing") is None
    assert len(codec.decoded) == 1  # a's record, once
    assert db.get("nope", "x") is None and len(codec.decoded) == 1
    db.set("b", "w", 1)  # a write decodes nothing: b's record is replaced on the save
    db.dump()
    assert len(codec.decoded) == 1  # b and c never asked for: never decoded
    again = Database(str(path), codec=TaskDataCodec())
    assert again.get("a", "x") == [1, 2, "é\u2603"] and again.get("c", "z") == "only"
    assert again.get("b", "w") == 1


def test_a_record_decodes_as_doits_own_backend_reads_it(tmp_path: Path) -> None:
    """Every value round-trips exactly as doit's ``SqliteDB`` would read it back."""
    path = tmp_path / "db"
    record = {"f": [1, 2, "3", 4.5, 6], "_values_:": {"outputs": [["p", 1]]}, "u": "ü\x00"}
    _saved(path, {"t": record})
    ours, theirs = _open(path), SqliteDB(str(path), JSONCodec())
    for key in record:
        assert ours.get("t", key) == theirs.get("t", key) == record[key]
    theirs._conn.close()


def test_runs_one_after_another_and_side_by_side_keep_each_others_records(
    tmp_path: Path,
) -> None:
    """Opened side by side, two commands each save only what they changed: both saves land;
    a later command sees both (read at its open)."""
    path = tmp_path / "db"
    _saved(path, {"a": {"x": 1}, "b": {"y": 2}})
    one, two = _open(path), _open(path)
    one.set("a", "x", 10)
    two.set("b", "y", 20)
    two.set("n", "k", "new")
    one.dump()
    two.dump()
    later = _open(path)
    assert (later.get("a", "x"), later.get("b", "y"), later.get("n", "k")) == (10, 20, "new")


def test_a_full_database_saves_nothing_and_says_so_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _saved(path, {"old": {"x": 1}, "gone": {"y": 2}})
    before = _records(path)
    db = _open(path)
    db.report_at_end()  # a build's reporter reports it
    db.remove("gone")
    for i in range(200):
        db.set(f"build:t{i}", "state", "x" * 500)
    _cap(db)
    db.dump()  # no exception: the reporter says it
    assert isinstance(db.failure, DatabaseUnwritable)
    assert db.failure.reason == "no space left on device" and db.failure.unsaved == 201
    text = str(db.failure)
    assert f"cannot write doit's database {path}: no space left on device" in text
    assert "none of the 201 record change(s) of this command was saved" in text
    assert "every target it ran runs again next time" in text
    assert _records(path) == before, "part of a failed save was kept"


def test_a_full_database_ends_another_command_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "db"
    _saved(path, {"old": {"x": 1}})
    db = _open(path)  # doit forget / ignore: no reporter
    for i in range(200):
        db.set(f"t{i}", "ignore:", "1" * 500)
    _cap(db)
    with pytest.raises(SystemExit) as ended:
        db.dump()
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot write doit's database")
    assert "(free space and run it again)" in err
    assert set(_records(path)) == {"old"}


def test_a_database_that_cannot_be_created_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no such directory" / ".doit.db"
    with pytest.raises(SystemExit) as ended:
        _open(missing)
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: cannot write doit's database {missing}: cannot open or create the file; "
        "nothing was run (free space or fix the file, then run again)\n"
    )


def test_a_file_that_is_not_a_database_stays_doits_error(tmp_path: Path) -> None:
    path = tmp_path / "db"
    path.write_bytes(b"not a database, and long enough to be read as one: " * 40)
    with pytest.raises(DatabaseException, match="corrupted"):
        _open(path)


def test_unwritable_reason_reads_the_sqlite_code_through_doits_wrapper() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
    assert unwritable_reason(full) == "no space left on device"
    try:
        try:
            raise full
        except sqlite3.Error as exc:
            raise DatabaseException("seems to use an bad format or is corrupted") from exc
    except DatabaseException as wrapped:
        assert unwritable_reason(wrapped) == "no space left on device"
    corrupt = sqlite3.DatabaseError("file is not a database")
    corrupt.sqlite_errorcode = sqlite3.SQLITE_NOTADB  # type: ignore[attr-defined]
    assert unwritable_reason(corrupt) is None
    assert unwritable_reason(ValueError("x")) is None
