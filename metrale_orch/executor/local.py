"""The local executor: compile actions as subprocesses of this process, ``jobs`` at a time.

Each action runs in a process group of its own (``start_new_session``), so
:meth:`LocalExecutor.stop` ends a compiler and everything it started (nvcc's
``cicc``, ``ptxas``, the host compiler) at once: SIGTERM to the group, then
SIGKILL to what is left after a grace period. A terminal's Ctrl-C reaches
this process only; the build turns it into :meth:`~LocalExecutor.stop`.
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
from metrale_orch.executor.slots import MachineSlots, PrioritySlots
from metrale_orch.proc import Completed, finished, start_process, timed_out

__all__ = ["LocalExecutor"]

#: Seconds a stopped process group gets between SIGTERM and SIGKILL.
GRACE = 2.0


class LocalExecutor:
    """Runs actions on this machine: at most ``jobs`` at once in this process, and, with
    ``slot_dir``, at most ``jobs`` at once across every process sharing that directory."""

    def __init__(self, jobs: int, *, slot_dir: Path | None = None) -> None:
        self._jobs = jobs
        self._slots = PrioritySlots(jobs)
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
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def run(self, action: Action) -> Completed:
        if self._stopped.is_set():
            raise ActionStopped(f"{action.label or action.argv[0]}: not started: the build stopped")
        with self._slots.slot(action.expected) as got:
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
        return finished(args, proc.returncode, out, err, time.perf_counter() - start)


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
