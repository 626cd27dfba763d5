"""doit's dependency database as this package keeps it: sqlite3, written once, at the end.

:class:`Database` is doit's ``SqliteDB`` with two changes, registered as the doit
backend plugin :data:`BACKEND` (the ``doit.BACKEND`` entry point of this
package; ``DOIT_CONFIG`` selects it). What touches doit's private state is
:class:`~metrale_orch.tasks.doit_api.SavedOnceSqliteDB`; this module adds the policy:

- every write waits for the final save: doit deletes a failed task's record
  (and ``doit forget`` deletes records) at once, inside the transaction the
  save commits anyway, so a full disk could stop the run halfway through with a
  traceback; here deletes and inserts go together in one transaction that
  commits or rolls back whole;
- a database that cannot be written (a full disk, a read-only or unopenable
  file: :func:`unwritable_reason`) is one line and exit status 1
  (:class:`DatabaseUnwritable`), never doit's traceback, nor its advice to
  delete a database that is not corrupt. When the database cannot be opened
  (a fresh project on a full disk) nothing runs. When the final save fails,
  nothing of the run is saved: the old records stay, so the targets this run
  built are stale next time and build again (from the cache); the build's
  reporter prints the line with its summary and ends with status 1
  (:meth:`Database.report_at_end`), and doit's other commands (``forget``,
  ``ignore``, ``clean``, ``reset-dep``) end with it here, the one place of the
  doit side besides the reporter that prints, since no reporter runs for them.

Other sqlite errors (a file that really is not a database) stay doit's own.

A failed build keeps the record of the last good one. doit's runner deletes a failed
task's record, so its state would read "never built" although the build installed
nothing (:mod:`metrale_orch.steps.install`) and the last good artefacts are intact. In a
run (:meth:`Database.report_at_end`: doit's runner deletes a record only for a failure,
or for a record of another file checker), a build record whose installed files (the
``outputs`` of its :class:`~metrale_orch.tasks.values.BuildRecord`) all still hold what
that build installed is kept, marked :data:`~metrale_orch.tasks.doit_api.FAILED_RECORD`:
it still says truthfully which inputs those artefacts were built from, so the next run
rebuilds exactly when they changed, and ``metrale-orch why`` names what changed since,
and that the last build failed. Any other record is deleted, as doit does. The mark goes with the
next success (doit writes ``checker:`` only then).

A task's dict result (doit's ``result:`` record: what a python-action returned,
the same data as the task's values) is kept as its digest
(:func:`~metrale_orch.tasks.checker.result_digest`), in memory and on disk, as
doit keeps any other result as its md5: only ``result_dep`` reads it, comparing a
task's result with the one a dependent task saved, and the digest changes exactly
when the dict does. Kept whole it was a third of the database, decoded every run.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from pathlib import Path
from typing import NoReturn

from metrale_orch.errors import EXIT_FAILURE, MetraleError, printable
from metrale_orch.ownership import not_own
from metrale_orch.tasks.checker import ContentChecker, check_outputs, result_digest
from metrale_orch.tasks.doit_api import (
    CHECKER_RECORD,
    FAILED_RECORD,
    VALUES_RECORD,
    DatabaseException,
    SavedOnceSqliteDB,
)
from metrale_orch.tasks.values import BuildRecord

__all__ = ["BACKEND", "Database", "DatabaseUnwritable", "unwritable_reason"]

#: The backend's name for ``DOIT_CONFIG["backend"]`` (the entry point in pyproject.toml).
BACKEND = "metrale-sqlite3"

#: doit's record key of a task's result (``Dependency.save_success``, ``result_dep``).
_RESULT_RECORD = "result:"

#: sqlite's result codes for a file that cannot be written, and how to say each.
_UNWRITABLE = {
    sqlite3.SQLITE_FULL: "no space left on device",
    sqlite3.SQLITE_IOERR: "I/O error",
    sqlite3.SQLITE_CANTOPEN: "cannot open or create the file",
    sqlite3.SQLITE_READONLY: "the file is read-only",
    sqlite3.SQLITE_PERM: "permission denied",
}


class DatabaseUnwritable(MetraleError):
    """doit's database cannot be written; names the file, why, and what follows."""

    exit_code = EXIT_FAILURE

    path: Path
    reason: str
    #: How many task records the command would have changed (None: it could not be opened).
    unsaved: int | None
    #: Whether the command ran tasks (a build), rather than only changing records.
    ran: bool = False

    def __str__(self) -> str:
        head = f"cannot write doit's database {self.path}: {self.reason}"
        if self.unsaved is None:
            return f"{head}; nothing was run (free space or fix the file, then run again)"
        lost = f"{head}; none of the {self.unsaved} record change(s) of this command was saved"
        if self.ran:
            return f"{lost}: every target it ran runs again next time (from the cache where built)"
        return f"{lost} (free space and run it again)"


