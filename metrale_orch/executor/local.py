"""The local executor: compile actions as subprocesses of this process, ``jobs`` at a time.

Each action runs in a process group of its own (``start_new_session``), so
:meth:`LocalExecutor.stop` ends a compiler and everything it started (nvcc's
``cicc``, ``ptxas``, the host compiler) at once: SIGTERM to the group, then
SIGKILL to what is left after a grace period. A terminal's Ctrl-C reaches
this process only; the build turns it into :meth:`~LocalExecutor.stop`.

An action starts only while its predicted peak memory fits beside the running ones'
(:mod:`metrale_orch.executor.memory`); each one's measured peak comes back on its
:class:`~metrale_orch.proc.Completed`. One killed by SIGKILL that this executor did
not send (the out-of-memory killer's), or whose tool was (nvcc's ``cicc``), runs again
once, alone, and is then reported as killed for memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from metrale_orch.executor.action import Action, ActionStopped
from metrale_orch.executor.memory import KILLED_FOR_MEMORY, available_memory, killed_for_memory
from metrale_orch.executor.reaping import OutputFiles, reap
from metrale_orch.executor.slots import MachineSlots, PrioritySlots
from metrale_orch.proc import (
    Completed,
    Measured,
    ProcessError,
    decode_output,
    finished,
    start_process,
    timed_out,
)

__all__ = ["LocalExecutor"]

#: Seconds a stopped process group gets between SIGTERM and SIGKILL.
GRACE = 2.0


class _KilledForMemory(ProcessError):
    """An action ended by a SIGKILL this executor did not send."""


class LocalExecutor:
    """Runs actions on this machine: at most ``jobs`` at once in this process, and, with
    ``slot_dir``, at most ``jobs`` at once across every process sharing that directory;
    in this process, only while their predicted peaks fit ``memory`` bytes (0: the
    memory available when it starts; where that cannot be read, no limit).

    :meth:`run` is a coroutine of the build's event loop: an action waiting for a slot or
    for its compiler holds no thread (the loop reaps each compiler through a pidfd,
    :func:`~metrale_orch.executor.reaping.reap`). :meth:`stop` may be called from any thread."""

    def __init__(self, jobs: int, *, slot_dir: Path | None = None, memory: int = 0) -> None:
        self._jobs = jobs
        self._slots = PrioritySlots(jobs, memory or available_memory())
        self._machine = MachineSlots(slot_dir, jobs) if slot_dir is not None else None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        #: The running compilers, each with an event set once the loop reaped it.
        self._running: dict[int, tuple[Measured, threading.Event]] = {}
        #: The loop the actions run on (known from the first one).
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Most actions seen running at once in this process (tests, the profile).
        self.peak = 0

    @property
    def jobs(self) -> int:
        return self._jobs

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)

    @property
    def memory(self) -> tuple[int, int]:
        """The predicted peaks of the running actions added up, and the budget (bytes)."""
        return self._slots.memory

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    async def run(self, action: Action) -> Completed:
        self._loop = asyncio.get_running_loop()
        try:
            return await self._admitted(action, alone=False)
        except _KilledForMemory:
            pass  # the out-of-memory killer's, most likely: once more, with nothing beside it
        try:
            return await self._admitted(action, alone=True)
        except _KilledForMemory as again:
            reason = f"{KILLED_FOR_MEMORY} (SIGKILL), twice: the second time running alone"
            raise ProcessError(
                again.argv, again.returncode, output=again.output, reason=reason
            ) from None

    async def _admitted(self, action: Action, *, alone: bool) -> Completed:
        """Run ``action`` once its slots are held (``alone``: with no other action)."""
        if self._stopped.is_set():
            raise ActionStopped(f"{action.label or action.argv[0]}: not started: the build stopped")
        async with self._slots.slot(action.expected, action.memory, alone) as got:
            if not got:
                raise ActionStopped(f"{action.label or action.argv[0]}: not started: stopped")
            if self._machine is None:
                return await self._spawn(action)
            async with self._machine.slot(self._stopped) as held:
                if not held:
                    raise ActionStopped(f"{action.label or action.argv[0]}: not started: stopped")
                return await self._spawn(action)

    def stop(self) -> None:
        """Stop every action in flight (SIGTERM to each group, SIGKILL after :data:`GRACE`
        seconds) and refuse the rest; from any thread. Called off the loop it returns once
        every compiler is gone (or the grace ran out); on the loop it does not wait."""
        self._stopped.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._slots.close)
        else:
            self._slots.close()
        with self._lock:
            procs = list(self._running.values())
        for proc, _reaped in procs:
            _signal_group(proc, signal.SIGTERM)
        if _on_loop(loop):
            assert loop is not None
            loop.call_later(GRACE, _kill_all, [p for p, _r in procs])
            return
        deadline = time.monotonic() + GRACE
        for proc, reaped in procs:
            if not reaped.wait(max(0.0, deadline - time.monotonic())):
                _signal_group(proc, signal.SIGKILL)
        for proc, _reaped in procs:
            # What a compiler left behind in its group (a killed nvcc's children).
            _signal_group(proc, signal.SIGKILL)

    async def _spawn(self, action: Action) -> Completed:
        start = time.perf_counter()
        # Started by the loop's pool: a fork and exec held the loop for milliseconds each
        # while targets were being prepared (measured: 32% of its time, and every exit
        # it watched was seen 0.4 s late), so 64 jobs ran a third of the time.
        spawning = asyncio.get_running_loop().run_in_executor(None, _start, action)
        try:
            args, proc, files = await asyncio.shield(spawning)
        except asyncio.CancelledError:
            spawning.add_done_callback(_kill_started)  # never left running, nor a zombie
            raise
        reaped = threading.Event()
        with self._lock:
            self._running[proc.pid] = (proc, reaped)
            self.peak = max(self.peak, len(self._running))
        try:
            if self._stopped.is_set():  # stop() ran between the slot and the registration
                _signal_group(proc, signal.SIGKILL)
            expired = await reap(
                proc,
                timeout=action.timeout,
                kill=lambda: _signal_group(proc, signal.SIGKILL),
            )
            try:
                out, err = files.read()
            except OSError as exc:
                reason = f"its output cannot be read: {exc.strerror or exc}"
                raise ProcessError(args, proc.returncode, reason=reason) from None
        finally:
            files.close()
            reaped.set()
            with self._lock:
                self._running.pop(proc.pid, None)
        if self._stopped.is_set():
            raise ActionStopped(f"{action.label or args[0]}: stopped")
        if expired:
            raise timed_out(args, out, err, action.timeout)
        assert proc.returncode is not None
        output = decode_output(out) + decode_output(err) if proc.returncode else ""
        if killed_for_memory(proc.returncode, output):  # neither stop() nor the timeout
            raise _KilledForMemory(args, proc.returncode, output=output, reason=KILLED_FOR_MEMORY)
        seconds = time.perf_counter() - start
        return finished(args, proc.returncode, out, err, seconds, proc.peak, proc.bound)


def _start(action: Action) -> tuple[list[str], Measured, OutputFiles]:
    if action.scratch is not None:
        _make_scratch(action)
    try:
        output = OutputFiles()
    except OSError as exc:
        reason = f"cannot make the files for its output: {exc.strerror or exc}"
        raise ProcessError(action.argv, None, reason=reason) from None
    try:
        args, proc = start_process(
            action.argv, cwd=action.cwd, env=action.env, new_session=True, output=output.fds
        )
    except BaseException:
        output.close()
        raise
    return args, proc, output


def _kill_started(spawning: asyncio.Future[tuple[list[str], Measured, OutputFiles]]) -> None:
    """Kill and reap a compiler whose start finished after its action was cancelled."""
    if spawning.cancelled() or spawning.exception() is not None:
        return
    _args, proc, output = spawning.result()
    output.close()
    _signal_group(proc, signal.SIGKILL)
    asyncio.get_running_loop().run_in_executor(None, proc.wait)


def _make_scratch(action: Action) -> None:
    """Make the action's new output directory, or raise :class:`ProcessError` saying why
    not. A second step of the same compile finds it made by the first."""
    assert action.scratch is not None
    try:
        try:
            os.mkdir(action.scratch)
        except FileNotFoundError:  # the first compile's: its parent is made first
            os.makedirs(action.scratch.parent, exist_ok=True)
            os.mkdir(action.scratch)
    except FileExistsError:
        if not action.scratch.is_dir() or action.scratch.is_symlink():
            raise ProcessError(
                action.argv,
                None,
                reason=f"{action.scratch} exists and is a link or not a directory",
            ) from None
    except OSError as exc:
        reason = f"cannot create the directory {action.scratch}: {exc.strerror or exc}"
        raise ProcessError(action.argv, None, reason=reason) from None


def _on_loop(loop: asyncio.AbstractEventLoop | None) -> bool:
    """Whether this thread runs ``loop``."""
    try:
        return loop is not None and asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _kill_all(procs: list[Measured]) -> None:
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
