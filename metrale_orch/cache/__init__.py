"""The content-addressed cache (SPEC 3.4): a local directory tier in front of an optional remote.

What it owns:

- **Keys** (:func:`cache_key`, pure): xxh3-128 of a canonical, type-tagged
  encoding of the schema version, the namespace and the caller's parts.
- **Objects**: one self-verifying object per key (magic, header length,
  header hash, JSON header naming every output's size and xxh3-128, payload).
  Every read verifies everything; a bad object is a miss, reported with its
  key, deleted from the local tier (and from a writable remote, so a fresh
  upload can replace it), never returned.
- **Bounded reads**: the local tier reads only regular files, never blocking
  (a FIFO, device, symlink or directory at an object path is a bad entry),
  and only the size the object's header declares; no tier reads more than
  ``max_object_size`` bytes of one object. A bad entry is removed, or
  reported once when it cannot be.
- **Validity**: :meth:`Cache.get` takes an ``accept`` predicate over the
  verified object's ``meta`` (the build checks that every file the compiler
  read still has its recorded content). A rejected entry is a miss (counted
  as ``rejected`` too); a rejected local entry is kept for the caller to
  replace (``put(..., replace=True)``), a rejected remote one is not copied.
- **Tiers**: ``<local_dir>/objects/<2 hex>/<key>`` published create-only via a
  temporary file (or replaced atomically on request); a remote fsspec URL
  (``_stores``) with one GET per lookup, create-only puts, a deadline per call
  and a circuit breaker. A remote hit fills the local tier. Uploads run in a
  background thread; :meth:`Cache.flush` waits for them, :meth:`Cache.close`
  finishes them.
- **Statistics**: ``Cache.stats`` counts the whole process; :meth:`Cache.track`
  gives one context (a thread's task) exactly its own counts, uploads it
  queued included.
- **Modes**: ``read-write``; ``read-only`` (the remote is never written — zero
  write requests; the local tier still fills); ``off`` (no cache at all).

The cache never fails a build for a store problem: it counts it in
:class:`CacheStats`, adds one line to :meth:`Cache.warnings` and logs. It
knows nothing of doit and prints nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from metrale_orch.cache.local import (
    DEFAULT_MAX_OBJECT_SIZE,
    STALE_TMP_SECONDS,
    EntryKind,
    LocalTier,
    key_lock,
    not_regular,
    read_object_file,
    remove_entry,
    scan_objects,
)
from metrale_orch.cache.objects import (
    KEY_RE,
    SCHEMA,
    CorruptObject,
    ObjectTooLarge,
    decode_object,
    encode_object,
    key_of,
)
from metrale_orch.cache.remote import RemoteFailure, RemoteOff, RemoteStore
from metrale_orch.config import CACHE_MODES
from metrale_orch.errors import MetraleError
from metrale_orch.fsutil import write_atomic

if TYPE_CHECKING:
    from metrale_orch.config import Config

__all__ = [
    "DEFAULT_MAX_OBJECT_SIZE",
    "SCHEMA",
    "Accept",
    "BadObject",
    "Cache",
    "CacheError",
    "CacheKeyError",
    "CacheSettings",
    "CacheSettingsError",
    "CacheStats",
    "CacheStatsError",
    "GcResult",
    "Hit",
    "LocalSummary",
    "SizeError",
    "VerifyResult",
    "cache_key",
    "gc_local",
    "open_cache",
    "parse_size",
    "read_stats",
    "summarize_local",
    "verify_local",
    "write_stats",
]

log = logging.getLogger(__name__)


# -- errors ---------------------------------------------------------------------------------------


class CacheError(MetraleError):
    """Base of the cache's errors (a misuse or unreadable file; store trouble never raises)."""


class CacheSettingsError(CacheError):
    """A cache setting is out of range; names the setting and the value."""

    def __init__(self, setting: str, value: object, problem: str) -> None:
        self.setting = setting
        self.value = value
        super().__init__(f"cache setting {setting}={value!r}: {problem}")


