"""A real remote-execution engine for tests: BuildGrid 0.4.4 on PostgreSQL, with test workers.

::

    with postgres_cluster() as pg, reapi_stack(StackOptions(workers=2), postgres=pg) as stack:
        stack.url, stack.instance, stack.cas_dir     # "grpc://127.0.0.1:PORT", "main", Path
        outcome = stack.execute(ProbeAction(argv=("/bin/sh", "-c", "echo hi")))

(``tests/conftest.py`` has the fixtures: ``reapi_stack``, ``reapi_stack_factory``.) The
pieces, each stopped by PID when the block exits, a failing test included:

- the BuildGrid venv and PostgreSQL (:mod:`tests.support.reapi_deps`); each stack gets its
  own database, copied from a template migrated once per cluster;
- the server (``bgd server start``, its config from :func:`server_config`): CAS on disk under
  ``cas_dir`` (so a test can corrupt a blob file), an LRU action cache, Execution + Bots on
  one instance name, the SQL scheduler (``thread-pool-size: 64``, assigner ``interval: 0.02``,
  ``jitter-factor: 0``, ``failure-backoff`` 0.25 s instead of 5, the ``match-property-keys``
  given), 127.0.0.1 on a free port kept across :meth:`ReapiStack.stop_server` /
  :meth:`ReapiStack.start_server`; ``execution=False`` makes a CAS + action cache server
  without PostgreSQL;
- the workers (:mod:`tests.support.reapi_worker`), each with its platform properties, in a
  mount namespace where ``StackOptions.hide`` (the tests' tmp root) is an empty tmpfs;
- :meth:`ReapiStack.execute` and friends: a small client (:mod:`tests.support.reapi_probe`,
  in the BuildGrid venv) for the stack's own tests.

Measured here (2 cores): a PostgreSQL cluster 0.8 s, the schema 1.7 s (once), a stack 2.1 s
(server 1.3-1.8 s, workers registering meanwhile); a server restart 1.3 s; teardown < 0.6 s.
An Execute of a trivial action ~90 ms, an action-cache hit ~17 ms.

What BuildGrid 0.4.4 does (read in its source, pinned by
``tests/scenarios/remote/test_reapi_stack.py``):

- **Action cache writes**: the scheduler itself stores the ActionResult when a lease completes
  with status OK, unless the Action is ``do_not_cache`` (a non-zero exit too, as
  ``cache-failed-actions`` is on: BuildGrid's default and ours). A status other than OK
  (timeout, missing input, worker error) is never cached. A read-only cache
  (``ac_allow_updates=False``) answers UpdateActionResult UNIMPLEMENTED ("Updating cache not
  allowed") and the scheduler's own write is a logged error: nothing is cached. The LRU cache
  lives in the server's memory: a restarted server has forgotten every entry (the CAS stays).
- **A lost worker** (SIGKILL mid-action): BuildGrid requeues its job, it does not fail it, but
  only when the bot session expires: ``keepalive_s`` (4 s) after the worker's last call, seen
  by the reaper within 0.5 s; then another worker runs it (the client's stream shows QUEUED,
  EXECUTING twice). The fifth loss of one job completes it ABORTED (from the source; 0.4.4
  parses ``max-job-attempts`` but never hands it to the scheduler: it is always 5). A worker
  that stops on SIGTERM hands its lease back (UNAVAILABLE, which BuildGrid retries): requeued
  within 0.3 s. A bot re-registering under the same name gets its old leases requeued at once.
- **A server restart**: the Execute stream dies (UNAVAILABLE "Stream removed"); jobs and bot
  sessions survive in PostgreSQL, a worker keeps running its command and reports after the
  restart; a new Execute of the same action joins the job (identical in-flight actions that
  are not ``do_not_cache`` share one job). A server down at the start: UNAVAILABLE at once.
- **Platforms**: a job whose platform no worker offers stays QUEUED for ever (use an Execute
  deadline); a key outside ``match-property-keys`` (OSFamily and ISA are always added) is
  refused: FAILED_PRECONDITION "Unregistered platform property".
- **A corrupt blob**: the disk CAS serves stored bytes unchecked. Same size, wrong bytes:
  OK through BatchReadBlobs and ByteStream. A shortened file: BatchReadBlobs OK with the short
  bytes, ByteStream DATA_LOSS ("Blob incomplete"). A deleted one: NOT_FOUND. Uploading the
  right bytes again answers OK and repairs nothing (the file exists, the write is skipped).
  The test worker checks every hash: the action fails FAILED_PRECONDITION with a MISSING
  violation ``blobs/<hash>/<size>``.
- **Instance names**: ``""`` works (resource names ``blobs/...``, bots ``/<uuid>``).
- **Execute errors**: a CAS + AC-only server answers Execute UNIMPLEMENTED; a non-OK status
  still carries an (empty) ActionResult, exit code 0: read the status first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NoReturn

import pytest

from tests.support import REPO
from tests.support.reapi_action import BlobRead, ExecuteOutcome, ProbeAction
from tests.support.reapi_deps import (
    BGD_SERVER,
    BUILDGRID_VERSION,
    VENV_ENV,
    PostgresCluster,
    StackUnavailable,
    buildgrid_venv,
    free_port,
    log_tail,
    postgres_cluster,
)

__all__ = [
    "BUILDGRID_VERSION",
    "DEFAULT_WORKER_PROPERTIES",
    "METRALE_PLATFORM_KEYS",
    "VENV_ENV",
    "BlobRead",
    "ExecuteOutcome",
    "PendingExecute",
    "PostgresCluster",
    "ProbeAction",
    "ReapiStack",
    "ReapiWorker",
    "StackOptions",
    "StackUnavailable",
    "buildgrid_venv",
    "postgres_cluster",
    "reapi_stack",
    "server_config",
    "unavailable",
]

#: Platform keys metrale-orch's remote executor sends (matched by the scheduler).
METRALE_PLATFORM_KEYS = ("metrale-toolchain", "metrale-toolchain-id", "metrale-toolchain-version")
#: What a test worker offers unless told otherwise (BuildGrid always matches these two keys).
DEFAULT_WORKER_PROPERTIES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"OSFamily": ("linux",), "ISA": ("x86-64",)}
)

_READY_S = 60.0


# -- small helpers --------------------------------------------------------------------------------


def _stop_process(proc: subprocess.Popen[Any], timeout: float, *, group: bool = True) -> None:
    """SIGTERM ``proc`` (its process group when ``group``), SIGKILL after ``timeout``; reaped,
    its pipes closed."""
    if proc.poll() is None:
        _signal(proc, signal.SIGTERM, group)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    _signal(proc, signal.SIGKILL, group)  # stragglers in its group too
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):  # a probe's output nobody read (a failed test)
        if pipe is not None:
            pipe.close()


def _signal(proc: subprocess.Popen[Any], sig: int, group: bool) -> None:
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- the server's configuration -------------------------------------------------------------------


def server_config(
    *,
    port: int,
    cas_dir: Path,
    instance: str,
    database_url: str | None,
    match_property_keys: Sequence[str],
    ac_allow_updates: bool = True,
    cache_failed_actions: bool = True,
    keepalive_s: float = 4.0,
    failure_backoff_s: float = 0.25,
) -> str:
    """BuildGrid's YAML for one instance (pure). ``database_url=None``: CAS + action cache only.

    Strings are written as JSON (a YAML subset), so paths and names need no escaping.
    """
    q = json.dumps
    lines = [
        "server:",
        "  - !channel",
        f"    address: {q(f'127.0.0.1:{port}')}",
        "    insecure-mode: true",
        "authorization:",
        "  method: none",
        "thread-pool-size: 64",
    ]
    if database_url is not None:
        lines += [
            "connections:",
            "  - !sql-connection &sql",
            f"    connection-string: {q(database_url)}",
            "    pool-size: 10",
            "    max-overflow: 20",
        ]
    lines += [
        "storages:",
        "  - !disk-storage &cas",
        f"    path: {q(str(cas_dir))}",
        "caches:",
        "  - !lru-action-cache &ac",
        "    storage: *cas",
        "    max-cached-refs: 100000",
        f"    allow-updates: {q(ac_allow_updates)}",
        f"    cache-failed-actions: {q(cache_failed_actions)}",
    ]
    if database_url is not None:
        lines += [
            "schedulers:",
            "  - !sql-scheduler &scheduler",
            "    sql: *sql",
            "    storage: *cas",
            "    action-cache: *ac",
            f"    bot-session-keepalive-timeout: {keepalive_s:g}",
            "    session-expiry-timer-interval: 0.5",
            "    property-set: !dynamic-property-set",
            f"      match-property-keys: {q(sorted(match_property_keys))}",
            "    assigners:",
            "      - !priority-age-assigner",
            "        interval: 0.02",
            "        jitter-factor: 0",
            f"        failure-backoff: {failure_backoff_s:g}",
        ]
    lines += [
        "instances:",
        f"  - name: {q(instance)}",
        "    services:",
        "      - !action-cache",
        "        cache: *ac",
        "      - !cas",
        "        storage: *cas",
        "      - !bytestream",
        "        storage: *cas",
    ]
    if database_url is not None:
        lines += ["      - !execution", "        scheduler: *scheduler"]
    return "\n".join(lines) + "\n"


# -- workers --------------------------------------------------------------------------------------


@dataclass(slots=True)
class ReapiWorker:
    """A running test worker: its process, its platform, and its event log."""

    name: str
    properties: Mapping[str, tuple[str, ...]]
    process: subprocess.Popen[bytes]
    events_path: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def events(self) -> list[dict[str, Any]]:
        """Every event the worker wrote so far (JSON lines: ``event``, ``t``, details)."""
        try:
            text = self.events_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def wait_event(self, kind: str, *, timeout: float = 30.0, after: int = 0) -> dict[str, Any]:
        """The first event ``kind`` at index ``after`` or later; waits for it.

        Raises ``TimeoutError`` (with the worker's log tail) when none comes, or the worker dies.
        """
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events()[after:]:
                if event["event"] == kind:
                    return event
            if not self.alive() or time.monotonic() > deadline:
                why = "exited" if not self.alive() else f"sent no {kind!r} within {timeout:g} s"
                raise TimeoutError(f"worker {self.name} {why}:\n{self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        """The tail of the worker's stdout/stderr."""
        try:
            return log_tail(self.log_path.read_text(errors="replace"))
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL the worker and its running command (a machine lost mid-build)."""
        _signal(self.process, signal.SIGKILL, True)
        self.process.wait()
        self.kill_commands()

    def kill_commands(self) -> None:
        """SIGKILL the process group of each command the worker started and did not finish.

        A command runs in a process group of its own, which the worker's death leaves behind.
        """
        running: dict[str, int] = {}
        for event in self.events():
            if event["event"] == "exec":
                running[event["lease"]] = int(event["pgid"])
            elif event["event"] in ("finished", "cancelled"):
                running.pop(event["lease"], None)
        for pgid in running.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM (hand back the lease, leave cleanly), SIGKILL after ``timeout``; the status."""
        _stop_process(self.process, timeout)
        return self.process.returncode


def _namespace_prefix() -> tuple[list[str], str | None]:
    """The ``unshare`` words for a private mount namespace, or why there is none here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return [], "no unshare (util-linux) on PATH"
    prefix = [unshare, "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        prefix.insert(1, "--map-root-user")
    probe = subprocess.run([*prefix, "--", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return [], f"cannot make a mount namespace ({' '.join(prefix)}): {probe.stderr.strip()}"
    return [*prefix, "--"], None


# -- the stack ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StackOptions:
    """What kind of engine to start; the defaults are the session stack's."""

    #: The REAPI instance name ("" works: BuildGrid 0.4.4 serves an empty name).
    instance: str = "main"
    #: Workers started with the stack (more with :meth:`ReapiStack.start_worker`).
    workers: int = 1
    worker_properties: Mapping[str, Sequence[str]] = field(
        default_factory=lambda: DEFAULT_WORKER_PROPERTIES
    )
    #: Platform keys the scheduler matches besides OSFamily and ISA; others are refused.
    match_property_keys: tuple[str, ...] = METRALE_PLATFORM_KEYS
    #: False: CAS + action cache only (no PostgreSQL, no Execution, no workers).
    execution: bool = True
    ac_allow_updates: bool = True
    cache_failed_actions: bool = True
    #: BuildGrid's bot-session keepalive and the workers' poll (≥ 3.75 s, see reapi_worker).
    keepalive_s: float = 4.0
    #: How long a job no worker could take waits before the assigner tries it again.
    failure_backoff_s: float = 0.25
    #: Directories covered by an empty tmpfs for the workers' commands (the client's files).
    hide: tuple[Path, ...] = ()
    #: Workers also inline stdout/stderr in the ActionResult (``stdout_raw``).
    inline_stdio: bool = False


class ReapiStack:
    """A running BuildGrid server (and workers) on 127.0.0.1; see the module docstring."""

    def __init__(self, *, options: StackOptions, venv: Path, database_url: str | None) -> None:
        self.options = options
        self.venv = venv
        self.python = venv / "bin" / "python"
        self.instance = options.instance
        self.base = Path(tempfile.mkdtemp(prefix="metrale-reapi-"))
        self.cas_dir = self.base / "cas"
        self.port = 0
        self.database_url = database_url
        self.workers: list[ReapiWorker] = []
        self.hidden: tuple[Path, ...] = ()
        #: Why the workers' commands can see the client's files (None: ``hide`` works).
        self.isolation_error: str | None = None
        self._namespace: list[str] = []
        self._server: subprocess.Popen[bytes] | None = None
        self._config = self.base / "buildgrid.yml"
        self._server_log = self.base / "server.log"
        self._worker_count = 0
        self._pending: list[PendingExecute] = []

    @property
    def url(self) -> str:
        """The server's endpoint, ``grpc://127.0.0.1:PORT``."""
        return f"grpc://127.0.0.1:{self.port}"

    # -- the server ---------------------------------------------------------------------------

    def _write_config(self) -> None:
        self._config.write_text(
            server_config(
                port=self.port,
                cas_dir=self.cas_dir,
                instance=self.instance,
                database_url=self.database_url,
                match_property_keys=self.options.match_property_keys,
                ac_allow_updates=self.options.ac_allow_updates,
                cache_failed_actions=self.options.cache_failed_actions,
                keepalive_s=self.options.keepalive_s,
                failure_backoff_s=self.options.failure_backoff_s,
            )
        )

    def _spawn_server(self) -> None:
        with open(self._server_log, "ab") as log:
            self._server = subprocess.Popen(
                [str(self.python), "-c", BGD_SERVER, "server", "start", str(self._config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.base,
                env=_child_env(),
                start_new_session=True,
            )

    def start_server(self, *, timeout: float = _READY_S) -> float:
        """Start the server (again, on the same port); the seconds until it answered.

        Raises ``RuntimeError`` with the server's log tail when it exits or does not answer.
        """
        if self.server_running():
            raise RuntimeError("the server is already running")
        started = time.monotonic()
        self._spawn_server()
        self._wait_ready(timeout)
        return time.monotonic() - started

    def _wait_ready(self, timeout: float) -> None:
        assert self._server is not None
        waiter = self._probe_process([{"op": "wait_ready", "timeout": timeout}])
        try:
            while waiter.poll() is None:
                if self._server.poll() is not None:
                    code = self._server.returncode
                    raise RuntimeError(f"the BuildGrid server exited {code}:\n{self.server_log()}")
                time.sleep(0.02)
            out, err = waiter.communicate()
        finally:
            _stop_process(waiter, 1.0, group=False)
        result = _probe_results(waiter.returncode, out, err)[0]
        if not result.get("ok"):
            raise RuntimeError(
                f"the BuildGrid server did not answer within {timeout:g} s "
                f"({result.get('error')}):\n{self.server_log()}"
            )

    def stop_server(self, *, graceful: bool = False) -> None:
        """Stop the server: SIGKILL (a crash), or with ``graceful`` SIGTERM (BuildGrid's own
        shutdown, 1-2 s; SIGKILL after 10 s). Workers, PostgreSQL and the disk CAS stay."""
        if self._server is None:
            return
        if not graceful:
            _signal(self._server, signal.SIGKILL, True)
        _stop_process(self._server, 10.0)
        self._server = None

    def server_running(self) -> bool:
        return self._server is not None and self._server.poll() is None

    def server_log(self) -> str:
        """The tail of the server's output."""
        try:
            return log_tail(self._server_log.read_text(errors="replace"), 40)
        except FileNotFoundError:
            return ""

    # -- workers ------------------------------------------------------------------------------

    def start_worker(
        self,
        properties: Mapping[str, Sequence[str]] | None = None,
        *,
        name: str | None = None,
        wait: bool = True,
        inline_stdio: bool | None = None,
    ) -> ReapiWorker:
        """Start a worker offering ``properties`` (default :data:`DEFAULT_WORKER_PROPERTIES`).

        With ``wait`` returns once it registered (raises ``TimeoutError`` otherwise). A
        ``name`` already used is the same bot id: BuildGrid requeues that bot's leases.
        ``inline_stdio`` overrides :attr:`StackOptions.inline_stdio` for this worker.
        """
        if not self.options.execution:
            raise RuntimeError("a CAS + action cache stack (execution=False) has no Bots service")
        self._worker_count += 1
        name = name or f"w{self._worker_count}"
        props = {
            k: tuple(v)
            for k, v in (
                self.options.worker_properties if properties is None else properties
            ).items()
        }
        events = self.base / "workers" / f"{name}.{self._worker_count}.events"
        log_path = events.with_suffix(".log")
        events.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            *(self._namespace if self.hidden else []),
            str(self.python),
            "-m",
            "tests.support.reapi_worker",
            f"--url={self.url}",
            f"--instance={self.instance}",
            f"--name={name}",
            f"--work-dir={self.base / 'work' / name}",
            f"--events={events}",
            f"--keepalive={self.options.keepalive_s:g}",
            *[f"--property={k}={v}" for k, values in sorted(props.items()) for v in values],
            *[f"--hide={p}" for p in self.hidden],
            *(["--inline-stdio"] if _pick(inline_stdio, self.options.inline_stdio) else []),
        ]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.base,
                env=_child_env(PYTHONPATH=str(REPO)),
                start_new_session=True,
            )
        worker = ReapiWorker(
            name=name, properties=props, process=process, events_path=events, log_path=log_path
        )
        self.workers.append(worker)
        if wait:
            worker.wait_event("registered", timeout=_READY_S)
        return worker

    # -- the CAS on disk ----------------------------------------------------------------------

    def blob_path(self, digest_hash: str) -> Path:
        """Where BuildGrid's disk storage keeps the blob ``digest_hash``."""
        return self.cas_dir / "cas" / "objects" / digest_hash[:2] / digest_hash[2:]

    def corrupt_blob(self, digest_hash: str, data: bytes | None = None) -> Path:
        """Overwrite a stored blob's file in place: with ``data``, else its bytes inverted
        (same size, wrong hash). Its path; ``FileNotFoundError`` when it is not stored."""
        path = self.blob_path(digest_hash)
        old = path.read_bytes()
        new = bytes(b ^ 0xFF for b in old) if data is None else data
        with open(path, "r+b") as f:
            f.write(new)
            f.truncate()
        return path

    # -- the probe ----------------------------------------------------------------------------

    def _probe_process(self, ops: Sequence[Mapping[str, object]]) -> subprocess.Popen[str]:
        request = self.base / f"probe-{uuid.uuid4().hex[:8]}.json"
        request.write_text(json.dumps({"url": self.url, "instance": self.instance, "ops": ops}))
        with open(request, encoding="utf-8") as stdin:
            process = subprocess.Popen(
                [str(self.python), "-m", "tests.support.reapi_probe"],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=self.base,
                env=_child_env(PYTHONPATH=str(REPO)),
            )
        request.unlink()
        return process

    def probe(
        self, ops: Sequence[Mapping[str, object]], *, timeout: float = 120.0
    ) -> list[dict[str, Any]]:
        """Run raw :mod:`tests.support.reapi_probe` ops; their JSON results."""
        process = self._probe_process(ops)
        try:
            out, err = process.communicate(timeout=timeout)
        finally:
            _stop_process(process, 1.0, group=False)
        return _probe_results(process.returncode, out, err)

    def execute(
        self, action: ProbeAction, *, deadline_s: float = 60.0, skip_cache_lookup: bool = False
    ) -> ExecuteOutcome:
        """Upload ``action``'s inputs and Execute it; what came back (never raises for RPCs)."""
        return self.execute_all(
            [action], deadline_s=deadline_s, skip_cache_lookup=skip_cache_lookup
        )[0]

    def execute_all(
        self,
        actions: Sequence[ProbeAction],
        *,
        deadline_s: float = 60.0,
        skip_cache_lookup: bool = False,
    ) -> list[ExecuteOutcome]:
        """:meth:`execute` each action in turn, in one probe process (saves ~0.2 s each)."""
        ops = [
            {
                "op": "execute",
                "action": a.to_dict(),
                "deadline": deadline_s,
                "skip_cache_lookup": skip_cache_lookup,
            }
            for a in actions
        ]
        results = self.probe(ops, timeout=deadline_s * len(actions) + 30)
        return [ExecuteOutcome.from_json(r) for r in results]

    def start_execute(
        self, action: ProbeAction, *, deadline_s: float = 60.0, skip_cache_lookup: bool = False
    ) -> PendingExecute:
        """:meth:`execute` in the background (a test acts on the stack meanwhile)."""
        op = {
            "op": "execute",
            "action": action.to_dict(),
            "deadline": deadline_s,
            "skip_cache_lookup": skip_cache_lookup,
        }
        pending = PendingExecute(self._probe_process([op]), deadline_s + 30)
        self._pending.append(pending)
        return pending

    def read_blob(
        self, digest_hash: str, size: int, *, via: Literal["batch", "bytestream"] = "batch"
    ) -> BlobRead:
        """Read one blob as the server serves it (unchecked)."""
        return BlobRead.from_json(
            self.probe([{"op": "read_blob", "hash": digest_hash, "size": size, "via": via}])[0]
        )

    def _boot(self) -> None:
        """The first start: server (on a free port, retried if it was taken) and workers."""
        options = self.options
        hidden = tuple(p.resolve() for p in options.hide if p.is_dir())
        for own in (self.base, self.venv.resolve(), REPO):
            for path in hidden:
                if own == path or path in own.parents:
                    raise ValueError(f"cannot hide {path}: the stack needs {own} below it")
        if hidden:
            self._namespace, self.isolation_error = _namespace_prefix()
            self.hidden = hidden if self.isolation_error is None else ()
        for attempt in range(3):
            self.port = free_port()
            self._write_config()
            self._spawn_server()
            # The workers retry until the server answers: start them meanwhile.
            for _ in range(options.workers if options.execution else 0):
                self.start_worker(wait=False)
            try:
                self._wait_ready(_READY_S)
                break
            except RuntimeError:
                if attempt == 2 or "Address already in use" not in self.server_log():
                    raise
                for worker in self.workers:  # they know the taken port: start others
                    worker.kill()
                self.workers.clear()
        for worker in self.workers:
            worker.wait_event("registered", timeout=_READY_S)

    # -- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every worker and the server (by PID), remove the stack's files."""
        for pending in self._pending:
            _stop_process(pending.process, 0.0, group=False)
        for worker in self.workers:
            _signal(worker.process, signal.SIGTERM, True)
        for worker in self.workers:
            _stop_process(worker.process, 5.0)
            worker.kill_commands()
        self.stop_server()
        if os.environ.get("METRALE_REAPI_KEEP") != "1":
            shutil.rmtree(self.base, ignore_errors=True)


def _probe_results(code: int, out: str, err: str) -> list[dict[str, Any]]:
    """The results a probe process printed; ``RuntimeError`` with its stderr if it failed."""
    if code != 0:
        raise RuntimeError(f"reapi_probe exited {code}:\n{log_tail(err)}")
    results: list[dict[str, Any]] = json.loads(out)["results"]
    return results


def _pick(given: bool | None, default: bool) -> bool:
    return default if given is None else given


class PendingExecute:
    """An Execute running in a background probe process."""

    def __init__(self, process: subprocess.Popen[str], timeout: float) -> None:
        self.process = process
        self._timeout = timeout

    def wait(self) -> ExecuteOutcome:
        """The outcome, once the Execute ended (its deadline bounds the wait)."""
        try:
            out, err = self.process.communicate(timeout=self._timeout)
        finally:
            _stop_process(self.process, 1.0, group=False)
        return ExecuteOutcome.from_json(_probe_results(self.process.returncode, out, err)[0])


def unavailable(reason: str, environ: Mapping[str, str] | None = None) -> NoReturn:
    """Skip the test for a missing prerequisite of the stack; fail it on CI (``CI=true``)."""
    env = os.environ if environ is None else environ
    if env.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"the REAPI test stack cannot run on this CI machine: {reason}", pytrace=False)
    pytest.skip(f"the REAPI test stack cannot run here: {reason}")


def _child_env(**extra: str) -> dict[str, str]:
    """A small environment for the stack's processes (nothing of the test's settings leaks)."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env.update(extra)
    return env


@contextlib.contextmanager
def reapi_stack(
    options: StackOptions = StackOptions(),
    *,
    environ: Mapping[str, str] | None = None,
    postgres: PostgresCluster | None = None,
) -> Iterator[ReapiStack]:
    """A BuildGrid stack for the block: server up and answering, workers registered.

    ``postgres``: a running cluster to put the stack's database in (a fresh one otherwise).
    Raises :class:`StackUnavailable` when the venv cannot be made or PostgreSQL is missing,
    ``RuntimeError``/``TimeoutError`` (with logs) when a piece does not start.
    """
    venv = buildgrid_venv(os.environ if environ is None else environ)
    with contextlib.ExitStack() as cleanup:
        database_url: str | None = None
        if options.execution:
            if postgres is None:
                postgres = cleanup.enter_context(postgres_cluster())
            database_url = postgres.buildgrid_database(venv, f"bgd_{uuid.uuid4().hex[:12]}")
        stack = ReapiStack(options=options, venv=venv, database_url=database_url)
        cleanup.callback(stack.close)
        stack._boot()
        yield stack
