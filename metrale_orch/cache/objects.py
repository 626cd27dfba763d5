"""The cache's object format and key encoding (pure: bytes in, values out).

An object is self-verifying::

    MAGIC (8 bytes) | header length (u32 LE) | xxh3-128 of header (16 bytes) | header | payload

The header is canonical JSON: ``schema``, ``key``, ``outputs`` (name, size,
xxh3-128 hex, in payload order, sorted by name) and ``meta``. The payload is
the outputs concatenated. :func:`decode_object` checks the magic, the header
hash, the schema, the key, every output's size and hash and that nothing
trails the payload; any mismatch raises :class:`CorruptObject` naming what.

A reader that must not trust a file's size (the local tier) reads the fixed
prefix first (:func:`header_length`), then the header (:func:`declared_size`),
and only then exactly the length the header declares.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from types import MappingProxyType

import xxhash

from metrale_orch.cache_schema import CACHE_SCHEMA

__all__ = [
    "KEY_RE",
    "MAGIC",
    "PREFIX_SIZE",
    "SCHEMA",
    "CorruptObject",
    "DecodedObject",
    "ObjectTooLarge",
    "canonical_key_bytes",
    "declared_size",
    "decode_object",
    "encode_object",
    "header_length",
    "key_of",
]

#: Cache schema version: part of every key and every header (see metrale_orch.cache_schema).
SCHEMA = CACHE_SCHEMA
MAGIC = b"MOCACHE\x01"
_PREFIX = struct.Struct("<8sI16s")
#: Bytes before the header: magic, header length, header hash.
PREFIX_SIZE = _PREFIX.size
_MAX_HEADER = 16 * 1024 * 1024
KEY_RE = re.compile(r"[0-9a-f]{32}")
#: One output in a header: name, size, xxh3-128 hex.
Spec = tuple[str, int, str]


class CorruptObject(ValueError):
    """The bytes are not a valid object for the key; ``reason`` says what failed.

    ``received`` is how many bytes were read before the object was refused
    (set by readers that count transferred bytes; 0 when unknown).
    """

    def __init__(self, reason: str, *, received: int = 0) -> None:
        self.reason = reason
        self.received = received
        super().__init__(reason)


class ObjectTooLarge(CorruptObject):
    """The object is larger than the reader's size limit (refused unread, not proven bad)."""


def _canon(value: object, where: str) -> object:
    """A type-tagged, order-free JSON value: two inputs encode equally iff they are equal."""
    if value is None:
        return "n"
    if value is True:
        return "t"
    if value is False:
        return "f"
    if isinstance(value, int):
        return ["i", str(value)]
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where}: non-finite float {value!r} cannot be part of a cache key")
        return ["d", value.hex()]
    if isinstance(value, str):
        return ["s", value]
    if isinstance(value, bytes | bytearray | memoryview):
        return ["b", bytes(value).hex()]
    if isinstance(value, Mapping):
        # (key, value) pairs: json writes a tuple as the same array a list would be.
        items: list[tuple[str, object]] = []
        for k in value:
            if not isinstance(k, str):
                raise TypeError(f"{where}: mapping key {k!r} is not a string")
            items.append((k, _canon(value[k], f"{where}.{k}")))
        items.sort(key=lambda kv: kv[0])
        return ["m", items]
    if isinstance(value, list | tuple):
        return ["l", [_canon(v, f"{where}[{i}]") for i, v in enumerate(value)]]
    raise TypeError(
        f"{where}: {type(value).__name__} cannot be part of a cache key "
        "(use str, bytes, int, float, bool, None, lists and string-keyed mappings)"
    )


def canonical_key_bytes(namespace: str, parts: Mapping[str, object]) -> bytes:
    """The canonical encoding hashed by :func:`key_of`. Raises ``TypeError`` for odd values."""
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a string, got {type(namespace).__name__}")
    doc = ["metrale-orch-cache", SCHEMA, namespace, _canon(parts, "parts")]
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8")


def key_of(namespace: str, parts: Mapping[str, object]) -> str:
    """xxh3-128 hex of :func:`canonical_key_bytes`."""
    return xxhash.xxh3_128_hexdigest(canonical_key_bytes(namespace, parts))


