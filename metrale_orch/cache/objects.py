"""The cache's object format and key encoding (pure: bytes in, values out).

An object is self-verifying::

    MAGIC (8 bytes) | header length (u32 LE) | xxh3-128 of header (16 bytes) | header | payload

The header is canonical JSON: ``schema``, ``key``, ``outputs`` (name, size,
xxh3-128 hex, in payload order, sorted by name), ``meta`` and, when a signing
writer published it, ``sig`` (:mod:`~.signing`: who signed :func:`signed_message`,
the key and the header without ``sig``; readers that check no signer ignore it,
so signed and unsigned entries share one schema). The payload is
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
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import xxhash

from metrale_orch.cache_schema import CACHE_SCHEMA
from metrale_orch.fsutil import bytes_hash

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
    "read_header",
    "signed_message",
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
#: Signs a message: returns the header's ``sig`` section (JSON strings).
SignFn = Callable[[bytes], Mapping[str, str]]
#: What a signature covers besides the header body: a domain tag, so no other message
#: signed by the same key can pass for an entry's.
_SIG_DOMAIN = b"metrale-orch cache entry v1\x00"
#: The header fields a signature covers (every field but ``sig`` itself).
_SIGNED_FIELDS = ("key", "meta", "outputs", "schema")


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


#: Where a value sits in the parts, for an error message: a name, or (parent, key or index),
#: formatted only when a value is refused (a key names hundreds of files: keys are hot).
_Where = str | tuple["_Where", str | int]


def _place(where: _Where) -> str:
    if isinstance(where, str):
        return where
    parent, step = where
    return f"{_place(parent)}[{step}]" if isinstance(step, int) else f"{_place(parent)}.{step}"


def _canon(value: object, where: _Where) -> object:
    """A type-tagged, order-free JSON value: two inputs encode equally iff they are equal."""
    if type(value) is str:  # most of a key: paths, hashes, argv words
        return ["s", value]
    if isinstance(value, Mapping):
        # (key, value) pairs: json writes a tuple as the same array a list would be.
        items: list[tuple[str, object]] = []
        for k in value:
            if not isinstance(k, str):
                raise TypeError(f"{_place(where)}: mapping key {k!r} is not a string")
            items.append((k, _canon(value[k], (where, k))))
        items.sort(key=lambda kv: kv[0])
        return ["m", items]
    if isinstance(value, list | tuple):
        if all(type(v) is str for v in value):  # argv, an input's [path, hash]: no descent
            return ["l", [["s", v] for v in value]]
        return ["l", [_canon(v, (where, i)) for i, v in enumerate(value)]]
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
            raise TypeError(
                f"{_place(where)}: non-finite float {value!r} cannot be part of a cache key"
            )
        return ["d", value.hex()]
    if isinstance(value, str):
        return ["s", value]
    if isinstance(value, bytes | bytearray | memoryview):
        return ["b", bytes(value).hex()]
    raise TypeError(
        f"{_place(where)}: {type(value).__name__} cannot be part of a cache key "
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
    return bytes_hash(canonical_key_bytes(namespace, parts))


def _canonical_json(doc: Mapping[str, object]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def signed_message(key: str, header: Mapping[str, object]) -> bytes:
    """The bytes a signature of ``key``'s entry covers (pure): the domain tag, the key, and
    the canonical JSON of the header's schema, key, meta and outputs (each output's name,
    size and xxh3-128), so a signature is valid for exactly one key, header and payload."""
    body = {name: header[name] for name in _SIGNED_FIELDS}
    return _SIG_DOMAIN + key.encode() + b"\x00" + _canonical_json(body)


def encode_object(
    key: str,
    outputs: Mapping[str, bytes],
    meta: Mapping[str, object],
    sign: SignFn | None = None,
) -> bytes:
    """The object bytes for ``outputs`` (name -> bytes) and ``meta`` (JSON-able values),
    with the ``sig`` section ``sign`` returns for :func:`signed_message` when given."""
    names = sorted(outputs)
    entries = []
    blobs = []
    for name in names:
        data = bytes(outputs[name])
        entries.append({"name": name, "size": len(data), "xxh3": bytes_hash(data)})
        blobs.append(data)
    header: dict[str, object] = {
        "schema": SCHEMA,
        "key": key,
        "outputs": entries,
        "meta": dict(meta),
    }
    if sign is not None:
        # round-trip first: the reader signs-checks the header as JSON gives it back
        body = json.loads(_canonical_json(header))
        header["sig"] = dict(sign(signed_message(key, body)))
    head = _canonical_json(header)
    prefix = _PREFIX.pack(MAGIC, len(head), xxhash.xxh3_128_digest(head))
    return b"".join([prefix, head, *blobs])


class DecodedObject:
    """A verified object: ``outputs`` (name -> bytes) and ``meta``; ``sig`` is its header's
    signature section as found (None: unsigned) and ``message`` what it must sign (b"" when
    unsigned). Who signed it is checked by :mod:`~.signing`, not here."""

    __slots__ = ("message", "meta", "outputs", "sig", "size")

    def __init__(
        self,
        outputs: Mapping[str, bytes],
        meta: Mapping[str, object],
        size: int,
        sig: object = None,
        message: bytes = b"",
    ) -> None:
        self.outputs = outputs
        self.meta = meta
        self.size = size
        self.sig = sig
        self.message = message


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


class _Header(NamedTuple):
    """A parsed header: the whole document and the fields every reader needs."""

    doc: dict[str, object]
    schema: object
    key: object
    meta: dict[str, object]
    specs: list[Spec]


def _parse_header(prefix: bytes, head: bytes | memoryview) -> _Header:
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
    return _Header(header, schema, hkey, meta, specs)


def declared_size(prefix: bytes, head: bytes) -> int:
    """The whole object's size as its verified header declares it (pure).

    ``prefix`` is the first :data:`PREFIX_SIZE` bytes, ``head`` the
    :func:`header_length` bytes after them. Raises :class:`CorruptObject`.
    """
    hlen = header_length(prefix)
    if len(head) != hlen:
        raise CorruptObject(f"truncated: header is {len(head)} bytes, prefix says {hlen}")
    specs = _parse_header(prefix, head).specs
    return _PREFIX.size + hlen + sum(size for _, size, _ in specs)


def read_header(prefix: bytes, head: bytes) -> tuple[str, DecodedObject]:
    """The key an object's verified header names, and the object without its payload
    (``outputs`` empty; ``meta``, ``sig`` and ``message`` as :func:`decode_object` gives
    them, so its signature can be checked). Pure; the payload is not read, so not verified:
    what a listing of entries needs, never what a hit serves.

    ``prefix`` is the first :data:`PREFIX_SIZE` bytes, ``head`` the :func:`header_length`
    bytes after them. Raises :class:`CorruptObject`, also for another schema.
    """
    if len(head) != header_length(prefix):
        raise CorruptObject(f"truncated: header is {len(head)} bytes")
    header = _parse_header(prefix, head)
    if header.schema != SCHEMA:
        raise CorruptObject(f"schema {header.schema!r}, expected {SCHEMA}")
    key = str(header.key)
    sig = header.doc.get("sig")
    message = b"" if sig is None else signed_message(key, header.doc)
    size = PREFIX_SIZE + len(head) + sum(n for _, n, _ in header.specs)
    meta = MappingProxyType(header.meta)
    return key, DecodedObject(MappingProxyType({}), meta, size, sig, message)


def decode_object(key: str, data: bytes) -> DecodedObject:
    """Verify ``data`` as the object of ``key``; raises :class:`CorruptObject` on any mismatch."""
    hlen = header_length(data)
    if _PREFIX.size + hlen > len(data):
        raise CorruptObject(f"truncated or bad header length {hlen}")
    view = memoryview(data)
    head = view[_PREFIX.size : _PREFIX.size + hlen]
    header = _parse_header(data, head)
    specs = header.specs
    if header.schema != SCHEMA:
        raise CorruptObject(f"schema {header.schema!r}, expected {SCHEMA}")
    if header.key != key:
        raise CorruptObject(f"header names key {header.key!r}")
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
        if bytes_hash(chunk) != digest:
            raise CorruptObject(f"output {name!r} hash mismatch")
        outputs[name] = bytes(chunk)
        pos += size
    sig = header.doc.get("sig")
    message = b"" if sig is None else signed_message(key, header.doc)
    return DecodedObject(
        MappingProxyType(outputs), MappingProxyType(header.meta), len(data), sig, message
    )
