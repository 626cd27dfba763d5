"""One doit run in this process: what the tasks load once and every part of the run shares.

A :class:`Run` is made when doit loads the tasks and handed, through the doit adapter's
:func:`~metrale_orch.tasks.doit_api.current_run`, to the task creators, the reporter
and the actions. It holds:

- what doit was asked (:class:`Selection`: its command and words, the dodo file's task
  creators), and so the run's scope (:mod:`metrale_orch.graph.scope`), and whether the
  package's task loader told it;
- the configuration, loaded once;
- the toolchain probes (one :class:`~metrale_orch.toolchain.probe.ProbeMemo`: task
  generation probes each toolchain once, the builds reuse those identities);
- the build sessions (the executor running at most ``jobs`` compiles, the artefacts
  obtained) and the opened cache, which every target this process builds shares;
- the build actions in flight and the stop state (Ctrl-C, SIGTERM);
- the build log's handle (:class:`~metrale_orch.tasks.buildlog.BuildLog`);
- doit's loop: the project's build lock from its start to its end, and the run's exit
  status (:meth:`Run.begin`, :meth:`Run.end`, :meth:`Run.exit_status`). doit's runner
  calls nothing of a project's but its reporter, so the reporter hands both ends here,
  and what it gathered to :mod:`~metrale_orch.tasks.run_files`, which writes the files a
  run leaves; it only reports.

Nothing of a run is kept at module level but the adapter's reference to the current one,
so a process that runs doit again (``metrale-orch doit`` in process, a watch loop) starts
each run clean. A worker process doit forks inherits its parent's run; one it spawns
makes its own on first need (its selection then unknown). Thread-safe where doit's target
threads meet it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from doit.exceptions import TaskFailed

from metrale_orch.config import Config, load_config
from metrale_orch.errors import EXIT_FAILURE, EXIT_USAGE, MetraleError
from metrale_orch.graph.selection import Selection
from metrale_orch.tasks.buildlog import BuildLog
from metrale_orch.tasks.run_end import exit_status
from metrale_orch.tasks.runlock import BuildLock
from metrale_orch.toolchain.probe import ProbeMemo

if TYPE_CHECKING:
    from metrale_orch.cache import Cache
    from metrale_orch.executor.loop import ActionLoop
    from metrale_orch.steps.session import BuildSession

__all__ = ["RUN_ENV", "Run", "Stop"]

#: The environment variable naming the doit run (:meth:`Run.begin`): the build sessions
#: of its worker processes (forked, spawned alike) take it as theirs, so a cache entry one
#: stored counts as shared in the run for the others (``steps.session``). Not a setting,
#: and outside ``METRALE_*``, which task generation reads.
RUN_ENV = "_METRALE_ORCH_RUN"


class Stop:
    """How the run stands with Ctrl-C and SIGTERM: the signal that stopped it (0: none),
    the process running doit's loop (0: none), and the fallback timer."""

    __slots__ = ("owner", "signum", "timer")

    def __init__(self) -> None:
        self.signum = 0
        self.owner = 0
        self.timer: threading.Timer | None = None


#: A build session's identity: build directory, jobs, remote executor.
SessionKey = tuple[str, int, str]


