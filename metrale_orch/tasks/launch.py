"""doit, started by the package: ``metrale-orch doit ARGS`` is ``doit ARGS`` that can speak
about its own configuration files.

doit reads ``./pyproject.toml`` (``[tool.doit]``, with ``tomllib``) and ``./doit.cfg`` in
``DoitMain.__init__``, before it loads a plugin, a command or ``dodo.py``: nothing of this
package runs before that, so a file doit cannot parse ends ``doit`` in a traceback out of
``tomllib`` (or ``configparser``) with exit status 1, whatever the package does. Short of
code run at every interpreter start (a ``.pth`` file), there is no earlier hook.
:func:`run_doit` reads both files first, the way doit will, and raises one
:class:`~metrale_orch.config.ConfigError` naming the file (for TOML, the line and column);
then it runs doit's own ``DoitMain`` in this process on the same arguments, with the
package's task loader (:mod:`metrale_orch.tasks.loader`, doit's documented door: it tells
the run what doit was asked), so everything else (tasks, options, reporter, exit status)
is doit's.

I/O: reads the files in the working directory and runs doit there, as ``doit`` does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from doit.doit_cmd import DoitMain

from metrale_orch.config import ConfigError, read_pyproject
from metrale_orch.tasks.doit_api import current_run, new_run, read_config_file
from metrale_orch.tasks.loader import Loader

if TYPE_CHECKING:
    from metrale_orch.executor.loop import ActionLoop

__all__ = ["DOIT_FILES", "read_doit_config", "run_doit", "run_doit_again"]

#: The configuration files doit reads from its working directory, in its order.
DOIT_FILES = ("pyproject.toml", "doit.cfg")


class _Main(DoitMain):  # type: ignore[misc]
    """doit's main, naming the command as the user typed it in its messages."""

    BIN_NAME = "metrale-orch doit"


def read_doit_config() -> None:
    """Read doit's configuration files in the working directory as ``doit`` will (I/O).

    Raises :class:`~metrale_orch.config.ConfigError` naming the file: the TOML error's
    line and column for a ``pyproject.toml`` that does not parse, doit's own complaint
    for a ``[tool.doit]`` table or a ``doit.cfg`` doit cannot use.
    """
    for name in DOIT_FILES:
        if not os.path.isfile(name):
            continue
        if name == "pyproject.toml":
            read_pyproject(Path(name))  # the TOML error, with its line and column
        try:
            read_config_file(name)
        except Exception as exc:  # whatever doit's reader raises is the file's problem
            key = "[tool.doit]" if name == "pyproject.toml" else "(file)"
            text = " ".join(str(exc).split())  # configparser's messages span lines
            what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
            raise ConfigError(name, key, f"doit cannot read it ({what})") from None


def run_doit(args: Sequence[str], outfile: TextIO | None = None) -> int:
    """``doit ARGS`` in the working directory, after :func:`read_doit_config`; returns
    doit's exit status. ``outfile``: where the reporter writes (None: standard output, as
    doit's own default). Raises ``ConfigError``.

    The process's ``sys.stdout`` and ``sys.stderr`` are its own again afterwards: doit's
    thread runner swaps them for a capture around each python-action, unlocked, so two
    targets finishing at once can leave one's capture in place, and what a process that
    goes on prints (doit run again, a watch loop's line) would vanish into it."""
    read_doit_config()
    extra = None if outfile is None else {"run": {"outfile": outfile}}
    streams = sys.stdout, sys.stderr
    try:
        status = _Main(task_loader=Loader(), extra_config=extra).run(list(args))
    finally:
        sys.stdout, sys.stderr = streams
    return 0 if status is None else int(status)  # some commands (forget) return None


def run_doit_again(
    args: Sequence[str], outfile: TextIO, *, fresh: bool, loop: ActionLoop | None = None
) -> int:
    """:func:`run_doit` once more in this process (the edit loop, ``metrale-orch watch``),
    on the run the last one left: its configuration, toolchain probes, build sessions and
    opened cache serve this one too (doit loads the tasks anew, through the task cache).
    ``fresh``: begin a new run instead (what those were made from changed: the
    configuration, a toolchain definition); ``loop``: the event loop its sessions are lent
    (the watch's own, which its watcher runs on too). Raises ``ConfigError``."""
    if fresh:
        new_run(Path.cwd(), os.environ, loop)
    else:
        current_run().loading = False  # the next load takes this run, not a new one
    return run_doit(args, outfile)
