"""The one door to the gRPC channel: the URL, the headers, typed calls, and error mapping.

:class:`Rpc` opens one channel (``grpc://host:port`` plaintext, ``grpcs://host[:port]``
TLS with the system roots or a CA file), and more for the Execute streams when a build
keeps more open than one connection carries (:mod:`~metrale_orch.remote.channels`),
sends the same metadata with every call (the caller's headers and REAPI's
``RequestMetadata``), and turns every gRPC failure
into one of :mod:`~metrale_orch.remote.errors` (:meth:`Rpc.error`). Its call objects
are typed multicallables built from the generated descriptors' service and method
names, so no method path is spelled by hand. The channels are ``grpc.aio`` ones, bound to
the event loop that opened them (:class:`Calls`, one per loop): every call of a build is a
coroutine on that loop, and nothing holds a thread while it waits for the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import re
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

import grpc
import grpc.aio
from google.longrunning import operations_pb2
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import Message
from google.rpc import status_pb2

from metrale_orch.remote._proto import bytestream_pb2 as bs_pb2
from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.channels import ChannelPool, channels_for
from metrale_orch.remote.errors import (
    RemoteAuthError,
    RemoteConfigError,
    RemoteError,
    RemoteOverloaded,
    RemoteRejected,
    RemoteUnavailable,
)

__all__ = ["Calls", "Rpc", "code_of", "describe", "header_metadata", "parse_url", "status_error"]

#: Largest message the channel accepts or sends (batch calls stay well below).
MAX_MESSAGE = 64 * 1024 * 1024
#: Codes that mean the remote cannot serve now: the caller may fall back.
INFRA_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.DATA_LOSS,
    }
)
AUTH_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
#: ``google.rpc.Status.code`` -> gRPC status code.
CODES: Mapping[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}

_HEADER_NAME = re.compile(r"[0-9a-z][0-9a-z_.-]*")
_REQUEST_METADATA = "build.bazel.remote.execution.v2.requestmetadata-bin"

_OPERATION = operations_pb2.Operation
_RESULT = re_pb2.ActionResult
Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp")
Resp_co = TypeVar("Resp_co", covariant=True)


def parse_url(url: str) -> tuple[str, bool]:
    """``(gRPC target, TLS?)`` of ``grpc://host:port`` or ``grpcs://host[:port]`` (pure).

    Raises :class:`RemoteConfigError` for anything else.
    """
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in ("grpc", "grpcs"):
        raise RemoteConfigError(
            f"URL {url!r}", "use grpc://host:port (plaintext) or grpcs://host:port (TLS)"
        )
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise RemoteConfigError(f"URL {url!r}", "the port is not a number 1-65535") from None
    host = parts.hostname
    if not host:
        raise RemoteConfigError(f"URL {url!r}", "names no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise RemoteConfigError(
            f"URL {url!r}", "has a path, query or user; the instance name is its own setting"
        )
    if port is None:
        if scheme == "grpc":
            raise RemoteConfigError(f"URL {url!r}", "needs a port (grpc://host:port)")
        port = 443
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return target, scheme == "grpcs"


def header_metadata(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The caller's headers as gRPC metadata, sorted; raises :class:`RemoteConfigError`."""
    out = []
    for name, value in headers.items():
        key = name.strip().lower()
        if not _HEADER_NAME.fullmatch(key) or key.startswith("grpc-") or key.endswith("-bin"):
            raise RemoteConfigError(
                f"header {name!r}", "not a plain gRPC metadata name (lowercase a-z, 0-9, - _ .)"
            )
        if not value.isascii() or not value.isprintable():
            raise RemoteConfigError(f"header {name!r}", "its value must be printable ASCII")
        out.append((key, value))
    return tuple(sorted(out))


