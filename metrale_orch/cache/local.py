"""The local tier: one file per key under ``<dir>/objects/<2 hex>/<key>``.

Invariants: an object file is only ever created complete (written to a
temporary name in the same directory, then hard-linked into place, which is
create-only — the first writer wins — or renamed where links are not
supported; a ``replace`` publish renames over the old entry), so a reader
never sees a partial object. Removal is a plain unlink: a reader that already
opened the file keeps reading it, one that did not gets a miss. A hit touches
the file's mtime, which :func:`gc` uses as last-use time.

Reads are bounded and never block: only a regular file is read (opened with
``O_NOFOLLOW | O_NONBLOCK``, then checked with ``fstat``, so a FIFO, a device,
a symlink or a directory at an object path is refused, not read), and only as
many bytes as its verified header declares, never more than the size limit; a
file whose size differs from what its header declares is refused. Anything
refused raises :class:`CorruptObject`; the caller removes it with
:func:`remove_entry`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.cache.objects import (
    KEY_RE,
    PREFIX_SIZE,
    CorruptObject,
    ObjectTooLarge,
    declared_size,
    header_length,
)

__all__ = [
    "DEFAULT_MAX_OBJECT_SIZE",
    "EntryKind",
    "LocalTier",
    "ObjectFile",
    "Scan",
    "key_lock",
    "kind_of",
    "make_private_dir",
    "not_regular",
    "publish_atomic",
    "publish_replace",
    "read_object_file",
    "read_object_head",
    "remove_entry",
    "scan_objects",
]

log = logging.getLogger(__name__)

_TMP_PREFIX = ".tmp-"
#: Temporary files older than this are leftovers of a killed writer.
STALE_TMP_SECONDS = 3600.0
#: The largest object any tier reads (2 GiB): a bigger one is refused, never read.
DEFAULT_MAX_OBJECT_SIZE = 2 * 1024**3
#: Read size per system call (Linux returns at most ~2 GiB from one read).
_CHUNK = 64 * 1024 * 1024
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

#: What an entry under ``objects/`` is (``lstat``, symlinks not followed).
EntryKind = Literal["file", "directory", "symlink", "fifo", "device", "socket", "other"]


def kind_of(mode: int) -> EntryKind:
    """The :data:`EntryKind` of an ``st_mode`` (pure)."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "other"


def not_regular(kind: EntryKind) -> str:
    """The reason given for an entry that is not a regular file."""
    what = {"symlink": "symbolic link", "other": "special file"}.get(kind, kind)
    return f"{'an' if what[0] in 'aeiou' else 'a'} {what}, not a regular file"


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with the last level mode 0700: by default only
    this user reads what the local cache holds. An existing directory is left as it is (a
    team may share one: nothing that decides trust lives there, see
    :mod:`~metrale_orch.cache.signing`)."""
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)


def publish_atomic(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True if this call created it.

    Writes a temporary file beside ``path`` and links it into place
    (create-only); falls back to ``os.replace`` where hard links are not
    supported. Raises ``OSError`` when the directory is not writable.
    """
    tmp = _write_temp(path, data)
    try:
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