class CacheKeyError(CacheError):
    """A key is malformed, or key parts / meta hold a value that cannot be encoded."""

    def __init__(self, what: str, problem: str) -> None:
        self.what = what
        self.problem = problem
        super().__init__(f"cache key {what}: {problem}")


class CacheStatsError(CacheError):
    """A statistics file cannot be read; names the file."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem} (delete it; the next build writes a fresh one)")


class SizeError(CacheError):
    """A size such as ``500M`` cannot be parsed."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(
            f"size {text!r} is not understood: use bytes or a number with K, M, G or T "
            "(powers of 1024), e.g. 500M or 2G"
        )


# -- keys -----------------------------------------------------------------------------------------


def cache_key(namespace: str, parts: Mapping[str, Any]) -> str:
    """The action key (32 hex chars) of ``parts`` in ``namespace`` (pure).

    ``parts`` may hold str, bytes (hashed by value, never by path), int, float,
    bool, None, lists/tuples and string-keyed mappings; mapping order does not
    matter, list order does. The schema version is always mixed in. Raises
    :class:`CacheKeyError` for any other value.
    """
    try:
        return key_of(namespace, parts)
    except TypeError as exc:
        raise CacheKeyError("parts", str(exc)) from None


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise CacheKeyError(repr(key), "must be 32 lowercase hex characters (from cache_key)")


# -- settings -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSettings:
    """Everything a cache needs; build one with :meth:`from_config` or by hand in tests."""

    local_dir: Path
    #: fsspec URL of the remote tier, "" for none.
    remote: str = ""
    mode: str = "read-write"
    namespace: str = ""
    #: Deadline in seconds of every remote call.
    timeout: float = 2.0
    storage_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: Consecutive failures (after a first success) that switch the remote off.
    failure_threshold: int = 3
    #: Upload in a background thread (``Cache.close`` waits); False: upload inside ``put``.
    background_uploads: bool = True
    #: The largest object stored or read, in bytes: a bigger one is refused, never read whole.
    max_object_size: int = DEFAULT_MAX_OBJECT_SIZE

    def __post_init__(self) -> None:
        if self.mode not in CACHE_MODES:
            raise CacheSettingsError("mode", self.mode, f"must be one of {', '.join(CACHE_MODES)}")
        if isinstance(self.timeout, bool) or not (
            isinstance(self.timeout, int | float)
            and math.isfinite(self.timeout)
            and self.timeout > 0
        ):
            raise CacheSettingsError("timeout", self.timeout, "must be a positive number")
        if isinstance(self.failure_threshold, bool) or not (
            isinstance(self.failure_threshold, int) and self.failure_threshold >= 1
        ):
            raise CacheSettingsError("failure_threshold", self.failure_threshold, "must be >= 1")
        if isinstance(self.max_object_size, bool) or not (
            isinstance(self.max_object_size, int) and self.max_object_size >= 1
        ):
            raise CacheSettingsError(
                "max_object_size", self.max_object_size, "must be a positive number of bytes"
            )
        object.__setattr__(self, "local_dir", Path(self.local_dir))
        object.__setattr__(self, "storage_options", MappingProxyType(dict(self.storage_options)))

    @classmethod
    def from_config(cls, config: Config) -> CacheSettings:
        """The settings of a project's :class:`~metrale_orch.config.Config`."""
        return cls(
            local_dir=config.local_cache,
            remote=config.cache,
            mode=config.cache_mode,
            namespace=config.cache_namespace,
            timeout=config.cache_timeout,
            storage_options=config.storage_options,
        )


# -- results --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Hit:
    """A verified entry: ``outputs`` (name -> bytes), ``meta``, and the ``tier`` it came from."""

    key: str
    outputs: Mapping[str, bytes]
    meta: Mapping[str, Any]
    #: "local" | "remote"
    tier: str


