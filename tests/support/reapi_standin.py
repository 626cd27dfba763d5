"""A REAPI engine stand-in for benchmarks: workers that sleep instead of compiling.

:func:`standin_engine` serves the scriptable fake's Capabilities, CAS and ByteStream
(:mod:`tests.support.reapi_fake`) with an Execute of its own: the action and its Command
are read from the CAS (missing ones answer FAILED_PRECONDITION, as an engine does, and so
does a missing input root), the action waits for one of ``workers`` slots, the slot
sleeps ``seconds`` (no CPU), and the result names one small blob per output path the
Command declares (a PTX-looking text naming the path, stored in the CAS), exit 0. No
action cache: every Execute runs. So the client's own cost is what a benchmark of a
build against it measures; the engine's counts say what ran::

    with standin_engine(workers=16, seconds=0.2) as engine:
        env["METRALE_ORCH_REMOTE_EXECUTOR"] = engine.url
        ...
    engine.executed, engine.peak      # actions run; most at once (<= workers)

The server runs on threads of the calling process (one per stream in flight, sleeping):
its CPU is the caller's, never a ``doit`` child's.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.digest import Digest, digest_bytes
from metrale_orch.remote.wire import digest_message
from tests.support.reapi_fake import FakeRemote, fake_remote, operation

__all__ = ["StandIn", "output_text", "standin_engine"]

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
    slots: threading.Semaphore = field(init=False)
    _ids: Iterator[int] = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.slots = threading.Semaphore(self.workers)

    @property
    def url(self) -> str:
        return self.fake.url

    def _blob(self, digest: Any, context: grpc.ServicerContext) -> bytes:
        data = self.fake.blobs.get(Digest(digest.hash, digest.size_bytes))
        if data is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"missing blob {digest.hash}/{digest.size_bytes}",
            )
        return data

    def execute(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """The Execute script (see the module docstring)."""
        action = re_pb2.Action.FromString(self._blob(request.action_digest, context))
        command = re_pb2.Command.FromString(self._blob(action.command_digest, context))
        if action.input_root_digest.size_bytes:  # the empty blob is always there
            self._blob(action.input_root_digest, context)
        name = f"standin/{next(self._ids)}"
        meta = re_pb2.ExecutedActionMetadata(queued_timestamp=_now())
        yield operation(name, _STAGE.QUEUED)
        with self.slots:
            with self._lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
                slot = self.running
            yield operation(name, _STAGE.EXECUTING)
            meta.worker = f"standin-{slot}"
            meta.worker_start_timestamp.CopyFrom(_now())
            meta.execution_start_timestamp.CopyFrom(meta.worker_start_timestamp)
            time.sleep(self.seconds)
            meta.execution_completed_timestamp.CopyFrom(_now())
            with self._lock:
                self.running -= 1
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


@contextlib.contextmanager
def standin_engine(workers: int, seconds: float, *, streams: int = 0) -> Iterator[StandIn]:
    """Serve a stand-in engine of ``workers`` slots sleeping ``seconds`` per action.

    ``streams``: the server threads (Execute streams in flight plus CAS calls); default
    ``4 * workers + 16``, enough for a client with ``remote_jobs`` up to ``2 * workers``.
    """
    with fake_remote(threads=streams or 4 * workers + 16) as fake:
        engine = StandIn(fake, workers, seconds)
        fake.execute = engine.execute
        yield engine
