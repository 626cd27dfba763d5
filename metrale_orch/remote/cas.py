"""CAS transfers: FindMissingBlobs first, small blobs in batches, big ones through ByteStream.

Invariants:

- An upload asks FindMissingBlobs first and sends only what is missing (unless its
  caller says the blobs are too few and small to be worth asking about); the empty
  blob is never sent or fetched (every server holds it).
- A blob travels in a batch call when it fits the batch limit with its framing
  (:data:`BLOB_OVERHEAD` per blob, :data:`REQUEST_OVERHEAD` per request), else
  through ByteStream in ``chunk_size`` pieces; no request exceeds the limit.
  Every per-blob status of a batch answer is checked.
- Files are read when sent. The last ByteStream chunk (``finish_write``) goes only
  after the whole file hashed to its digest, so a file that changed since it was
  hashed is never committed under the old digest (:class:`BlobChanged`).
- Every download is verified (size and SHA-256) before it is returned or renamed
  into place; a stream is read to at most the digest's size plus one chunk. A
  corrupt blob is a :class:`CorruptBlob`, never returned, never left on disk.
- Transfers run under ``timeout + size / MIN_RATE`` seconds.
- Every call is a coroutine on the client's event loop; reading files to send and
  hashing what came back, where there is more than a little of it, run on the loop's
  default executor (a small pool) so the loop keeps serving the other actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, NamedTuple, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from metrale_orch.remote._proto import bytestream_pb2 as bs_pb2
from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.digest import EMPTY, ON_LOOP, Digest
from metrale_orch.remote.errors import (
    BlobChanged,
    BlobMissing,
    CorruptBlob,
    RemoteError,
    RemoteUnavailable,
)
from metrale_orch.remote.merkle import Blob
from metrale_orch.remote.rpc import Calls, Rpc, code_of, status_error
from metrale_orch.remote.wire import digest_message, from_message

__all__ = ["BLOB_OVERHEAD", "MIN_RATE", "REQUEST_OVERHEAD", "Cas", "UploadStats"]

#: Bytes counted for each blob of a batch besides its data (digest, framing, status).
BLOB_OVERHEAD = 256
#: Bytes counted once per batch request (instance name, framing).
REQUEST_OVERHEAD = 1024
#: Slowest transfer rate a deadline allows for, in bytes per second.
MIN_RATE = 1024 * 1024
#: Digests per FindMissingBlobs request (~100 bytes each on the wire).
FIND_MISSING_CHUNK = 4096

T = TypeVar("T")
Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp")


class UploadStats(NamedTuple):
    """What one upload did: blobs and bytes sent, and blobs the CAS already had."""

    sent: int
    bytes: int
    present: int


class Cas:
    """The CAS calls of one client; ``limit`` gives the batch limit (capabilities, cached)."""

    def __init__(
        self, rpc: Rpc, *, timeout: float, chunk_size: int, limit: Callable[[], Awaitable[int]]
    ) -> None:
        self.rpc = rpc
        self.timeout = timeout
        self.chunk_size = chunk_size
        self._limit = limit

    # -- queries and uploads -------------------------------------------------------------

    async def find_missing(self, digests: Iterable[Digest]) -> set[Digest]:
        """The digests the CAS lacks (the empty blob never is)."""
        wanted = sorted(set(digests) - {EMPTY})
        missing: set[Digest] = set()
        for start in range(0, len(wanted), FIND_MISSING_CHUNK):
            chunk = wanted[start : start + FIND_MISSING_CHUNK]
            request = re_pb2.FindMissingBlobsRequest(
                instance_name=self.rpc.instance, blob_digests=[digest_message(d) for d in chunk]
            )
            calls = self.rpc.calls()
            answer = await self._unary(
                calls, calls.find_missing, request, "FindMissingBlobs", self.timeout
            )
            missing.update(from_message(d) for d in answer.missing_blob_digests)
        return missing

    async def upload(self, blobs: Mapping[Digest, Blob], *, ask: bool = True) -> UploadStats:
        """Send every blob of ``blobs`` the CAS lacks (without ``ask``: every one, unasked);
        raises a :class:`RemoteError`."""
        missing = sorted(await self.find_missing(blobs) if ask else set(blobs) - {EMPTY})
        limit = await self._limit()
        small = [d for d in missing if fits(d.size, limit)]
        for batch in plan_batches(small, limit):
            await self._batch_update(batch, blobs)
        for digest in missing:
            if not fits(digest.size, limit):
                await self._write(digest, blobs[digest])
        wanted = len(set(blobs) - {EMPTY})
        return UploadStats(len(missing), sum(d.size for d in missing), wanted - len(missing))

    async def _batch_update(self, batch: list[Digest], blobs: Mapping[Digest, Blob]) -> None:
        def build() -> re_pb2.BatchUpdateBlobsRequest:
            return re_pb2.BatchUpdateBlobsRequest(
                instance_name=self.rpc.instance,
                requests=[
                    re_pb2.BatchUpdateBlobsRequest.Request(
                        digest=digest_message(d), data=_read_whole(d, blobs[d])
                    )
                    for d in batch
                ],
            )

        size = sum(d.size for d in batch)
        files = any(not isinstance(blobs[d], bytes) for d in batch)
        request = await _off_loop(build) if files and size > ON_LOOP else build()
        timeout = self._transfer_timeout(size)
        calls = self.rpc.calls()
        answer = await self._unary(calls, calls.batch_update, request, "BatchUpdateBlobs", timeout)
        answered = set()
        for response in answer.responses:
            digest = from_message(response.digest)
            answered.add(digest)
            if response.status.code != 0:
                raise status_error(self.rpc, response.status, f"BatchUpdateBlobs {digest}", timeout)
        if not answered >= set(batch):
            raise self._bad_answer("BatchUpdateBlobs left blobs without a status")

    async def _write(self, digest: Digest, blob: Blob) -> None:
        blob_name = f"blobs/{digest.hash}/{digest.size}"
        name = f"{self.rpc.resource_prefix()}uploads/{uuid.uuid4()}/{blob_name}"
        outgoing = _Outgoing(name, digest, blob, self.chunk_size)
        timeout = self._transfer_timeout(digest.size)
        try:
            calls = self.rpc.calls()
            with calls.streams.channel(stream=False) as index:
                call = calls.write[index](
                    outgoing.requests(), timeout=timeout, metadata=self.rpc.metadata
                )
                answer = await call
        except grpc.RpcError as exc:
            outgoing.raise_problem()
            raise self.rpc.error(exc, f"ByteStream.Write {digest}", timeout) from None
        outgoing.raise_problem()
        if answer.committed_size not in (digest.size, -1):
            raise self._bad_answer(
                f"ByteStream.Write of {digest} committed {answer.committed_size} bytes"
            )

    # -- downloads -------------------------------------------------------------------------

    async def download(self, digest: Digest) -> bytes:
        """The verified content of ``digest``; raises :class:`BlobMissing`,
        :class:`CorruptBlob` or another :class:`RemoteError`."""
        return (await self.download_many([digest]))[digest]

    async def download_many(self, digests: Iterable[Digest]) -> dict[Digest, bytes]:
        """The verified content of each of ``digests``: those that fit the batch limit in
        as few BatchReadBlobs calls as hold them, the others streamed. Raises as
        :meth:`download` does."""
        wanted = sorted(set(digests))
        limit = await self._limit()
        got: dict[Digest, bytes] = {d: b"" for d in wanted if d == EMPTY}
        for batch in plan_batches([d for d in wanted if d != EMPTY and fits(d.size, limit)], limit):
            got.update(await self._batch_read(batch))
        for digest in wanted:
            if digest not in got:
                got[digest] = b"".join([chunk async for chunk in self._read(digest)])
        if sum(d.size for d in got) > ON_LOOP:
            await _off_loop(lambda: self._verify(got))
        else:
            self._verify(got)
        return got

    def _verify(self, got: Mapping[Digest, bytes]) -> None:
        for digest, data in got.items():
            found = Digest(hashlib.sha256(data).hexdigest(), len(data))
            if found != digest:
                raise CorruptBlob(self.rpc.url, str(digest), str(found))

    async def download_to(self, digest: Digest, path: Path) -> None:
        """Write the verified content of ``digest`` to ``path`` (atomically: a temporary
        file beside it, renamed once verified; a big one streamed, written by the pool).
        Raises as :meth:`download` does, and ``OSError`` when ``path`` cannot be written."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.part")
        try:
            with open(tmp, "wb") as f:
                if digest == EMPTY:
                    pass
                elif fits(digest.size, await self._limit()):
                    f.write(await self.download(digest))
                else:
                    await self._stream_to(digest, f)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    async def _stream_to(self, digest: Digest, f: BinaryIO) -> None:
        hasher = hashlib.sha256()
        size = 0

        def take(chunk: bytes) -> None:
            hasher.update(chunk)
            f.write(chunk)

        async for chunk in self._read(digest):
            size += len(chunk)
            await _off_loop(functools.partial(take, chunk))
        got = Digest(hasher.hexdigest(), size)
        if got != digest:
            raise CorruptBlob(self.rpc.url, str(digest), str(got))

    async def _batch_read(self, batch: list[Digest]) -> dict[Digest, bytes]:
        request = re_pb2.BatchReadBlobsRequest(
            instance_name=self.rpc.instance, digests=[digest_message(d) for d in batch]
        )
        timeout = self._transfer_timeout(sum(d.size for d in batch))
        calls = self.rpc.calls()
        answer = await self._unary(calls, calls.batch_read, request, "BatchReadBlobs", timeout)
        got: dict[Digest, bytes] = {}
        for response in answer.responses:
            digest = from_message(response.digest)
            if digest not in batch:
                continue
            if response.status.code == grpc.StatusCode.NOT_FOUND.value[0]:
                raise BlobMissing(self.rpc.url, str(digest))
            if response.status.code != 0:
                raise status_error(self.rpc, response.status, f"BatchReadBlobs {digest}", timeout)
            got[digest] = bytes(response.data)
        for digest in batch:
            if digest not in got:
                raise self._bad_answer(f"BatchReadBlobs did not answer for {digest}")
        return got

    async def _read(self, digest: Digest) -> AsyncIterator[bytes]:
        """ByteStream Read of ``digest``, cut off after ``size`` + one chunk."""
        name = f"{self.rpc.resource_prefix()}blobs/{digest.hash}/{digest.size}"
        timeout = self._transfer_timeout(digest.size)
        calls = self.rpc.calls()
        with calls.streams.channel(stream=False) as index:
            call = calls.read[index](
                bs_pb2.ReadRequest(resource_name=name), timeout=timeout, metadata=self.rpc.metadata
            )
            got = 0
            try:
                async for response in call:
                    got += len(response.data)
                    yield response.data
                    if got > digest.size:
                        return  # the caller's verification reports it
            except grpc.RpcError as exc:
                if code_of(exc) is grpc.StatusCode.NOT_FOUND:
                    raise BlobMissing(self.rpc.url, str(digest)) from None
                raise self.rpc.error(exc, f"ByteStream.Read {digest}", timeout) from None
            finally:
                call.cancel()

    # -- helpers ---------------------------------------------------------------------------

    async def _unary(
        self,
        calls: Calls,
        method: list[grpc.aio.UnaryUnaryMultiCallable[Req, Resp]],
        request: Req,
        call: str,
        timeout: float,
    ) -> Resp:
        try:
            return await calls.unary(method, request, timeout=timeout, metadata=self.rpc.metadata)
        except grpc.RpcError as exc:
            raise self.rpc.error(exc, call, timeout) from None

    def _transfer_timeout(self, size: int) -> float:
        return self.timeout + size / MIN_RATE

    def _bad_answer(self, what: str) -> RemoteError:
        return RemoteUnavailable(self.rpc.url, f"bad answer: {what}")


