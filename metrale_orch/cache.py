"""The content-addressed cache (SPEC 3.4): a local directory tier in front of an optional remote.

What it owns:

- **Keys** (:func:`cache_key`, pure): xxh3-128 of a canonical, type-tagged
  encoding of the schema version, the namespace and the caller's parts.
- **Objects**: one self-verifying object per key (magic, header length,
  header hash, JSON header naming every output's size and xxh3-128, payload).
  Every read verifies everything; a bad object is a miss, reported with its
  key, deleted from the local tier (and from a writable remote, so a fresh
  upload can replace it), never returned.
- **Tiers**: ``<local_dir>/objects/<2 hex>/<key>`` published create-only via a
  temporary file; a remote fsspec URL (``_stores``) with one GET per lookup,
  create-only puts, a deadline per call and a circuit breaker. A remote hit
  fills the local tier. Uploads run in a background thread; :meth:`Cache.close`
  finishes them.
- **Modes**: ``read-write``; ``read-only`` (the remote is never written — zero
  write requests; the local tier still fills); ``off`` (no cache at all).

The cache never fails a build for a store problem: it counts it in
:class:`CacheStats`, adds one line to :meth:`Cache.warnings` and logs. It
knows nothing of doit and prints nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from metrale_orch._cache_local import (
    STALE_TMP_SECONDS,
    LocalTier,
    key_lock,
    scan_objects,
)
from metrale_orch._cache_object import (
    KEY_RE,
    SCHEMA,
    CorruptObject,
    decode_object,
    encode_object,
    key_of,
)
from metrale_orch._fsutil import write_atomic
from metrale_orch._stores import RemoteFailure, RemoteOff, RemoteStore
from metrale_orch.config import CACHE_MODES
from metrale_orch.errors import MetraleError

if TYPE_CHECKING:
    from metrale_orch.config import Config

__all__ = [
    "SCHEMA",
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


class Cache:
    """A two-tier cache; obtain one with :func:`open_cache`. Thread-safe."""

    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._warnings: list[str] = []
        self._off_seen = False
        self._enabled = settings.mode != "off"
        self._local = LocalTier(settings.local_dir) if self._enabled else None
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
            )
        self._uploads: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
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
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    def _count_failure(self, exc: RemoteFailure) -> None:
        if exc.timeout:
            self._count(timeouts=1)
        else:
            self._count(errors=1)

    def key(self, parts: Mapping[str, Any]) -> str:
        """:func:`cache_key` in this cache's namespace."""
        return cache_key(self.settings.namespace, parts)

    @property
    def enabled(self) -> bool:
        return self._enabled

    # -- lookups --

    def get(self, key: str) -> Hit | None:
        """The verified entry of ``key``: local tier first, then one remote GET; None on a miss.

        A remote hit is written to the local tier. Raises only :class:`CacheKeyError`.
        """
        _check_key(key)
        if not self._enabled or self._local is None:
            return None
        hit = self._get_local(self._local, key)
        if hit is None and self._remote is not None:
            hit = self._get_remote(self._remote, self._local, key)
        if hit is None:
            self._count(misses=1)
        return hit

    def _get_local(self, local: LocalTier, key: str) -> Hit | None:
        try:
            data = local.read(key)
        except OSError as exc:
            self._count(errors=1)
            self._warn(f"local cache {local.dir} cannot be read ({exc}); treating as a miss")
            return None
        if data is None:
            return None
        try:
            obj = decode_object(key, data)
        except CorruptObject as exc:
            self._count(corrupt=1)
            self._warn(
                f"cache object {key} in the local cache is corrupt ({exc.reason}); deleted it"
            )
            with contextlib.suppress(OSError):
                local.remove(key)
            return None
        local.touch(key)
        self._count(local_hits=1, seconds_saved=_seconds(obj.meta))
        return Hit(key=key, outputs=obj.outputs, meta=obj.meta, tier="local")

    def _get_remote(self, remote: RemoteStore, local: LocalTier, key: str) -> Hit | None:
        try:
            data = remote.get(key)
        except RemoteOff:
            return None
        except RemoteFailure as exc:
            self._count_failure(exc)
            return None
        if data is None:
            return None
        self._count(bytes_down=len(data))
        try:
            obj = decode_object(key, data)
        except CorruptObject as exc:
            self._count(corrupt=1)
            deleted = ""
            if remote.writable:
                try:
                    remote.delete(key)
                    deleted = "; deleted it"
                except (RemoteOff, RemoteFailure):
                    pass
            self._warn(f"cache object {key} in the remote cache is corrupt ({exc.reason}){deleted}")
            return None
        try:
            if local.write(key, data):
                self._count(puts=1)
        except OSError as exc:
            self._count(errors=1)
            self._warn(f"local cache {local.dir} cannot be written ({exc}); not filling it")
        self._count(remote_hits=1, seconds_saved=_seconds(obj.meta))
        return Hit(key=key, outputs=obj.outputs, meta=obj.meta, tier="remote")

    # -- publishing --

    def put(self, key: str, outputs: Mapping[str, bytes], meta: Mapping[str, Any]) -> None:
        """Publish ``outputs`` under ``key`` in the local tier and (read-write) the remote.

        ``meta`` holds JSON values: command, toolchain, producer, compile_seconds.
        An existing entry wins (create-only). Store trouble is counted and warned,
        never raised; raises :class:`CacheKeyError` for a bad key or meta.
        """
        _check_key(key)
        if not self._enabled or self._local is None:
            return
        try:
            data = encode_object(key, outputs, meta)
        except (TypeError, ValueError) as exc:
            raise CacheKeyError(key, f"outputs or meta cannot be stored: {exc}") from None
        try:
            if self._local.write(key, data):
                self._count(puts=1)
        except OSError as exc:
            self._count(errors=1)
            self._warn(f"local cache {self._local.dir} cannot be written ({exc}); not storing")
        remote = self._remote
        if remote is None or not remote.writable or remote.disabled:
            return
        if self.settings.background_uploads:
            self._start_uploader()
            self._uploads.put((key, data))
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
                if self._remote is not None:
                    self._upload(self._remote, *job)
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
    """Count the local tier's objects and bytes."""
    objs = [o for o in scan_objects(local_dir) if not o.temporary]
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

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def gc_local(local_dir: Path, max_size: int, *, now: float | None = None) -> GcResult:
    """Remove least-recently-used objects until the local tier holds at most ``max_size`` bytes.

    Last use is the file's mtime (a hit touches it). Safe while other processes
    read or write: removal is an unlink (open readers keep their file, later
    ones miss), and nothing is ever rewritten in place. Also removes
    temporaries left by killed writers and lock files older than an hour.
    """
    if max_size < 0:
        raise SizeError(str(max_size))
    now = time.time() if now is None else now
    found = scan_objects(local_dir)
    temps = [o for o in found if o.temporary and now - o.mtime > STALE_TMP_SECONDS]
    objs = sorted((o for o in found if not o.temporary), key=lambda o: (o.mtime, o.key))
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
        else:
            removed += 1
            removed_bytes += obj.size
        total -= obj.size
    temps_removed = 0
    for tmp in temps:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp.path)
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
    )


