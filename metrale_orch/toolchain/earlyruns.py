"""The probes' dry runs, started before the package loads (I/O: starts programs).

Every run probes its toolchains (:mod:`~metrale_orch.toolchain.probe`); a no-op
runs only their dry runs, the compiler's and its host compiler's, which show a
wrapper's switch that no ``stat`` sees. They are the no-op's longest wait (issue
21), so the dodo file's first statement, :func:`start_plan`, starts the commands
the last run's probes asked for, from the plan it left in
``<build_dir>/.state/probe-plan.json`` (each command's argv and the variables its
environment sets or drops against the caller's: no copy of the caller's own
environment is written), while doit and the package load.

A probe takes an early run (:func:`take`) only for exactly its own command: the
same argv, the same environment, the same working directory (or a fresh one
holding the probe source, for a dry run). Anything else runs as it always did,
and a run nobody took is killed and its directory removed when the process ends.
So every command a probe reads was still run by this process, on the compiler
installed now: what it prints is what the probe would have seen a few
milliseconds later. The plan is only a guess of what will be asked; a wrong or
unreadable plan costs those runs, never a result.

Only the standard library is imported here (and :mod:`metrale_orch.ownership`, which
imports nothing else): :func:`start_plan` runs before anything else of the package
loads. A plan that is not the user's own file is not read.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from metrale_orch.ownership import read_own

__all__ = [
    "PLAN_NAME",
    "PROBE_KERNEL",
    "PROBE_SOURCE",
    "SCOPED_PLAN_GLOB",
    "EarlyRun",
    "EarlyRuns",
    "plan_name",
]

#: The plan's file in the build's state directory (a run of the whole tree's; a run
#: scoped to some targets keeps its own, :func:`plan_name`).
PLAN_NAME = "probe-plan.json"
#: The plans of scoped runs (:func:`plan_name`), beside the whole tree's.
SCOPED_PLAN_GLOB = "probe-plan.scope-*.json"
#: The dry run's throw-away source (its name and text), in a directory of its own.
PROBE_SOURCE = "metrale_probe.cu"
PROBE_KERNEL = 'extern "C" __global__ void metrale_probe() {}\n'
#: The most commands a plan starts.
_PLAN_MAX = 64
#: A dry run's working directory: a fresh one, holding the probe source.
_PROBE_DIR = "<probe dir>"

_Key = tuple[tuple[str, ...], tuple[tuple[str, str], ...], str]


class EarlyRun:
    """A command started from the plan: its argv (text), its process, when it started
    (``time.perf_counter``) and, for a dry run, the directory it runs in (``tmp``, with
    the scratch directory ``tmp/tmp`` as its ``TMPDIR``)."""

    __slots__ = ("args", "proc", "started", "tmp")

    def __init__(
        self, args: list[str], proc: subprocess.Popen[bytes], started: float, tmp: str | None
    ) -> None:
        self.args = args
        self.proc = proc
        self.started = started
        self.tmp = tmp

    def close(self) -> None:
        """Remove the run's directory (after its output was read)."""
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def discard(self) -> None:
        """Kill the run if it still runs, reap it and remove its directory (its pipes are
        closed, not read: a child it started may hold them open)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        self.close()


def _key(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> _Key:
    return tuple(str(a) for a in argv), tuple(sorted(env.items())), cwd


def plan_name(scope: Sequence[str] | None) -> str:
    """The plan file of a run scoped to ``scope`` (None: the whole tree), pure: each kind
    of run starts the dry runs it asked for last, not another kind's."""
    if scope is None:
        return PLAN_NAME
    words = "\0".join(sorted(set(scope))).encode("utf-8", "surrogateescape")
    return f"probe-plan.scope-{hashlib.blake2b(words, digest_size=8).hexdigest()}.json"


