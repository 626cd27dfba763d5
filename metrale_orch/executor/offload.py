"""The remote executor: compile actions on a Remote Execution API engine, honest fallback.

:class:`RemoteExecutor` sends every action that has a usable
:class:`~metrale_orch.executor.RemoteForm` to a :class:`RemoteBackend` (the REAPI
glue, :mod:`metrale_orch.executor.reapi`), at most ``remote_jobs`` at once and
independently of the local ``jobs``; everything else runs on its
:class:`~metrale_orch.executor.LocalExecutor`. Where each action ran is said on its
:class:`~metrale_orch.proc.Completed` (``where``) and counted per owner (the target
that asked), with the reason for each local run.

How many go out at once follows the engine's queue (:class:`Window`): REAPI reports no
worker count, so ``remote_jobs`` is the most, and the window backs off while actions
wait long for a worker, then grows again.

Failures keep their meaning. A remote compile that exits non-zero is a compile error
(:class:`~metrale_orch.proc.ProcessError`, as a local one), never retried here. An
infrastructure failure (:class:`RemoteUnavailable`: unreachable, deadline, no worker
for the platform, a lost worker, a corrupt blob) runs the action here instead, and
after :data:`BREAKER_FAILURES` of them in a row the remote is not asked again this
run (a circuit breaker: a dead endpoint costs one deadline, not one per action);
with ``strict`` it is a failure of the module instead (CI, where a silent fallback
would hide a broken farm).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from metrale_orch.errors import MetraleError
from metrale_orch.executor.action import Action, ActionStopped, RemoteForm
from metrale_orch.executor.local import LocalExecutor
from metrale_orch.proc import Completed, ProcessError

__all__ = [
    "BREAKER_FAILURES",
    "RemoteBackend",
    "RemoteCounts",
    "RemoteExecutor",
    "RemoteRun",
    "RemoteUnavailable",
    "Window",
]

#: Infrastructure failures in a row after which the remote is not asked again this run.
BREAKER_FAILURES = 3
#: Seconds of waiting for a worker that count as a queue building up (see :class:`Window`).
QUEUE_LONG = 0.25
#: Actions the remote window starts with (see :class:`Window`).
START = 16


class RemoteUnavailable(MetraleError):
    """Remote execution could not run an action (infrastructure, not the compile):
    ``reason`` is short and human ("unreachable: grpc://…", "no worker for platform …")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteRun:
    """What a remote action came back with (its outputs in memory, written nowhere)."""

    returncode: int
    stdout: str
    stderr: str
    #: Wall seconds from sending to having the outputs here.
    seconds: float
    #: Whether the engine's action cache answered (nothing ran).
    cached: bool = False
    #: The worker's stages: name ("queued", "executing", "uploading", "downloading") ->
    #: (start, end) in ``time.time()`` seconds, where the engine reported them.
    stages: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    #: The worker that ran it, where known.
    worker: str = ""
    #: A run that exited 0: each declared output's bytes, by its local path
    #: (:attr:`RemoteForm.outputs`); the caller uses them where it would read the file.
    outputs: Mapping[Path, bytes] = field(default_factory=dict)


class RemoteBackend(Protocol):
    """Runs one remote form on an engine and brings its outputs back in memory.
    Raises :class:`RemoteUnavailable` for infrastructure trouble; a non-zero exit is a
    :class:`RemoteRun`. ``close`` may be called from any thread: calls in flight fail."""

    @property
    def endpoint(self) -> str: ...

    async def run(
        self,
        form: RemoteForm,
        *,
        timeout: float,
        started: Callable[[float], None] | None = None,
    ) -> RemoteRun:
        """On the build's event loop; cancelled (its calls with it) when the build stops.
        ``started`` is told the seconds the action waited for a worker, when one takes it."""
        ...

    def close(self) -> None: ...


