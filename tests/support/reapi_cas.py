"""CAS helpers shared by the scripts that run in the BuildGrid venv (the test worker and the probe).

Runs only under the BuildGrid venv's Python (``python -m tests.support.reapi_worker`` with the
repository root on ``PYTHONPATH``): it imports ``buildgrid._protos``, which cannot share a
process with ``googleapis-common-protos`` (NOTES, "Remote execution"), and never imports
``metrale_orch``.

- digests are SHA-256 over the exact bytes (REAPI's only function BuildGrid 0.4.4 offers);
- :class:`Cas` uploads what the server lacks (``FindMissingBlobs``, then ``BatchUpdateBlobs`` for
  small blobs and ``ByteStream.Write`` for big ones) and downloads with the hash checked, so a
  corrupt blob surfaces as :class:`BlobError` ``kind="corrupt"`` (BuildGrid itself serves a
  blob's stored bytes without checking them);
- :func:`tree_of` turns a local directory into Directory messages (the input root of an Action,
  or an output directory's ``Tree``); :func:`materialise` writes a root back out: files with
  their executable bit, nested directories, symlinks as symlinks.

Type-checking these scripts against BuildGrid's generated ``.pyi`` stubs (it ships them
without ``py.typed``; the project's mypy run sees the protos as ``Any``)::

    mkdir /tmp/bgstubs && ln -s <venv>/lib/python3.11/site-packages/buildgrid /tmp/bgstubs/
    MYPYPATH=/tmp/bgstubs mypy --config-file /dev/null --strict --follow-imports=silent \
        --ignore-missing-imports tests/support/reapi_{cas,run,worker,probe}.py

Every name inside a Directory must be a plain name (no ``/``, not ``.``/``..``): a root that
breaks this raises :class:`BlobError` ``kind="invalid"`` instead of writing outside ``dest``.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as re_grpc,
)
from buildgrid._protos.google.bytestream import bytestream_pb2 as bs_pb2
from buildgrid._protos.google.bytestream import bytestream_pb2_grpc as bs_grpc
from google.protobuf.message import Message

__all__ = [
    "BATCH_BYTES",
    "BlobError",
    "Cas",
    "Tree",
    "channel",
    "digest_of",
    "materialise",
    "tree_of",
]

#: Blobs up to this size travel in Batch* calls (gRPC's default message limit is 4 MiB);
#: bigger ones stream through ByteStream in chunks of this size.
BATCH_BYTES = 1 << 20

M = TypeVar("M", bound=Message)
T = TypeVar("T")

#: gRPC's reconnect backoff starts at 1 s and grows 1.6 times a try: a client that tried
#: before the server was up would see it seconds late. Tests restart servers: retry fast.
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
)


def channel(url: str) -> grpc.Channel:
    """An insecure channel to ``grpc://HOST:PORT`` that reconnects within 0.25 s."""
    return grpc.insecure_channel(url.removeprefix("grpc://"), options=CHANNEL_OPTIONS)


def digest_of(data: bytes) -> re_pb2.Digest:
    """The REAPI digest of ``data`` (SHA-256, size in bytes)."""
    return re_pb2.Digest(hash=hashlib.sha256(data).hexdigest(), size_bytes=len(data))


@dataclass(slots=True)
class BlobError(Exception):
    """A blob the CAS lacks, serves with other bytes than its digest's, or that is malformed."""

    kind: Literal["missing", "corrupt", "invalid"]
    hash: str
    size: int
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} blob {self.hash}/{self.size}: {self.detail}".rstrip(": ")

    @property
    def subject(self) -> str:
        """The ``PreconditionFailure`` subject REAPI uses for a missing blob."""
        return f"blobs/{self.hash}/{self.size}"