class EarlyRuns:
    """The early runs of one run's probes (thread-safe): started from the last run's plan
    (:meth:`start_plan`), taken by the probes that ask for exactly their command
    (:meth:`take`), and what was asked, the next plan (:meth:`plan_bytes`). Held by the
    run's probe memo (:class:`~metrale_orch.toolchain.probe.ProbeMemo`). A process forked
    from the one that started them (``doit -P process``) sees none of them; the runs no
    probe took are killed and removed by :meth:`discard`, at the latest when the process
    ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[_Key, EarlyRun] = {}
        #: The commands asked for in this run, in order: the next plan.
        self._asked: dict[_Key, None] = {}
        #: The process the runs belong to (checked before the lock: a forked worker may
        #: have inherited it held by another thread).
        self._owner = os.getpid()
        self._at_exit = False

    def _mine(self) -> bool:
        return os.getpid() == self._owner

    def start_plan(
        self, state_dir: Path, environ: Mapping[str, str], scope: Sequence[str] | None = None
    ) -> int:
        """Start the commands of ``state_dir``'s plan for ``scope`` (:func:`plan_name`) in
        ``environ`` with the plan's changes (I/O); how many started. A missing or malformed
        plan, or one that is not the user's own file, starts nothing."""
        if not self._mine():
            return 0
        try:
            runs = json.loads(read_own(Path(state_dir) / plan_name(scope)))["runs"]
        except (OSError, ValueError, KeyError, TypeError):
            return 0
        if not isinstance(runs, list):
            return 0
        started = 0
        for entry in runs[:_PLAN_MAX]:
            command = _command(entry, environ)
            if command is None:
                continue
            argv, env, cwd = command
            key = _key(argv, env, cwd)
            with self._lock:
                if key in self._runs:
                    continue
            run = _spawn(argv, env, cwd)
            if run is not None:
                with self._lock:
                    self._runs[key] = run
                    if not self._at_exit:  # none left running when the process ends
                        self._at_exit = True
                        atexit.register(self._discard_at_exit)
                started += 1
        return started

    def take(
        self, argv: Sequence[str], env: Mapping[str, str], *, probe_dir: bool
    ) -> EarlyRun | None:
        """The early run of exactly this command, if one was started (it is the caller's
        then: read its output, then :meth:`EarlyRun.close`), else None. ``env``: the
        command's environment (for a dry run, without the ``TMPDIR`` its directory sets);
        ``probe_dir``: a dry run in a fresh probe directory, else run in the current
        directory. Either way the command is remembered for the next plan."""
        if not self._mine():
            return None
        try:
            key = _key(argv, env, _PROBE_DIR if probe_dir else os.getcwd())
        except OSError:  # the current directory is gone: nothing was started there
            return None
        with self._lock:
            self._asked[key] = None
            return self._runs.pop(key, None)

    def waiting(self) -> int:
        """How many early runs no probe has taken (yet)."""
        if not self._mine():
            return 0
        with self._lock:
            return len(self._runs)

    def asked(self) -> int:
        """How many distinct commands were asked for in this run."""
        if not self._mine():
            return 0
        with self._lock:
            return len(self._asked)

    def plan_bytes(self, environ: Mapping[str, str]) -> bytes:
        """The plan of the commands asked for so far (sorted): each one's argv, working
        directory and the variables its environment sets or drops against ``environ``."""
        with self._lock:
            keys = list(self._asked) if self._mine() else []
        runs = []
        for argv, items, cwd in keys:
            env = dict(items)
            changed = {k: v for k, v in env.items() if environ.get(k) != v}
            dropped = sorted(k for k in environ if k not in env)
            runs.append({"argv": list(argv), "cwd": cwd, "set": changed, "unset": dropped})
        runs.sort(key=lambda r: json.dumps(r, sort_keys=True))
        return json.dumps({"runs": runs[:_PLAN_MAX]}, indent=1, sort_keys=True).encode()

    def discard(self) -> None:
        """Kill, reap and remove every run no probe took (a run that ends)."""
        if not self._mine():
            return
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        for run in runs:
            run.discard()

    def _discard_at_exit(self) -> None:
        self.discard()


def _command(
    entry: object, environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str], str] | None:
    """A plan entry's argv, environment and working directory, or None (malformed, or a
    program that is not an executable file any more)."""
    if not isinstance(entry, dict):
        return None
    argv, changed, dropped, cwd = (entry.get(k) for k in ("argv", "set", "unset", "cwd"))
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return None
    if not (isinstance(changed, dict) and all(isinstance(v, str) for v in changed.values())):
        return None
    if not (isinstance(dropped, list) and all(isinstance(k, str) for k in dropped)):
        return None
    if not isinstance(cwd, str) or not (cwd == _PROBE_DIR or os.path.isabs(cwd)):
        return None
    program = argv[0]
    if not (os.path.isabs(program) and os.path.isfile(program) and os.access(program, os.X_OK)):
        return None
    gone = set(dropped)
    env = {k: v for k, v in environ.items() if k not in gone}
    env.update({str(k): v for k, v in changed.items()})
    return argv, env, cwd


def _spawn(argv: list[str], env: dict[str, str], cwd: str) -> EarlyRun | None:
    """Start one command as :func:`metrale_orch.proc.start_process` starts it (no input,
    output piped); a dry run in a fresh directory with the probe source."""
    tmp = None
    run_env, run_cwd = env, (None if cwd == _PROBE_DIR else cwd)
    try:
        if cwd == _PROBE_DIR:
            tmp = tempfile.mkdtemp(prefix="metrale-probe.")
            Path(tmp, PROBE_SOURCE).write_text(PROBE_KERNEL, encoding="utf-8")
            os.mkdir(os.path.join(tmp, "tmp"))
            run_env, run_cwd = {**env, "TMPDIR": os.path.join(tmp, "tmp")}, tmp
        proc = subprocess.Popen(
            argv,
            cwd=run_cwd,
            env=run_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        return None
    return EarlyRun(list(argv), proc, time.perf_counter(), tmp)
