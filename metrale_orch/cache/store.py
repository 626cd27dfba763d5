"""The two-tier cache: :class:`Cache` (get, put, track, flush, close) and :func:`cache_key`.

A local directory tier in front of an optional remote; every read verifies
the object, a bad one is a miss (reported once, deleted), a remote hit fills
the local tier, uploads run in a background thread. With trusted keys
(:mod:`~.signing`) an entry no trusted key signed is a miss too (counted,
warned once per tier), checked before anything reads its meta; a refused local
entry is replaced by the next fill or put of its key. Store trouble never
raises: it is counted in :class:`~metrale_orch.cache.stats.CacheStats`, warned
once (:meth:`Cache.warnings`) and logged. Knows nothing of doit; prints nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.cache.bucket import RemoteStore
from metrale_orch.cache.bucket_failures import RemoteFailure, RemoteOff
from metrale_orch.cache.errors import CacheKeyError, why
from metrale_orch.cache.local import LocalTier, key_lock
from metrale_orch.cache.objects import (
    KEY_RE,
    CorruptObject,
    DecodedObject,
    ObjectTooLarge,
    SignFn,
    decode_object,
    encode_object,
    key_of,
)
from metrale_orch.cache.settings import CacheSettings
from metrale_orch.cache.signing import Signing
from metrale_orch.cache.stats import CacheStats
from metrale_orch.extras import ExtraMissing
from metrale_orch.ownership import not_own

__all__ = ["RUN_META", "Accept", "Cache", "Hit", "cache_key", "open_cache"]

# Named for the package, as before the split: the shared log file shows the logger's name.
log = logging.getLogger("metrale_orch.cache")


def cache_key(namespace: str, parts: Mapping[str, object]) -> str:
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Hit:
    """A verified entry: ``outputs`` (name -> bytes), ``meta``, and the ``tier`` it came from."""

    key: str
    outputs: Mapping[str, bytes]
    meta: Mapping[str, object]
    #: "local" | "remote"
    tier: str
    #: Stored by the caller's own run (:data:`RUN_META`): served, but counted as
    #: ``shared`` (another target compiled it in this run), not as a hit.
    shared: bool = False


#: The ``meta`` field naming the run that stored an entry (see :meth:`Cache.get`'s ``run``).
RUN_META = "run"


def _of_run(meta: Mapping[str, object], run: str) -> bool:
    """Whether an entry with ``meta`` was stored by the run ``run`` ("": none)."""
    return bool(run) and meta.get(RUN_META) == run


#: A verified entry is valid for the caller's current inputs (called with its ``meta``).
Accept = Callable[[Mapping[str, object]], bool]

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
        """Raises :class:`~.errors.SigningKeyError` when ``signing_key`` cannot be used."""
        self.settings = settings
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._warnings: list[str] = []
        self._off_seen = False
        self._enabled = settings.mode != "off"
        try:  # raises SigningKeyError for a key that cannot be read
            self._signing = Signing.of(settings) if self._enabled else None
        except ExtraMissing as exc:  # nothing unverified served, nothing unsigned stored
            self._warn(f"{exc}; building without the cache")
            self._enabled, self._signing = False, None
        self._local = (
            LocalTier(settings.local_dir, settings.max_object_size) if self._enabled else None
        )
        self._remote: RemoteStore | None = None
        if self._enabled and settings.remote:
            self._remote = settings.remote_store(
                writable=settings.mode == "read-write", warn=self._remote_warn
            )
        if self._enabled and self._signing is None:
            self._warn_shared_local(settings.local_dir)
        #: Keys whose local entry was refused as not trusted: the next fill or put replaces it.
        self._untrusted_local: set[str] = set()
        self._trust_warned: set[str] = set()
        self._uploads: queue.Queue[_UploadJob | None] = queue.Queue()
        self._uploader: threading.Thread | None = None
        self._closed = False

    def _warn_shared_local(self, local_dir: Path) -> None:
        """Warn when a local cache that others may write is read with no trusted keys:
        its entries are then served whoever wrote them (I/O: one ``stat``)."""
        try:
            problem = not_own(os.stat(local_dir))
        except OSError:
            return
        if problem:
            self._warn(
                f"the local cache {local_dir} is {problem}, and cache_trusted_keys is not "
                "set: whoever can write there decides what this build serves; set "
                "cache_trusted_keys (docs/guarantees.md) or use a private local_cache"
            )

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

    def count_shared(self) -> None:
        """Count one module lookup that another target of the run answered from memory
        (the build session's memo): one of the run's lookups, neither a hit nor a miss,
        with the cache off too (no tier is involved either way)."""
        self._count(shared=1)

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

    def key(self, parts: Mapping[str, object]) -> str:
        """:func:`cache_key` in this cache's namespace."""
        return cache_key(self.settings.namespace, parts)

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def networked(self) -> bool:
        """Whether a lookup may ask a remote tier (network I/O: off the event loop)."""
        return self._enabled and self._remote is not None and not self._remote.disabled

    def tiers(self) -> str:
        """The tiers a lookup asks, in words for a message: ``the local cache and the remote
        s3://b/p``, or why one is not asked (no remote set, the remote switched off, the
        cache off)."""
        if not self._enabled:
            return "no tier, as cache_mode is off"
        remote = self._remote
        if remote is None:
            return "the local cache only, as no remote cache is set (METRALE_ORCH_CACHE)"
        if remote.disabled:
            return f"the local cache only, as the remote {remote.url} is off for this run"
        return f"the local cache and the remote {remote.url}"

    # -- lookups --

    def get(self, key: str, *, accept: Accept | None = None, run: str = "") -> Hit | None:
        """The verified entry of ``key``: local tier first, then one remote GET; None on a miss.

        With ``accept``, a verified entry counts only if ``accept(meta)`` is
        true; a rejected local entry is kept (replace it with
        ``put(..., replace=True)``) and the remote is asked, a rejected remote
        entry is not copied to the local tier. A rejected lookup counts as a
        miss and as ``rejected``. A remote hit is written to the local tier. With the cache
        off every lookup is a miss, counted as such and as ``cache_off`` (so hits, shared
        and misses add up to every lookup in every mode).
        With ``run``, an entry whose meta names that run (:data:`RUN_META`: another
        worker process of the same build stored it) is returned with ``shared`` set and
        counted as ``shared``, not as a hit (it saved no compile).
        Raises only :class:`CacheKeyError` (and whatever ``accept`` raises).
        """
        _check_key(key)
        if not self._enabled or self._local is None:
            self._count(misses=1, cache_off=1)
            return None
        hit, rejected = self._get_local(self._local, key, accept, run)
        if hit is None and self._remote is not None:
            with self._lock:
                replace = rejected or key in self._untrusted_local
            hit, remote_rejected = self._get_remote(
                self._remote, self._local, key, accept, replace_local=replace, run=run
            )
            rejected = rejected or remote_rejected
        if hit is None:
            self._count(misses=1, rejected=int(rejected))
        return hit

    def _get_local(
        self, local: LocalTier, key: str, accept: Accept | None, run: str
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
            self._drop_local(local, key, f"cannot be read ({why(exc)})")
            return None, False
        if not self._trusted(obj, key, None):
            with self._lock:
                self._untrusted_local.add(key)
            return None, False
        if accept is not None and not accept(obj.meta):
            return None, True
        local.touch(key)
        return self._hit(key, obj, "local", run), False

    def _hit(self, key: str, obj: DecodedObject, tier: Literal["local", "remote"], run: str) -> Hit:
        """The hit of a served entry of ``tier``, counted once: as shared when this run
        stored it (:data:`RUN_META`, saving nothing), else as a hit of its tier."""
        shared = _of_run(obj.meta, run)
        if shared:
            self._count(shared=1)
        elif tier == "local":
            self._count(local_hits=1, seconds_saved=_seconds(obj.meta))
        else:
            self._count(remote_hits=1, seconds_saved=_seconds(obj.meta))
        return Hit(key=key, outputs=obj.outputs, meta=obj.meta, tier=tier, shared=shared)

    def _drop_local(self, local: LocalTier, key: str, problem: str) -> None:
        """Remove a bad local entry; warn once (per process and key) either way."""
        path = local.path(key)
        try:
            local.remove(key)
        except OSError as exc:
            self._warn(
                f"cache object {key} in the local cache {local.dir} {problem} and cannot be "
                f"removed ({why(exc)}); treating it as a miss: remove {path} by hand"
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
        run: str = "",
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
        if not self._trusted(obj, key, remote):
            return None, False
        if accept is not None and not accept(obj.meta):
            return None, True
        try:
            if local.write(key, data, replace=replace_local):
                self._count(puts=1)
            with self._lock:
                self._untrusted_local.discard(key)
        except OSError as exc:
            self._count(errors=1)
            self._warn(f"local cache {local.dir} cannot be written ({why(exc)}); not filling it")
        return self._hit(key, obj, "remote", run), False

    def _trusted(self, obj: DecodedObject, key: str, remote: RemoteStore | None) -> bool:
        """Whether ``obj`` (from ``remote``, or the local tier when None) may be served:
        always without trusted keys; else only when a trusted key signed it (the local
        tier trusts this user's own keys too). A refusal is counted and warned once per tier.
        """
        signing = self._signing
        if signing is None or not signing.verifying:
            return True
        trust = signing.remote if remote is not None else signing.local_trust()
        verdict, reason = trust.check(obj)
        if verdict == "verified":
            self._count(verified=1)
            return True
        self._count(**{verdict: 1})
        place = f"the remote cache {remote.url}" if remote else f"the local cache {self._dir()}"
        with self._lock:
            first = place not in self._trust_warned
            self._trust_warned.add(place)
        if first:
            self._warn(
                f"{place} holds entries that no key in cache_trusted_keys signed; they are not "
                f"served and compile here instead (first: {key}, {reason})"
            )
        if remote is None:
            self._warn_local_key(signing)
        return False

    def _warn_local_key(self, signing: Signing) -> None:
        """Warn (once) that this user's local key was refused or cannot be read."""
        if signing.local_problem:
            self._warn(
                f"your local signing key cannot be used ({signing.local_problem}): entries "
                "compiled here are not trusted on later runs"
            )

    def _dir(self) -> str:
        return str(self.settings.local_dir)

    def _sign_fn(self) -> SignFn | None:
        signing = self._signing
        signer = None if signing is None else signing.signer()
        if signer is None and signing is not None:
            self._warn_local_key(signing)
        return None if signer is None else signer.section

    def _may_upload(self) -> bool:
        """Whether a put goes to the remote: not when its readers would refuse it (trusted
        keys set, and no signing key or one they do not list; warned once)."""
        signing = self._signing
        if signing is None or signing.publishes_trusted:
            return True
        if signing.own is None:
            why_not = "no cache_signing_key is set"
        else:
            why_not = f"the signing key {signing.own.public.line()} is not in cache_trusted_keys"
        self._warn(
            f"not publishing to the remote cache: {why_not}, so readers (who serve only "
            "entries a key in cache_trusted_keys signed) would refuse what this build "
            "uploads; entries stay in the local cache (CI signs with cache_signing_key; "
            'developers set cache_mode = "read-only")'
        )
        return False

    # -- publishing --

    def put(
        self,
        key: str,
        outputs: Mapping[str, bytes],
        meta: Mapping[str, object],
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
            data = encode_object(key, outputs, meta, self._sign_fn())
        except (TypeError, ValueError) as exc:
            raise CacheKeyError(key, f"outputs or meta cannot be stored: {exc}") from None
        limit = self.settings.max_object_size
        if len(data) > limit:
            self._warn(
                f"cache object {key} would be {len(data)} bytes, more than the {limit}-byte "
                "limit on an object (max_object_size); not storing it"
            )
            return
        with self._lock:
            replace = replace or key in self._untrusted_local
        try:
            if self._local.write(key, data, replace=replace):
                self._count(puts=1)
            with self._lock:
                self._untrusted_local.discard(key)
        except OSError as exc:
            self._count(errors=1)
            self._warn(f"local cache {self._local.dir} cannot be written ({why(exc)}); not storing")
        remote = self._remote
        if remote is None or not remote.writable or remote.disabled or not self._may_upload():
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

    @contextlib.asynccontextmanager
    async def key_lock(self, key: str, timeout: float | None = None) -> AsyncIterator[None]:
        """Serialise processes working on ``key`` (an ``flock`` under the local dir, waited
        for on the event loop).

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
            await lock.__aenter__()
        except OSError as exc:
            self._warn(f"local cache {self.settings.local_dir} cannot hold locks ({exc})")
            yield
            return
        try:
            yield
        finally:
            await lock.__aexit__(None, None, None)


def _seconds(meta: Mapping[str, object]) -> float:
    value = meta.get("compile_seconds", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return 0.0
    return float(value)


def open_cache(settings: CacheSettings) -> Cache:
    """A :class:`Cache` for ``settings``. Touches no store until the first call."""
    return Cache(settings)