def describe(text: str | None, limit: int = 160) -> str:
    """A server's detail text on one short line."""
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Rpc:
    """The settings of one endpoint and its channels on an event loop (see the module
    docstring): :meth:`calls` opens them on the running loop the first time."""

    def __init__(
        self,
        url: str,
        *,
        instance: str,
        headers: Mapping[str, str],
        ca_file: Path | None,
        streams: int = 100,
    ) -> None:
        self.target, tls = parse_url(url)
        self.url = url
        self.instance = instance
        self.header_names = tuple(name for name, _ in header_metadata(headers))
        self.metadata: tuple[tuple[str, str | bytes], ...] = (
            *header_metadata(headers),
            (_REQUEST_METADATA, _request_metadata()),
        )
        self.creds: grpc.ChannelCredentials | None = None
        if tls:
            self.creds = grpc.ssl_channel_credentials(root_certificates=_read_ca(ca_file))
        elif ca_file is not None:
            raise RemoteConfigError("CA file", f"{ca_file} is set for a plaintext grpc:// URL")
        self.size = channels_for(streams)
        self._bound: Calls | None = None
        self._closed = False
        self._lock = threading.Lock()

    def calls(self) -> Calls:
        """The typed calls on the running loop's channels, opened on first use. A call from
        another loop (an earlier one ended) opens fresh channels there: a ``grpc.aio``
        channel serves only the loop it was opened on. Raises :class:`RemoteUnavailable`
        once closed."""
        if self._closed:
            raise RemoteUnavailable(self.url, "the client was closed (the build stopped)")
        loop = asyncio.get_running_loop()
        bound = self._bound
        if bound is not None and bound.loop is loop:
            return bound
        with self._lock:
            old, self._bound = self._bound, Calls(loop, self._open_channel, self.size)
            if old is not None:
                old.close()
            return self._bound

    def _open_channel(self, index: int) -> grpc.aio.Channel:
        # A distinct argument and a subchannel pool of its own: gRPC would otherwise
        # share one connection among channels to the same target.
        options: list[tuple[str, object]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.primary_user_agent", "metrale-orch"),
        ]
        if index:
            options += [("grpc.channel_pool_index", index), ("grpc.use_local_subchannel_pool", 1)]
        if self.creds is None:
            return grpc.aio.insecure_channel(self.target, options=options)
        return grpc.aio.secure_channel(self.target, self.creds, options=options)

    @property
    def bound(self) -> Calls | None:
        """The calls on the loop that last used this endpoint (None before any call)."""
        return self._bound

    async def aclose(self) -> None:
        """Close the running loop's channels and wait until they are closed (also when
        :meth:`close` began it from another thread)."""
        with self._lock:
            self._closed = True
            bound = self._bound
        if bound is not None and bound.loop is asyncio.get_running_loop():
            await bound.aclose()

    def close(self) -> None:
        """Close the channels (from any thread, without waiting): calls in flight fail at
        once, later ones raise :class:`RemoteUnavailable`."""
        with self._lock:
            self._closed = True
            bound = self._bound
        if bound is not None:
            bound.close()

    def resource_prefix(self) -> str:
        """``{instance}/`` (nothing for the default instance), for ByteStream names."""
        return f"{self.instance}/" if self.instance else ""

    def error(self, exc: grpc.RpcError, call: str, timeout: float) -> RemoteError:
        """The client error for a failed call (``timeout``: the deadline it ran under)."""
        code = code_of(exc)
        detail = describe(exc.details() if callable(getattr(exc, "details", None)) else str(exc))
        return self.code_error(code, detail, call, timeout)

    def code_error(
        self, code: grpc.StatusCode, detail: str, call: str, timeout: float
    ) -> RemoteError:
        if code in AUTH_CODES:
            return RemoteAuthError(self.url, code.name, detail, self.header_names)
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return RemoteOverloaded(self.url, self._reason(code, detail, call, timeout))
        if code in INFRA_CODES:
            return RemoteUnavailable(self.url, self._reason(code, detail, call, timeout))
        return RemoteRejected(self.url, call, code.name, detail)

    def _reason(self, code: grpc.StatusCode, detail: str, call: str, timeout: float) -> str:
        low = detail.lower()
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"no answer to {call} within {timeout:g} s"
        if code is grpc.StatusCode.UNAVAILABLE:
            if "connection refused" in low:
                return f"unreachable: {self.url} (connection refused)"
            if "dns" in low or "resolve" in low or "name or service not known" in low:
                return f"unreachable: {self.url} (cannot resolve the host)"
            if "handshake" in low or "ssl" in low or "certificate" in low:
                return f"unreachable: {self.url} (TLS handshake failed: {detail})"
            if "failed to connect" in low or "connect failed" in low:
                return f"unreachable: {self.url} ({detail})"
            if any(w in low for w in ("socket closed", "reset", "broken pipe", "goaway", "eof")):
                return f"connection lost during {call} ({detail})"
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return f"{call}: the server is overloaded ({detail})"
        return f"{call} failed ({code.name}: {detail})"


