"""A CAS + action cache BuildGrid server for the REAPI client's tests (no database).

:func:`cas_server` starts ``bgd server start`` (BuildGrid 0.4.4, in a venv of its own:
its generated protos cannot load beside googleapis-common-protos) on 127.0.0.1 at a
free port, with in-memory LRU storage, the CAS, ByteStream and action cache services
under one instance name, and no execution (that needs PostgreSQL and a worker: the
full stack fixture). It waits until the port accepts connections, yields a
:class:`CasServer`, and stops the server's process group (the one it started) on exit::

    with cas_server() as server:      # server.url == "grpc://127.0.0.1:<port>"
        client = RemoteClient(server.url, instance=server.instance)

BuildGrid is ``$METRALE_BGD`` where set, else the test suite's BuildGrid venv
(:func:`tests.support.reapi_deps.buildgrid_venv`, made when missing, as the full stack's
fixture does); :func:`bgd_command` raises :class:`~tests.support.reapi_deps.StackUnavailable`
where neither can be had (tests skip with the reason, or fail on CI).
BuildGrid's batch limit is fixed (4 MiB less 1 KiB): tests that want ByteStream without
megabytes of data lower the client's ``batch_limit`` instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.reapi_deps import BGD, buildgrid_venv

__all__ = ["CasServer", "bgd_command", "buildgrid_python", "cas_server", "free_port"]

_READY_SECONDS = 30.0

_CONFIG = """\
server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
  method: none
storages:
  - !lru-storage &main-storage
    size: 256MB
caches:
  - !lru-action-cache &main-action
    storage: *main-storage
    max-cached-refs: 4096
    allow-updates: true
    cache-failed-actions: true
instances:
  - name: {instance}
    services:
      - !action-cache
        cache: *main-action
      - !cas
        storage: *main-storage
      - !bytestream
        storage: *main-storage
thread-pool-size: 64
"""


@dataclass(frozen=True, slots=True)
class CasServer:
    """A running BuildGrid: where to reach it, its instance, and its log file."""

    url: str
    instance: str
    port: int
    pid: int
    log: Path


def buildgrid_python() -> Path:
    """The Python of the test suite's BuildGrid venv (made when missing)."""
    return buildgrid_venv(os.environ) / "bin" / "python"


def bgd_command() -> list[str]:
    """How to run BuildGrid's ``bgd`` (see the module docstring)."""
    configured = os.environ.get("METRALE_BGD")
    if configured:
        return [configured]
    return [str(buildgrid_python()), "-c", BGD]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def cas_server(instance: str = "main") -> Iterator[CasServer]:
    """Start BuildGrid (CAS, ByteStream, action cache), yield it, stop it."""
    bgd = bgd_command()
    with tempfile.TemporaryDirectory(prefix="metrale-bgd-") as tmp:
        for _attempt in range(3):  # another process may take the port first
            port = free_port()
            config = Path(tmp) / "config.yml"
            config.write_text(_CONFIG.format(port=port, instance=instance), encoding="utf-8")
            log = Path(tmp) / f"bgd-{port}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [*bgd, "server", "start", str(config)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            try:
                if _wait_ready(proc, port):
                    yield CasServer(f"grpc://127.0.0.1:{port}", instance, port, proc.pid, log)
                    return
            finally:
                _stop(proc)
        raise RuntimeError(f"BuildGrid did not start; its log:\n{log.read_text()[-3000:]}")


def _wait_ready(proc: subprocess.Popen[bytes], port: int) -> bool:
    deadline = time.monotonic() + _READY_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group this fixture started, SIGKILL after 5 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