async def _off_loop(fn: Callable[[], T]) -> T:
    """``fn()`` on the running loop's default executor (the build's small pool)."""
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def fits(size: int, limit: int) -> bool:
    """Whether a blob of ``size`` bytes goes in a batch under ``limit`` (pure)."""
    return size + BLOB_OVERHEAD + REQUEST_OVERHEAD <= limit


def plan_batches(digests: list[Digest], limit: int) -> list[list[Digest]]:
    """Consecutive batches whose data and framing stay within ``limit`` (pure)."""
    batches: list[list[Digest]] = []
    current: list[Digest] = []
    used = REQUEST_OVERHEAD
    for digest in digests:
        cost = digest.size + BLOB_OVERHEAD
        if current and used + cost > limit:
            batches.append(current)
            current, used = [], REQUEST_OVERHEAD
        current.append(digest)
        used += cost
    if current:
        batches.append(current)
    return batches


def _read_whole(digest: Digest, blob: Blob) -> bytes:
    """A small blob's bytes; a file is read (at most size + 1 bytes) and checked."""
    if isinstance(blob, bytes):
        return blob
    try:
        with open(blob, "rb") as f:
            data = f.read(digest.size + 1)
    except OSError as exc:
        raise BlobChanged(str(blob), f"{digest} (unreadable: {exc.strerror or exc})") from None
    if len(data) != digest.size or hashlib.sha256(data).hexdigest() != digest.hash:
        raise BlobChanged(str(blob), str(digest))
    return data


