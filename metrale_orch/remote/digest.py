"""REAPI content digests: SHA-256 of the bytes and their length (pure, no protobuf).

A :class:`Digest` is the client's own value for a blob's name (``hash`` is 64
lowercase hex digits); the client converts it to and from the REAPI ``Digest``
message at its edge. REAPI v2 names every blob this way, whatever cache keys the
rest of the package uses (xxh3 stays local).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import NamedTuple

__all__ = ["CHUNK", "EMPTY", "ON_LOOP", "Digest", "digest_bytes", "digest_file", "parse_digest"]

#: Bytes read at a time when hashing or streaming a file.
CHUNK = 1024 * 1024
#: Bytes up to which data is read, hashed, verified or written on the event loop itself;
#: more goes to the loop's default executor (a small pool), so the loop keeps serving.
ON_LOOP = 256 * 1024

_HEX64 = re.compile(r"[0-9a-f]{64}")


class Digest(NamedTuple):
    """A blob's SHA-256 (lowercase hex) and size in bytes; ``str()`` is ``hash/size``."""

    hash: str
    size: int

    def __str__(self) -> str:
        return f"{self.hash}/{self.size}"


def digest_bytes(data: bytes) -> Digest:
    """The digest of ``data`` (pure)."""
    return Digest(hashlib.sha256(data).hexdigest(), len(data))


#: The empty blob: every REAPI server holds it, so it is never uploaded or downloaded.
EMPTY = digest_bytes(b"")


def digest_file(path: Path) -> Digest:
    """The digest of the file at ``path``, read in :data:`CHUNK` pieces (never whole).

    Raises ``OSError`` when it cannot be read.
    """
    hasher = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return Digest(hasher.hexdigest(), size)


def parse_digest(text: str) -> Digest:
    """``hash/size`` back to a :class:`Digest`; raises ``ValueError`` for anything else."""
    hash_, sep, size = text.partition("/")
    if not sep or not _HEX64.fullmatch(hash_) or not size.isdigit():
        raise ValueError(f"not a SHA-256 digest 'hash/size': {text!r}")
    return Digest(hash_, int(size))
