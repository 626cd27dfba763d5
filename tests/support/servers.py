"""Real local object-store servers for tests: S3 (moto) and GCS (gcp-storage-emulator).

Both bind 127.0.0.1 on an ephemeral port, run in a daemon thread of the test
process, record every request (method, path) and are stopped by the context
manager that started them::

    with s3_server() as s3:          # s3.url("prefix") -> "s3://<bucket>/prefix"
        settings = CacheSettings(..., remote=s3.url("p"), storage_options=s3.storage_options)
    with gcs_server() as gcs:        # gcs.url("prefix") -> "gs://<bucket>/prefix"
        ...

Plus dead endpoints for outage tests: :func:`refused_endpoint`,
:func:`silent_endpoint` (accepts TCP, never answers), :data:`DNS_FAILURE_ENDPOINT`,
:func:`garbage_server` (answers 200 with random bytes to every request) and
:func:`s3_auth_enforced` (moto answers 403 to unknown credentials).

Notes: moto keeps its state per process, so every server gets a fresh bucket
name; the GCS emulator is single-threaded, ignores create-only preconditions,
and drops a trailing ``b"\r"`` from uploaded data (gcp-storage-emulator
2026.7.19 multipart parsing; the cache's verification reports such objects as
corrupt) — test payloads must not end in ``\r``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from http import server as http_server
from typing import Any

__all__ = [
    "DNS_FAILURE_ENDPOINT",
    "ObjectServer",
    "garbage_server",
    "gcs_server",
    "gcs_storage_options",
    "refused_endpoint",
    "s3_auth_enforced",
    "s3_server",
    "s3_storage_options",
    "silent_endpoint",
]

#: An endpoint whose name cannot resolve (RFC 2606 reserves ``.invalid``).
DNS_FAILURE_ENDPOINT = "http://nonexistent.invalid"

_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE", "PATCH"})


@dataclass(slots=True)
class ObjectServer:
    """A running server: its endpoint, a created bucket, and the request log."""

    scheme: str  # "s3" | "gs"
    endpoint_url: str
    bucket: str
    storage_options: dict[str, Any]
    requests: list[tuple[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, prefix: str = "") -> str:
        """An fsspec URL under this server's bucket."""
        prefix = prefix.strip("/")
        return (
            f"{self.scheme}://{self.bucket}/{prefix}"
            if prefix
            else f"{self.scheme}://{self.bucket}"
        )

    def record(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))

    def log(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.requests)

    def writes(self, since: int = 0) -> list[tuple[str, str]]:
        """Write requests (PUT/POST/DELETE/PATCH) from ``log()[since:]``."""
        return [r for r in self.log()[since:] if r[0] in _WRITE_METHODS]

    def mark(self) -> int:
        """A position in the request log, for ``writes(since=...)``."""
        with self._lock:
            return len(self.requests)


