"""The shared build log (``build/metrale-orch.log``), written by one thread per process.

A thread that logs puts the record on a queue (no file work, no file lock) and
goes on; a listener thread writes the queue to the file through
concurrent-log-handler, which keeps several processes (doit's ``-P process``
workers) from interleaving or losing lines while rotating. Writing in the
logging thread itself held the handler's lock across a file lock and half a
dozen system calls, and with a hundred module threads each needing the
interpreter back after every call that lock became a convoy every compile start
queued behind (E3 in bench/HISTORY.md).

The records of a target are on disk when its doit action returns
(:meth:`BuildLog.flush`), and everything else when the run is closed or the process
exits (the listener is stopped then; a forked worker, which exits without running
``atexit``, flushes after each action). The handler lives on the package
logger, like any handler: a forked child finds its parent's there, without its
listener thread, and replaces it.

A :class:`BuildLog` belongs to a run (:class:`~metrale_orch.tasks.run.Run` holds it):
nothing of it is kept at module level, and closing the run closes its log, so a process
that runs doit again starts the next run's log afresh.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from logging.handlers import QueueHandler, QueueListener
from pathlib import Path

from metrale_orch.paths import LOG_NAME

__all__ = ["BuildLog"]

#: The package logger every module logs under (``metrale_orch.*``).
PACKAGE = "metrale_orch"
FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"


class _BuildLogHandler(QueueHandler):
    """The package logger's handler: records to the queue of this process's listener."""

    def __init__(self, path: Path, *, max_bytes: int, backups: int) -> None:
        from concurrent_log_handler import ConcurrentRotatingFileHandler

        self.records: queue.Queue[logging.LogRecord | None] = queue.Queue()
        super().__init__(self.records)
        self.path = path
        self.pid = os.getpid()
        writer = ConcurrentRotatingFileHandler(
            str(path), mode="a", maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )
        writer.setFormatter(logging.Formatter(FORMAT))
        self.writer = writer
        self.listener = QueueListener(self.records, writer)
        self.listener.start()
        self.running = True
        atexit.register(self.stop)

    def enqueue(self, record: logging.LogRecord) -> None:
        if self.running and self.pid == os.getpid():
            self.records.put_nowait(record)
        else:  # after the listener stopped, or in a forked child not configured yet
            self.writer.handle(record)

    def flush(self) -> None:
        """Return once every record put so far is written (this process's own only)."""
        if self.running and self.pid == os.getpid():
            self.records.join()

    def stop(self) -> None:
        """Write what is queued and end the listener (once; later records are written
        directly, and :func:`logging.shutdown` closes the file)."""
        atexit.unregister(self.stop)
        if self.running and self.pid == os.getpid():
            self.running = False
            self.listener.stop()

    def close(self) -> None:
        """Stop the listener (what is queued is written) and close the file."""
        self.stop()
        self.writer.close()
        super().close()


class BuildLog:
    """A run's side of the shared build log (see the module docstring)."""

    def __init__(self) -> None:
        #: doit's target threads open the log at once: one of them adds the handler.
        self._configuring = threading.Lock()

    def open(self, build_dir: Path, *, max_bytes: int, backups: int) -> logging.Logger:
        """Attach the shared rotating build log under ``build_dir`` to the package logger
        (idempotent per process) and return the logger.

        A process logs to one build directory at a time: opening another one (a
        long-lived process, or the test suite, building a second project) closes the
        first one's handler after writing what it queued, so no project's records land
        in an earlier project's log and no listener thread outlives its use.

        Every process (doit's and each worker) opens the same file with the same
        rotation settings, as concurrent-log-handler requires.
        """
        pkg = logging.getLogger(PACKAGE)
        path = (Path(build_dir) / LOG_NAME).resolve()
        with self._configuring:
            for handler in _handlers():
                if handler.pid != os.getpid():  # inherited through fork: no listener here
                    pkg.removeHandler(handler)
                elif handler.path == path:
                    return pkg
                else:  # another build directory's: its records are written, then it goes
                    pkg.removeHandler(handler)
                    handler.close()
            Path(build_dir).mkdir(parents=True, exist_ok=True)
            pkg.addHandler(_BuildLogHandler(path, max_bytes=max_bytes, backups=backups))
            if pkg.level == logging.NOTSET or pkg.level > logging.INFO:
                pkg.setLevel(logging.INFO)
        return pkg

    def flush(self) -> None:
        """Wait until this process's build-log records so far are in the file."""
        for handler in _handlers():
            handler.flush()

    def close(self) -> None:
        """Write what is queued and detach this process's handler (the run is over)."""
        pkg = logging.getLogger(PACKAGE)
        with self._configuring:
            for handler in _handlers():
                if handler.pid == os.getpid():
                    pkg.removeHandler(handler)
                    handler.close()


def _handlers() -> list[_BuildLogHandler]:
    """The build-log handlers on the package logger."""
    handlers = logging.getLogger(PACKAGE).handlers
    return [h for h in handlers if isinstance(h, _BuildLogHandler)]