def _gc_locks(local_dir: Path, now: float) -> None:
    # A lock removed while held can at worst let two processes compile one key once more.
    root = local_dir / "locks"
    if not root.is_dir():
        return
    for path in sorted(root.glob("*/*.lock")):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > STALE_TMP_SECONDS:
                path.unlink()


@dataclass(frozen=True, slots=True, kw_only=True)
class BadObject:
    """An object :func:`verify_local` rejected (and removed)."""

    key: str
    reason: str
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyResult:
    """What :func:`verify_local` found."""

    checked: int
    ok: int
    bad: tuple[BadObject, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "bad": [{"key": b.key, "reason": b.reason, "size": b.size} for b in self.bad],
            "checked": self.checked,
            "ok": self.ok,
        }


def verify_local(local_dir: Path) -> VerifyResult:
    """Re-hash every local object; remove and report each one that fails verification."""
    local = LocalTier(local_dir)
    checked = ok = 0
    bad: list[BadObject] = []
    for obj in scan_objects(local_dir):
        if obj.temporary:
            continue
        try:
            data = local.read(obj.key)
        except OSError as exc:
            bad.append(BadObject(key=obj.key, reason=f"unreadable: {exc}", size=obj.size))
            checked += 1
            continue
        if data is None:  # removed meanwhile
            continue
        checked += 1
        try:
            decode_object(obj.key, data)
        except CorruptObject as exc:
            bad.append(BadObject(key=obj.key, reason=exc.reason, size=len(data)))
            with contextlib.suppress(OSError):
                local.remove(obj.key)
        else:
            ok += 1
    return VerifyResult(checked=checked, ok=ok, bad=tuple(bad))


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
