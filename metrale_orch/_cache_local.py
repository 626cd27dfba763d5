"""The local tier: one file per key under ``<dir>/objects/<2 hex>/<key>``.

Invariants: an object file is only ever created complete (written to a
temporary name in the same directory, then hard-linked into place, which is
create-only — the first writer wins — or renamed where links are not
supported), so a reader never sees a partial object. Removal is a plain
unlink: a reader that already opened the file keeps reading it, one that did
not gets a miss. A hit touches the file's mtime, which :func:`gc` uses as
last-use time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from metrale_orch._cache_object import KEY_RE, CorruptObject, decode_object

__all__ = [
    "LocalTier",
    "ObjectFile",
    "key_lock",
    "publish_atomic",
    "scan_objects",
]

log = logging.getLogger(__name__)

_TMP_PREFIX = ".tmp-"
#: Temporary files older than this are leftovers of a killed writer.
STALE_TMP_SECONDS = 3600.0


def publish_atomic(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True if this call created it.

    Writes a temporary file beside ``path`` and links it into place
    (create-only); falls back to ``os.replace`` where hard links are not
    supported. Raises ``OSError`` when the directory is not writable.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{_TMP_PREFIX}{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK):
                raise
            if path.exists():
                return False
            os.replace(tmp, path)
            return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectFile:
    """One file found under ``objects/`` by :func:`scan_objects`."""

    path: Path
    key: str
    size: int
    mtime: float
    temporary: bool


def scan_objects(local_dir: Path) -> list[ObjectFile]:
    """Every object (and temporary) file of the local tier, sorted by path."""
    found: list[ObjectFile] = []
    root = local_dir / "objects"
    try:
        shards = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return found
    for shard in shards:
        if not shard.is_dir(follow_symlinks=False):
            continue
        try:
            entries = sorted(os.scandir(shard.path), key=lambda e: e.name)
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            temporary = entry.name.startswith(_TMP_PREFIX)
            if not temporary and not KEY_RE.fullmatch(entry.name):
                continue
            found.append(
                ObjectFile(
                    path=Path(entry.path),
                    key="" if temporary else entry.name,
                    size=st.st_size,
                    mtime=st.st_mtime,
                    temporary=temporary,
                )
            )
    return found


class LocalTier:
    """Reads and publishes objects under one local directory."""

    def __init__(self, local_dir: Path) -> None:
        self.dir = local_dir

    def path(self, key: str) -> Path:
        return self.dir / "objects" / key[:2] / key

    def read(self, key: str) -> bytes | None:
        """The raw bytes stored for ``key`` (unverified), or None if absent."""
        try:
            with open(self.path(key), "rb") as fh:
                return fh.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def touch(self, key: str) -> None:
        """Mark ``key`` as used now (for LRU gc); a vanished file is fine."""
        with contextlib.suppress(OSError):
            os.utime(self.path(key))

    def write(self, key: str, data: bytes) -> bool:
        """Publish ``data`` for ``key`` unless present; True if this call created it."""
        return publish_atomic(self.path(key), data)

    def remove(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(key))

    def is_valid(self, key: str) -> bool:
        data = self.read(key)
        if data is None:
            return False
        try:
            decode_object(key, data)
        except CorruptObject:
            return False
        return True


@contextlib.contextmanager
def key_lock(local_dir: Path, key: str, timeout: float | None) -> Iterator[bool]:
    """Hold an exclusive ``flock`` for ``key``; yields False if ``timeout`` ran out unlocked."""
    path = local_dir / "locks" / key[:2] / f"{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locked = _acquire(fd, timeout)
        if not locked:
            log.warning("lock %s still held after %.0f s; going on without it", path, timeout)
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, timeout: float | None) -> bool:
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
