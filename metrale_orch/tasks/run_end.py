"""How a build run ends: its exit status from its failures, or the interrupted line.

Called by :meth:`~metrale_orch.tasks.reporter.BuildReporter.complete_run` (doit's runner
calls it last) and by the doit entry module for an interrupt before the run started.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from typing import NoReturn, TextIO

from doit.exceptions import TaskFailed, UnmetDependency

from metrale_orch.errors import (
    EXIT_FAILURE,
    EXIT_USAGE,
    interrupt_exit_code,
)
from metrale_orch.tasks.report_lines import format_interrupted
from metrale_orch.tasks.values import BuildValues

__all__ = ["end_interrupted", "exit_status"]


def end_interrupted(exc: BaseException, finished: int, stream: TextIO) -> NoReturn:
    """Print :func:`format_interrupted` on ``stream`` and exit 130 (Ctrl-C) or 143 (SIGTERM).

    A second Ctrl-C while the line is written is ignored: the run is already ending.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        stream.write(format_interrupted(finished) + "\n")
        stream.flush()
    except (OSError, ValueError):  # a closed pipe must not turn into a traceback
        pass
    raise SystemExit(interrupt_exit_code(exc)) from None


def exit_status(failures: Iterable[tuple[str, object]]) -> int | None:
    """The exit status of a run from its failures, ``(task kind, doit failure)`` each (pure).

    None without failures. A dependency left unmet (the group ``build`` after
    a failed target, ``smoke:<hw>`` after its builds) follows from another
    failure and is never more than 1 itself. A target that ran and failed is 1;
    a target that could not be planned (kind ``error``: tree or configuration
    error) or any other doit error is 2. A failure's values may name its own
    status (``exit_code``: the package error's).
    """
    status: int | None = None
    for kind, fail in failures:
        if isinstance(fail, UnmetDependency):
            code = EXIT_FAILURE
        elif isinstance(fail, TaskFailed):
            values = getattr(fail, "values", None)
            declared = values.exit_code if isinstance(values, BuildValues) else None
            if kind == "error":
                code = EXIT_USAGE
            elif declared in (EXIT_FAILURE, EXIT_USAGE):
                code = int(declared)
            else:
                code = EXIT_FAILURE
        else:
            code = EXIT_USAGE
        status = code if status is None else max(status, code)
    return status