def encode_object(key: str, outputs: Mapping[str, bytes], meta: Mapping[str, object]) -> bytes:
    """The object bytes for ``outputs`` (name -> bytes) and ``meta`` (JSON-able values)."""
    names = sorted(outputs)
    entries = []
    blobs = []
    for name in names:
        data = bytes(outputs[name])
        entries.append({"name": name, "size": len(data), "xxh3": xxhash.xxh3_128_hexdigest(data)})
        blobs.append(data)
    header = {"schema": SCHEMA, "key": key, "outputs": entries, "meta": dict(meta)}
    head = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    prefix = _PREFIX.pack(MAGIC, len(head), xxhash.xxh3_128_digest(head))
    return b"".join([prefix, head, *blobs])


class DecodedObject:
    """A verified object: ``outputs`` (name -> bytes) and ``meta``."""

    __slots__ = ("meta", "outputs", "size")

    def __init__(self, outputs: Mapping[str, bytes], meta: Mapping[str, object], size: int) -> None:
        self.outputs = outputs
        self.meta = meta
        self.size = size


def header_length(prefix: bytes) -> int:
    """The header length an object's first :data:`PREFIX_SIZE` bytes declare.

    Raises :class:`CorruptObject` for a short prefix, a bad magic or an absurd length.
    """
    if len(prefix) < _PREFIX.size:
        raise CorruptObject(f"truncated: {len(prefix)} bytes, shorter than the object prefix")
    magic, hlen, _ = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise CorruptObject("bad magic (not a metrale-orch cache object, or another version)")
    if hlen > _MAX_HEADER:
        raise CorruptObject(f"truncated or bad header length {hlen}")
    return int(hlen)


def _parse_header(
    prefix: bytes, head: bytes | memoryview
) -> tuple[object, object, dict[str, object], list[Spec]]:
    if xxhash.xxh3_128_digest(head) != _PREFIX.unpack_from(prefix)[2]:
        raise CorruptObject("header hash mismatch")
    try:
        header = json.loads(bytes(head))
        schema = header["schema"]
        hkey = header["key"]
        entries = header["outputs"]
        meta = header["meta"]
        if not isinstance(entries, list) or not isinstance(meta, dict):
            raise TypeError("outputs/meta have the wrong type")
        specs = [(str(e["name"]), int(e["size"]), str(e["xxh3"])) for e in entries]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptObject(f"malformed header: {exc}") from None
    if any(size < 0 for _, size, _ in specs):
        raise CorruptObject("malformed header: negative output size")
    return schema, hkey, meta, specs


def declared_size(prefix: bytes, head: bytes) -> int:
    """The whole object's size as its verified header declares it (pure).

    ``prefix`` is the first :data:`PREFIX_SIZE` bytes, ``head`` the
    :func:`header_length` bytes after them. Raises :class:`CorruptObject`.
    """
    hlen = header_length(prefix)
    if len(head) != hlen:
        raise CorruptObject(f"truncated: header is {len(head)} bytes, prefix says {hlen}")
    _, _, _, specs = _parse_header(prefix, head)
    return _PREFIX.size + hlen + sum(size for _, size, _ in specs)


def decode_object(key: str, data: bytes) -> DecodedObject:
    """Verify ``data`` as the object of ``key``; raises :class:`CorruptObject` on any mismatch."""
    hlen = header_length(data)
    if _PREFIX.size + hlen > len(data):
        raise CorruptObject(f"truncated or bad header length {hlen}")
    view = memoryview(data)
    head = view[_PREFIX.size : _PREFIX.size + hlen]
    schema, hkey, meta, specs = _parse_header(data, head)
    if schema != SCHEMA:
        raise CorruptObject(f"schema {schema!r}, expected {SCHEMA}")
    if hkey != key:
        raise CorruptObject(f"header names key {hkey!r}")
    pos = _PREFIX.size + hlen
    expected_end = pos + sum(size for _, size, _ in specs)
    if expected_end != len(data):
        raise CorruptObject(
            f"payload is {len(data) - pos} bytes, header says {expected_end - pos}"
            + (" (truncated)" if expected_end > len(data) else " (trailing garbage)")
        )
    outputs: dict[str, bytes] = {}
    for name, size, digest in specs:
        chunk = view[pos : pos + size]
        if xxhash.xxh3_128_hexdigest(chunk) != digest:
            raise CorruptObject(f"output {name!r} hash mismatch")
        outputs[name] = bytes(chunk)
        pos += size
    return DecodedObject(MappingProxyType(outputs), MappingProxyType(meta), len(data))