@dataclass(slots=True)
class RemoteCounts:
    """Where one owner's actions ran: remotely, from the action cache, here (by reason)."""

    remote: int = 0
    action_cache: int = 0
    local: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready (sorted; zero counts left out)."""
        out: dict[str, object] = {}
        if self.remote:
            out["remote"] = self.remote
        if self.action_cache:
            out["action_cache"] = self.action_cache
        if self.local:
            out["local"] = dict(sorted(self.local.items()))
        return out


class _Breaker:
    """Opens after :data:`BREAKER_FAILURES` infrastructure failures in a row."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures = 0
        self.reason = ""

    @property
    def open(self) -> bool:
        with self._lock:
            return self._failures >= BREAKER_FAILURES

    def failed(self, reason: str) -> None:
        with self._lock:
            self._failures += 1
            if self._failures >= BREAKER_FAILURES and not self.reason:
                self.reason = reason

    def succeeded(self) -> None:
        with self._lock:
            if self._failures < BREAKER_FAILURES:
                self._failures = 0


class Window:
    """How many actions the engine is given at once. REAPI reports no worker count, and an
    engine that serves each call on a thread of a small pool (BuildGrid: 64) refuses its
    own workers' calls once the Execute streams hold them all, so the window starts at
    :data:`START` (``ceiling``, ``remote_jobs``, when smaller) and grows as the engine
    shows room: by one for each action a worker takes within ``QUEUE_LONG / 2`` of its
    sending (:meth:`started`: the window doubles per round trip while workers are free),
    and by one for each that ends having hardly waited, or with no stage times (a cache
    hit, an engine that reports none); up to ``ceiling``. It follows the engine's queue
    down: an action that waited at least :data:`QUEUE_LONG` seconds, and at least half its
    run, for a worker shrinks it by a quarter, one the engine refused for a while as
    overloaded (RESOURCE_EXHAUSTED: its ``throttled`` stage) halves it, either at most
    once per window of actions ending."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.limit = min(ceiling, START)
        #: Actions to end before the window may shrink again.
        self._hold = 0

    def started(self, waited: float) -> None:
        """A worker took an action ``waited`` seconds after it was sent."""
        if waited < QUEUE_LONG / 2:
            self.limit = min(self.ceiling, self.limit + 1)

    def ended(self, stages: Mapping[str, tuple[float, float]]) -> None:
        """Adjust to one action's stage times (see the class docstring)."""
        queued, ran = stages.get("queued"), stages.get("executing")
        if "throttled" in stages:
            self._hold = max(0, self._hold - 1)
            self._shrink(self.limit // 2)
            return
        if queued is None:
            self.limit = min(self.ceiling, self.limit + 1)
            return
        waited = queued[1] - queued[0]
        self._hold = max(0, self._hold - 1)
        if waited >= QUEUE_LONG and (ran is None or waited >= (ran[1] - ran[0]) / 2):
            self._shrink(self.limit * 3 // 4)
        elif waited < QUEUE_LONG / 2:
            self.limit = min(self.ceiling, self.limit + 1)

    def _shrink(self, to: int) -> None:
        if not self._hold:
            self.limit = max(1, to)
            self._hold = self.limit


class RemoteExecutor:
    """See the module docstring. :meth:`run` is a coroutine of the build's event loop;
    :meth:`stop`, :meth:`counts` and the properties may be called from any thread."""

    def __init__(
        self,
        backend: RemoteBackend,
        local: LocalExecutor,
        *,
        remote_jobs: int = 100,
        strict: bool = False,
    ) -> None:
        self.backend = backend
        self.local = local
        self.strict = strict
        self._remote_jobs = remote_jobs
        #: Actions sent and not back, the window they must fit, and the senders waiting
        #: for room (futures of the loop, woken by one coming back or by stop()).
        self._sent = 0
        self.window = Window(remote_jobs)
        self._room: collections.deque[asyncio.Future[None]] = collections.deque()
        #: The calls in flight, cancelled by stop().
        self._calls: set[asyncio.Future[RemoteRun]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancel = threading.Event()
        self._breaker = _Breaker()
        self._lock = threading.Lock()
        self._counts: dict[str, RemoteCounts] = {}

    @property
    def jobs(self) -> int:
        """How many actions may be in flight at once: the remote budget (the local one
        still caps what runs here)."""
        return max(self.local.jobs, self._remote_jobs)

    @property
    def running(self) -> int:
        return self.local.running + len(self._calls)

    @property
    def memory(self) -> tuple[int, int]:
        """The local executor's memory in use and budget (remote actions take none here)."""
        return self.local.memory

    def stop(self) -> None:
        self._cancel.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._stopped_on_loop)
        self.local.stop()
        self.backend.close()  # calls in flight fail at once: nothing waits for the engine

    def _stopped_on_loop(self) -> None:
        for call in list(self._calls):
            call.cancel()
        while self._room:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        self.backend.close()

    def counts(self, owner: str) -> RemoteCounts:
        """Where ``owner``'s actions ran so far, and forget them (the caller reports them)."""
        with self._lock:
            return self._counts.pop(owner, RemoteCounts())

    async def run(self, action: Action) -> Completed:
        self._loop = asyncio.get_running_loop()
        if self._cancel.is_set():
            raise ActionStopped(f"{action.label or action.argv[0]}: not started: the build stopped")
        form = action.remote
        if form is None:
            return await self._here(action, "no remote form")
        if form.local_reason:
            return await self._here(action, form.local_reason)
        if self._breaker.open:  # counted under the failure that opened it
            return await self._unavailable(action, self._breaker.reason)
        try:
            run = await self._send(action, form)
        except RemoteUnavailable as exc:
            self._breaker.failed(exc.reason)
            return await self._unavailable(action, exc.reason)
        self._breaker.succeeded()
        with self._lock:
            counts = self._counts.setdefault(action.owner, RemoteCounts())
            if run.cached:
                counts.action_cache += 1
            else:
                counts.remote += 1
        where = "remote (action cache)" if run.cached else "remote"
        if run.returncode != 0:  # the compile failed there: a compile error, as here
            raise ProcessError(form.argv, run.returncode, output=run.stdout + run.stderr)
        return Completed(
            argv=form.argv,
            returncode=run.returncode,
            stdout=run.stdout,
            stderr=run.stderr,
            seconds=run.seconds,
            where=where,
            stages=run.stages,
            outputs=run.outputs,
        )

    async def _send(self, action: Action, form: RemoteForm) -> RemoteRun:
        loop = asyncio.get_running_loop()
        while self._sent >= self.window.limit:
            if self._cancel.is_set():
                raise ActionStopped(f"{action.label or action.argv[0]}: not started: stopped")
            waiter: asyncio.Future[None] = loop.create_future()
            self._room.append(waiter)
            await waiter
        if self._cancel.is_set():
            raise ActionStopped(f"{action.label or action.argv[0]}: not started: stopped")
        self._sent += 1
        run: RemoteRun | None = None
        call = asyncio.ensure_future(
            self.backend.run(form, timeout=action.timeout, started=self._started)
        )
        self._calls.add(call)
        try:
            run = await call
        except (Exception, asyncio.CancelledError):
            if self._cancel.is_set():  # stopped: whatever the call raised (grpc's
                # "Channel closed!", a cancellation), the action was stopped
                raise ActionStopped(f"{action.label or action.argv[0]}: stopped") from None
            raise
        finally:
            self._calls.discard(call)
            self._sent -= 1
            was = self.window.limit
            if run is not None:
                self.window.ended(run.stages)
            # One free place, or more when the window grew.
            self._wake(max(1, self.window.limit - was + 1))
        if self._cancel.is_set():
            raise ActionStopped(f"{action.label or action.argv[0]}: stopped")
        return run

    def _started(self, waited: float) -> None:
        """A worker took one of the actions sent (on the loop): the window may grow."""
        was = self.window.limit
        self.window.started(waited)
        self._wake(self.window.limit - was)

    def _wake(self, places: int) -> None:
        while places > 0 and self._room:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)
                places -= 1

    async def _unavailable(self, action: Action, reason: str) -> Completed:
        if self.strict:
            raise ProcessError(
                action.argv,
                None,
                reason=f"remote execution failed ({reason}); remote_strict forbids running it here",
            )
        return await self._here(action, reason)

    async def _here(self, action: Action, reason: str) -> Completed:
        start = time.perf_counter()
        done = await self.local.run(action)
        with self._lock:
            self._counts.setdefault(action.owner, RemoteCounts()).local[reason] += 1
        return Completed(
            argv=done.argv,
            returncode=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr,
            seconds=done.seconds or time.perf_counter() - start,
            where=f"local: {reason}",
        )
