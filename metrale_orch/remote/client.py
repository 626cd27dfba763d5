"""The REAPI v2 client: capabilities, the CAS, the action cache and Execute.

:class:`AsyncRemoteClient` is the one implementation: coroutines on ``grpc.aio``, for a
build's event loop (thousands of actions in flight on one loop, no thread held while
one waits). :class:`RemoteClient` is the same client for synchronous callers (the
``remote check`` command, the REAPI cache tier): each method runs the coroutine on a
private loop thread (:class:`~metrale_orch.remote.loop.LoopThread`) and waits. Both raise
only :mod:`~metrale_orch.remote.errors`. Invariants:

- Capabilities are read first, once (callers that arrive meanwhile wait for that one
  call, and share its failure for ``timeout`` seconds rather than each spending a
  deadline): SHA-256 must be among the server's digest functions, the batch limit
  is the smaller of the server's ``max_batch_total_size_bytes`` (4 MiB when it says 0)
  and the client's ``batch_limit``.
- Uploads ask FindMissingBlobs first; an action result is uploaded only after every
  blob it names is in the CAS (:meth:`RemoteClient.update_action_result` checks).
- Downloads are verified; a corrupt blob is an error, never a value.
- Every call runs under a deadline: ``timeout`` for plain calls, that plus
  ``size / MIN_RATE`` for transfers, the caller's for Execute.
- Execute streams go over a pool of channels sized for ``streams`` in flight
  (:mod:`~metrale_orch.remote.channels`), each its own connection.
- A client belongs to the process that made it: a gRPC channel does not survive a
  ``fork`` (doit's process workers make their own).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypedDict, TypeVar, Unpack

import grpc

from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.cas import Cas, UploadStats
from metrale_orch.remote.channels import ChannelPool
from metrale_orch.remote.digest import CHUNK, EMPTY, Digest
from metrale_orch.remote.errors import (
    CapabilityError,
    MissingResultBlobs,
    RemoteConfigError,
    RemoteError,
)
from metrale_orch.remote.execution import ExecuteResult, execute
from metrale_orch.remote.loop import LoopThread
from metrale_orch.remote.merkle import Blob
from metrale_orch.remote.rpc import MAX_MESSAGE, Rpc, code_of
from metrale_orch.remote.wire import digest_message, from_message

__all__ = [
    "DEFAULT_BATCH_LIMIT",
    "AsyncRemoteClient",
    "Capabilities",
    "RemoteClient",
    "UploadStats",
]

#: The batch limit when the server sets none (gRPC's default message limit).
DEFAULT_BATCH_LIMIT = 4 * 1024 * 1024

T = TypeVar("T")


class Inline(TypedDict, total=False):
    """What :meth:`AsyncRemoteClient.get_action_result` may ask to be inlined."""

    inline_stdout: bool
    inline_stderr: bool
    inline_output_files: Iterable[str]


class How(TypedDict, total=False):
    """How :meth:`AsyncRemoteClient.execute` runs an action, besides its timeout."""

    skip_cache_lookup: bool
    platform: Mapping[str, str] | Iterable[tuple[str, str]] | None
    queue_timeout: float | None


class Settings(TypedDict, total=False):
    """A client's settings besides its URL (see :class:`AsyncRemoteClient`)."""

    instance: str
    headers: Mapping[str, str] | None
    timeout: float
    ca_file: Path | None
    batch_limit: int | None
    chunk_size: int
    streams: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What the server offers, as the client uses it."""

    #: The batch limit the client keeps to (see the module docstring).
    max_batch_bytes: int
    #: As the server advertised it (0: no limit set).
    server_max_batch_bytes: int
    exec_enabled: bool
    ac_update_enabled: bool
    #: REAPI versions the server speaks, ``major.minor``.
    low_api: str
    high_api: str


class AsyncRemoteClient:
    """A REAPI v2 client on ``grpc.aio`` (see the module docstring).

    ``url``: ``grpc://host:port`` (plaintext) or ``grpcs://host[:port]`` (TLS with the
    system roots, or ``ca_file``). ``headers`` go with every call (an API key such as
    ``x-buildbuddy-api-key``). ``timeout``: seconds per call. ``batch_limit`` lowers the
    server's batch limit. ``streams``: the Execute calls expected in flight at once (the
    channel pool's size). Raises :class:`RemoteConfigError` for settings it cannot use;
    nothing is sent before the first call, whose event loop the channels then serve.
    """

    def __init__(
        self,
        url: str,
        *,
        instance: str = "",
        headers: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        ca_file: Path | None = None,
        batch_limit: int | None = None,
        chunk_size: int = CHUNK,
        streams: int = 100,
    ) -> None:
        if not timeout > 0:
            raise RemoteConfigError("timeout", f"{timeout!r} must be a positive number of seconds")
        if batch_limit is not None and batch_limit < 4096:
            raise RemoteConfigError("batch limit", f"{batch_limit} bytes is below 4096")
        if not 0 < chunk_size <= MAX_MESSAGE // 2:
            raise RemoteConfigError("chunk size", f"{chunk_size} bytes is out of range")
        self.url = url
        self.instance = instance
        self.timeout = timeout
        self._rpc = Rpc(
            url, instance=instance, headers=headers or {}, ca_file=ca_file, streams=streams
        )
        self._batch_limit = batch_limit
        self._cas = Cas(
            self._rpc, timeout=timeout, chunk_size=chunk_size, limit=self._max_batch_bytes
        )
        self._caps: Capabilities | None = None
        self._caps_failure: tuple[float, RemoteError] | None = None
        self._caps_reading: asyncio.Task[Capabilities] | None = None

    # -- capabilities ----------------------------------------------------------------------

    async def capabilities(self) -> Capabilities:
        """The server's capabilities, read once; raises :class:`CapabilityError` without
        SHA-256, or the call's :class:`RemoteError`."""
        caps = self._caps
        if caps is not None:
            return caps
        failure = self._caps_failure
        if failure is not None and time.monotonic() < failure[0]:
            raise failure[1]
        reading = self._caps_reading
        if reading is None or reading.get_loop() is not asyncio.get_running_loop():
            reading = self._caps_reading = asyncio.ensure_future(self._capabilities_once())
        # Shielded: one caller cancelled leaves the call to those still waiting on it.
        return await asyncio.shield(reading)

    async def _capabilities_once(self) -> Capabilities:
        try:
            self._caps = await self._read_capabilities()
            return self._caps
        except RemoteError as exc:
            self._caps_failure = (time.monotonic() + self.timeout, exc)
            raise
        finally:
            self._caps_reading = None

    async def _read_capabilities(self) -> Capabilities:
        rpc = self._rpc
        try:
            calls = rpc.calls()
            answer = await calls.unary(
                calls.get_capabilities,
                re_pb2.GetCapabilitiesRequest(instance_name=self.instance),
                timeout=self.timeout,
                metadata=rpc.metadata,
            )
        except grpc.RpcError as exc:
            raise rpc.error(exc, "GetCapabilities", self.timeout) from None
        return self._from_answer(answer)

    def _from_answer(self, answer: re_pb2.ServerCapabilities) -> Capabilities:
        cache = answer.cache_capabilities
        functions = set(cache.digest_functions)
        if re_pb2.DigestFunction.SHA256 not in functions:
            names = sorted(re_pb2.DigestFunction.Value.Name(f) for f in functions) or ["none"]
            raise CapabilityError(
                self.url,
                f"the server's CAS does not offer SHA-256 (it offers {', '.join(names)}); "
                "metrale-orch needs SHA-256 digests",
            )
        server_limit = int(cache.max_batch_total_size_bytes)
        limit = min(
            server_limit or DEFAULT_BATCH_LIMIT,
            MAX_MESSAGE - 1024 * 1024,
            self._batch_limit or MAX_MESSAGE,
        )
        return Capabilities(
            max_batch_bytes=limit,
            server_max_batch_bytes=server_limit,
            exec_enabled=answer.execution_capabilities.exec_enabled,
            ac_update_enabled=cache.action_cache_update_capabilities.update_enabled,
            low_api=f"{answer.low_api_version.major}.{answer.low_api_version.minor}",
            high_api=f"{answer.high_api_version.major}.{answer.high_api_version.minor}",
        )

    async def _max_batch_bytes(self) -> int:
        return (await self.capabilities()).max_batch_bytes

    # -- the CAS ---------------------------------------------------------------------------

    async def find_missing(self, digests: Iterable[Digest]) -> set[Digest]:
        """The digests the CAS lacks; raises a :class:`RemoteError`."""
        await self.capabilities()
        return await self._cas.find_missing(digests)

    async def upload(self, blobs: Mapping[Digest, Blob], *, ask: bool = True) -> UploadStats:
        """Put every blob the CAS lacks (FindMissingBlobs first; without ``ask``, every
        blob, for a few small ones; small ones batched, big ones streamed). A ``Path``
        blob is read now and must still match its digest (:class:`BlobChanged`). Raises
        a :class:`RemoteError`."""
        await self.capabilities()
        return await self._cas.upload(blobs, ask=ask)

    async def download(self, digest: Digest) -> bytes:
        """The verified bytes of ``digest``; raises :class:`BlobMissing`,
        :class:`CorruptBlob` or another :class:`RemoteError`."""
        await self.capabilities()
        return await self._cas.download(digest)

    async def download_many(self, digests: Iterable[Digest]) -> dict[Digest, bytes]:
        """The verified bytes of each of ``digests``, the small ones in as few batch calls
        as hold them; raises as :meth:`download` does."""
        await self.capabilities()
        return await self._cas.download_many(digests)

    async def download_to(self, digest: Digest, path: Path) -> None:
        """Write the verified blob to ``path`` (atomically, streamed when big); raises as
        :meth:`download` does, and ``OSError`` when ``path`` cannot be written."""
        await self.capabilities()
        await self._cas.download_to(digest, path)

    async def std_outputs(self, result: re_pb2.ActionResult) -> tuple[bytes, bytes]:
        """(stdout, stderr) of a result, inline or downloaded."""
        out = [
            raw if raw or not result.HasField(name) else await self.download(from_message(digest))
            for raw, name, digest in (
                (result.stdout_raw, "stdout_digest", result.stdout_digest),
                (result.stderr_raw, "stderr_digest", result.stderr_digest),
            )
        ]
        return bytes(out[0]), bytes(out[1])

    # -- the action cache ------------------------------------------------------------------

    async def get_action_result(
        self,
        action: Digest,
        *,
        inline_stdout: bool = False,
        inline_stderr: bool = False,
        inline_output_files: Iterable[str] = (),
    ) -> re_pb2.ActionResult | None:
        """The cached result of ``action``, or None; raises a :class:`RemoteError`."""
        await self.capabilities()
        request = re_pb2.GetActionResultRequest(
            instance_name=self.instance,
            action_digest=digest_message(action),
            inline_stdout=inline_stdout,
            inline_stderr=inline_stderr,
            inline_output_files=sorted(inline_output_files),
        )
        rpc = self._rpc
        try:
            calls = rpc.calls()
            return await calls.unary(
                calls.get_action_result, request, timeout=self.timeout, metadata=rpc.metadata
            )
        except grpc.RpcError as exc:
            if code_of(exc) is grpc.StatusCode.NOT_FOUND:
                return None
            raise rpc.error(exc, "GetActionResult", self.timeout) from None

    async def update_action_result(
        self,
        action: Digest,
        result: re_pb2.ActionResult,
        *,
        blobs: Mapping[Digest, Blob] | None = None,
    ) -> re_pb2.ActionResult:
        """Store ``result`` for ``action``, after its ``blobs`` (outputs, stdout, stderr)
        are in the CAS. A digest the result names that is neither in ``blobs`` nor in
        the CAS raises :class:`MissingResultBlobs` before anything is stored. Raises
        :class:`CapabilityError` when the server refuses action cache updates."""
        caps = await self.capabilities()
        if not caps.ac_update_enabled:
            raise CapabilityError(self.url, "the server does not accept action cache updates")
        given = blobs or {}
        if given:
            await self.upload(given)
        named = _result_digests(result) - set(given) - {EMPTY}
        missing = await self._cas.find_missing(named) if named else set()
        if missing:
            raise MissingResultBlobs(self.url, tuple(str(d) for d in sorted(missing)))
        request = re_pb2.UpdateActionResultRequest(
            instance_name=self.instance, action_digest=digest_message(action), action_result=result
        )
        rpc = self._rpc
        try:
            calls = rpc.calls()
            return await calls.unary(
                calls.update_action_result, request, timeout=self.timeout, metadata=rpc.metadata
            )
        except grpc.RpcError as exc:
            raise rpc.error(exc, "UpdateActionResult", self.timeout) from None

    # -- execution -------------------------------------------------------------------------

    async def execute(
        self,
        action: Digest,
        *,
        skip_cache_lookup: bool = False,
        timeout: float,
        platform: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        queue_timeout: float | None = None,
        on_executing: Callable[[float], None] | None = None,
    ) -> ExecuteResult:
        """Run ``action`` (its blobs uploaded) and wait, ``timeout`` seconds in all; the
        result carries the exit code, whatever it is, and the stage timings. ``platform``
        only words the error when no worker takes the action; ``on_executing`` is told
        the seconds it waited for a worker, when one takes it. Raises
        :class:`CapabilityError` when the server does not execute, and
        :class:`RemoteUnavailable`, :class:`RemoteAuthError` or :class:`RemoteRejected`.
        Cancelling the awaiting task cancels the Execute stream."""
        if not (await self.capabilities()).exec_enabled:
            raise CapabilityError(self.url, "the server does not execute actions (cache only)")
        return await execute(
            self._rpc,
            action,
            skip_cache_lookup=skip_cache_lookup,
            timeout=timeout,
            platform=platform,
            queue_timeout=queue_timeout,
            on_executing=on_executing,
        )

    @property
    def channels(self) -> ChannelPool:
        """The Execute streams' channels on the loop that last used them (how many, what
        each carried); raises ``RuntimeError`` before any call."""
        bound = self._rpc.bound
        if bound is None:
            raise RuntimeError("no call made yet: no channels")
        return bound.streams

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the channels (from any thread); calls in flight fail at once."""
        self._rpc.close()

    async def aclose(self) -> None:
        """Close the channels and wait until they are closed (on their loop)."""
        await self._rpc.aclose()


class RemoteClient:
    """The :class:`AsyncRemoteClient` for synchronous callers: the same settings, the same
    methods, each run on a private loop thread and waited for. Thread-safe (calls from
    many threads share the loop and its channels)."""

    def __init__(self, url: str, **settings: Unpack[Settings]) -> None:
        self.aio = AsyncRemoteClient(url, **settings)
        self.url = self.aio.url
        self.instance = self.aio.instance
        self.timeout = self.aio.timeout
        self._loop = LoopThread("metrale-remote")

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def capabilities(self) -> Capabilities:
        """See :meth:`AsyncRemoteClient.capabilities`."""
        return self._run(self.aio.capabilities())

    def find_missing(self, digests: Iterable[Digest]) -> set[Digest]:
        """See :meth:`AsyncRemoteClient.find_missing`."""
        return self._run(self.aio.find_missing(digests))

    def upload(self, blobs: Mapping[Digest, Blob], *, ask: bool = True) -> UploadStats:
        """See :meth:`AsyncRemoteClient.upload`."""
        return self._run(self.aio.upload(blobs, ask=ask))

    def download(self, digest: Digest) -> bytes:
        """See :meth:`AsyncRemoteClient.download`."""
        return self._run(self.aio.download(digest))

    def download_many(self, digests: Iterable[Digest]) -> dict[Digest, bytes]:
        """See :meth:`AsyncRemoteClient.download_many`."""
        return self._run(self.aio.download_many(digests))

    def download_to(self, digest: Digest, path: Path) -> None:
        """See :meth:`AsyncRemoteClient.download_to`."""
        self._run(self.aio.download_to(digest, path))

    def std_outputs(self, result: re_pb2.ActionResult) -> tuple[bytes, bytes]:
        """See :meth:`AsyncRemoteClient.std_outputs`."""
        return self._run(self.aio.std_outputs(result))

    def get_action_result(
        self, action: Digest, **inline: Unpack[Inline]
    ) -> re_pb2.ActionResult | None:
        """See :meth:`AsyncRemoteClient.get_action_result`."""
        return self._run(self.aio.get_action_result(action, **inline))

    def update_action_result(
        self,
        action: Digest,
        result: re_pb2.ActionResult,
        *,
        blobs: Mapping[Digest, Blob] | None = None,
    ) -> re_pb2.ActionResult:
        """See :meth:`AsyncRemoteClient.update_action_result`."""
        return self._run(self.aio.update_action_result(action, result, blobs=blobs))

    def execute(self, action: Digest, *, timeout: float, **how: Unpack[How]) -> ExecuteResult:
        """See :meth:`AsyncRemoteClient.execute`."""
        return self._run(self.aio.execute(action, timeout=timeout, **how))

    @property
    def channels(self) -> ChannelPool:
        """See :attr:`AsyncRemoteClient.channels`."""
        return self.aio.channels

    def close(self) -> None:
        """Close the channels on the loop, then the loop thread; calls in flight fail."""
        self._loop.close(self.aio.aclose)

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _result_digests(result: re_pb2.ActionResult) -> set[Digest]:
    """Every blob a result names directly (output files, trees, stdout, stderr) (pure)."""
    named = {from_message(f.digest) for f in result.output_files}
    for directory in result.output_directories:
        named.add(from_message(directory.tree_digest))
        if directory.HasField("root_directory_digest"):
            named.add(from_message(directory.root_directory_digest))
    for name in ("stdout_digest", "stderr_digest"):
        if result.HasField(name):
            named.add(from_message(getattr(result, name)))
    return named