def s3_storage_options(endpoint_url: str) -> dict[str, Any]:
    """s3fs options for a moto endpoint (fixed dummy credentials)."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint_url, "region_name": "us-east-1"},
    }


def gcs_storage_options(endpoint_url: str) -> dict[str, Any]:
    """gcsfs options for an emulator endpoint (anonymous)."""
    return {"endpoint_url": endpoint_url, "token": "anon", "project": "test"}


def _http(method: str, url: str, body: bytes | None = None) -> bytes:
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        data: bytes = resp.read()
        return data


@contextlib.contextmanager
def s3_server(bucket: str | None = None) -> Iterator[ObjectServer]:
    """A moto S3 server on 127.0.0.1:<ephemeral> with ``bucket`` created; stopped on exit."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class QuietHandler(MotoRequestHandler):
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            pass

    app = DomainDispatcherApplication(create_backend_app)
    holder: dict[str, ObjectServer] = {}

    def recording(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/moto-api"):
            holder["server"].record(environ["REQUEST_METHOD"], path)
        return app(environ, start_response)

    httpd = make_server("127.0.0.1", 0, recording, threaded=True, request_handler=QuietHandler)
    endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    name = bucket or f"cache-{uuid.uuid4().hex[:12]}"
    server = ObjectServer(
        scheme="s3",
        endpoint_url=endpoint,
        bucket=name,
        storage_options=s3_storage_options(endpoint),
    )
    holder["server"] = server
    thread = threading.Thread(target=httpd.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    try:
        _http("PUT", f"{endpoint}/{name}")
        server.requests.clear()
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def s3_auth_enforced(server: ObjectServer) -> Iterator[None]:
    """Make moto check credentials (unknown keys get 403) until exit.

    moto's switch is process-wide, so keep the block short and never run tests
    of the same process in parallel with it.
    """
    previous = json.loads(_http("POST", f"{server.endpoint_url}/moto-api/reset-auth", b"0"))
    try:
        yield
    finally:
        restore = previous.get("PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT", "inf")
        _http("POST", f"{server.endpoint_url}/moto-api/reset-auth", str(restore).encode())


@contextlib.contextmanager
def gcs_server(bucket: str | None = None) -> Iterator[ObjectServer]:
    """A gcp-storage-emulator on 127.0.0.1:<ephemeral> (in memory) with ``bucket``; stopped on exit.

    Also sets ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (before gcsfs is
    imported, or every gcsfs call against the emulator waits 60 s).
    """
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    import tempfile

    from gcp_storage_emulator.server import RequestHandler
    from gcp_storage_emulator.storage import Storage

    holder: dict[str, ObjectServer] = {}
    quiet = logging.getLogger("gcp_storage_emulator")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # it logs every 404 as an error

    class RecordingHandler(RequestHandler):  # type: ignore[misc]
        def parse_request(self) -> bool:
            ok: bool = super().parse_request()
            if ok and "server" in holder:  # record before answering
                holder["server"].record(self.command, self.path.split("?", 1)[0])
            return ok

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with tempfile.TemporaryDirectory(prefix="gcs-emulator-") as data_dir:
        storage = Storage(use_memory_fs=True, data_dir=data_dir)
        httpd = http_server.HTTPServer(("127.0.0.1", 0), partial(RecordingHandler, storage))
        endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
        name = bucket or f"cache-{uuid.uuid4().hex[:12]}"
        server = ObjectServer(
            scheme="gs",
            endpoint_url=endpoint,
            bucket=name,
            storage_options=gcs_storage_options(endpoint),
        )
        thread = threading.Thread(target=httpd.serve_forever, name="gcs-emulator", daemon=True)
        thread.start()
        try:
            _http(
                "POST",
                f"{endpoint}/storage/v1/b?project=test",
                json.dumps({"name": name}).encode(),
            )
            holder["server"] = server
            yield server
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=10)
            quiet.setLevel(level)


def refused_endpoint() -> str:
    """An http endpoint on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """An http endpoint that accepts TCP connections and never answers; closed on exit."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)  # the kernel completes handshakes; nobody ever accept()s or replies
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def garbage_server(size: int = 4096) -> Iterator[ObjectServer]:
    """An HTTP server on 127.0.0.1:<ephemeral> answering 200 + ``size`` random bytes to anything.

    A misconfigured endpoint (or a broken proxy) as an S3 store sees it: every
    GET "succeeds" with garbage, every PUT and DELETE "succeeds". Its
    ``storage_options`` point s3fs at it; requests are recorded.
    """
    holder: dict[str, ObjectServer] = {}

    class Garbage(http_server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, body: bool) -> None:
            holder["server"].record(self.command, self.path.split("?", 1)[0])
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if body:
                self.wfile.write(os.urandom(size))

        def do_GET(self) -> None:
            self._answer(True)

        def do_PUT(self) -> None:
            self._answer(True)

        def do_POST(self) -> None:
            self._answer(True)

        def do_DELETE(self) -> None:
            self._answer(True)

        def do_HEAD(self) -> None:
            self._answer(False)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = http_server.ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    httpd.daemon_threads = True
    endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    server = ObjectServer(
        scheme="s3",
        endpoint_url=endpoint,
        bucket=f"garbage-{uuid.uuid4().hex[:12]}",
        storage_options=s3_storage_options(endpoint),
    )
    holder["server"] = server
    thread = threading.Thread(target=httpd.serve_forever, name="garbage-http", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