_COUNTERS = (
    "local_hits",
    "remote_hits",
    "misses",
    "rejected",
    "errors",
    "timeouts",
    "corrupt",
    "puts",
    "uploads",
    "bytes_up",
    "bytes_down",
    "remote_disabled",
)


@dataclass(slots=True, kw_only=True)
class CacheStats:
    """Counters of one process (or, added up, one run). Mutable; ``Cache.stats`` is live."""

    local_hits: int = 0
    remote_hits: int = 0
    misses: int = 0
    #: Misses where an entry verified but ``accept`` refused it (stale for the current inputs).
    rejected: int = 0
    #: Failed store calls (remote errors, unreadable local files).
    errors: int = 0
    #: Remote calls that ran past their deadline.
    timeouts: int = 0
    #: Objects that failed verification (never returned).
    corrupt: int = 0
    #: Objects this process published to the local tier.
    puts: int = 0
    #: Objects this process published to the remote tier.
    uploads: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    #: Compile time recorded in the objects that hit.
    seconds_saved: float = 0.0
    #: Processes whose remote was switched off (breaker, missing extra).
    remote_disabled: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _COUNTERS}
        out["seconds_saved"] = round(self.seconds_saved, 3)
        return dict(sorted(out.items()))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> CacheStats:
        """Inverse of :meth:`to_dict`; missing counters are 0. Raises ``ValueError``."""
        kwargs: dict[str, Any] = {}
        for name in _COUNTERS:
            value = doc.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
            kwargs[name] = value
        saved = doc.get("seconds_saved", 0.0)
        if isinstance(saved, bool) or not isinstance(saved, int | float) or saved < 0:
            raise ValueError(f"seconds_saved must be a non-negative number, got {saved!r}")
        return cls(seconds_saved=float(saved), **kwargs)

    def __add__(self, other: CacheStats) -> CacheStats:
        if not isinstance(other, CacheStats):
            return NotImplemented
        return CacheStats(
            seconds_saved=self.seconds_saved + other.seconds_saved,
            **{name: getattr(self, name) + getattr(other, name) for name in _COUNTERS},
        )

    def copy(self) -> CacheStats:
        return CacheStats(**{f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def lookups(self) -> int:
        return self.local_hits + self.remote_hits + self.misses

    def summary_line(self) -> str:
        """One line, e.g. ``cache: 12 local hits, 3 remote hits, 2 misses; ...``."""
        parts = [
            f"{self.local_hits} local hit{_s(self.local_hits)}",
            f"{self.remote_hits} remote hit{_s(self.remote_hits)}",
            f"{self.misses} miss{'es' if self.misses != 1 else ''}",
        ]
        if self.rejected:
            parts.append(f"{self.rejected} rejected as stale")
        trouble = [
            f"{n} {label}"
            for n, label in (
                (self.errors, "errors" if self.errors != 1 else "error"),
                (self.timeouts, "timeouts" if self.timeouts != 1 else "timeout"),
                (self.corrupt, "corrupt"),
            )
            if n
        ]
        moved = f"{_human(self.bytes_down)} down, {_human(self.bytes_up)} up"
        line = "cache: " + ", ".join(parts)
        if trouble:
            line += " (" + ", ".join(trouble) + ")"
        line += f"; {moved}; {self.seconds_saved:.1f} s of compiling saved"
        if self.remote_disabled:
            line += "; remote off"
        return line


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def write_stats(path: Path, stats: CacheStats) -> None:
    """Write ``stats`` as JSON to ``path`` atomically (temp file + rename)."""
    write_atomic(path, (json.dumps(stats.to_dict(), indent=2, sort_keys=True) + "\n").encode())


def read_stats(path: Path) -> CacheStats:
    """Read a file written by :func:`write_stats`.

    Raises ``FileNotFoundError`` if absent and :class:`CacheStatsError` if malformed.
    """
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return CacheStats.from_dict(doc)
    except (ValueError, TypeError) as exc:
        raise CacheStatsError(path, f"not a cache statistics file: {exc}") from None


# -- the cache ------------------------------------------------------------------------------------

#: A verified entry is valid for the caller's current inputs (called with its ``meta``).
Accept = Callable[[Mapping[str, Any]], bool]

_Trackers = tuple[tuple["Cache", CacheStats], ...]
_UploadJob = tuple[str, bytes, _Trackers]

#: The :meth:`Cache.track` statistics active in the current context, with the cache each
#: belongs to. A context variable, not a registry: each thread (and each task a caller runs
#: with ``contextvars.copy_context()``) sees only the trackers it opened itself.
_TRACKERS: contextvars.ContextVar[_Trackers] = contextvars.ContextVar(
    "metrale_orch_cache_trackers", default=()
)


class Cache:
    """A two-tier cache; obtain one with :func:`open_cache`. Thread-safe."""

    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._warnings: list[str] = []
        self._off_seen = False
        self._enabled = settings.mode != "off"
        self._local = (
            LocalTier(settings.local_dir, settings.max_object_size) if self._enabled else None
        )
        self._remote: RemoteStore | None = None
        if self._enabled and settings.remote:
            self._remote = RemoteStore(
                settings.remote,
                storage_options=settings.storage_options,
                namespace=settings.namespace,
                timeout=float(settings.timeout),
                failure_threshold=settings.failure_threshold,
                writable=settings.mode == "read-write",
                warn=self._remote_warn,
                max_size=settings.max_object_size,
            )
        self._uploads: queue.Queue[_UploadJob | None] = queue.Queue()
        self._uploader: threading.Thread | None = None
        self._closed = False

    # -- warnings and counters --

    def warnings(self) -> list[str]:
        """One-line warnings so far (each at most once), in order."""
        with self._lock:
            return list(self._warnings)

    def _warn(self, message: str) -> None:
        with self._lock:
            if message in self._warnings:
                return
            self._warnings.append(message)
        log.warning("%s", message)

    def _remote_warn(self, message: str) -> None:
        # The store warns once when it switches itself off (and once if it refuses writes).
        with self._lock:
            newly_off = self._remote is not None and self._remote.disabled and not self._off_seen
            self._off_seen = self._off_seen or newly_off
        if newly_off:
            self._count(remote_disabled=1)
        self._warn(message)

    def _count(self, **deltas: float) -> None:
        """Add ``deltas`` to the process total and to this context's trackers of this cache."""
        targets = [self.stats, *(stats for owner, stats in _TRACKERS.get() if owner is self)]
        with self._lock:
            for stats in targets:
                for name, delta in deltas.items():
                    if delta:
                        setattr(stats, name, getattr(stats, name) + delta)

    def _count_failure(self, exc: RemoteFailure) -> None:
        if exc.timeout:
            self._count(timeouts=1)
        else:
            self._count(errors=1)

    @contextlib.contextmanager
    def track(self) -> Iterator[CacheStats]:
        """Count this context's calls apart: yields a fresh :class:`CacheStats`.

        Every count made by a call of this cache in the ``with`` block, in this
        thread, goes to the yielded stats as well as to ``Cache.stats``;
        uploads queued by ``put`` inside the block count there even when they
        finish after it (:meth:`flush` waits for them). Nested blocks all
        count. Work handed to other threads counts only if they run in a copy
        of this context (``contextvars.copy_context().run``).
        """
        stats = CacheStats()
        token = _TRACKERS.set((*_TRACKERS.get(), (self, stats)))
        try:
            yield stats
        finally:
            _TRACKERS.reset(token)

    def key(self, parts: Mapping[str, Any]) -> str:
        """:func:`cache_key` in this cache's namespace."""
        return cache_key(self.settings.namespace, parts)

    @property
    def enabled(self) -> bool:
        return self._enabled

    # -- lookups --

    def get(self, key: str, *, accept: Accept | None = None) -> Hit | None:
        """The verified entry of ``key``: local tier first, then one remote GET; None on a miss.

        With ``accept``, a verified entry counts only if ``accept(meta)`` is
        true; a rejected local entry is kept (replace it with
        ``put(..., replace=True)``) and the remote is asked, a rejected remote
        entry is not copied to the local tier. A rejected lookup counts as a
        miss and as ``rejected``. A remote hit is written to the local tier.
        Raises only :class:`CacheKeyError` (and whatever ``accept`` raises).
        """
        _check_key(key)
        if not self._enabled or self._local is None:
            return None
        hit, rejected = self._get_local(self._local, key, accept)
        if hit is None and self._remote is not None:
            hit, remote_rejected = self._get_remote(
                self._remote, self._local, key, accept, replace_local=rejected
            )
            rejected = rejected or remote_rejected
        if hit is None:
            self._count(misses=1, rejected=int(rejected))
        return hit

    def _get_local(
        self, local: LocalTier, key: str, accept: Accept | None
    ) -> tuple[Hit | None, bool]:
        """(hit, rejected by ``accept``)."""
        try:
            data = local.read(key)
            if data is None:
                return None, False
            obj = decode_object(key, data)
        except CorruptObject as exc:
            self._count(corrupt=1)
            self._drop_local(local, key, f"is corrupt ({exc.reason})")
            return None, False
        except OSError as exc:
            self._count(errors=1)
            self._drop_local(local, key, f"cannot be read ({_why(exc)})")
            return None, False
        if accept is not None and not accept(obj.meta):
            return None, True
        local.touch(key)
        self._count(local_hits=1, seconds_saved=_seconds(obj.meta))
        return Hit(key=key, outputs=obj.outputs, meta=obj.meta, tier="local"), False

    def _drop_local(self, local: LocalTier, key: str, problem: str) -> None:
        """Remove a bad local entry; warn once (per process and key) either way."""
        path = local.path(key)
        try:
            local.remove(key)
        except OSError as exc:
            self._warn(
                f"cache object {key} in the local cache {local.dir} {problem} and cannot be "
                f"removed ({_why(exc)}); treating it as a miss: remove {path} by hand"
            )
        else:
            self._warn(f"cache object {key} in the local cache {local.dir} {problem}; deleted it")

    def _get_remote(
        self,
        remote: RemoteStore,
        local: LocalTier,
        key: str,
        accept: Accept | None,
        *,
        replace_local: bool,
    ) -> tuple[Hit | None, bool]:
        """(hit, rejected by ``accept``); ``replace_local``: overwrite a rejected local entry."""
        try:
            got = remote.get(key, lambda data: (data, decode_object(key, data)))
        except RemoteOff:
            return None, False
        except RemoteFailure as exc:
            self._count_failure(exc)
            return None, False
        except CorruptObject as exc:
            self._count(corrupt=1, bytes_down=exc.received)
            deleted = ""
            # an object over this reader's limit is not proven bad: leave it to others
            if remote.writable and not remote.disabled and not isinstance(exc, ObjectTooLarge):
                try:
                    remote.delete(key)
                    deleted = "; deleted it"
                except (RemoteOff, RemoteFailure):
                    pass
            self._warn(
                f"cache object {key} in the remote cache {remote.url} is corrupt "
                f"({exc.reason}){deleted}"
            )
            return None, False
        if got is None:
            return None, False
        data, obj = got
        self._count(bytes_down=len(data))
        if accept is not None and not accept(obj.meta):
            return None, True
        try:
            if local.write(key, data, replace=replace_local):
                self._count(puts=1)
        except OSError as exc:
            self._count(errors=1)
            self._warn(f"local cache {local.dir} cannot be written ({_why(exc)}); not filling it")
        self._count(remote_hits=1, seconds_saved=_seconds(obj.meta))
        return Hit(key=key, outputs=obj.outputs, meta=obj.meta, tier="remote"), False

    # -- publishing --

    def put(
        self,
        key: str,
        outputs: Mapping[str, bytes],
        meta: Mapping[str, Any],
        *,
        replace: bool = False,
    ) -> None:
        """Publish ``outputs`` under ``key`` in the local tier and (read-write) the remote.

        ``meta`` holds JSON values: command, toolchain, producer, compile_seconds.
        An existing entry wins (create-only) unless ``replace``: then the local
        entry is overwritten atomically; the remote stays create-only (an
        existing remote object is left as it is). An object larger than
        ``max_object_size`` is not stored (one warning). Store trouble is
        counted and warned, never raised; raises :class:`CacheKeyError` for a
        bad key or meta.
        """
        _check_key(key)
        if not self._enabled or self._local is None:
            return
        try:
            data = encode_object(key, outputs, meta)
        except (TypeError, ValueError) as exc:
            raise CacheKeyError(key, f"outputs or meta cannot be stored: {exc}") from None
        limit = self.settings.max_object_size
        if len(data) > limit:
            self._warn(
                f"cache object {key} would be {len(data)} bytes, more than the {limit}-byte "
                "limit on an object (max_object_size); not storing it"
            )
            return
        try:
            if self._local.write(key, data, replace=replace):
                self._count(puts=1)
        except OSError as exc:
            self._count(errors=1)
            self._warn(
                f"local cache {self._local.dir} cannot be written ({_why(exc)}); not storing"
            )
        remote = self._remote
        if remote is None or not remote.writable or remote.disabled:
            return
        if self.settings.background_uploads:
            self._start_uploader()
            self._uploads.put((key, data, _TRACKERS.get()))
        else:
            self._upload(remote, key, data)

    def _upload(self, remote: RemoteStore, key: str, data: bytes) -> None:
        try:
            created = remote.put(key, data)
        except RemoteOff:
            return
        except RemoteFailure as exc:
            self._count_failure(exc)
            return
        if created:
            self._count(uploads=1, bytes_up=len(data))

    def _start_uploader(self) -> None:
        with self._lock:
            if self._uploader is not None or self._closed:
                return
            self._uploader = threading.Thread(
                target=self._upload_loop, name="metrale-cache-upload", daemon=True
            )
            self._uploader.start()

    def _upload_loop(self) -> None:
        while True:
            job = self._uploads.get()
            try:
                if job is None:
                    return
                key, data, trackers = job
                if self._remote is not None:
                    # count in the trackers that were active where ``put`` queued the job
                    token = _TRACKERS.set(trackers)
                    try:
                        self._upload(self._remote, key, data)
                    finally:
                        _TRACKERS.reset(token)
            finally:
                self._uploads.task_done()

    def flush(self) -> None:
        """Wait until every queued upload is done (or failed)."""
        if self._uploader is not None:
            self._uploads.join()

    def close(self) -> None:
        """Finish queued uploads (each bounded by the deadline; none once the remote is off)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            uploader = self._uploader
        if uploader is not None:
            self._uploads.put(None)
            uploader.join()
        if self._remote is not None:
            self._remote.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- coordination --

    @contextlib.contextmanager
    def key_lock(self, key: str, timeout: float | None = None) -> Iterator[None]:
        """Serialise processes working on ``key`` (an ``flock`` under the local dir).

        The second process to ask waits, then usually hits. With ``timeout``, it
        goes on unlocked after that many seconds. A no-op when the cache is off
        or the local dir is not writable.
        """
        _check_key(key)
        if not self._enabled:
            yield
            return
        try:
            lock = key_lock(self.settings.local_dir, key, timeout)
            lock.__enter__()
        except OSError as exc:
            self._warn(f"local cache {self.settings.local_dir} cannot hold locks ({exc})")
            yield
            return
        try:
            yield
        finally:
            lock.__exit__(None, None, None)


def _why(exc: OSError) -> str:
    """A short reason for an ``OSError`` (its strerror, else its type and text)."""
    if exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _seconds(meta: Mapping[str, Any]) -> float:
    value = meta.get("compile_seconds", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return 0.0
    return float(value)


def open_cache(settings: CacheSettings) -> Cache:
    """A :class:`Cache` for ``settings``. Touches no store until the first call."""
    return Cache(settings)


# -- housekeeping of the local tier ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalSummary:
    """How much the local tier holds."""

    directory: Path
    objects: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "directory": str(self.directory), "objects": self.objects}


def summarize_local(local_dir: Path) -> LocalSummary:
    """Count the local tier's objects (regular files) and bytes. Never raises for what it finds."""
    objs = scan_objects(local_dir).objects()
    return LocalSummary(directory=local_dir, objects=len(objs), bytes=sum(o.size for o in objs))


@dataclass(frozen=True, slots=True, kw_only=True)
class GcResult:
    """What :func:`gc_local` did."""

    max_size: int
    objects_before: int
    bytes_before: int
    removed: int
    removed_bytes: int
    objects_after: int
    bytes_after: int
    temporaries_removed: int
    #: Entries that can never be served (not a regular file, or over the size limit), removed.
    unusable_removed: int = 0
    #: One line per entry that could not be listed or removed (path, why, what to do).
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["problems"] = list(self.problems)
        return out


def _unremovable(path: Path, exc: OSError) -> str:
    return f"{path}: cannot be removed ({_why(exc)}); remove it by hand"


def _unlistable(path: Path, why: str) -> str:
    return f"{path}: cannot be listed ({why}); fix its permissions or remove it"


def gc_local(
    local_dir: Path,
    max_size: int,
    *,
    now: float | None = None,
    max_object_size: int = DEFAULT_MAX_OBJECT_SIZE,
) -> GcResult:
    """Remove least-recently-used objects until the local tier holds at most ``max_size`` bytes.

    Last use is the file's mtime (a hit touches it). Safe while other processes
    read or write: removal is an unlink (open readers keep their file, later
    ones miss), and nothing is ever rewritten in place. Also removes entries
    that can never be served (a directory, FIFO, symlink or device at a key
    path, an object over ``max_object_size``), temporaries left by killed
    writers and lock files older than an hour. Never reads an object, never
    raises for what it finds: what it cannot list or remove is in
    :attr:`GcResult.problems`. Raises :class:`SizeError` for a negative size.
    """
    if max_size < 0:
        raise SizeError(str(max_size))
    now = time.time() if now is None else now
    scan = scan_objects(local_dir)
    problems = [_unlistable(path, why) for path, why in scan.unreadable]
    unusable = [
        e
        for e in scan.entries
        if not e.temporary and (e.kind != "file" or e.size > max_object_size)
    ]
    unusable_removed = 0
    for entry in unusable:
        try:
            remove_entry(entry.path)
        except OSError as exc:
            problems.append(_unremovable(entry.path, exc))
        else:
            unusable_removed += 1
    temps = [e for e in scan.entries if e.temporary and now - e.mtime > STALE_TMP_SECONDS]
    objs = sorted(
        (o for o in scan.objects() if o.size <= max_object_size), key=lambda o: (o.mtime, o.key)
    )
    total = sum(o.size for o in objs)
    before = (len(objs), total)
    removed = removed_bytes = 0
    for obj in objs:
        if total <= max_size:
            break
        try:
            os.unlink(obj.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(_unremovable(obj.path, exc))
            continue
        else:
            removed += 1
            removed_bytes += obj.size
        total -= obj.size
    temps_removed = 0
    for tmp in temps:
        try:
            remove_entry(tmp.path)
        except OSError as exc:
            problems.append(_unremovable(tmp.path, exc))
        else:
            temps_removed += 1
    _gc_locks(local_dir, now)
    return GcResult(
        max_size=max_size,
        objects_before=before[0],
        bytes_before=before[1],
        removed=removed,
        removed_bytes=removed_bytes,
        objects_after=before[0] - removed,
        bytes_after=total,
        temporaries_removed=temps_removed,
        unusable_removed=unusable_removed,
        problems=tuple(problems),
    )


def _gc_locks(local_dir: Path, now: float) -> None:
    # A lock removed while held can at worst let two processes compile one key once more.
    root = local_dir / "locks"
    with contextlib.suppress(OSError):
        if not root.is_dir():
            return
        for path in sorted(root.glob("*/*.lock")):
            with contextlib.suppress(OSError):
                if now - path.lstat().st_mtime > STALE_TMP_SECONDS:
                    path.unlink()


@dataclass(frozen=True, slots=True, kw_only=True)
class BadObject:
    """An entry :func:`verify_local` rejected, and whether it could be removed."""

    key: str
    reason: str
    size: int
    path: Path | None = None
    removed: bool = True
    #: Why it could not be removed ("" when it was).
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyResult:
    """What :func:`verify_local` found."""

    checked: int
    ok: int
    bad: tuple[BadObject, ...]
    #: One line per directory that could not be listed.
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "bad": [
                {
                    "error": b.error,
                    "key": b.key,
                    "path": None if b.path is None else str(b.path),
                    "reason": b.reason,
                    "removed": b.removed,
                    "size": b.size,
                }
                for b in self.bad
            ],
            "checked": self.checked,
            "ok": self.ok,
            "problems": list(self.problems),
        }


def verify_local(
    local_dir: Path, *, max_object_size: int = DEFAULT_MAX_OBJECT_SIZE
) -> VerifyResult:
    """Re-hash every local object; remove and report each entry that fails.

    An entry fails when it is not a regular file (directory, FIFO, symlink,
    device), is larger than ``max_object_size``, cannot be read, or does not
    verify. Reads are bounded and never block. Never raises for what it finds.
    """
    scan = scan_objects(local_dir)
    checked = ok = 0
    bad: list[BadObject] = []
    for entry in scan.entries:
        if entry.temporary:
            continue
        reason = _verify_entry(entry.path, entry.key, entry.kind, max_object_size)
        if reason is None:
            checked += 1
            ok += 1
            continue
        if not reason:  # removed meanwhile
            continue
        checked += 1
        try:
            remove_entry(entry.path)
        except OSError as exc:
            bad.append(
                BadObject(
                    key=entry.key,
                    reason=reason,
                    size=entry.size,
                    path=entry.path,
                    removed=False,
                    error=_why(exc),
                )
            )
        else:
            bad.append(BadObject(key=entry.key, reason=reason, size=entry.size, path=entry.path))
    return VerifyResult(
        checked=checked,
        ok=ok,
        bad=tuple(bad),
        problems=tuple(_unlistable(path, why) for path, why in scan.unreadable),
    )


def _verify_entry(path: Path, key: str, kind: EntryKind, max_object_size: int) -> str | None:
    """None if the entry is a good object, "" if it vanished, else why it is bad."""
    if kind != "file":
        return not_regular(kind)
    try:
        data = read_object_file(path, max_object_size)
        if data is None:
            return ""
        decode_object(key, data)
    except CorruptObject as exc:
        return exc.reason
    except OSError as exc:
        return f"unreadable ({_why(exc)})"
    return None


_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """Bytes for ``500M``, ``2G``, ``1.5GiB``, ``4096`` (powers of 1024).

    Raises :class:`SizeError`.
    """
    m = _SIZE_RE.fullmatch(text)
    if m is None:
        raise SizeError(text)
    number, unit, _ = m.groups()
    return int(float(number) * _UNITS[unit.lower()])