class _Outgoing:
    """The WriteRequests of one ByteStream upload; remembers why it stopped short.

    gRPC consumes the requests in a task of its own, where an exception would only be
    logged: a problem is recorded instead, the stream ends without ``finish_write``
    (so nothing is committed), and :meth:`raise_problem` raises it on the caller's side.
    The file is read and hashed on the loop's default executor, a chunk at a time.
    """

    def __init__(self, name: str, digest: Digest, blob: Blob, chunk_size: int) -> None:
        self.name = name
        self.digest = digest
        self.blob = blob
        self.chunk_size = chunk_size
        self.problem: RemoteError | None = None

    async def requests(self) -> AsyncIterator[bs_pb2.WriteRequest]:
        offset = 0
        chunks = self._chunks()
        while (item := await _off_loop(lambda: next(chunks, None))) is not None:
            data, last = item
            yield bs_pb2.WriteRequest(
                resource_name=self.name if offset == 0 else "",
                write_offset=offset,
                data=data,
                finish_write=last,
            )
            offset += len(data)

    def raise_problem(self) -> None:
        if self.problem is not None:
            raise self.problem

    def _chunks(self) -> Iterator[tuple[bytes, bool]]:
        blob, size, step = self.blob, self.digest.size, self.chunk_size
        if isinstance(blob, bytes):
            for start in range(0, size, step):
                yield blob[start : start + step], start + step >= size
            return
        try:
            yield from self._file_chunks(blob)
        except OSError as exc:
            self.problem = BlobChanged(
                str(blob), f"{self.digest} (unreadable: {exc.strerror or exc})"
            )

    def _file_chunks(self, path: Path) -> Iterator[tuple[bytes, bool]]:
        """The file's chunks, holding each back until the next is read, so the last one
        goes only once the whole file hashed to the digest."""
        hasher = hashlib.sha256()
        sent = 0
        with open(path, "rb") as f:
            pending = f.read(self.chunk_size)
            while pending:
                hasher.update(pending)
                sent += len(pending)
                following = f.read(self.chunk_size) if sent <= self.digest.size else b""
                if not following:
                    if Digest(hasher.hexdigest(), sent) != self.digest:
                        break
                    yield pending, True
                    return
                yield pending, False
                pending = following
        self.problem = BlobChanged(str(path), str(self.digest))