class Run:
    """One doit run of this process (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        environ: Mapping[str, str],
        selection: Selection | None = None,
        loop: ActionLoop | None = None,
    ) -> None:
        self.root = Path(root)
        self.environ = environ
        self.selection = selection
        #: Whether doit has started loading this run's tasks (a new load is a new run).
        self.loading = False
        #: Whether the package's task loader loads them (it tells :attr:`selection`).
        self.loader = False
        self.probes = ProbeMemo()
        #: The shared build log, as this run writes it.
        self.log = BuildLog()
        self.stop = Stop()
        self._configs: dict[Path, Config] = {}
        self._lock = threading.Lock()
        self._sessions: dict[SessionKey, BuildSession] = {}
        self._cache: tuple[tuple[object, ...], Cache] | None = None
        self._active = 0
        self._active_changed = threading.Condition()
        self._build_lock: BuildLock | None = None
        #: The event loop the run's sessions share: lent (a watch keeps one across its
        #: runs), or made with the first session and closed with the run.
        self._loop, self._owns_loop = loop, loop is None
        self._loop_lock = threading.Lock()

    # -- configuration --

    def config(self, root: Path | None = None) -> Config:
        """The configuration of the project at ``root`` (default: the run's), loaded once
        per run. Raises :class:`~metrale_orch.config.ConfigError`."""
        where = self.root if root is None else Path(root)
        with self._lock:
            got = self._configs.get(where)
        if got is None:
            got = load_config(where, self.environ)
            with self._lock:
                got = self._configs.setdefault(where, got)
        return got

    def loaded_config(self) -> Config | None:
        """:meth:`config`, or None when the configuration cannot be loaded (whoever needs
        the error asks :meth:`config`)."""
        try:
            return self.config()
        except MetraleError:
            return None

    # -- the shared build state --

    def session(self, key: SessionKey, make: Callable[[], BuildSession]) -> BuildSession:
        """The build session of ``key``, made by ``make`` on first use."""
        with self._lock:
            got = self._sessions.get(key)
            if got is None:
                got = self._sessions[key] = make()
            return got

    def sessions(self) -> list[BuildSession]:
        """This process's build sessions so far."""
        with self._lock:
            return list(self._sessions.values())

    def cache(self, key: tuple[object, ...], make: Callable[[], Cache]) -> Cache:
        """The cache opened for ``key`` (the settings that name it), made on first use: a
        remote tier's circuit breaker and connections live once per process."""
        with self._lock:
            if self._cache is None or self._cache[0] != key:
                self._cache = (key, make())
            return self._cache[1]

    @property
    def loop(self) -> ActionLoop:
        """The event loop the run's build sessions run their module pipelines on."""
        with self._loop_lock:
            if self._loop is None:
                from metrale_orch.executor.loop import ActionLoop  # a build's, not a no-op's
                from metrale_orch.steps.session import LOOP_WORKERS

                self._loop = ActionLoop(LOOP_WORKERS)
            return self._loop

    def close(self) -> None:
        """Close the build sessions, the loop the run made and the build log, and discard
        the early runs no probe took (a process that starts a new run: doit run again,
        tests)."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.close()
        with self._loop_lock:
            loop, self._loop = (self._loop, None) if self._owns_loop else (None, self._loop)
        if loop is not None:
            loop.close()
        self.probes.early.discard()
        self.log.close()

    # -- the build actions in flight --

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Count a build action as running for the ``with`` block."""
        with self._active_changed:
            self._active += 1
        try:
            yield
        finally:
            with self._active_changed:
                self._active -= 1
                self._active_changed.notify_all()

    def wait_for_builds(self, timeout: float) -> bool:
        """Wait until no build action runs (True), at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._active_changed:
            while self._active:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._active_changed.wait(left)
        return True

    # -- doit's loop --

    def begin(self, say: Callable[[str], None]) -> None:
        """doit's loop starts in this process (before its first up-to-date check of a run
        that executes tasks; never for ``list``): take the project's build lock, one build
        per project until :meth:`end` (``say``: that another build holds it, or that the
        build directory cannot hold one; none when the configuration is broken, as every
        target then fails with that error). From here a first Ctrl-C or SIGTERM stops the
        run gracefully, and the run has its identity (:data:`RUN_ENV`), which every worker
        process it starts inherits."""
        self._build_lock = self._take_build_lock(say)
        self.stop.signum = 0
        self.stop.owner = os.getpid()
        os.environ[RUN_ENV] = uuid.uuid4().hex

    def _take_build_lock(self, say: Callable[[str], None]) -> BuildLock | None:
        config = self.loaded_config()
        if config is None:
            return None
        build_dir = config.build_dir
        lock = BuildLock(build_dir)
        try:
            lock.acquire(say)
        except OSError as exc:
            say(f"metrale-orch: cannot take the build lock in {build_dir}: {exc}")
            return None
        return lock

    def end(self, *, interrupted: bool) -> None:
        """doit's loop has ended and doit has saved every finished task. An interrupted run
        first stops its compiles and lets the targets still installing finish (at most
        10 s), so nothing half-written is left; then the next build may take the lock."""
        stop = self.stop
        stop.owner = 0
        os.environ.pop(RUN_ENV, None)
        if stop.timer is not None:
            stop.timer.cancel()
            stop.timer = None
        if interrupted:
            for session in self.sessions():
                session.stop()
            self.wait_for_builds(10)
        if self._build_lock is not None:
            self._build_lock.release()
            self._build_lock = None
        self.log.flush()  # the run's lines are in the file when it ends

    @staticmethod
    def exit_status(
        failures: Iterable[tuple[str, BaseException]], unsaved: int | None = None
    ) -> int | None:
        """The status the run exits with when it is not what doit's runner returns, else
        None: from its failures (``(task kind, doit failure)`` each, see
        :func:`~metrale_orch.tasks.run_end.exit_status`) and, when doit's database could
        not be saved, that error's status (doit's own status says nothing of it)."""
        failures = list(failures)
        status = exit_status(failures)
        if unsaved is not None:
            status = max(status or 0, unsaved)
        doit_status = EXIT_FAILURE if failures else 0
        if any(not isinstance(fail, TaskFailed) for _kind, fail in failures):
            doit_status = EXIT_USAGE  # doit's runner: 2 when a failure is no TaskFailed
        return None if status is None or status == doit_status else status
