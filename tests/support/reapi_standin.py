"""A REAPI engine stand-in for benchmarks: workers that sleep instead of compiling.

:func:`standin_engine` serves the scriptable fake's Capabilities, CAS and ByteStream
(:mod:`tests.support.reapi_fake`, the same state and handlers) with an Execute of its
own, all on one ``grpc.aio`` event loop on a thread of the calling process: the action and
its Command are read from the CAS (missing ones answer FAILED_PRECONDITION, as an engine
does, and so does a missing input root), the action waits for one of ``workers`` slots,
the slot sleeps ``seconds`` (no CPU, no thread), and the result names one small blob per
output path the Command declares (a PTX-looking text naming the path, stored in the CAS),
exit 0. Its action cache is always empty: every Execute runs. So the client's own cost
is what a benchmark of a build against it measures, and the engine's own (a few hundred
microseconds per action, on one loop) stays out of its way; the engine's counts say what
ran::

    with standin_engine(workers=16, seconds=0.2) as engine:
        env["METRALE_ORCH_REMOTE_EXECUTOR"] = engine.url
        ...
    engine.executed, engine.peak      # actions run; most at once (<= workers)
    engine.fake.methods()             # every call, in order

Its CPU is the calling process's (``getrusage(RUSAGE_SELF)``), never a ``doit`` child's.
:func:`standin_process` serves it from a process of its own instead, so that the caller's
CPU and threads are the client's alone (``python -m tests.support.reapi_standin WORKERS
SECONDS`` prints its URL, serves until its stdin closes, then prints its counts as JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import resource
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from metrale_orch.remote._proto import bytestream_pb2, bytestream_pb2_grpc
from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote._proto import remote_execution_pb2_grpc as re_grpc
from metrale_orch.remote.digest import Digest, digest_bytes
from metrale_orch.remote.wire import digest_message
from tests.support.reapi_fake import FakeRemote, operation
from tests.support.reapi_fake import _ByteStream as _SyncByteStream
from tests.support.reapi_fake import _Capabilities as _SyncCapabilities
from tests.support.reapi_fake import _Cas as _SyncCas

__all__ = ["EngineProcess", "StandIn", "output_text", "standin_engine", "standin_process"]

_STAGE = re_pb2.ExecutionStage


def output_text(path: str, arch: str) -> bytes:
    """What a stand-in worker writes for an output (deterministic, small)."""
    return f".version 8.0\n.target {arch}\n.address_size 64\n// {path}\n".encode()


@dataclass
class StandIn:
    """The engine's settings and what it did (counts read after the build)."""

    fake: FakeRemote
    workers: int
    seconds: float
    executed: int = 0
    running: int = 0
    peak: int = 0
    #: Execute streams the client cancelled while the engine served them.
    cancelled: int = 0
    #: Execute streams served at once before more are refused as RESOURCE_EXHAUSTED (0:
    #: no limit), as an engine whose thread pool caps its calls does (BuildGrid), and
    #: how many were refused.
    capacity: int = 0
    refused: int = 0
    streams: int = 0
    _ids: Iterator[int] = field(default_factory=itertools.count)
    #: Made on the engine's loop (an asyncio semaphore belongs to one loop).
    _slots: asyncio.Semaphore | None = None

    @property
    def url(self) -> str:
        return self.fake.url

    async def _blob(self, digest: Any, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        data = self.fake.blobs.get(Digest(digest.hash, digest.size_bytes))
        if data is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"missing blob {digest.hash}/{digest.size_bytes}",
            )
        assert data is not None
        return data

    async def execute(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        """The Execute script (see the module docstring); counts a cancelled stream, and
        refuses one beyond ``capacity``."""
        if self.capacity and self.streams >= self.capacity:
            self.refused += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "thread pool exhausted")
        self.streams += 1
        try:
            async for op in self._execute(request, context):
                yield op
        except asyncio.CancelledError:  # the client cancelled the call
            self.cancelled += 1
            raise
        finally:
            self.streams -= 1

    async def _execute(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        self.fake.record("Execute", context)  # type: ignore[arg-type]
        action = re_pb2.Action.FromString(await self._blob(request.action_digest, context))
        command = re_pb2.Command.FromString(await self._blob(action.command_digest, context))
        if action.input_root_digest.size_bytes:  # the empty blob is always there
            await self._blob(action.input_root_digest, context)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        name = f"standin/{next(self._ids)}"
        meta = re_pb2.ExecutedActionMetadata(queued_timestamp=_now())
        yield operation(name, _STAGE.QUEUED)
        async with self._slots:
            # A worker took it: the queue time ends here, not when the client has read on.
            meta.worker_start_timestamp.CopyFrom(_now())
            self.running += 1
            self.peak = max(self.peak, self.running)
            meta.worker = f"standin-{self.running}"
            yield operation(name, _STAGE.EXECUTING)
            meta.execution_start_timestamp.CopyFrom(_now())
            try:
                await asyncio.sleep(self.seconds)
            finally:
                self.running -= 1
            meta.execution_completed_timestamp.CopyFrom(_now())
            self.executed += 1
        result = re_pb2.ActionResult(exit_code=0, execution_metadata=meta)
        arch = next((a.split("=", 1)[1] for a in command.arguments if a.startswith("-arch=")), "")
        for path in command.output_paths:
            data = output_text(path, arch or "sm_90a")
            digest = digest_bytes(data)
            self.fake.blobs[digest] = data
            result.output_files.add(path=path, digest=digest_message(digest))
        meta.worker_completed_timestamp.CopyFrom(_now())
        yield operation(name, _STAGE.COMPLETED, response=re_pb2.ExecuteResponse(result=result))


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


# The fake's handlers, answered on the loop (each is a few dictionary look-ups; the fake's
# ``fail`` and ``refuse`` scripts are not used here).


class _Capabilities(_SyncCapabilities):
    async def GetCapabilities(self, request: Any, context: Any) -> Any:
        return super().GetCapabilities(request, context)


class _Cas(_SyncCas):
    async def FindMissingBlobs(self, request: Any, context: Any) -> Any:
        return super().FindMissingBlobs(request, context)

    async def BatchUpdateBlobs(self, request: Any, context: Any) -> Any:
        return super().BatchUpdateBlobs(request, context)

    async def BatchReadBlobs(self, request: Any, context: Any) -> Any:
        return super().BatchReadBlobs(request, context)


class _ActionCache(re_grpc.ActionCacheServicer):
    """An engine's action cache that never has the answer (every Execute runs)."""

    def __init__(self, fake: FakeRemote) -> None:
        self.fake = fake

    async def GetActionResult(self, request: Any, context: Any) -> Any:
        self.fake.record("GetActionResult", context)
        await context.abort(grpc.StatusCode.NOT_FOUND, "no result")


class _ByteStream(_SyncByteStream):
    async def Read(self, request: Any, context: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        self.fake.record("Read", context)
        hash_, size = request.resource_name.split("/")[-2:]
        data = self.fake.blobs.get(Digest(hash_, int(size)))
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such blob")
            return
        for start in range(0, len(data), 65536):
            yield bytestream_pb2.ReadResponse(data=data[start : start + 65536])

    async def Write(self, request_iterator: Any, context: Any) -> Any:
        self.fake.record("Write", context)
        name, parts = "", []
        async for request in request_iterator:
            name = name or request.resource_name
            parts.append(request.data)
        hash_, size = name.split("/")[-2:]
        self.fake.blobs[Digest(hash_, int(size))] = b"".join(parts)
        return bytestream_pb2.WriteResponse(committed_size=int(size))


class _Execution(re_grpc.ExecutionServicer):
    def __init__(self, engine: StandIn) -> None:
        self.engine = engine

    async def Execute(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for op in self.engine.execute(request, context):
            yield op


async def _start(engine: StandIn) -> grpc.aio.Server:
    # gRPC's server cancels calls beyond 1,000 waiting for the application (its pending
    # requests' soft limit): thousands of actions in flight arrive faster than one loop
    # takes them, and a refused call would be the engine's doing, not the client's.
    server = grpc.aio.server(
        options=[
            ("grpc.max_concurrent_streams", 1 << 20),
            ("grpc.server.max_pending_requests", 1 << 20),
            ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
        ]
    )
    fake = engine.fake
    re_grpc.add_CapabilitiesServicer_to_server(_Capabilities(fake), server)  # type: ignore[no-untyped-call]
    re_grpc.add_ContentAddressableStorageServicer_to_server(_Cas(fake), server)  # type: ignore[no-untyped-call]
    re_grpc.add_ExecutionServicer_to_server(_Execution(engine), server)  # type: ignore[no-untyped-call]
    re_grpc.add_ActionCacheServicer_to_server(_ActionCache(fake), server)  # type: ignore[no-untyped-call]
    bytestream_pb2_grpc.add_ByteStreamServicer_to_server(_ByteStream(fake), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    fake.url = f"grpc://127.0.0.1:{port}"
    return server


@contextlib.contextmanager
def standin_engine(workers: int, seconds: float, *, capacity: int = 0) -> Iterator[StandIn]:
    """Serve a stand-in engine of ``workers`` slots sleeping ``seconds`` per action (and
    at most ``capacity`` Execute streams at once, 0: any number), on an event loop of its
    own thread, for the ``with`` block."""
    engine = StandIn(FakeRemote(), workers, seconds, capacity=capacity)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="standin-engine", daemon=True)
    thread.start()
    try:
        server = asyncio.run_coroutine_threadsafe(_start(engine), loop).result(30)
        try:
            yield engine
        finally:
            asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@dataclass
class EngineProcess:
    """A stand-in in a process of its own: its URL, and once it ended, its counts."""

    url: str
    #: CPU seconds (user + system) the engine's process spent, calls it answered, actions
    #: it ran, and the most it ran at once.
    cpu: float = 0.0
    calls: int = 0
    executed: int = 0
    peak: int = 0


@contextlib.contextmanager
def standin_process(workers: int, seconds: float) -> Iterator[EngineProcess]:
    """Serve a stand-in engine from a process of its own for the ``with`` block; its
    counts are filled in when the block ends."""
    argv = [sys.executable, "-m", "tests.support.reapi_standin", str(workers), str(seconds)]
    repo = Path(__file__).resolve().parents[2]
    with subprocess.Popen(
        argv, cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        engine = EngineProcess(proc.stdout.readline().strip())
        try:
            yield engine
        finally:
            proc.stdin.close()
            counts = json.loads(proc.stdout.read() or "{}")
        for name in ("cpu", "calls", "executed", "peak"):
            setattr(engine, name, counts.get(name, 0))


def main() -> None:
    """Serve until stdin closes (see the module docstring)."""
    with standin_engine(workers=int(sys.argv[1]), seconds=float(sys.argv[2])) as engine:
        print(engine.url, flush=True)
        sys.stdin.read()
        calls = len(engine.fake.methods())
    use = resource.getrusage(resource.RUSAGE_SELF)
    counts = {"cpu": use.ru_utime + use.ru_stime, "calls": calls}
    print(json.dumps(counts | {"executed": engine.executed, "peak": engine.peak}), flush=True)


if __name__ == "__main__":
    main()
