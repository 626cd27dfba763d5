"""A minimal REAPI test worker on BuildGrid's Bots API (runs in the BuildGrid venv)::

    python -m tests.support.reapi_worker --url grpc://127.0.0.1:PORT --instance main \\
        --name w0 --property OSFamily=linux --property ISA=x86-64 \\
        --work-dir DIR --events FILE [--keepalive 4] [--hide PATH]... [--inline-stdio]

No REAPI worker installs here (NOTES, "Remote execution"), so :mod:`tests.support.reapi`
starts these. One action at a time (capacity 1), many leases over its life; each action runs
as :mod:`tests.support.reapi_run` describes. It imports ``buildgrid._protos``, never
``metrale_orch``. Every step is a JSON line in ``--events`` (``registered``, ``lease``,
``exec`` (with the command's process group), ``finished``, ``cancelled``, ``lost``,
``unavailable``, ``available``, ``stopped``) for tests to wait on.

The Bots protocol as BuildGrid 0.4.4 runs it (read in its source, measured):

- ``CreateBotSession`` registers at once when its deadline is under 3.75 s (the server only
  waits for work when 0.8 x min(deadline, keepalive) reaches its 3 s ``NETWORK_TIMEOUT``);
  ``UpdateBotSession`` then long-polls for 0.8 x min(deadline, keepalive). The worker polls with
  deadline = ``--keepalive``, which must be at least 3.75 s and equal to the server's
  ``bot-session-keepalive-timeout``; an idle poll refreshes the session's expiry.
- Leases arrive ACTIVE with the Action packed in the payload (a Digest from older schedulers).
  While a command runs the worker heartbeats every keepalive/4 s (``UpdateBotSession`` with the
  lease ACTIVE: no long-poll at capacity). A lease missing from an answer was cancelled: the
  command is killed and nothing is reported.
- Completing a lease (COMPLETED, status, ``ActionResult`` packed in ``result``) is answered,
  often, with the next lease: BuildGrid fetches one for a bot that just finished.
- SIGTERM (or SIGINT): the running command's process group is killed, its lease handed back
  with UNAVAILABLE (BuildGrid requeues INTERNAL and UNAVAILABLE at once, up to
  five attempts in all), the session marked ``BOT_TERMINATING`` so no lease follows, exit 0.
  SIGKILL leaves the lease to BuildGrid's reaper (see :mod:`tests.support.reapi`).
- The server down: calls are retried every 0.2 s, a running command keeps running; a session
  the server no longer knows (reaped after the keepalive) is created anew and the result of a
  lease it lost is dropped.
- ``--hide PATH``: the worker must be in a mount namespace of its own (the stack starts it under
  ``unshare --mount``; it refuses otherwise) and covers each PATH with an empty tmpfs, so no
  command can read the client's files by absolute path. Without it a same-host worker sees
  them, and an input missing from the input root would go unnoticed until a real farm.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TypeVar

import grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)
from buildgrid._protos.google.devtools.remoteworkers.v1test2 import bots_pb2, worker_pb2
from buildgrid._protos.google.devtools.remoteworkers.v1test2 import (
    bots_pb2_grpc as bots_grpc,
)
from buildgrid._protos.google.rpc import code_pb2, status_pb2

from tests.support.reapi_cas import BlobError, Cas, channel
from tests.support.reapi_run import ActionRun, Cancelled, run_action

__all__ = ["Options", "TestWorker", "main"]

#: Between two tries of a call the server did not answer, seconds.
RETRY_S = 0.2
#: How long the worker's CAS calls wait for a server that went away, seconds.
RETRY_CAS_S = 120.0
#: The deadline of calls that must not long-poll (under BuildGrid's 3.75 s), seconds.
SHORT_S = 2.0
#: Calls that mean "server not there (yet)": retried.
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """The worker's command line."""

    url: str
    instance: str
    name: str
    properties: tuple[tuple[str, str], ...]
    work_dir: Path
    events: Path
    keepalive: float
    hide: tuple[Path, ...]
    inline_stdio: bool


class _Terminated(Exception):
    """Raised by the signal handler to leave an idle wait at once."""


class _SessionLost(Exception):
    """The server no longer knows the session (it reaped it, or restarted without it)."""


