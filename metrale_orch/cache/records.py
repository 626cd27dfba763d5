"""What a tier holds, read by header only: each entry's key and meta, for ``why-miss``.

A build stores, with each entry, a record of its key's parts in the meta field
:data:`RECORD_META` (:mod:`metrale_orch.steps.keyrecord`). :class:`TierHeads` reads one
tier's entries without their payloads: one key's meta, and whether a build would refuse
it for its signature (:meth:`TierHeads.entry`), and the records of every entry
(:meth:`TierHeads.records`). The local tier is scanned on disk
(two reads per entry); a remote bucket is listed and each entry's header read with one
ranged request: a diagnosis costs one request per entry, so it is asked for
(``--remote``), never made by a build. A REAPI action cache cannot be listed
(:class:`TierUnreadable`). Headers are verified (their hash) and, with trusted keys, a
key's own entry is checked as the build checks it (a signature covers the header alone);
payloads are not read: a record only explains, it never serves a hit. Read-only: nothing
is written, touched or removed (not even this user's local signing key is made).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from metrale_orch.cache.bucket import RemoteStore
from metrale_orch.cache.bucket_failures import RemoteFailure, RemoteOff
from metrale_orch.cache.errors import CacheError, why
from metrale_orch.cache.local import LocalTier, read_object_head, scan_objects
from metrale_orch.cache.objects import CorruptObject, DecodedObject, read_header
from metrale_orch.cache.settings import CacheSettings
from metrale_orch.cache.signing import Signing, Trust, local_signer
from metrale_orch.errors import MetraleError

__all__ = ["RECORD_META", "Entry", "Records", "TierHeads", "TierUnreadable"]

log = logging.getLogger(__name__)

#: The meta field holding the record of an entry's key parts.
RECORD_META = "key_parts"
#: What the remote's warnings add for a build (cut: why-miss builds nothing).
_BUILD_WORDS = re.compile(r"(;|,)? *(off for the rest of this run|using the local cache only).*$")
#: How the field shows in a header's canonical JSON (a test of the bytes, before parsing).
_RECORD_FIELD = f'"{RECORD_META}":'.encode()


class TierUnreadable(CacheError):
    """A tier cannot be listed or read (no remote configured, a REAPI cache, a failure)."""

    tier: str
    problem: str

    exit_code = 1
    template = "{tier}: {problem}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Records:
    """Every entry of a tier that carries a record, and how many do not."""

    #: key -> its record (:data:`RECORD_META`), sorted by key.
    found: Mapping[str, Mapping[str, object]]
    #: Entries without a record (stored before records were kept, or by another tool).
    unrecorded: int
    #: Entries whose header could not be read.
    unreadable: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One key's entry as its header shows it."""

    meta: Mapping[str, object]
    #: Why a build would not serve it for its signature ("" when it would).
    refused: str = ""


