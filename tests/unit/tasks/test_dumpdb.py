"""``doit dumpdb`` on the project's sqlite3 database (:mod:`metrale_orch.tasks.dumpdb`).

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/tasks/test_dumpdb.py``.
"""

from __future__ import annotations

from pathlib import Path

from doit.doit_cmd import DoitMain

from metrale_orch.tasks.dumpdb import DumpDB, db_kind, format_records


def test_the_package_replaces_doits_dumpdb() -> None:
    """Through the ``doit.COMMAND`` entry point (pyproject.toml): fails when the
    environment's metadata of the package is stale (reinstall it: pip install -e .)."""
    assert DoitMain().get_cmds().get_plugin("dumpdb") is DumpDB


def test_db_kind(tmp_path: Path) -> None:
    assert db_kind(tmp_path / "none") == "missing"
    assert db_kind(tmp_path) == ""
    (tmp_path / "junk").write_bytes(b"junk")
    assert db_kind(tmp_path / "junk") == ""


def test_format_records_as_doit_lays_out_its_dump() -> None:
    text = format_records([("a", {"x": [1, "h"]}), ("b\udcff", {})])
    assert text == "a -> {'x': [1, 'h']}\nb\\xff -> {}\n"  # printable: the raw byte