class TestWorker:
    """One bot session's loop: register, poll, run leases one at a time, report."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._channel = channel(options.url)
        self._bots = bots_grpc.BotsStub(self._channel)
        # A server restart mid-lease must not lose the lease's fetch or upload.
        self.cas = Cas(
            self._channel,
            options.instance,
            retry_s=RETRY_CAS_S,
            keep_trying=lambda: not self.stopping,
        )
        self.stopping = False
        self._idle = False
        self._unavailable = False
        self._session = bots_pb2.BotSession()

    # -- plumbing -----------------------------------------------------------------------------

    def event(self, kind: str, **fields: object) -> None:
        """Append one JSON line to the events file."""
        line = json.dumps({"t": time.time(), "event": kind, "worker": self.options.name, **fields})
        with open(self.options.events, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        if self._idle:
            raise _Terminated()

    def _call(self, fn: Callable[[], T], *, idle: bool) -> T:
        """``fn()``, retried while the server is unavailable; :class:`_SessionLost` otherwise."""
        while True:
            self._idle = idle
            try:
                answer = fn()
                if self._unavailable:
                    self._unavailable = False
                    self.event("available")
                return answer
            except grpc.RpcError as exc:
                code = exc.code()
                if code not in TRANSIENT:
                    raise _SessionLost(f"{code.name}: {exc.details()}") from exc
                if not self._unavailable and code == grpc.StatusCode.UNAVAILABLE:
                    self._unavailable = True
                    self.event("unavailable")
                if code == grpc.StatusCode.UNAVAILABLE:
                    if self.stopping:
                        raise
                    time.sleep(RETRY_S)
            finally:
                self._idle = False

    def _bot_session(self) -> bots_pb2.BotSession:
        device = worker_pb2.Device(handle=self.options.name)
        for key, value in self.options.properties:
            device.properties.add(key=key, value=value)
        return bots_pb2.BotSession(
            bot_id=self.options.name,
            status=bots_pb2.OK,
            worker=worker_pb2.Worker(devices=[device]),
        )

    def _create(self) -> None:
        request = bots_pb2.CreateBotSessionRequest(
            parent=self.options.instance, bot_session=self._bot_session()
        )
        self._session = self._call(
            lambda: self._bots.CreateBotSession(request, timeout=SHORT_S), idle=True
        )
        self.event("registered", session=self._session.name)

    def _update(self, session: bots_pb2.BotSession, *, timeout: float, idle: bool) -> None:
        request = bots_pb2.UpdateBotSessionRequest(name=session.name, bot_session=session)
        self._session = self._call(
            lambda: self._bots.UpdateBotSession(request, timeout=timeout), idle=idle
        )

    # -- the loop -----------------------------------------------------------------------------

    def serve(self) -> int:
        """Run until SIGTERM; the exit status."""
        self.event("started", pid=os.getpid())
        try:
            self._create()
            while not self.stopping:
                try:
                    self._step()
                except _SessionLost as exc:
                    self.event("lost", reason=str(exc))
                    self._create()
        except _Terminated:
            pass
        except grpc.RpcError:
            if not self.stopping:
                raise
        self._goodbye()
        self.event("stopped")
        return 0

    def _step(self) -> None:
        pending = [
            lease
            for lease in self._session.leases
            if lease.state in (bots_pb2.LeaseState.PENDING, bots_pb2.LeaseState.ACTIVE)
        ]
        if not pending:
            started = time.monotonic()
            self._update(self._session, timeout=self.options.keepalive, idle=True)
            if time.monotonic() - started < 0.05 and not self._session.leases:
                time.sleep(0.05)  # a server that answers at once must not make this spin
            return
        lease = pending[0]
        lease.state = bots_pb2.LeaseState.ACTIVE
        try:
            run = self._work(lease)
        except Cancelled:
            if not self.stopping:
                self.event("cancelled", lease=lease.id)
                return
            run = ActionRun(
                status=status_pb2.Status(code=code_pb2.UNAVAILABLE, message="the worker stopped")
            )
        self._report(lease, run)

    def _work(self, lease: bots_pb2.Lease) -> ActionRun:
        action = re_pb2.Action()
        if lease.payload.Is(re_pb2.Action.DESCRIPTOR):
            lease.payload.Unpack(action)
        else:
            digest = re_pb2.Digest()
            lease.payload.Unpack(digest)
            try:
                action = self.cas.read_message(digest, re_pb2.Action)
            except BlobError as exc:
                return ActionRun(
                    status=status_pb2.Status(code=code_pb2.FAILED_PRECONDITION, message=str(exc))
                )
        self.event("lease", lease=lease.id, command=action.command_digest.hash)
        scratch = Path(tempfile.mkdtemp(prefix="lease-", dir=self.options.work_dir))
        try:
            run = run_action(
                self.cas,
                action,
                scratch,
                worker=self.options.name,
                inline_stdio=self.options.inline_stdio,
                tick=self._heartbeat(lease.id),
                spawned=lambda pid: self.event("exec", lease=lease.id, pgid=pid),
            )
        except (Cancelled, _Terminated):
            raise
        except Exception as exc:  # a worker bug, or the CAS gone for good: BuildGrid retries
            self.event("error", lease=lease.id, error=repr(exc))
            return ActionRun(
                status=status_pb2.Status(code=code_pb2.INTERNAL, message=f"test worker: {exc!r}")
            )
        else:
            return run
        finally:
            _remove_tree(scratch)

    def _heartbeat(self, lease_id: str) -> Callable[[], bool]:
        """A tick for :func:`run_action`: False once stopping, or the lease is gone."""
        period = self.options.keepalive / 4
        last = time.monotonic()

        def tick() -> bool:
            nonlocal last
            if self.stopping:
                return False
            if time.monotonic() - last < period:
                return True
            last = time.monotonic()
            request = bots_pb2.UpdateBotSessionRequest(
                name=self._session.name, bot_session=self._session
            )
            try:
                self._session = self._bots.UpdateBotSession(request, timeout=SHORT_S)
            except grpc.RpcError as exc:
                # The server down: keep running, report later. Anything else: the lease is lost.
                return exc.code() in TRANSIENT
            return any(lease.id == lease_id for lease in self._session.leases)

        return tick

    def _report(self, lease: bots_pb2.Lease, run: ActionRun) -> None:
        lease.state = bots_pb2.LeaseState.COMPLETED
        lease.status.CopyFrom(run.status)
        if run.result is not None:
            lease.result.Pack(run.result)
        self.event(
            "finished",
            lease=lease.id,
            code=code_pb2.Code.Name(run.status.code),
            exit_code=run.result.exit_code if run.result is not None else None,
            phases={k: round(v, 4) for k, v in run.phases.items()},
        )
        session = bots_pb2.BotSession()
        session.CopyFrom(self._session)
        del session.leases[:]
        session.leases.append(lease)
        if self.stopping:
            session.status = bots_pb2.BOT_TERMINATING
        try:
            # A short deadline: the answer comes at once (with the next lease when one waits).
            self._update(session, timeout=SHORT_S, idle=False)
        except grpc.RpcError:
            if not self.stopping:
                raise

    def _goodbye(self) -> None:
        """Tell the server this bot takes no more work; hand back any lease it still holds."""
        session = self._session
        if not session.name:
            return
        for _ in range(3):
            session.status = bots_pb2.BOT_TERMINATING
            held = False
            for lease in session.leases:
                if lease.state in (bots_pb2.LeaseState.PENDING, bots_pb2.LeaseState.ACTIVE):
                    lease.state = bots_pb2.LeaseState.COMPLETED
                    lease.status.CopyFrom(
                        status_pb2.Status(code=code_pb2.UNAVAILABLE, message="the worker stopped")
                    )
                    held = True
            request = bots_pb2.UpdateBotSessionRequest(name=session.name, bot_session=session)
            try:
                session = self._bots.UpdateBotSession(request, timeout=1.0)
            except grpc.RpcError:
                return
            if not held and not session.leases:
                return


def _remove_tree(path: Path) -> None:
    """Remove a lease's scratch directory, even where the command made directories read-only."""
    for dirpath, _, _ in os.walk(path):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def hide_paths(paths: Sequence[Path]) -> None:
    """Cover each existing path with an empty tmpfs, in this process's own mount namespace.

    Raises ``SystemExit`` when this process shares its parent's mount namespace: the mounts
    would hide the paths from the whole machine.
    """
    if not paths:
        return
    mine = os.readlink("/proc/self/ns/mnt")
    parents = os.readlink(f"/proc/{os.getppid()}/ns/mnt")
    if mine == parents:
        raise SystemExit(
            "reapi_worker: --hide needs a mount namespace of its own (unshare --mount)"
        )
    mount = shutil.which("mount") or "/usr/bin/mount"
    for path in paths:
        if path.is_dir():
            subprocess.run(
                [mount, "-t", "tmpfs", "-o", "size=64k,mode=0755", "metrale-hidden", str(path)],
                check=True,
            )


