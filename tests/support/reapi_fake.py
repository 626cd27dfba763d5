"""A scriptable REAPI server in the test process, for what a real server will not do on cue.

:func:`fake_remote` serves Capabilities, the CAS, ByteStream, the action cache (reads of
``results``) and Execution on
127.0.0.1 (an ephemeral port) from a :class:`FakeRemote` whose state a test sets:
the capabilities, the stored blobs (tampered ones included: the fake serves what
it holds, never checking digests), an error to answer every call with, and the
Execute / WaitExecution behaviour as generator functions of (request, context).
Every call's method and metadata are recorded::

    with fake_remote() as fake:
        fake.blobs[digest] = b"not what the digest says"
        client = RemoteClient(fake.url)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.longrunning import operations_pb2

from metrale_orch.executor.action import RemoteForm
from metrale_orch.executor.offload import RemoteRun
from metrale_orch.executor.reapi import ReapiBackend
from metrale_orch.remote._proto import (
    bytestream_pb2,
    bytestream_pb2_grpc,
    remote_execution_pb2,
    remote_execution_pb2_grpc,
)
from metrale_orch.remote.digest import Digest

__all__ = ["FakeRemote", "fake_remote", "operation", "run_once"]

re_pb2 = remote_execution_pb2

#: Execute / WaitExecution behaviour: yields the operations to stream.
Script = Callable[[Any, grpc.ServicerContext], Iterator[operations_pb2.Operation]]


def _caps() -> re_pb2.ServerCapabilities:
    return re_pb2.ServerCapabilities(
        cache_capabilities=re_pb2.CacheCapabilities(
            digest_functions=[re_pb2.DigestFunction.SHA256],
            max_batch_total_size_bytes=1024 * 1024,
            action_cache_update_capabilities=re_pb2.ActionCacheUpdateCapabilities(
                update_enabled=True
            ),
        ),
        execution_capabilities=re_pb2.ExecutionCapabilities(
            digest_function=re_pb2.DigestFunction.SHA256, exec_enabled=True
        ),
    )


def _no_script(request: Any, context: grpc.ServicerContext) -> Iterator[operations_pb2.Operation]:
    context.abort(grpc.StatusCode.UNIMPLEMENTED, "no script")
    yield from ()


@dataclass
class FakeRemote:
    """The fake's state (see the module docstring)."""

    url: str = ""
    caps: re_pb2.ServerCapabilities = field(default_factory=_caps)
    blobs: dict[Digest, bytes] = field(default_factory=dict)
    #: (code, detail) every call is answered with, when set.
    fail: tuple[grpc.StatusCode, str] | None = None
    #: Per-blob statuses BatchUpdateBlobs answers with (the blob is then not stored).
    refuse: dict[Digest, tuple[grpc.StatusCode, str]] = field(default_factory=dict)
    #: The action cache: action digest -> its result (GetActionResult answers NOT_FOUND
    #: for any other).
    results: dict[Digest, re_pb2.ActionResult] = field(default_factory=dict)
    execute: Script = _no_script
    wait: Script = _no_script
    calls: list[tuple[str, dict[str, str | bytes]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, method: str, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.calls.append((method, dict(context.invocation_metadata())))
        if self.fail is not None:
            context.abort(*self.fail)

    def methods(self) -> list[str]:
        with self.lock:
            return [m for m, _ in self.calls]


def operation(
    name: str,
    stage: int,
    *,
    response: re_pb2.ExecuteResponse | None = None,
) -> operations_pb2.Operation:
    """An Execute operation at ``stage``; done, with ``response``, when one is given."""
    op = operations_pb2.Operation(name=name, done=response is not None)
    op.metadata.Pack(re_pb2.ExecuteOperationMetadata(stage=re_pb2.ExecutionStage.Value.Name(stage)))
    if response is not None:
        op.response.Pack(response)
    return op


class _Capabilities(remote_execution_pb2_grpc.CapabilitiesServicer):
    def __init__(self, fake: FakeRemote) -> None:
        self.fake = fake

    def GetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.record("GetCapabilities", context)
        return self.fake.caps


class _Cas(remote_execution_pb2_grpc.ContentAddressableStorageServicer):
    def __init__(self, fake: FakeRemote) -> None:
        self.fake = fake

    def FindMissingBlobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.record("FindMissingBlobs", context)
        missing = [
            d for d in request.blob_digests if Digest(d.hash, d.size_bytes) not in self.fake.blobs
        ]
        return re_pb2.FindMissingBlobsResponse(missing_blob_digests=missing)

    def BatchUpdateBlobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.record("BatchUpdateBlobs", context)
        out = re_pb2.BatchUpdateBlobsResponse()
        for r in request.requests:
            digest = Digest(r.digest.hash, r.digest.size_bytes)
            answer = out.responses.add(digest=r.digest)
            if digest in self.fake.refuse:
                code, detail = self.fake.refuse[digest]
                answer.status.code, answer.status.message = code.value[0], detail
            else:
                self.fake.blobs[digest] = r.data
        return out

    def BatchReadBlobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.record("BatchReadBlobs", context)
        out = re_pb2.BatchReadBlobsResponse()
        for d in request.digests:
            data = self.fake.blobs.get(Digest(d.hash, d.size_bytes))
            answer = out.responses.add(digest=d)
            if data is None:
                answer.status.code = grpc.StatusCode.NOT_FOUND.value[0]
            else:
                answer.data = data
        return out


class _ActionCache(remote_execution_pb2_grpc.ActionCacheServicer):
    def __init__(self, fake: FakeRemote) -> None:
        self.fake = fake

    def GetActionResult(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.record("GetActionResult", context)
        digest = request.action_digest
        found = self.fake.results.get(Digest(digest.hash, digest.size_bytes))
        if found is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no result")
        return found


class _ByteStream(bytestream_pb2_grpc.ByteStreamServicer):
    def __init__(self, fake: FakeRemote) -> None:
        self.fake = fake

    def Read(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.fake.record("Read", context)
        hash_, size = request.resource_name.split("/")[-2:]
        data = self.fake.blobs.get(Digest(hash_, int(size)))
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such blob")
        for start in range(0, len(data), 65536):
            yield bytestream_pb2.ReadResponse(data=data[start : start + 65536])

    def Write(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        self.fake.record("Write", context)
        name, parts = "", []
        for request in request_iterator:
            name = name or request.resource_name
            parts.append(request.data)
        hash_, size = name.split("/")[-2:]
        self.fake.blobs[Digest(hash_, int(size))] = b"".join(parts)
        return bytestream_pb2.WriteResponse(committed_size=int(size))


class _Execution(remote_execution_pb2_grpc.ExecutionServicer):
    def __init__(self, fake: FakeRemote) -> None:
        self.fake = fake

    def Execute(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.fake.record("Execute", context)
        yield from self.fake.execute(request, context)

    def WaitExecution(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.fake.record("WaitExecution", context)
        yield from self.fake.wait(request, context)


@contextlib.contextmanager
def fake_remote(threads: int = 16) -> Iterator[FakeRemote]:
    """Serve a fresh :class:`FakeRemote` on 127.0.0.1 for the ``with`` block, on ``threads``
    server threads (one per call in flight, a stream's for as long as it lasts)."""
    fake = FakeRemote()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    remote_execution_pb2_grpc.add_CapabilitiesServicer_to_server(_Capabilities(fake), server)
    remote_execution_pb2_grpc.add_ContentAddressableStorageServicer_to_server(_Cas(fake), server)
    remote_execution_pb2_grpc.add_ExecutionServicer_to_server(_Execution(fake), server)
    remote_execution_pb2_grpc.add_ActionCacheServicer_to_server(_ActionCache(fake), server)
    bytestream_pb2_grpc.add_ByteStreamServicer_to_server(_ByteStream(fake), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    fake.url = f"grpc://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        server.stop(grace=None).wait()


def run_once(backend: ReapiBackend, form: RemoteForm, timeout: float = 30.0) -> RemoteRun:
    """``backend.run(form)`` on a loop of its own, as ``remote check`` runs it: the
    backend's channels are closed after it (the loop ends with the call)."""

    async def once() -> RemoteRun:
        try:
            return await backend.run(form, timeout=timeout)
        finally:
            await backend.client.aclose()

    return asyncio.run(once())
