"""The remote tier: any fsspec URL, every call under a deadline, behind a circuit breaker.

One :class:`RemoteStore` per cache. Invariants:

- A lookup is one request (``cat_file``; not-found is a miss), a publish is
  one create-only request where the backend offers it (S3 ``If-None-Match``,
  GCS ``ifGenerationMatch=0``, a hard link on ``file://``, ``xb`` on
  ``memory://``); "already exists" is success.
- Every call, including opening the filesystem (gcsfs may probe credentials),
  runs under ``timeout`` seconds: async filesystems through
  ``fsspec.asyn.sync(loop, coro, timeout=...)``, which cancels the request;
  blocking ones in a daemon worker thread that is abandoned if it overruns.
- Circuit breaker: until the first successful call the remote is unproven and
  calls are serialised; a failure then switches the remote off at once (a dead
  remote costs about one deadline per run). Once proven, ``failure_threshold``
  consecutive failures switch it off. Either way: one warning, off for the
  rest of the run. A store that refuses writes (403 on a put) keeps serving
  reads, with one warning.
- A missing extra (s3fs, gcsfs) is one warning naming what to install.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import logging
import os
import queue
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import xxhash

from metrale_orch._cache_local import publish_atomic
from metrale_orch._cache_object import SCHEMA

__all__ = ["RemoteFailure", "RemoteStore", "extra_for", "remote_object_path"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: protocol -> (module to import, extra to install)
_EXTRAS: Mapping[str, tuple[str, str]] = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
}
_SAFE_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class RemoteFailure(Exception):
    """A remote call failed (``timeout`` True when it ran past its deadline)."""

    def __init__(self, detail: str, *, timeout: bool = False) -> None:
        self.detail = detail
        self.timeout = timeout
        super().__init__(detail)


class _WriteRefused(Exception):
    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(str(cause))


class RemoteOff(Exception):
    """The remote is switched off (breaker open, missing extra, bad URL)."""


def extra_for(url: str) -> tuple[str, str] | None:
    """(module, extra) a URL's protocol needs beyond fsspec, or None."""
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    return _EXTRAS.get(protocol)


def namespace_segment(namespace: str) -> str:
    """A path segment for ``namespace``: itself when plain, else a stable hash."""
    if not namespace:
        return "default"
    if _SAFE_SEGMENT.fullmatch(namespace) and namespace != "default":
        return namespace
    return "ns-" + xxhash.xxh3_64_hexdigest(namespace.encode("utf-8"))


def remote_object_path(root: str, namespace: str, key: str) -> str:
    """Where ``key`` lives under the store's root path (pure)."""
    base = root.rstrip("/")
    return f"{base}/{namespace_segment(namespace)}/v{SCHEMA}/{key[:2]}/{key}"