def parse(argv: Sequence[str]) -> Options:
    parser = argparse.ArgumentParser(prog="reapi_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--instance", default="")
    parser.add_argument("--name", required=True)
    parser.add_argument("--property", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--keepalive", type=float, default=4.0)
    parser.add_argument("--hide", type=Path, action="append", default=[])
    parser.add_argument("--inline-stdio", action="store_true")
    args = parser.parse_args(argv)
    if args.keepalive < 3.75:
        parser.error("--keepalive must be at least 3.75 s (BuildGrid long-polls 0.8 x it, >= 3 s)")
    pairs = []
    for item in args.property:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--property wants KEY=VALUE, not {item!r}")
        pairs.append((key, value))
    return Options(
        url=args.url,
        instance=args.instance,
        name=args.name,
        properties=tuple(pairs),
        work_dir=args.work_dir,
        events=args.events,
        keepalive=args.keepalive,
        hide=tuple(args.hide),
        inline_stdio=args.inline_stdio,
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack in the log
    hide_paths(options.hide)
    options.work_dir.mkdir(parents=True, exist_ok=True)
    worker = TestWorker(options)
    signal.signal(signal.SIGTERM, worker.on_signal)
    signal.signal(signal.SIGINT, worker.on_signal)
    return worker.serve()


if __name__ == "__main__":
    sys.exit(main())
