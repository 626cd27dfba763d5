"""Housekeeping of the local tier: size (:func:`summarize_local`), :func:`gc_local`,
:func:`verify_local`, and :func:`parse_size` for the sizes users type.

Safe while other processes read and write the tier (removal is an unlink,
nothing is rewritten in place); never raises for what it finds: what cannot be
listed or removed is reported in the result.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path

from metrale_orch.cache.errors import SizeError, why
from metrale_orch.cache.local import (
    DEFAULT_MAX_OBJECT_SIZE,
    STALE_TMP_SECONDS,
    EntryKind,
    not_regular,
    read_object_file,
    remove_entry,
    scan_objects,
)
from metrale_orch.cache.objects import CorruptObject, decode_object
from metrale_orch.cache.signing import Trust
from metrale_orch.config.values import MAX_BYTES, size_bytes

__all__ = [
    "BadObject",
    "GcResult",
    "LocalSummary",
    "VerifyResult",
    "gc_local",
    "parse_size",
    "summarize_local",
    "verify_local",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalSummary:
    """How much the local tier holds."""

    directory: Path
    objects: int
    bytes: int

    def to_dict(self) -> dict[str, int | str]:
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

    def to_dict(self) -> dict[str, object]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["problems"] = list(self.problems)
        return out


def _unremovable(path: Path, exc: OSError) -> str:
    return f"{path}: cannot be removed ({why(exc)}); remove it by hand"


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
    unusable_removed = _remove_all([e.path for e in unusable], problems)
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
    temps_removed = _remove_all([tmp.path for tmp in temps], problems)
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


def _remove_all(paths: list[Path], problems: list[str]) -> int:
    """Remove each entry; returns how many went (each one that cannot goes to ``problems``)."""
    removed = 0
    for path in paths:
        try:
            remove_entry(path)
        except OSError as exc:
            problems.append(_unremovable(path, exc))
        else:
            removed += 1
    return removed


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
    #: With trusted keys: (key, why) of each good object no trusted key signed (kept: the
    #: build refuses and replaces it), and how many a trusted key signed.
    untrusted: tuple[tuple[str, str], ...] = ()
    verified: int = 0
    checked_signatures: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "signatures": {
                "checked": self.checked_signatures,
                "untrusted": [{"key": k, "reason": r} for k, r in self.untrusted],
                "verified": self.verified,
            },
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
    local_dir: Path, *, max_object_size: int = DEFAULT_MAX_OBJECT_SIZE, trust: Trust | None = None
) -> VerifyResult:
    """Re-hash every local object; remove and report each entry that fails.

    An entry fails when it is not a regular file (directory, FIFO, symlink,
    device), is larger than ``max_object_size``, cannot be read, or does not
    verify. With ``trust``, each good object's signature is checked too: one no
    trusted key signed is reported (in ``untrusted``), not removed. Reads are
    bounded and never block. Never raises for what it finds.
    """
    scan = scan_objects(local_dir)
    checked = ok = verified = 0
    bad: list[BadObject] = []
    untrusted: list[tuple[str, str]] = []
    for entry in scan.entries:
        if entry.temporary:
            continue
        reason = _verify_entry(entry.path, entry.key, entry.kind, max_object_size, trust)
        if reason is None or reason.startswith(_UNTRUSTED):
            checked += 1
            ok += reason is None
            verified += reason is None and trust is not None
            if reason is not None:
                untrusted.append((entry.key, reason.removeprefix(_UNTRUSTED)))
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
                    error=why(exc),
                )
            )
        else:
            bad.append(BadObject(key=entry.key, reason=reason, size=entry.size, path=entry.path))
    return VerifyResult(
        checked=checked,
        ok=ok,
        bad=tuple(bad),
        problems=tuple(_unlistable(path, why) for path, why in scan.unreadable),
        untrusted=tuple(untrusted),
        verified=verified,
        checked_signatures=trust is not None,
    )


#: How :func:`_verify_entry` marks a good object that no trusted key signed.
_UNTRUSTED = "untrusted: "


def _verify_entry(
    path: Path, key: str, kind: EntryKind, max_object_size: int, trust: Trust | None
) -> str | None:
    """None if the entry is a good object (signed by a trusted key, with ``trust``), "" if
    it vanished, :data:`_UNTRUSTED` and why for a good object no trusted key signed, else
    why it is bad."""
    if kind != "file":
        return not_regular(kind)
    try:
        data = read_object_file(path, max_object_size)
        if data is None:
            return ""
        obj = decode_object(key, data)
    except CorruptObject as exc:
        return exc.reason
    except OSError as exc:
        return f"unreadable ({why(exc)})"
    if trust is not None:
        verdict, reason = trust.check(obj)
        if verdict != "verified":
            return _UNTRUSTED + reason
    return None


def parse_size(text: str) -> int:
    """Bytes for ``500M``, ``2G``, ``1.5GiB``, ``4096`` (powers of 1024; the one parser
    of sizes people type, :func:`~metrale_orch.config.values.size_bytes`).

    Raises :class:`SizeError`, also for one over :data:`~metrale_orch.config.values.MAX_BYTES`
    (a typo, and past what the report's arithmetic takes).
    """
    size = size_bytes(text)
    if size is None or size > MAX_BYTES:
        raise SizeError(text)
    return size
