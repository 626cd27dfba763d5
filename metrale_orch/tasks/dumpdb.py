"""``doit dumpdb`` that reads the project's sqlite3 database (a doit command plugin).

doit's own ``dumpdb`` reads only ``dbm`` files: on the sqlite3 database
:mod:`metrale_orch.dodo` configures (``backend: sqlite3``) it ends in a
``dbm.error`` traceback. The package registers :class:`DumpDB` as doit's
``dumpdb`` (the ``doit.COMMAND`` entry point in ``pyproject.toml``; doit lets a
plugin replace a core command of the same name), so in an environment with
metrale-orch installed:

- a sqlite3 database is printed one task per record, sorted by task name, each
  decoded with the project's :class:`~metrale_orch.tasks.checker.TaskDataCodec`
  (which reads doit's plain JSON records too) and laid out as doit lays out
  its own dump (``name -> {...}``);
- a ``dbm`` database (another project of the environment) goes to doit's own
  command, unchanged;
- a missing, unknown or corrupted database is one line (doit's ``ERROR: ...``,
  exit status 3), never a traceback.

The database is read through doit's own backend
(:mod:`~metrale_orch.tasks.doit_api`) and closed without doit's final dump: no
record is ever written, and a missing file is not created.
"""

from __future__ import annotations

import os
import pprint
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from dbm import whichdb
from pathlib import Path

from doit.cmd_dumpdb import DumpDB as DoitDumpDB
from doit.dependency import DatabaseException
from doit.exceptions import InvalidCommand

from metrale_orch.errors import printable
from metrale_orch.tasks.checker import ContentChecker, TaskDataCodec
from metrale_orch.tasks.doit_api import open_dependency, stored_records

__all__ = ["DumpDB", "db_kind", "format_records"]

#: The first bytes of every sqlite3 database file.
_SQLITE_MAGIC = b"SQLite format 3\x00"


def db_kind(dep_file: Path) -> str:
    """``"sqlite3"``, a ``dbm`` module's name (:func:`dbm.whichdb`), ``""`` for a file no
    backend reads, or ``"missing"`` (I/O: reads the file's first bytes)."""
    try:
        with open(dep_file, "rb") as fh:
            if fh.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC:
                return "sqlite3"
    except IsADirectoryError:
        return ""
    except OSError:
        pass  # dbm.dumb keeps <name>.dat and <name>.dir, never <name> itself
    kind = whichdb(os.fspath(dep_file))
    return "missing" if kind is None else kind


def format_records(records: Sequence[tuple[str, object]]) -> str:
    """The dump's text (pure): one ``name -> record`` per task, as doit's ``dumpdb``."""
    return "".join(
        printable(f"{name} -> {pprint.pformat(record, indent=4, width=100)}\n")
        for name, record in records
    )


class DumpDB(DoitDumpDB):  # type: ignore[misc]
    """dump dependency DB (the sqlite3 backend too, decoded)"""

    doc_purpose = "dump dependency DB (dbm or sqlite3: every task's saved record)"

    def execute(self, opt_values: Mapping[str, object], pos_args: Sequence[str]) -> int:
        dep_file = Path(str(opt_values["dep_file"]))
        kind = db_kind(dep_file)
        if kind == "missing":
            raise InvalidCommand(
                f"no dependency database {dep_file}: nothing has been built here yet "
                "(run doit first, in the project's root)"
            )
        if kind == "":
            raise InvalidCommand(f"{dep_file} is neither a dbm nor a sqlite3 database")
        if kind != "sqlite3":
            super().execute(opt_values, pos_args)
            return 0
        try:
            with open_dependency(
                dep_file, checker_cls=ContentChecker, codec_cls=TaskDataCodec
            ) as dep:
                records = stored_records(dep)
        except (DatabaseException, sqlite3.DatabaseError) as exc:
            raise InvalidCommand(
                f"{dep_file} cannot be read as doit's sqlite3 database: {str(exc).splitlines()[0]}"
            ) from None
        sys.stdout.write(f"DBM type is 'sqlite3' ({len(records)} task records)\n")
        sys.stdout.write(format_records(records))
        return 0
