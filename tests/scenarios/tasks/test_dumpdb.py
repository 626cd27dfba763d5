"""``doit dumpdb`` on the project's sqlite3 database (:mod:`metrale_orch.tasks.dumpdb`).

Run as a user runs it: ``python -m doit dumpdb`` in a project after a build
(the fake recording compiler, so no nvcc is needed).

The tests of this topic that run in-process are in ``tests/unit/tasks/test_dumpdb.py``.
"""

from __future__ import annotations

import dbm.dumb
import json
from pathlib import Path

from metrale_orch.tasks.dumpdb import db_kind
from tests.support.build import fake_toolchain_env, small_tree
from tests.support.trust import base_env, doit_run, with_path, write_files


def _env(tmp_path: Path) -> dict[str, str]:
    fake = fake_toolchain_env(tmp_path / "fakebin")
    return with_path(base_env(tmp_path / "cache"), Path(fake["PATH"]))


def test_dumpdb_after_a_build_prints_the_saved_state(tmp_path: Path) -> None:
    root = write_files(small_tree(tmp_path / "proj"), {})
    env = _env(tmp_path)
    built = doit_run(root, ["build"], env)
    assert built.returncode == 0, built.text
    run = doit_run(root, ["dumpdb"], env)
    assert run.returncode == 0, run.text
    assert "Traceback" not in run.text and run.err == ""
    lines = run.out.splitlines()
    assert lines[0] == "DBM type is 'sqlite3' (2 task records)"
    # Every task's record, decoded (not the marshal text the codec stores).
    assert lines[1].startswith("build -> ")
    target = next(i for i, ln in enumerate(lines) if ln.startswith("build:hw1/m1/q1 -> {"))
    record = "\n".join(lines[target:])
    assert "'outcome': 'built'" in record and "'signature':" in record
    assert "'kernels/hw1/common/add.cu': " in record
    # Reading never writes: a second dump is the same, and so is the next no-op build.
    assert doit_run(root, ["dumpdb"], env).out == run.out
    again = doit_run(root, ["build"], env)
    assert again.returncode == 0 and "0 built" in again.out, again.text


def test_dumpdb_without_a_database_says_so_in_one_line(tmp_path: Path) -> None:
    root = write_files(small_tree(tmp_path / "proj"), {})
    run = doit_run(root, ["dumpdb"], _env(tmp_path))
    assert run.returncode == 3, run.text
    assert run.out == ""
    assert run.err == (
        "ERROR: no dependency database .doit.db: nothing has been built here yet "
        "(run doit first, in the project's root)\n"
    )
    assert not (root / ".doit.db").exists()  # not created by looking


def test_dumpdb_on_a_damaged_database_says_so_in_one_line(tmp_path: Path) -> None:
    root = write_files(small_tree(tmp_path / "proj"), {})
    env = _env(tmp_path)
    (root / ".doit.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    run = doit_run(root, ["dumpdb"], env)
    assert run.returncode == 3 and "Traceback" not in run.text, run.text
    assert run.err.startswith("ERROR: .doit.db cannot be read as doit's sqlite3 database: ")
    assert len(run.err.splitlines()) == 1
    (root / ".doit.db").write_bytes(b"not a database")
    run = doit_run(root, ["dumpdb"], env)
    assert run.returncode == 3, run.text
    assert run.err == "ERROR: .doit.db is neither a dbm nor a sqlite3 database\n"


def test_a_dbm_database_goes_to_doits_own_dump(tmp_path: Path) -> None:
    """Another project of the environment (doit's default dbm backend) is not affected."""
    with dbm.dumb.open(str(tmp_path / "other.db"), "c") as db:
        db["t"] = json.dumps({"a.txt": [1, 2, "h"]})
    assert db_kind(tmp_path / "other.db") == "dbm.dumb"
    run = doit_run(tmp_path, ["dumpdb", "--db-file", "other.db"], _env(tmp_path))
    assert run.returncode == 0, run.text
    assert run.out == "DBM type is 'dbm.dumb'\nb't' -> {'a.txt': [1, 2, 'h']}\n"