def publish_replace(path: Path, data: bytes) -> None:
    """Put ``data`` at ``path``, replacing what is there atomically (temp file + ``os.replace``).

    Raises ``OSError`` (for instance when a directory sits at ``path``).
    """
    tmp = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _write_temp(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{_TMP_PREFIX}{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def _open_regular(path: Path) -> int | None:
    """A read-only descriptor of the object file at ``path`` (never through a link), None
    if absent. Raises :class:`CorruptObject` for a link or anything but a regular file,
    ``OSError`` when it cannot be opened."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symlink
            raise CorruptObject(not_regular("symlink")) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CorruptObject(not_regular(kind_of(mode)))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_object_file(path: Path, max_size: int) -> bytes | None:
    """The bytes of the object file at ``path`` (framing checked, hashes not), None if absent.

    Reads the fixed prefix, then the header, then exactly the size the header
    declares. Raises :class:`CorruptObject` for an entry that is not a regular
    file, is larger than ``max_size``, or whose size differs from what its
    header declares; ``OSError`` when it cannot be read (permissions, I/O).
    """
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size > max_size:
            raise ObjectTooLarge(f"{size} bytes, more than the {max_size}-byte limit on an object")
        prefix = _pread_exact(fd, PREFIX_SIZE, 0)
        hlen = header_length(prefix)
        if PREFIX_SIZE + hlen > size:
            raise CorruptObject(f"truncated: {size} bytes, but the header alone is {hlen}")
        declared = declared_size(prefix, _pread_exact(fd, hlen, PREFIX_SIZE))
        if declared != size:
            raise CorruptObject(
                f"file is {size} bytes, its header declares {declared}"
                + (" (truncated)" if size < declared else " (trailing garbage)")
            )
        data = _pread_exact(fd, declared, 0)
        if len(data) != declared:
            raise CorruptObject(f"truncated: {len(data)} bytes read, header declares {declared}")
        return data
    finally:
        os.close(fd)


def read_object_head(path: Path) -> tuple[bytes, bytes] | None:
    """The prefix and header bytes of the object file at ``path`` (the payload unread), None
    if absent. Raises :class:`CorruptObject` for an entry that is not a regular file or
    whose header is cut short, ``OSError`` when it cannot be read."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        prefix = _pread_exact(fd, PREFIX_SIZE, 0)
        hlen = header_length(prefix)
        if PREFIX_SIZE + hlen > st.st_size:
            raise CorruptObject(f"truncated: {st.st_size} bytes, but the header alone is {hlen}")
        return prefix, _pread_exact(fd, hlen, PREFIX_SIZE)
    finally:
        os.close(fd)


def _pread_exact(fd: int, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes from ``offset`` (fewer only at end of file)."""
    chunks: list[bytes] = []
    got = 0
    while got < n:
        chunk = os.pread(fd, min(n - got, _CHUNK), offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def remove_entry(path: Path) -> None:
    """Remove whatever sits at ``path`` (file, symlink, FIFO, directory tree); absent is fine.

    A symlink is removed, never followed. Raises ``OSError`` when it cannot be removed.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectFile:
    """One entry found under ``objects/<shard>/`` by :func:`scan_objects`."""

    path: Path
    #: The key its name spells, "" for a temporary.
    key: str
    size: int
    mtime: float
    temporary: bool
    kind: EntryKind = "file"


@dataclass(frozen=True, slots=True, kw_only=True)
class Scan:
    """What :func:`scan_objects` found: entries, and directories it could not list."""

    entries: tuple[ObjectFile, ...]
    #: (directory, why) for each directory that could not be listed.
    unreadable: tuple[tuple[Path, str], ...] = ()

    def objects(self) -> list[ObjectFile]:
        """Regular files named by a key: the entries that can be objects."""
        return [e for e in self.entries if not e.temporary and e.kind == "file"]


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _list(path: str | Path) -> list[os.DirEntry[str]]:
    with os.scandir(path) as it:
        return sorted(it, key=lambda e: e.name)


def scan_objects(local_dir: Path) -> Scan:
    """Every key-named or temporary entry of the local tier, whatever its kind, sorted by path.

    Never raises for what it finds: a directory it cannot list is reported in
    :attr:`Scan.unreadable`.
    """
    found: list[ObjectFile] = []
    unreadable: list[tuple[Path, str]] = []
    root = local_dir / "objects"
    try:
        shards = _list(root)
    except FileNotFoundError:
        return Scan(entries=())
    except OSError as exc:
        return Scan(entries=(), unreadable=((root, _why(exc)),))
    for shard in shards:
        try:
            if not shard.is_dir(follow_symlinks=False):
                continue
            entries = _list(shard.path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            unreadable.append((Path(shard.path), _why(exc)))
            continue
        for entry in entries:
            temporary = entry.name.startswith(_TMP_PREFIX)
            if not temporary and not KEY_RE.fullmatch(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                unreadable.append((Path(entry.path), _why(exc)))
                continue
            found.append(
                ObjectFile(
                    path=Path(entry.path),
                    key="" if temporary else entry.name,
                    size=st.st_size,
                    mtime=st.st_mtime,
                    temporary=temporary,
                    kind=kind_of(st.st_mode),
                )
            )
    return Scan(entries=tuple(found), unreadable=tuple(unreadable))


class LocalTier:
    """Reads and publishes objects under one local directory."""

    def __init__(self, local_dir: Path, max_size: int = DEFAULT_MAX_OBJECT_SIZE) -> None:
        self.dir = local_dir
        self.max_size = max_size
        self._made = False

    def path(self, key: str) -> Path:
        return self.dir / "objects" / key[:2] / key

    def read(self, key: str) -> bytes | None:
        """The bytes stored for ``key`` (framing checked, hashes not), or None if absent.

        Raises :class:`CorruptObject` for an entry that must be removed and
        ``OSError`` for one that cannot be read (see :func:`read_object_file`).
        """
        return read_object_file(self.path(key), self.max_size)

    def touch(self, key: str) -> None:
        """Mark ``key`` as used now (for LRU gc); a vanished file is fine."""
        with contextlib.suppress(OSError):
            os.utime(self.path(key), follow_symlinks=False)

    def write(self, key: str, data: bytes, *, replace: bool = False) -> bool:
        """Publish ``data`` for ``key``; True if this call stored it.

        Create-only (an existing entry wins) unless ``replace``, which
        overwrites atomically. Raises ``OSError``.
        """
        if not self._made:  # the directory is created private (see make_private_dir)
            make_private_dir(self.dir)
            self._made = True
        if replace:
            publish_replace(self.path(key), data)
            return True
        return publish_atomic(self.path(key), data)

    def remove(self, key: str) -> None:
        """Remove ``key``'s entry, whatever it is; raises ``OSError`` if it cannot."""
        remove_entry(self.path(key))


@contextlib.asynccontextmanager
async def key_lock(local_dir: Path, key: str, timeout: float | None) -> AsyncIterator[bool]:
    """Hold an exclusive ``flock`` for ``key``; yields False if ``timeout`` ran out unlocked.
    Waited for on the event loop (polled, holding no thread)."""
    path = local_dir / "locks" / key[:2] / f"{key}.lock"
    make_private_dir(local_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locked = await _acquire(fd, timeout)
        if not locked:
            log.warning("lock %s still held after %.0f s; going on without it", path, timeout)
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


async def _acquire(fd: int, timeout: float | None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