def unwritable_reason(exc: BaseException) -> str | None:
    """How to say why sqlite could not write (``exc`` or the error it was raised from),
    or None when ``exc`` is not about writing the file (pure)."""
    while exc is not None:
        if isinstance(exc, sqlite3.Error):
            code = getattr(exc, "sqlite_errorcode", None)
            if isinstance(code, int):
                return _UNWRITABLE.get(code & 0xFF)  # an extended code's primary part
            return None
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


class Database(SavedOnceSqliteDB):
    """doit's sqlite3 backend, written in one transaction at the end (module docstring)."""

    desc = "sqlite3, saved in one transaction; a full disk is one line (metrale-orch)"

    def __init__(self, name: str, codec: object, *, module_name: str | None = None) -> None:
        self._defer = False
        #: Why the final save failed, once it has (see :meth:`report_at_end`).
        self.failure: DatabaseUnwritable | None = None
        try:
            _drop_foreign(name)
            super().__init__(name, codec, module_name=module_name)
        except (DatabaseException, sqlite3.Error) as exc:
            reason = unwritable_reason(exc)
            if reason is None:
                raise
            _end(DatabaseUnwritable(_shown(name), reason, None))

    def set(self, task_id: str, dependency: str, value: object) -> None:
        if dependency == _RESULT_RECORD and isinstance(value, dict):
            value = result_digest(value)  # see the module docstring
        elif dependency == CHECKER_RECORD:  # a success: its record is no failed run's
            self._cache.get(task_id, {}).pop(FAILED_RECORD, None)
        super().set(task_id, dependency, value)

    def remove(self, task_id: str) -> None:
        if not (self._defer and self._keep_failed(task_id)):
            super().remove(task_id)

    def _keep_failed(self, task_id: str) -> bool:
        """Keep ``task_id``'s record, marked, when it is a build's whose installed files
        are intact (see the module docstring); whether it was kept."""
        if not self.in_(task_id):
            return False
        record = self._record(task_id)
        outputs = BuildRecord.from_values(record.get(VALUES_RECORD)).outputs
        if (
            record.get(CHECKER_RECORD) != ContentChecker.__name__
            or outputs is None
            or check_outputs(outputs)[0]
        ):
            return False
        record[FAILED_RECORD] = True
        self._dirty.add(task_id)
        return True

    def report_at_end(self) -> None:
        """A run's reporter will report a failed save (with its summary) and end the run
        with its status; until this is called, a failed save ends the process itself.
        From here a removal is doit's runner's, of a failed task (module docstring)."""
        self._defer = True

    def dump(self) -> None:
        """Save the command's changes (all or none), then close; see the module docstring."""
        unsaved = self.pending()
        try:
            super().dump()
        except sqlite3.Error as exc:
            reason = unwritable_reason(exc)
            if reason is None:
                raise
            shown = _shown(str(self.name))
            self.failure = DatabaseUnwritable(shown, reason, unsaved, self._defer)
        if self.failure is not None and not self._defer:
            _end(self.failure)


#: The files sqlite reads as the database's content: the file and its journals.
_SQLITE_FILES = ("", "-journal", "-wal", "-shm")


def _drop_foreign(name: str) -> None:
    """Remove doit's database ``name`` (and sqlite's journals of it) when it is not the
    user's own (:func:`~metrale_orch.ownership.not_own`): its records decide which targets
    are up to date, so anyone else's is ignored, with one warning, and made anew, private
    (every target is checked again; artefacts come from the cache). A new database is
    created private whatever the umask. One that cannot be removed ends the command with
    one line (:class:`DatabaseUnwritable`)."""
    for suffix in _SQLITE_FILES:
        path = name + suffix
        try:
            problem = not_own(os.stat(path))
        except FileNotFoundError:
            continue
        if problem:
            try:
                os.unlink(path)
            except OSError as exc:
                reason = f"it is {problem} and cannot be removed ({exc.strerror})"
                _end(DatabaseUnwritable(_shown(path), reason, None))
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(
                    printable(
                        f"metrale-orch: warning: doit's database {_shown(path)} is {problem}:"
                        " ignored and made anew (every target is checked again)"
                    )
                    + "\n"
                )
    # Made here, private; where it cannot be, sqlite's open says why (as before).
    with contextlib.suppress(OSError):
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def _shown(name: str) -> Path:
    """The database's path as the line shows it: absolute (doit's is relative to the root)."""
    return Path(os.path.abspath(name))


def _end(error: DatabaseUnwritable) -> NoReturn:
    """End a doit command that no reporter ends: one line on stderr, exit status 1."""
    with contextlib.suppress(OSError, ValueError):  # a closed stream must not add a traceback
        sys.stderr.write(printable(f"error: {error}") + "\n")
        sys.stderr.flush()
    raise SystemExit(error.exit_code)
