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

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from metrale_orch.executor.action import Action, ActionStopped
from metrale_orch.executor.memory import KILLED_FOR_MEMORY, available_memory, killed_for_memory
from metrale_orch.executor.slots import MachineSlots, PrioritySlots
from metrale_orch.proc import (
    Completed,
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
    memory available when it starts; where that cannot be read, no limit)."""

    def __init__(self, jobs: int, *, slot_dir: Path | None = None, memory: int = 0) -> None:
        self._jobs = jobs
        self._slots = PrioritySlots(jobs, memory or available_memory())
        self._machine = MachineSlots(slot_dir, jobs) if slot_dir is not None else None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[int, subprocess.Popen[bytes]] = {}
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

    def run(self, action: Action) -> Completed:
        try:
            return self._admitted(action, alone=False)
        except _KilledForMemory:
            pass  # the out-of-memory killer's, most likely: once more, with nothing beside it
        try:
            return self._admitted(action, alone=True)
        except _KilledForMemory as again:
            reason = f"{KILLED_FOR_MEMORY} (SIGKILL), twice: the second time running alone"
            raise ProcessError(
                again.argv, again.returncode, output=again.output, reason=reason
            ) from None

    def _admitted(self, action: Action, *, alone: bool) -> Completed:
        """Run ``action`` once its slots are held (``alone``: with no other action)."""
        if self._stopped.is_set():
            raise ActionStopped(f"{action.label or action.argv[0]}: not started: the build stopped")
        with self._slots.slot(action.expected, action.memory, alone) as got:
            if not got:
                raise ActionStopped(f"{action.label or action.argv[0]}: not started: stopped")
            if self._machine is None:
                return self._spawn(action)
            with self._machine.slot(self._stopped) as held:
                if not held:
                    raise ActionStopped(f"{action.label or action.argv[0]}: not started: stopped")
                return self._spawn(action)

    def stop(self) -> None:
        self._stopped.set()
        self._slots.close()
        with self._lock:
            procs = list(self._running.values())
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
        for proc in procs:
            # What a compiler left behind in its group (a killed nvcc's children).
            _signal_group(proc, signal.SIGKILL)

    def _spawn(self, action: Action) -> Completed:
        start = time.perf_counter()
        args, proc = start_process(action.argv, cwd=action.cwd, env=action.env, new_session=True)
        with self._lock:
            self._running[proc.pid] = proc
            self.peak = max(self.peak, len(self._running))
        try:
            if self._stopped.is_set():  # stop() ran between the slot and the registration
                _signal_group(proc, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=action.timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                raise timed_out(args, *_drain(proc), action.timeout) from None
        finally:
            with self._lock:
                self._running.pop(proc.pid, None)
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        if self._stopped.is_set():
            raise ActionStopped(f"{action.label or args[0]}: stopped")
        output = decode_output(out) + decode_output(err) if proc.returncode else ""
        if killed_for_memory(proc.returncode, output):  # neither stop() nor the timeout
            raise _KilledForMemory(args, proc.returncode, output=output, reason=KILLED_FOR_MEMORY)
        seconds = time.perf_counter() - start
        return finished(args, proc.returncode, out, err, seconds, proc.peak, proc.bound)


#: Seconds to read what a killed compiler printed: a process it started in a session of
#: its own (a daemon) may hold its pipes open forever.
_DRAIN_SECONDS = 5.0


def _drain(proc: subprocess.Popen[bytes]) -> tuple[bytes | None, bytes | None]:
    """What the killed ``proc`` printed, read for at most :data:`_DRAIN_SECONDS`; then its
    pipes are closed, whoever still holds them."""
    try:
        return proc.communicate(timeout=_DRAIN_SECONDS)
    except subprocess.TimeoutExpired as exc:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return exc.stdout, exc.stderr


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
