"""The remote tier: any fsspec URL, every call under a deadline, behind a circuit breaker.

One :class:`RemoteStore` per cache. Invariants:

- A lookup is one request (not-found is a miss), a publish is one
  create-only request where the backend offers it (S3 ``If-None-Match``,
  GCS ``ifGenerationMatch=0``, a hard link on ``file://``, ``xb`` on
  ``memory://``); "already exists" is success.
- A lookup reads at most ``max_size + 1`` bytes: S3 asks for that range and
  stops reading the body there (so a server that ignores the range cannot
  make it read more); GCS and other fsspec stores ask for the range;
  ``file://`` reads like the local tier (regular files only, as long as the
  header declares). A longer answer is refused as corrupt.
- Every call, including opening the filesystem (gcsfs may probe credentials),
  runs under ``timeout`` seconds: async filesystems through
  ``fsspec.asyn.sync(loop, coro, timeout=...)``, which cancels the request;
  blocking ones in a daemon worker thread that is abandoned if it overruns.
- Circuit breaker: until the first successful call the remote is unproven and
  calls are serialised; a failure then switches the remote off at once (a dead
  remote costs about one deadline per run). Once proven, ``failure_threshold``
  consecutive failures switch it off. An answer that fails verification (a
  server answering 200 with garbage) is a failure too (counted toward the
  threshold, never proving the remote); only a lookup that ends in a verified
  object or a clean not-found resets the count (a server may accept writes and
  still serve garbage). Either way: one warning, off for the rest of the run.
- A missing bucket or denied access (403) on a lookup switches the remote off
  at once with one warning naming the URL and what to do. A store that
  refuses writes (403 on a put) keeps serving reads, with one warning; a
  refused delete is ignored.
- A call that runs past its deadline is diagnosed with one TCP connect to the
  endpoint, so a closed port is reported as "connection refused" and an
  unknown host as such; "no answer" is kept for a server that accepts the
  connection and stays silent.
- A missing extra (s3fs, gcsfs) is one warning naming what to install.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from metrale_orch.cache.bucket_failures import (
    MissingBucket,
    RemoteFailure,
    RemoteOff,
    WriteRefused,
    bucket_of,
    describe,
    error_code,
    is_forbidden,
    is_missing_bucket,
)
from metrale_orch.cache.deadline import DeadlineWorker
from metrale_orch.cache.local import (
    DEFAULT_MAX_OBJECT_SIZE,
    publish_atomic,
    read_object_file,
    read_object_head,
)
from metrale_orch.cache.objects import (
    KEY_RE,
    PREFIX_SIZE,
    SCHEMA,
    CorruptObject,
    ObjectTooLarge,
    header_length,
)
from metrale_orch.cache.reapi_tier import ReapiObjects
from metrale_orch.extras import GCS, REMOTE, S3, Extra, ExtraMissing, import_extra
from metrale_orch.fsutil import bytes_digest

__all__ = ["RemoteStore", "extra_for", "remote_object_path"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: protocol -> the extra it needs beyond fsspec
_EXTRAS: Mapping[str, Extra] = {
    "s3": S3,
    "s3a": S3,
    "gs": GCS,
    "gcs": GCS,
    "grpc": REMOTE,
    "grpcs": REMOTE,
}
_SAFE_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Body read size per await on S3 (the answer is read at most up to the limit + 1).
_CHUNK = 8 * 1024 * 1024
#: Longest TCP connect of the diagnosis that follows a timeout.
_DIAGNOSE_SECONDS = 1.0
#: Bytes a header read asks for first (most headers fit; a longer one is read again whole).
_HEAD_GUESS = 64 * 1024


def extra_for(url: str) -> Extra | None:
    """The extra a URL's protocol needs beyond fsspec, or None."""
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    return _EXTRAS.get(protocol)


def namespace_segment(namespace: str) -> str:
    """A path segment for ``namespace``: itself when plain, else a stable hash."""
    if not namespace:
        return "default"
    if _SAFE_SEGMENT.fullmatch(namespace) and namespace != "default":
        return namespace
    return "ns-" + bytes_digest(namespace.encode("utf-8"))


def remote_objects_dir(root: str, namespace: str) -> str:
    """The directory of a namespace's objects under the store's root path (pure)."""
    return f"{root.rstrip('/')}/{namespace_segment(namespace)}/v{SCHEMA}"