class Calls:
    """One event loop's channels (:class:`ChannelPool`) and the typed calls on each: one
    connection carries ~100 streams, unary calls are streams too, so every call goes to
    the channel with the fewest in flight."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, make: Callable[[int], grpc.aio.Channel], size: int
    ) -> None:
        self.loop = loop
        self.streams = ChannelPool(make, size)
        self._closing: asyncio.Task[None] | None = None
        channels, re_file, bs_file = self.streams.channels, re_pb2.DESCRIPTOR, bs_pb2.DESCRIPTOR
        cas, ac, ex = "ContentAddressableStorage", "ActionCache", "Execution"
        # Each call on every channel: a call goes to the one with the fewest in flight.
        self.get_capabilities = _unary(
            channels,
            (re_file, "Capabilities", "GetCapabilities"),
            re_pb2.GetCapabilitiesRequest,
            re_pb2.ServerCapabilities,
        )
        self.find_missing = _unary(
            channels,
            (re_file, cas, "FindMissingBlobs"),
            re_pb2.FindMissingBlobsRequest,
            re_pb2.FindMissingBlobsResponse,
        )
        self.batch_update = _unary(
            channels,
            (re_file, cas, "BatchUpdateBlobs"),
            re_pb2.BatchUpdateBlobsRequest,
            re_pb2.BatchUpdateBlobsResponse,
        )
        self.batch_read = _unary(
            channels,
            (re_file, cas, "BatchReadBlobs"),
            re_pb2.BatchReadBlobsRequest,
            re_pb2.BatchReadBlobsResponse,
        )
        self.get_action_result = _unary(
            channels, (re_file, ac, "GetActionResult"), re_pb2.GetActionResultRequest, _RESULT
        )
        self.update_action_result = _unary(
            channels, (re_file, ac, "UpdateActionResult"), re_pb2.UpdateActionResultRequest, _RESULT
        )
        self.execute = _stream(
            channels, (re_file, ex, "Execute"), re_pb2.ExecuteRequest, _OPERATION
        )
        self.wait_execution = _stream(
            channels, (re_file, ex, "WaitExecution"), re_pb2.WaitExecutionRequest, _OPERATION
        )
        self.read = _stream(
            channels, (bs_file, "ByteStream", "Read"), bs_pb2.ReadRequest, bs_pb2.ReadResponse
        )
        self.write: list[
            grpc.aio.StreamUnaryMultiCallable[bs_pb2.WriteRequest, bs_pb2.WriteResponse]
        ] = [
            c.stream_unary(
                _path((bs_file, "ByteStream", "Write")),
                request_serializer=_serialize,
                response_deserializer=bs_pb2.WriteResponse.FromString,
            )
            for c in channels
        ]

    async def unary(
        self,
        method: list[grpc.aio.UnaryUnaryMultiCallable[Req, Resp]],
        request: Req,
        *,
        timeout: float,
        metadata: tuple[tuple[str, str | bytes], ...],
    ) -> Resp:
        """One unary call (``method``: its callables, one per channel) on the connection
        with the fewest calls in flight."""
        with self.streams.channel(stream=False) as index:
            return await method[index](request, timeout=timeout, metadata=metadata)

    def close(self) -> None:
        """Close the channels from any thread, without waiting: on their loop's thread a
        task closes them at its next turn; another thread hands the loop a callback that
        starts that task (no coroutine crosses threads: one handed to a loop that stops
        first would be dropped unawaited); the channels of a loop that no longer runs are
        dropped (nothing can be in flight)."""
        loop = self.loop
        if loop.is_closed() or not loop.is_running():
            return
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            self._start_close()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed since
                loop.call_soon_threadsafe(self._start_close)

    async def aclose(self) -> None:
        """Close the channels and wait until they are closed (on their loop)."""
        await self._start_close()

    def _start_close(self) -> asyncio.Task[None]:
        """The task that closes the channels, started once (on their loop)."""
        if self._closing is None:
            close = self.streams.close()
            self._closing = self.loop.create_task(close)
            # A loop whose owner stops it in this very turn and closes it without another
            # drops the task unrun: its coroutine is closed then, not left unawaited.
            weakref.finalize(self._closing, close.close).atexit = False
        return self._closing


def status_error(rpc: Rpc, status: status_pb2.Status, call: str, timeout: float) -> RemoteError:
    """The client error for a non-OK ``google.rpc.Status`` inside an answer."""
    code = CODES.get(int(status.code), grpc.StatusCode.UNKNOWN)
    return rpc.code_error(code, describe(status.message), call, timeout)


def code_of(exc: grpc.RpcError) -> grpc.StatusCode:
    """The status code of a failed call (UNKNOWN when the error carries none)."""
    try:
        return exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
    except Exception:  # a broken error object: still an error of the transport
        return grpc.StatusCode.UNKNOWN


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


#: (generated file, service, method) naming one RPC.
_Method = tuple[FileDescriptor, str, str]


def _path(method: _Method) -> str:
    """``/package.Service/Method``, looked up in the generated descriptor (never spelled)."""
    file, service, name = method
    found = file.services_by_name[service].methods_by_name[name]
    return f"/{found.containing_service.full_name}/{found.name}"


class _FromString(Protocol[Resp_co]):
    def FromString(self, data: bytes, /) -> Resp_co: ...


def _unary(
    channels: list[grpc.aio.Channel],
    method: _Method,
    request: type[Req],
    response: _FromString[Resp],
) -> list[grpc.aio.UnaryUnaryMultiCallable[Req, Resp]]:
    """A typed unary call on each channel (``request`` only types it: every message
    serializes alike)."""
    path = _path(method)
    return [
        c.unary_unary(
            path, request_serializer=_serialize, response_deserializer=response.FromString
        )
        for c in channels
    ]


def _stream(
    channels: list[grpc.aio.Channel],
    method: _Method,
    request: type[Req],
    response: _FromString[Resp],
) -> list[grpc.aio.UnaryStreamMultiCallable[Req, Resp]]:
    """A typed server-streaming call on each channel."""
    path = _path(method)
    return [
        c.unary_stream(
            path, request_serializer=_serialize, response_deserializer=response.FromString
        )
        for c in channels
    ]


def _read_ca(ca_file: Path | None) -> bytes | None:
    if ca_file is None:
        return None
    try:
        return Path(ca_file).read_bytes()
    except OSError as exc:
        raise RemoteConfigError("CA file", f"{ca_file}: {exc.strerror or exc}") from None


def _request_metadata() -> bytes:
    """REAPI's ``RequestMetadata`` naming this tool and this client's invocation."""
    try:
        version = importlib.metadata.version("metrale-orch")
    except importlib.metadata.PackageNotFoundError:
        version = ""
    meta = re_pb2.RequestMetadata(
        tool_details=re_pb2.ToolDetails(tool_name="metrale-orch", tool_version=version),
        tool_invocation_id=str(uuid.uuid4()),
    )
    return meta.SerializeToString()