class Cas:
    """A CAS + ByteStream client on one channel and instance name.

    ``retry_s``: how long each call is retried while the server is UNAVAILABLE (every 0.2 s,
    while ``keep_trying()``); a worker outlives a server restart this way, the probe (0)
    reports the outage instead.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        instance: str,
        timeout: float = 30.0,
        retry_s: float = 0.0,
        keep_trying: Callable[[], bool] = lambda: True,
    ) -> None:
        self.instance = instance
        self.timeout = timeout
        self.retry_s = retry_s
        self._keep_trying = keep_trying
        self._cas = re_grpc.ContentAddressableStorageStub(channel)
        self._bytestream = bs_grpc.ByteStreamStub(channel)

    def _call(self, fn: Callable[[], T]) -> T:
        give_up = time.monotonic() + self.retry_s
        while True:
            try:
                return fn()
            except grpc.RpcError as exc:
                if (
                    exc.code() != grpc.StatusCode.UNAVAILABLE
                    or time.monotonic() >= give_up
                    or not self._keep_trying()
                ):
                    raise
            time.sleep(0.2)

    def _resource(self, digest: re_pb2.Digest, upload: bool = False) -> str:
        tail = f"blobs/{digest.hash}/{digest.size_bytes}"
        if upload:
            tail = f"uploads/{uuid.uuid4()}/{tail}"
        return f"{self.instance}/{tail}" if self.instance else tail

    # -- upload -------------------------------------------------------------------------------

    def upload(self, blobs: Sequence[bytes]) -> list[re_pb2.Digest]:
        """Store ``blobs`` (those the server reports missing); their digests, in order."""
        by_hash = {digest_of(b).hash: b for b in blobs}
        digests = [digest_of(b) for b in blobs]
        wanted = list({d.hash: d for d in digests}.values())
        request = re_pb2.FindMissingBlobsRequest(instance_name=self.instance, blob_digests=wanted)
        missing = self._call(
            lambda: self._cas.FindMissingBlobs(request, timeout=self.timeout)
        ).missing_blob_digests
        batch: list[re_pb2.BatchUpdateBlobsRequest.Request] = []
        size = 0
        for digest in missing:
            data = by_hash[digest.hash]
            if len(data) > BATCH_BYTES:
                self._write(digest, data)
                continue
            if size + len(data) > BATCH_BYTES and batch:
                self._batch_update(batch)
                batch, size = [], 0
            batch.append(re_pb2.BatchUpdateBlobsRequest.Request(digest=digest, data=data))
            size += len(data)
        if batch:
            self._batch_update(batch)
        return digests

    def upload_message(self, message: Message) -> re_pb2.Digest:
        """Store a serialised message; its digest."""
        return self.upload([message.SerializeToString()])[0]

    def _batch_update(self, requests: list[re_pb2.BatchUpdateBlobsRequest.Request]) -> None:
        request = re_pb2.BatchUpdateBlobsRequest(instance_name=self.instance, requests=requests)
        response = self._call(lambda: self._cas.BatchUpdateBlobs(request, timeout=self.timeout))
        for answer in response.responses:
            if answer.status.code != 0:
                raise BlobError(
                    "invalid", answer.digest.hash, answer.digest.size_bytes, answer.status.message
                )

    def _write(self, digest: re_pb2.Digest, data: bytes) -> None:
        name = self._resource(digest, upload=True)

        def chunks() -> Iterator[bs_pb2.WriteRequest]:
            offset = 0
            while True:
                piece = data[offset : offset + BATCH_BYTES]
                last = offset + len(piece) >= len(data)
                yield bs_pb2.WriteRequest(
                    resource_name=name if offset == 0 else "",
                    write_offset=offset,
                    data=piece,
                    finish_write=last,
                )
                offset += len(piece)
                if last:
                    return

        self._call(lambda: self._bytestream.Write(chunks(), timeout=self.timeout))

    # -- download -----------------------------------------------------------------------------

    def download(self, digests: Sequence[re_pb2.Digest]) -> dict[str, bytes]:
        """The bytes of each digest, by hash, each checked against its digest.

        Raises :class:`BlobError` (``missing`` or ``corrupt``) for the first bad blob.
        """
        out: dict[str, bytes] = {}
        unique = list({d.hash: d for d in digests}.values())
        batch: list[re_pb2.Digest] = []
        size = 0
        for digest in unique:
            if digest.size_bytes == 0:
                out[digest.hash] = b""
            elif digest.size_bytes > BATCH_BYTES:
                out[digest.hash] = self._read(digest)
            else:
                if size + digest.size_bytes > BATCH_BYTES and batch:
                    out.update(self._batch_read(batch))
                    batch, size = [], 0
                batch.append(digest)
                size += digest.size_bytes
        if batch:
            out.update(self._batch_read(batch))
        for digest in unique:
            _check(digest, out[digest.hash])
        return out

    def read_message(self, digest: re_pb2.Digest, kind: type[M]) -> M:
        """The message ``kind`` stored under ``digest`` (checked); :class:`BlobError` if bad."""
        data = self.download([digest])[digest.hash]
        message: M = kind()
        try:
            message.ParseFromString(data)
        except Exception as exc:  # protobuf raises DecodeError, a plain Exception subclass
            raise BlobError(
                "invalid", digest.hash, digest.size_bytes, f"not a {kind.__name__}: {exc}"
            ) from exc
        return message

    def _batch_read(self, digests: list[re_pb2.Digest]) -> dict[str, bytes]:
        request = re_pb2.BatchReadBlobsRequest(instance_name=self.instance, digests=digests)
        response = self._call(lambda: self._cas.BatchReadBlobs(request, timeout=self.timeout))
        out: dict[str, bytes] = {}
        for answer in response.responses:
            if answer.status.code != 0:
                raise BlobError(
                    "missing", answer.digest.hash, answer.digest.size_bytes, answer.status.message
                )
            out[answer.digest.hash] = answer.data
        for digest in digests:
            if digest.hash not in out:
                raise BlobError(
                    "missing", digest.hash, digest.size_bytes, "not in the batch answer"
                )
        return out

    def _read(self, digest: re_pb2.Digest) -> bytes:
        request = bs_pb2.ReadRequest(resource_name=self._resource(digest))
        try:
            parts = self._call(
                lambda: [r.data for r in self._bytestream.Read(request, timeout=self.timeout)]
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                detail = str(exc.details())
                raise BlobError("missing", digest.hash, digest.size_bytes, detail) from exc
            raise
        return b"".join(parts)


def _check(digest: re_pb2.Digest, data: bytes) -> None:
    got = hashlib.sha256(data).hexdigest()
    if got != digest.hash or len(data) != digest.size_bytes:
        raise BlobError(
            "corrupt",
            digest.hash,
            digest.size_bytes,
            f"the CAS served {len(data)} bytes hashing to {got}",
        )


# -- trees --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tree:
    """A local directory as REAPI messages: its root, every Directory below, every file's bytes."""

    root: re_pb2.Directory
    root_digest: re_pb2.Digest
    #: Every Directory of the tree below the root, by digest hash (serialised bytes).
    children: Mapping[str, bytes]
    #: Every file's content, by digest hash.
    files: Mapping[str, bytes]

    def blobs(self) -> list[bytes]:
        """Everything a CAS needs to hold for the tree (the root included)."""
        return [self.root.SerializeToString(), *self.children.values(), *self.files.values()]

    def tree_message(self) -> re_pb2.Tree:
        """The REAPI ``Tree`` of this directory (an output directory's form)."""
        return re_pb2.Tree(
            root=self.root,
            children=[re_pb2.Directory.FromString(b) for _, b in sorted(self.children.items())],
        )


