"""A compile's temporary directory under the build's ``.tmp``: its name, and the sweep of
those that killed compiles left.

A compile's directory is ``<module>.<pid>.<random>``: :func:`scratch_name` makes the name
(the executor that runs the compile here makes the directory, and fails when it exists);
:func:`sweep_tmp` removes a directory whose process no longer runs, or older than a day.

I/O: :func:`sweep_tmp` lists and removes; :func:`scratch_name` touches no file.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import shutil
import time
from pathlib import Path

__all__ = ["scratch_name", "sweep_tmp"]

#: A name's part past its pid: a random part drawn once per process, then a count (a name
#: an earlier process of the same pid left is refused by the executor's mkdir).
#: ``secrets.token_hex`` per compile was a ``getrandom`` call on the event loop.
_SALT = secrets.token_hex(4)
_COUNT = itertools.count()


def scratch_name(module: str) -> str:
    """A new ``<module>.<pid>.<random>`` for one compile's directory."""
    return f"{module}.{os.getpid()}.{_SALT}{next(_COUNT):x}"


def sweep_tmp(tmp_root: Path, log: logging.Logger) -> None:
    """Remove leftovers of killed compiles under ``tmp_root`` (once per session: the
    caller asks :meth:`BuildSession.first_sweep`).

    A compile's directory (:func:`scratch_name`) is a leftover when
    that process no longer runs, or when it is older than a day.
    """
    try:
        entries = list(os.scandir(tmp_root))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        parts = entry.name.rsplit(".", 2)
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if pid == os.getpid() or (pid and _alive(pid) and age < 86400):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        log.info("removed the leftover %s of an interrupted compile", entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
