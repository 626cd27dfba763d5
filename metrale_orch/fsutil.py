"""Atomic file writes (the one way this package replaces a file) and the file digest.

A reader never sees a partial file: data goes to a temporary name in the same
directory (unique per process and thread) and is renamed into place. No fsync:
the rename makes an interrupted process safe, which is what the build promises;
a power loss may need ``doit forget`` and a rebuild.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import xxhash

_BLOCK = 1 << 20

#: ``[mtime_ns, size, digest]`` of a file as a build left or read it (saved states).
FileState = list[int | str]


def file_digest(path: str) -> str:
    """xxh3-64 hex digest of a file's bytes (raises ``OSError``): the one digest of file
    states (doit's saved states, installed outputs, a build's inputs, the task cache)."""
    return _hexdigest(path, xxhash.xxh3_64())


def file_hash(path: str) -> str:
    """xxh3-128 hex digest of a file's bytes (raises ``OSError``): the content hash of
    files a compile read and of compiler binaries (cache keys and recorded inputs)."""
    return _hexdigest(path, xxhash.xxh3_128())


def _hexdigest(path: str, h: xxhash.xxh3_64 | xxhash.xxh3_128) -> str:
    with open(path, "rb") as fh:
        while chunk := fh.read(_BLOCK):
            h.update(chunk)
    return h.hexdigest()


__all__ = ["FileState", "file_digest", "file_hash", "write_atomic", "write_if_changed"]


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, creating its directory. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_if_changed(path: Path, data: bytes) -> bool:
    """:func:`write_atomic` unless ``path`` already holds ``data``; True when it wrote."""
    try:
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    except OSError:
        pass
    write_atomic(path, data)
    return True