class _Worker:
    """One daemon thread running blocking calls; abandoned (never joined) if a call overruns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._jobs = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_work, args=(self._jobs,), name="metrale-cache-io", daemon=True
                )
                self._thread.start()
            jobs = self._jobs
            jobs.put((fn, fut))
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                if self._jobs is jobs:  # the thread is stuck: leave it, start afresh next time
                    fut.cancel()
                    jobs.put((_stop, concurrent.futures.Future()))
                    self._jobs = queue.SimpleQueue()
                    self._thread = None
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def close(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._jobs.put((_stop, concurrent.futures.Future()))
                self._thread = None


class _Stop(Exception):
    pass


def _stop() -> None:
    raise _Stop


def _work(
    jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]],
) -> None:
    while True:
        fn, fut = jobs.get()
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(fn())
        except _Stop:
            fut.set_result(None)
            return
        except BaseException as exc:
            fut.set_exception(exc)


def _is_forbidden(exc: BaseException) -> bool:
    # s3fs maps 403 to PermissionError; gcsfs raises OSError("Forbidden: ...").
    return isinstance(exc, PermissionError) or (
        isinstance(exc, OSError) and str(exc).startswith("Forbidden")
    )


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class RemoteStore:
    """Objects under ``url`` (an fsspec URL); see the module docstring for the guarantees."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any],
        namespace: str,
        timeout: float,
        failure_threshold: int,
        writable: bool,
        warn: Callable[[str], None],
    ) -> None:
        self.url = url
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
        self._opened = False
        self._fs: Any = None
        self._root = ""
        self._protocol = ""
        self._worker = _Worker()

    # -- public operations -------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The stored bytes of ``key`` (unverified), None if absent; raises RemoteFailure/Off."""
        return self._guarded(lambda: self._get(key))

    def put(self, key: str, data: bytes) -> bool:
        """Publish create-only; True if created, False if it existed. Raises RemoteFailure/Off."""
        if not self.writable:
            raise RemoteOff("remote is read-only")
        return self._guarded(lambda: self._put(key, data))

    def delete(self, key: str) -> None:
        """Remove ``key`` (a corrupt object); raises RemoteFailure/Off."""
        if not self.writable:
            raise RemoteOff("remote is read-only")
        self._guarded(lambda: self._delete(key))

    def path(self, key: str) -> str:
        self._ensure_open()
        return remote_object_path(self._root, self._namespace, key)

    def close(self) -> None:
        self._worker.close()

    # -- the breaker ---------------------------------------------------------------------------

    def _guarded(self, op: Callable[[], T]) -> T:
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
            except _WriteRefused as exc:  # the remote answered: not a breaker failure
                raise RemoteFailure(_describe(exc.cause)) from None
            except TimeoutError as exc:
                self._failed(f"no answer within {self.timeout:g} s", exc)
                raise RemoteFailure(f"no answer within {self.timeout:g} s", timeout=True) from None
            except Exception as exc:
                self._failed(_describe(exc), exc)
                raise RemoteFailure(_describe(exc)) from None
            with self._lock:
                self._proven = True
                self._failures = 0
            return result

    def _failed(self, detail: str, exc: BaseException) -> None:
        log.debug("remote cache %s: %s", self.url, detail, exc_info=exc)
        with self._lock:
            self._failures += 1
            trip = not self._proven or self._failures >= self._threshold
            if trip and not self.disabled:
                self.disabled = True
                n = self._failures
                self._warn(
                    f"remote cache {self.url} is off for the rest of this run after "
                    f"{n} failed call{'s' if n != 1 else ''} (last: {detail}); "
                    "using the local cache only"
                )

    # -- opening -------------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._opened:
            return
        extra = extra_for(self.url)
        if extra is not None:
            module, name = extra
            if module == "gcsfs":
                # gcsfs >= 2026 probes every bucket's type over gRPC unless this is off
                # (and the probe never answers off Google Cloud); our flat objects need none.
                os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
            try:
                __import__(module)
            except ImportError:
                self.disabled = True
                self._warn(
                    f"remote cache {self.url} needs {module}: pip install 'metrale-orch[{name}]'; "
                    "using the local cache only"
                )
                raise RemoteOff(f"{module} missing") from None
        import fsspec.core

        options = dict(self._options)
        try:
            fs, root = self._worker.call(
                lambda: fsspec.core.url_to_fs(self.url, **options), self.timeout
            )
        except ValueError as exc:  # unknown protocol, malformed URL
            self.disabled = True
            self._warn(
                f"remote cache {self.url} cannot be opened ({_describe(exc)}); "
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
            import fsspec.asyn

            fsspec.asyn.sync(fs.loop, fs.set_session, timeout=self.timeout)
        self._fs, self._root, self._protocol = fs, root, protocol
        self._opened = True

    # -- per-protocol calls --------------------------------------------------------------------

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call an fs method under the deadline (async: cancelled on timeout)."""
        fs = self._fs
        if getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None:
            import fsspec.asyn

            return fsspec.asyn.sync(fs.loop, fn, *args, timeout=self.timeout, **kwargs)
        if self._protocol == "memory":  # an in-process dict: cannot block
            return fn(*args, **kwargs)
        return self._worker.call(lambda: fn(*args, **kwargs), self.timeout)

    def _get(self, key: str) -> bytes | None:
        fs = self._fs
        path = remote_object_path(self._root, self._namespace, key)
        try:
            if fs.async_impl:
                extra = {"max_concurrency": 1} if self._protocol in ("s3", "s3a") else {}
                data = self._run(fs._cat_file, path, **extra)
            else:
                data = self._run(fs.cat_file, path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return bytes(data)

    def _put(self, key: str, data: bytes) -> bool:
        fs = self._fs
        path = remote_object_path(self._root, self._namespace, key)
        try:
            if self._protocol in ("file", "local"):
                created: bool = self._run(publish_atomic, Path(path), data)
                return created
            if fs.async_impl:
                self._run(fs._pipe_file, path, data, mode="create")
            else:
                self._run(fs.pipe_file, path, data, mode="create")
        except FileExistsError:
            return False
        except Exception as exc:
            if _is_forbidden(exc):
                self._refuse_writes(exc)
                raise _WriteRefused(exc) from exc
            raise
        return True

    def _refuse_writes(self, exc: BaseException) -> None:
        with self._lock:
            if not self.writable:
                return
            self.writable = False
        self._warn(
            f"remote cache {self.url} refuses writes ({_describe(exc)}); "
            "reading from it but not uploading for the rest of this run"
        )

    def _delete(self, key: str) -> None:
        fs = self._fs
        path = remote_object_path(self._root, self._namespace, key)
        try:
            if fs.async_impl:
                self._run(fs._rm_file, path)
            else:
                self._run(fs.rm_file, path)
        except FileNotFoundError:
            pass