def tree_of(path: Path) -> Tree:
    """The Merkle tree of the directory at ``path`` (symlinks kept as symlinks, names sorted)."""
    children: dict[str, bytes] = {}
    files: dict[str, bytes] = {}
    root = _directory(path, children, files)
    return Tree(
        root=root, root_digest=digest_of(root.SerializeToString()), children=children, files=files
    )


def _directory(path: Path, children: dict[str, bytes], files: dict[str, bytes]) -> re_pb2.Directory:
    directory = re_pb2.Directory()
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            directory.symlinks.add(name=entry.name, target=os.readlink(entry.path))
        elif stat.S_ISDIR(st.st_mode):
            sub = _directory(Path(entry.path), children, files)
            data = sub.SerializeToString()
            digest = digest_of(data)
            children[digest.hash] = data
            directory.directories.add(name=entry.name, digest=digest)
        elif stat.S_ISREG(st.st_mode):
            data = Path(entry.path).read_bytes()
            digest = digest_of(data)
            files[digest.hash] = data
            directory.files.add(
                name=entry.name, digest=digest, is_executable=bool(st.st_mode & stat.S_IXUSR)
            )
    return directory


def materialise(cas: Cas, root_digest: re_pb2.Digest, dest: Path) -> int:
    """Write the tree under ``root_digest`` into the (new or empty) directory ``dest``.

    Fetches one level of directories per round trip, then the files in batches. Returns the
    number of files written. Raises :class:`BlobError` for a missing, corrupt or malformed blob.
    """
    dest.mkdir(parents=True, exist_ok=True)
    level: list[tuple[Path, re_pb2.Digest]] = [(dest, root_digest)]
    wanted: list[tuple[Path, re_pb2.FileNode]] = []
    while level:
        messages = cas.download([d for _, d in level])
        next_level: list[tuple[Path, re_pb2.Digest]] = []
        for where, digest in level:
            directory = re_pb2.Directory()
            try:
                directory.ParseFromString(messages[digest.hash])
            except Exception as exc:
                raise BlobError(
                    "invalid", digest.hash, digest.size_bytes, f"not a Directory: {exc}"
                ) from exc
            for node in directory.directories:
                sub = where / _name(node.name, digest)
                sub.mkdir()
                next_level.append((sub, node.digest))
            for link in directory.symlinks:
                os.symlink(link.target, where / _name(link.name, digest))
            wanted.extend((where / _name(f.name, digest), f) for f in directory.files)
        level = next_level
    contents = cas.download([f.digest for _, f in wanted])
    for target, node in wanted:
        target.write_bytes(contents[node.digest.hash])
        target.chmod(0o755 if node.is_executable else 0o644)
    return len(wanted)


def _name(name: str, parent: re_pb2.Digest) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise BlobError("invalid", parent.hash, parent.size_bytes, f"bad entry name {name!r}")
    return name