def remote_object_path(root: str, namespace: str, key: str) -> str:
    """Where ``key`` lives under the store's root path (pure)."""
    return f"{remote_objects_dir(root, namespace)}/{key[:2]}/{key}"


def _not_open(*args: object, **kwargs: object) -> object:
    raise AssertionError("the remote store is used before it is opened")


def _connect(host: str, port: int, timeout: float) -> None:
    with socket.create_connection((host, port), timeout=timeout):
        pass


class RemoteStore:
    """Objects under ``url`` (an fsspec URL); see the module docstring for the guarantees."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, object],
        namespace: str,
        timeout: float,
        failure_threshold: int,
        writable: bool,
        warn: Callable[[str], None],
        max_size: int = DEFAULT_MAX_OBJECT_SIZE,
    ) -> None:
        self.url = url
        self.max_size = max_size
        self._options = dict(storage_options)
        self._namespace = namespace
        self.timeout = timeout
        self._threshold = max(1, failure_threshold)
        self.writable = writable
        self._warn = warn
        self._lock = threading.Lock()
        self._probe = threading.Lock()
        self._proven = False
        self._failures = 0
        self.disabled = False
        #: The extra this store's protocol needs and does not have (it is then disabled).
        self.missing: ExtraMissing | None = None
        self._opened = False
        # An fsspec filesystem: fsspec is untyped, so its objects are Any here.
        self._fs: Any = None
        self._sync: Callable[..., object] = _not_open
        self._root = ""
        self._protocol = ""
        self._worker = DeadlineWorker()

    # -- public operations -------------------------------------------------------------------

    def get(self, key: str, decode: Callable[[bytes], T]) -> T | None:
        """``decode`` of the stored bytes of ``key`` (at most ``max_size``), None if absent.

        ``decode`` verifies the bytes and raises :class:`CorruptObject` when they
        fail; that is re-raised (with ``received`` set) and counts as a failure
        for the breaker. Raises RemoteFailure/RemoteOff.
        """
        return self._guarded(lambda: self._get(key, decode), resets=True)

    def put(self, key: str, data: bytes) -> bool:
        """Publish create-only; True if created, False if it existed. Raises RemoteFailure/Off."""
        if not self.writable:
            raise RemoteOff("remote is read-only")
        return self._guarded(lambda: self._put(key, data), resets=False)

    def delete(self, key: str) -> None:
        """Remove ``key`` (a corrupt object); raises RemoteFailure/Off."""
        if not self.writable:
            raise RemoteOff("remote is read-only")
        self._guarded(lambda: self._delete(key), resets=False)

    def keys(self) -> list[str]:
        """Every key stored in this cache's namespace, sorted: one listing of the store
        (paged by the backend), for a diagnosis, never a build. Raises RemoteFailure, or
        RemoteOff (also for a REAPI action cache, which cannot be listed)."""
        return self._guarded(self._keys, resets=False)

    def head(self, key: str) -> tuple[bytes, bytes] | None:
        """The prefix and header bytes of ``key``'s object, its payload unread (one ranged
        read, two for a header past 64 KiB); None if absent. Raises CorruptObject,
        RemoteFailure or RemoteOff."""
        return self._guarded(lambda: self._head(key), resets=False)

    def path(self, key: str) -> str:
        self._ensure_open()
        return remote_object_path(self._root, self._namespace, key)

    def close(self) -> None:
        self._worker.close()
        if self._protocol == "grpc" and self._fs is not None:
            self._fs.close()

    # -- the breaker ---------------------------------------------------------------------------

    def _guarded(self, op: Callable[[], T], *, resets: bool) -> T:
        """Run ``op`` under the breaker; ``resets``: a success clears the failure count."""
        if self.disabled:
            raise RemoteOff("remote is off")
        probe = self._probe if not self._proven else contextlib.nullcontext()
        with probe:
            if self.disabled:
                raise RemoteOff("remote is off")
            try:
                self._ensure_open()
                result = op()
            except RemoteOff:
                raise
            except CorruptObject as exc:  # it answered, with garbage: a failure, not a proof
                self._failed(f"an answer failed verification: {exc.reason}", exc, at_once=False)
                raise
            except WriteRefused as exc:  # the remote answered: not a breaker failure
                raise RemoteFailure(describe(exc.cause)) from None
            except TimeoutError as exc:
                detail, timed_out = self._diagnose_timeout()
                self._failed(detail, exc)
                raise RemoteFailure(detail, timeout=timed_out) from None
            except Exception as exc:
                detail = describe(exc.cause if isinstance(exc, MissingBucket) else exc)
                if isinstance(exc, MissingBucket) or is_missing_bucket(exc):
                    self._switch_off(
                        f"remote cache {self.url}: bucket {bucket_of(self.url)!r} does not exist "
                        f"({detail}); create it or fix the cache URL; off for the rest of this "
                        "run, using the local cache only",
                        exc,
                    )
                elif is_forbidden(exc):
                    self._switch_off(
                        f"remote cache {self.url} denies access ({detail}): check its credentials "
                        "(storage_options or the environment) and permissions; off for the rest "
                        "of this run, using the local cache only",
                        exc,
                    )
                else:
                    self._failed(detail, exc)
                raise RemoteFailure(detail) from None
            with self._lock:
                self._proven = True
                if resets:
                    self._failures = 0
            return result

    def _failed(self, detail: str, exc: BaseException, *, at_once: bool = True) -> None:
        """Count a failure; trip at the threshold (or at once if unproven and ``at_once``)."""
        log.debug("remote cache %s: %s", self.url, detail, exc_info=exc)
        with self._lock:
            self._failures += 1
            trip = (at_once and not self._proven) or self._failures >= self._threshold
            if trip and not self.disabled:
                self.disabled = True
                n = self._failures
                self._warn(
                    f"remote cache {self.url} is off for the rest of this run after "
                    f"{n} failed call{'s' if n != 1 else ''} (last: {detail}); "
                    "using the local cache only"
                )

    def _switch_off(self, message: str, exc: BaseException) -> None:
        log.debug("remote cache %s: %s", self.url, message, exc_info=exc)
        with self._lock:
            if self.disabled:
                return
            self.disabled = True
            self._warn(message)

    def _diagnose_timeout(self) -> tuple[str, bool]:
        """(detail, still a timeout?) for a call that ran past its deadline.

        One TCP connect to the endpoint tells a closed port ("connection
        refused") and an unknown host from a server that stays silent.
        """
        no_answer = f"no answer within {self.timeout:g} s"
        endpoint = self._endpoint()
        if endpoint is None:
            return no_answer, True
        host, port = endpoint
        wait = min(_DIAGNOSE_SECONDS, self.timeout)
        try:
            self._worker.call(lambda: _connect(host, port, wait), wait + 0.5)
        except ConnectionRefusedError:
            return f"connection refused by {host}:{port}", False
        except socket.gaierror:
            return f"cannot resolve host {host!r}", False
        except TimeoutError:
            return no_answer, True
        except OSError as exc:
            return f"cannot connect to {host}:{port} ({exc.strerror or describe(exc)})", False
        return no_answer, True

    def _endpoint(self) -> tuple[str, int] | None:
        """(host, port) the store talks to, where it is an HTTP endpoint we can name."""
        opts = self._options
        client_kwargs = opts.get("client_kwargs")
        url: object = opts.get("endpoint_url") or (
            client_kwargs.get("endpoint_url") if isinstance(client_kwargs, Mapping) else None
        )
        if not url and self._fs is not None:
            client = getattr(self._fs, "s3", None)  # s3fs, after set_session
            url = getattr(getattr(client, "meta", None), "endpoint_url", None)
            if not url:
                url = getattr(self._fs, "_location", None)  # gcsfs
        if not isinstance(url, str) or "://" not in url:
            return None
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None
        if not parts.hostname:
            return None
        return parts.hostname, port

    # -- opening -------------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._opened:
            return
        extra = extra_for(self.url)
        if extra is not None:
            if extra is GCS:
                # gcsfs >= 2026 probes every bucket's type over gRPC unless this is off
                # (and the probe never answers off Google Cloud); our flat objects need none.
                os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
            try:
                import_extra(extra, f"remote cache {self.url}")
            except ExtraMissing as exc:
                self.disabled, self.missing = True, exc
                self._warn(f"{exc}; using the local cache only")
                raise RemoteOff(f"{exc.module} missing") from None
        if self.url.startswith(("grpc://", "grpcs://")):
            self._open_reapi()
            return
        # fsspec takes ~180 ms to import; only a remote cache needs it, and a no-op build
        # opens none: so it is imported here, on first use, and nowhere else.
        import fsspec.asyn
        import fsspec.core

        self._sync = fsspec.asyn.sync
        options = dict(self._options)
        try:
            fs, root = self._worker.call(
                lambda: fsspec.core.url_to_fs(self.url, **options), self.timeout
            )
        except ValueError as exc:  # unknown protocol, malformed URL
            self.disabled = True
            self._warn(
                f"remote cache {self.url} cannot be opened ({describe(exc)}); "
                "using the local cache only"
            )
            raise RemoteOff(str(exc)) from None
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if getattr(fs, "async_impl", False) and inspect.iscoroutinefunction(
            getattr(fs, "set_session", None)
        ):
            # Building the client (botocore models, credentials) is local work that can take
            # a good part of a second on a busy machine: give it its own deadline so the
            # first request's deadline measures the remote, not our CPU.
            fsspec.asyn.sync(fs.loop, fs.set_session, timeout=self.timeout)
        self._fs, self._root, self._protocol = fs, root, protocol
        self._opened = True

    def _open_reapi(self) -> None:
        """A REAPI action cache and CAS (:mod:`metrale_orch.cache.reapi_tier`) as the store."""
        from metrale_orch.remote.client import RemoteClient

        options = dict(self._options)
        headers = options.get("headers", {})
        instance = options.get("instance", "")
        self._fs = ReapiObjects(
            RemoteClient(
                self.url,
                instance=str(instance),
                headers={str(k): str(v) for k, v in dict(headers).items()}
                if isinstance(headers, Mapping)
                else {},
                timeout=self.timeout,
            )
        )
        self._protocol = "grpc"
        self._root = ""
        self._opened = True

    # -- per-protocol calls --------------------------------------------------------------------

    def _run(self, fn: Callable[..., object], *args: object, **kwargs: object) -> Any:
        """Call an fs method under the deadline (async: cancelled on timeout); its result is
        untyped, as fsspec is."""
        fs = self._fs
        if getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None:
            return self._sync(fs.loop, fn, *args, timeout=self.timeout, **kwargs)
        if self._protocol == "memory":  # an in-process dict: cannot block
            return fn(*args, **kwargs)
        return self._worker.call(lambda: fn(*args, **kwargs), self.timeout)

    def _get(self, key: str, decode: Callable[[bytes], T]) -> T | None:
        path = remote_object_path(self._root, self._namespace, key)
        try:
            data = self._fetch(path)
        except (FileNotFoundError, NotADirectoryError) as exc:
            if is_missing_bucket(exc):
                raise
            return None
        if data is None:
            return None
        if len(data) > self.max_size:
            raise ObjectTooLarge(
                f"more than the {self.max_size}-byte limit on an object", received=len(data)
            )
        try:
            return decode(data)
        except CorruptObject as exc:
            exc.received = len(data)
            raise

    def _fetch(self, path: str) -> bytes | None:
        """At most ``max_size + 1`` bytes of ``path``; None (or FileNotFoundError) if absent."""
        fs = self._fs
        limit = self.max_size + 1
        if self._protocol in ("file", "local"):
            found: bytes | None = self._run(read_object_file, Path(path), self.max_size)
            return found
        if self._protocol == "grpc":  # every call carries its own deadline
            got: bytes | None = fs.get(path, self.max_size)
            return got
        if self._protocol in ("s3", "s3a"):
            return bytes(self._run(self._s3_read, path, limit))
        if fs.async_impl:
            return bytes(self._run(fs._cat_file, path, start=0, end=limit))
        return bytes(self._run(fs.cat_file, path, start=0, end=limit))

    async def _s3_read(self, path: str, limit: int) -> bytes:
        """GET the first ``limit`` bytes and stop reading there, whatever the server sends."""
        fs = self._fs
        bucket, key, _ = fs.split_path(path)
        try:
            resp = await fs._call_s3(
                "get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{limit - 1}"
            )
        except OSError as exc:
            if error_code(exc) in ("InvalidRange", "416"):
                return b""  # S3 answers 416 to any range of an empty object
            raise
        body = resp["Body"]
        chunks: list[bytes] = []
        got = 0
        try:
            while got < limit:
                chunk = await body.read(min(_CHUNK, limit - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        finally:
            body.close()
        return b"".join(chunks)

    def _keys(self) -> list[str]:
        if self._protocol == "grpc":
            raise RemoteOff("a REAPI action cache cannot be listed")
        fs = self._fs
        base = remote_objects_dir(self._root, self._namespace)
        try:
            found = self._run(fs._find if fs.async_impl else fs.find, base)
        except FileNotFoundError as exc:
            if is_missing_bucket(exc):
                raise
            return []
        keys = set()
        for path in found:
            parent, _, name = str(path).rstrip("/").rpartition("/")
            if KEY_RE.fullmatch(name) and parent.endswith("/" + name[:2]):
                keys.add(name)
        return sorted(keys)

    def _head(self, key: str) -> tuple[bytes, bytes] | None:
        path = remote_object_path(self._root, self._namespace, key)
        if self._protocol in ("file", "local"):
            found: tuple[bytes, bytes] | None = self._run(read_object_head, Path(path))
            return found
        try:
            data = self._range(path, _HEAD_GUESS)
            hlen = header_length(data[:PREFIX_SIZE])
            if PREFIX_SIZE + hlen > len(data):
                data = self._range(path, PREFIX_SIZE + hlen)
        except (FileNotFoundError, NotADirectoryError) as exc:
            if is_missing_bucket(exc):
                raise
            return None
        if PREFIX_SIZE + hlen > len(data):
            raise CorruptObject(f"truncated: {len(data)} bytes, but the header alone is {hlen}")
        return data[:PREFIX_SIZE], data[PREFIX_SIZE : PREFIX_SIZE + hlen]

    def _range(self, path: str, size: int) -> bytes:
        """The first ``size`` bytes of ``path`` (fewer when it is shorter)."""
        fs = self._fs
        if self._protocol == "grpc":
            got: bytes | None = fs.get(path, self.max_size)
            if got is None:
                raise FileNotFoundError(path)
            return got[:size]
        if self._protocol in ("s3", "s3a"):
            return bytes(self._run(self._s3_read, path, size))
        if fs.async_impl:
            return bytes(self._run(fs._cat_file, path, start=0, end=size))
        return bytes(self._run(fs.cat_file, path, start=0, end=size))

    def _put(self, key: str, data: bytes) -> bool:
        fs = self._fs
        path = remote_object_path(self._root, self._namespace, key)
        try:
            if self._protocol in ("file", "local"):
                created: bool = self._run(publish_atomic, Path(path), data)
                return created
            if self._protocol == "grpc":
                stored: bool = fs.put(path, data)
                return stored
            if fs.async_impl:
                self._run(fs._pipe_file, path, data, mode="create")
            else:
                self._run(fs.pipe_file, path, data, mode="create")
        except FileExistsError:
            return False
        except FileNotFoundError as exc:
            if self._protocol in ("memory", "file", "local"):
                raise
            # an object store fails a create with "not found" only when the bucket is missing
            raise MissingBucket(exc) from exc
        except Exception as exc:
            if is_forbidden(exc):
                self._refuse_writes(exc)
                raise WriteRefused(exc) from exc
            raise
        return True

    def _refuse_writes(self, exc: BaseException) -> None:
        with self._lock:
            if not self.writable:
                return
            self.writable = False
        self._warn(
            f"remote cache {self.url} refuses writes ({describe(exc)}); "
            "reading from it but not uploading for the rest of this run"
        )

    def _delete(self, key: str) -> None:
        fs = self._fs
        if self._protocol == "grpc":
            return  # an action cache has no delete: a corrupt entry is refused, not removed
        path = remote_object_path(self._root, self._namespace, key)
        try:
            if fs.async_impl:
                self._run(fs._rm_file, path)
            else:
                self._run(fs.rm_file, path)
        except FileNotFoundError as exc:
            if is_missing_bucket(exc):
                raise
        except Exception as exc:
            if is_forbidden(exc):  # many policies allow create but not delete: keep going
                raise WriteRefused(exc) from exc
            raise
