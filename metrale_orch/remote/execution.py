"""Execute: follow the operation stream to its end, and unpack the ExecuteResponse.

- One Execute call per action. The operation's name is kept; a stream that breaks
  (UNAVAILABLE, a reset, an end before ``done``) is followed with WaitExecution on
  that name, at most :data:`STREAM_RETRIES` times with a short pause; a name the server
  forgot (NOT_FOUND) starts Execute afresh (the action digest makes that idempotent).
  A failure before any operation arrived is not retried: a dead remote costs one call.
- Each stream is a ``grpc.aio`` call awaited on the client's loop: cancelling the task
  that awaits :func:`execute` cancels the stream (the server sees the cancel) and the
  ``CancelledError`` goes on up.
- Everything runs under one deadline. When it passes, the error says where the action
  was: still queued ("no worker for platform ... took the action"), executing, or never
  answered.
- The response's status decides: OK is a result; DEADLINE_EXCEEDED is a result with
  ``timed_out`` (the action's own timeout on the worker); the rest map as RPC failures
  do (:meth:`~metrale_orch.remote.rpc.Rpc.code_error`). An action that ran and exited
  non-zero is a result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
import grpc.aio
from google.longrunning import operations_pb2
from google.protobuf import timestamp_pb2

from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.digest import Digest
from metrale_orch.remote.errors import RemoteError, RemoteUnavailable
from metrale_orch.remote.rpc import CODES, Rpc, code_of, describe, status_error
from metrale_orch.remote.wire import digest_message

__all__ = ["STREAM_RETRIES", "ExecuteResult", "Timings", "execute"]

#: Broken operation streams followed with WaitExecution before giving up.
STREAM_RETRIES = 3
#: Seconds before the first WaitExecution after a break (then twice, three times that).
PAUSE = 0.2
#: Codes with which a stream may break while the operation goes on at the server.
_BREAKS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.ABORTED,
    }
)
_STAGE = re_pb2.ExecutionStage
_Req = TypeVar("_Req")
#: An operation stream (Execute or WaitExecution).
_Stream = grpc.aio.UnaryStreamCall[_Req, operations_pb2.Operation]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timings:
    """Where an action's time went: the worker's ``ExecutedActionMetadata`` timestamps
    (seconds since the epoch; None where the server left one out) and the client's wall
    time from the Execute call to the answer."""

    wall: float
    worker: str = ""
    queued: float | None = None
    worker_start: float | None = None
    input_fetch_start: float | None = None
    input_fetch_completed: float | None = None
    execution_start: float | None = None
    execution_completed: float | None = None
    output_upload_start: float | None = None
    output_upload_completed: float | None = None
    worker_completed: float | None = None

    def durations(self) -> dict[str, float]:
        """Seconds per phase where both ends are known: ``queued`` (to the worker's
        start), ``input_fetch``, ``execution``, ``output_upload``, ``worker`` (pure)."""
        spans = {
            "queued": (self.queued, self.worker_start),
            "input_fetch": (self.input_fetch_start, self.input_fetch_completed),
            "execution": (self.execution_start, self.execution_completed),
            "output_upload": (self.output_upload_start, self.output_upload_completed),
            "worker": (self.worker_start, self.worker_completed),
        }
        return {k: end - begin for k, (begin, end) in spans.items() if begin and end}


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteResult:
    """An action that ran (or came from the action cache): its result, whatever its exit."""

    result: re_pb2.ActionResult
    #: The server answered from its action cache.
    cached: bool
    #: The worker stopped the action at its timeout (the result may be partial).
    timed_out: bool
    #: The server's message for a person (may be empty).
    message: str
    operation: str
    timings: Timings

    @property
    def exit_code(self) -> int:
        return int(self.result.exit_code)


@dataclass(slots=True)
class _Watch:
    """What the client has seen of one operation; ``on_executing`` is told, once, the
    seconds from the call to a worker taking the action."""

    name: str = ""
    stage: int = _STAGE.UNKNOWN
    stages: dict[int, float] = field(default_factory=dict)
    start: float = 0.0
    on_executing: Callable[[float], None] | None = None

    def see(self, op: operations_pb2.Operation) -> None:
        if op.name:
            self.name = op.name
        meta = re_pb2.ExecuteOperationMetadata()
        if op.HasField("metadata") and op.metadata.Unpack(meta) and meta.stage != self.stage:
            self.stage = meta.stage
            now = time.monotonic()
            first = meta.stage not in self.stages
            self.stages.setdefault(meta.stage, now)
            if first and meta.stage == _STAGE.EXECUTING and self.on_executing is not None:
                self.on_executing(now - self.start)


async def execute(
    rpc: Rpc,
    action: Digest,
    *,
    skip_cache_lookup: bool,
    timeout: float,
    platform: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    queue_timeout: float | None = None,
    on_executing: Callable[[float], None] | None = None,
) -> ExecuteResult:
    """Run ``action`` remotely and wait for it, under ``timeout`` seconds in all, and at
    most ``queue_timeout`` seconds before a worker takes it (None: no bound but
    ``timeout``; no worker for the platform is then said after ``queue_timeout``).
    ``on_executing`` is called with the seconds it waited when the server says a worker
    took it.

    ``platform`` only words the error when no worker takes the action. Raises
    :class:`RemoteUnavailable` (the caller may fall back), :class:`RemoteAuthError`
    or :class:`RemoteRejected`.
    """
    start = time.monotonic()
    deadline = start + timeout
    request = re_pb2.ExecuteRequest(
        instance_name=rpc.instance,
        action_digest=digest_message(action),
        skip_cache_lookup=skip_cache_lookup,
    )
    watch = _Watch(start=start, on_executing=on_executing)
    breaks = 0
    queue_deadline = deadline if queue_timeout is None else min(deadline, start + queue_timeout)
    while True:
        now = time.monotonic()
        waiting = watch.stage != _STAGE.EXECUTING and watch.stage != _STAGE.COMPLETED
        limit = queue_deadline if waiting else deadline
        remaining = limit - now
        if remaining <= 0:
            raise _deadline_error(rpc, watch, limit - start, platform)
        try:
            op, why = await _follow(rpc, request, watch, remaining, (limit - start, platform))
        except RemoteUnavailable:
            if not waiting or watch.stage != _STAGE.EXECUTING or time.monotonic() >= deadline:
                raise
            continue  # a worker took it as the queue deadline passed: wait for it to end
        if op is not None:
            return _result(rpc, op, watch, time.monotonic() - start, timeout)
        breaks += 1
        if breaks > STREAM_RETRIES:
            raise RemoteUnavailable(
                rpc.url, f"the Execute stream broke {breaks} times (last: {why})"
            )
        await asyncio.sleep(max(0.0, min(PAUSE * breaks, deadline - time.monotonic())))


async def _follow(
    rpc: Rpc,
    request: re_pb2.ExecuteRequest,
    watch: _Watch,
    remaining: float,
    context: tuple[float, Mapping[str, str] | Iterable[tuple[str, str]] | None],
) -> tuple[operations_pb2.Operation | None, str]:
    """One Execute or WaitExecution stream: (the finished operation, "") or (None, why it
    broke). Raises for a failure that is not a break."""
    calls = rpc.calls()
    with calls.streams.channel() as index:  # the connection with the fewest streams
        call: _Stream[re_pb2.WaitExecutionRequest] | _Stream[re_pb2.ExecuteRequest]
        if watch.name:
            call_name = "WaitExecution"
            call = calls.wait_execution[index](
                re_pb2.WaitExecutionRequest(name=watch.name),
                timeout=remaining,
                metadata=rpc.metadata,
            )
        else:
            call_name = "Execute"
            call = calls.execute[index](request, timeout=remaining, metadata=rpc.metadata)
        try:
            async for op in call:
                watch.see(op)
                if op.done:
                    return op, ""
            return None, "the stream ended before the action finished"
        except grpc.RpcError as exc:
            code = code_of(exc)
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise _deadline_error(rpc, watch, *context) from None
            if code is grpc.StatusCode.NOT_FOUND and watch.name:
                lost, watch.name = watch.name, ""
                return None, f"the server lost operation {lost}"
            if watch.name and code in _BREAKS:
                return None, f"{code.name}: {describe(exc.details())}"
            raise rpc.error(exc, call_name, remaining) from None
        finally:
            call.cancel()


def _result(
    rpc: Rpc, op: operations_pb2.Operation, watch: _Watch, wall: float, timeout: float
) -> ExecuteResult:
    if op.WhichOneof("result") == "error":
        raise status_error(rpc, op.error, "Execute", timeout)
    response = re_pb2.ExecuteResponse()
    if op.WhichOneof("result") != "response" or not op.response.Unpack(response):
        got = op.response.type_url if op.HasField("response") else "no response"
        raise RemoteUnavailable(rpc.url, f"bad answer: Execute finished with {got}")
    timed_out = CODES.get(response.status.code) is grpc.StatusCode.DEADLINE_EXCEEDED
    if response.status.code != 0 and not timed_out:
        raise status_error(rpc, response.status, "Execute", timeout)
    return ExecuteResult(
        result=response.result,
        cached=response.cached_result,
        timed_out=timed_out,
        message=response.message,
        operation=watch.name,
        timings=timings(response.result.execution_metadata, wall),
    )


def timings(meta: re_pb2.ExecutedActionMetadata, wall: float) -> Timings:
    """The :class:`Timings` of a result's metadata (pure)."""

    def at(name: str) -> float | None:
        if not meta.HasField(name):
            return None
        stamp: timestamp_pb2.Timestamp = getattr(meta, name)
        return stamp.seconds + stamp.nanos / 1e9

    return Timings(
        wall=wall,
        worker=meta.worker,
        queued=at("queued_timestamp"),
        worker_start=at("worker_start_timestamp"),
        input_fetch_start=at("input_fetch_start_timestamp"),
        input_fetch_completed=at("input_fetch_completed_timestamp"),
        execution_start=at("execution_start_timestamp"),
        execution_completed=at("execution_completed_timestamp"),
        output_upload_start=at("output_upload_start_timestamp"),
        output_upload_completed=at("output_upload_completed_timestamp"),
        worker_completed=at("worker_completed_timestamp"),
    )


def _deadline_error(
    rpc: Rpc,
    watch: _Watch,
    timeout: float,
    platform: Mapping[str, str] | Iterable[tuple[str, str]] | None,
) -> RemoteError:
    if watch.stage == _STAGE.EXECUTING:
        reason = f"the action was still executing after {timeout:g} s (operation {watch.name})"
    elif watch.stage == _STAGE.CACHE_CHECK:
        reason = f"the server was still checking its cache after {timeout:g} s"
    elif watch.name:
        reason = (
            f"no worker for platform {_platform_text(platform)} took the action "
            f"within {timeout:g} s (still queued)"
        )
    else:
        reason = f"no answer to Execute within {timeout:g} s"
    return RemoteUnavailable(rpc.url, reason)


def _platform_text(platform: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> str:
    if platform is None:
        return "(not given)"
    pairs = platform.items() if isinstance(platform, Mapping) else platform
    text = " ".join(f"{name}={value}" for name, value in sorted(pairs))
    return text or "(no properties)"