class TierHeads:
    """One tier's entry headers, read-only: the local tier, or the remote one."""

    def __init__(self, settings: CacheSettings, *, remote: bool) -> None:
        """Raises :class:`TierUnreadable` for ``remote`` without a remote tier configured."""
        self._settings = settings
        self._store: RemoteStore | None = None
        self._local = LocalTier(settings.local_dir, settings.max_object_size)
        if remote:
            if not settings.remote:
                raise TierUnreadable(
                    "remote tier", "no remote cache is configured (set `cache` to its URL)"
                )
            self._store = settings.remote_store(writable=False, warn=self._warn)
        self.warnings: list[str] = []
        self._trust = _trust(settings, remote=remote)

    @property
    def name(self) -> str:
        """The tier in words: ``local cache <dir>`` or ``remote cache <url>``."""
        if self._store is not None:
            return f"remote cache {self._settings.remote}"
        return f"local cache {self._settings.local_dir}"

    def _warn(self, message: str) -> None:
        self.warnings.append(message)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def entry(self, key: str) -> Entry | None:
        """``key``'s entry, None when the tier holds none (or a bad one). Raises
        :class:`TierUnreadable` when the remote fails."""
        head = self._read(key)
        obj = None if head is None else self._object(key, head)
        if obj is None:
            return None
        refused = ""
        if self._trust is not None:
            verdict, reason = self._trust.check(obj)
            refused = "" if verdict == "verified" else reason
        return Entry(meta=obj.meta, refused=refused)

    def meta(self, key: str) -> Mapping[str, object] | None:
        """The meta of ``key``'s entry, None when the tier holds none (or a bad one).
        Raises :class:`TierUnreadable` when the remote fails."""
        got = self.entry(key)
        return None if got is None else got.meta

    def records(self, wanted: Callable[[bytes], bool] | None = None) -> Records:
        """The record of every entry of the tier (headers only) whose raw header
        ``wanted`` accepts (a cheap test of the bytes before they are parsed; all when
        None). Raises :class:`TierUnreadable` when the remote cannot be listed."""
        found: dict[str, Mapping[str, object]] = {}
        unrecorded = unreadable = 0
        for key in self._keys():
            head = self._read(key)
            if head is None:
                unreadable += 1
                continue
            if _RECORD_FIELD not in head[1]:
                unrecorded += 1
                continue
            if wanted is not None and not wanted(head[1]):
                continue
            obj = self._object(key, head)
            meta = None if obj is None else obj.meta
            record = None if meta is None else meta.get(RECORD_META)
            if isinstance(record, Mapping):
                found[key] = record
            elif meta is None:
                unreadable += 1
            else:
                unrecorded += 1
        return Records(found=found, unrecorded=unrecorded, unreadable=unreadable)

    def _read(self, key: str) -> tuple[bytes, bytes] | None:
        try:
            return self._head(key)
        except CorruptObject as exc:
            log.debug("%s: entry %s: %s", self.name, key, exc.reason)
        except OSError as exc:
            log.debug("%s: entry %s: %s", self.name, key, why(exc))
        return None

    def _object(self, key: str, head: tuple[bytes, bytes]) -> DecodedObject | None:
        try:
            named, obj = read_header(*head)
        except CorruptObject as exc:
            log.debug("%s: entry %s: %s", self.name, key, exc.reason)
            return None
        return obj if named == key else None

    def _keys(self) -> list[str]:
        if self._store is None:
            return sorted({e.key for e in scan_objects(self._local.dir).objects()})
        try:
            return self._store.keys()
        except (RemoteFailure, RemoteOff) as exc:
            raise self._unreadable(exc, "cannot be listed") from None

    def _head(self, key: str) -> tuple[bytes, bytes] | None:
        if self._store is None:
            return read_object_head(self._local.path(key))
        try:
            return self._store.head(key)
        except (RemoteFailure, RemoteOff) as exc:
            raise self._unreadable(exc, "cannot be read") from None

    def _unreadable(self, exc: Exception, what: str) -> MetraleError:
        """The error of a remote that failed: the missing extra itself (exit 2, its fix
        named), as every command that cannot work without one says it; else
        :class:`TierUnreadable`."""
        missing = None if self._store is None else self._store.missing
        return missing or TierUnreadable(self.name, self._failure(exc, what))

    def _failure(self, exc: Exception, what: str) -> str:
        """Why the remote failed: the call's own failure, else the warning that switched it
        off, without the build's "using the local cache only" (nothing is built here)."""
        if isinstance(exc, RemoteFailure) or not self.warnings:
            return f"{what}: {exc}"
        detail = self.warnings[-1].removeprefix(self.name + " ")
        detail = _BUILD_WORDS.sub("", detail)
        return f"{what}: {detail}"


def _trust(settings: CacheSettings, *, remote: bool) -> Trust | None:
    """The keys a build trusts the tier's entries from, None when it checks none: the
    trusted keys; for the local tier also the signing key and this user's local key when
    it exists (never made here). Raises ``SigningKeyError`` for an unusable signing key."""
    if not settings.trusted_keys:
        return None
    signing = Signing(
        trusted_keys=settings.trusted_keys,
        signing_key=settings.signing_key,
        signing_key_where=settings.signing_key_where,
        local_key=None,
    )
    if remote:
        return signing.remote
    keys = set(signing.trusted)
    if signing.own is not None:
        keys.add(signing.own.public.raw)
    path = settings.local_key
    if path is not None and path.exists():
        with contextlib.suppress(OSError, CacheError):  # refused or unreadable: not trusted
            keys.add(local_signer(path).public.raw)
    return Trust(keys)
