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
  (:mod:`~.remote`) with one GET per lookup, create-only puts, a deadline per call
  and a circuit breaker. A remote hit fills the local tier. Uploads run in a
  background thread; :meth:`Cache.flush` waits for them, :meth:`Cache.close`
  finishes them.
- **Statistics**: ``Cache.stats`` counts the whole process; :meth:`Cache.track`
  gives one context (a thread's task) exactly its own counts, uploads it
  queued included.
- **Records**: a build stores with each entry, in its meta (:data:`RECORD_META`), a record
  of the parts its key hashed, never changing the key; :class:`~.records.TierHeads` reads a
  tier's records by header only, for ``why-miss``.
- **Modes**: ``read-write``; ``read-only`` (the remote is never written — zero
  write requests; the local tier still fills); ``off`` (no cache at all).

The cache never fails a build for a store problem: it counts it in
:class:`CacheStats`, adds one line to :meth:`Cache.warnings` and logs. It
knows nothing of doit and prints nothing.

Its modules, bottom up: :mod:`~.errors`, :mod:`~.objects` (the object format
and key encoding), :mod:`~.local` and :mod:`~.remote` (the tiers),
:mod:`~.settings`, :mod:`~.stats`, :mod:`~.store` (:class:`Cache`),
:mod:`~.maintenance` (gc, verify, size of the local tier) and :mod:`~.records` (a tier's
entries read by header only: the records of their keys' parts that ``why-miss`` compares).
"""

from __future__ import annotations

from metrale_orch.cache.errors import (
    CacheError,
    CacheKeyError,
    CacheSettingsError,
    CacheStatsError,
    SizeError,
)
from metrale_orch.cache.local import (
    DEFAULT_MAX_OBJECT_SIZE,
)
from metrale_orch.cache.maintenance import (
    BadObject,
    GcResult,
    LocalSummary,
    VerifyResult,
    gc_local,
    parse_size,
    summarize_local,
    verify_local,
)
from metrale_orch.cache.objects import (
    SCHEMA,
)
from metrale_orch.cache.records import (
    RECORD_META,
)
from metrale_orch.cache.settings import (
    CacheSettings,
)
from metrale_orch.cache.stats import (
    CacheStats,
    read_stats,
    write_stats,
)
from metrale_orch.cache.store import (
    RUN_META,
    Accept,
    Cache,
    Hit,
    cache_key,
    open_cache,
)

__all__ = [
    "DEFAULT_MAX_OBJECT_SIZE",
    "RECORD_META",
    "RUN_META",
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
