"""Who wrote an entry: Ed25519 signatures on cache entries (SPEC 3.4, "Signed entries").

A signing writer adds a ``sig`` section to the header of every object it
publishes, ``{"alg": "ed25519", "pub": <base64 public key>, "sig": <base64>}``,
over :func:`~.objects.signed_message`: a domain tag, the key, and the header's
schema, key, meta and every output's name, size and xxh3-128. The signature
lives in the object itself, so an entry and its signature are published (and
copied into the local tier) as one object, atomically; a signature made for
other bytes cannot verify, because the reader checks it against the very header
it then uses, and the payload against that header's hashes.

Trust (:class:`Trust`, :class:`Signing`): once ``cache_trusted_keys`` is set, an
entry from a remote tier is served only when a listed key signed it. The local
tier trusts those keys and this user's own: the signing key, and the key that
:func:`local_signer` keeps under the user's configuration directory
(:data:`~metrale_orch.config.LOCAL_KEY`), which signs what this user compiles when
no ``cache_signing_key`` is set. Nothing that decides trust lives in the local cache
directory, so others may share it: an entry there signed by any other key is a miss
(counted, warned once), and a key file left there (where older versions kept the
local key) is never read. An entry copied from a remote into the local tier keeps
its signature, so copying never launders an unsigned one.

A private key file is used only when it is the user's own and no one else may read it
(:func:`~metrale_orch.ownership.not_own`, as ssh asks); otherwise it is refused with
the path and the ``chmod 600`` to run. ``cryptography`` is imported only when a key is
used: a build without keys pays nothing. No private key is ever shown, logged or
written but by :func:`write_key_pair`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import os
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from metrale_orch.cache.errors import SigningKeyError, why
from metrale_orch.cache.local import make_private_dir
from metrale_orch.config import LOCAL_KEY, PUBLIC_KEY_PREFIX, parse_public_key_line
from metrale_orch.extras import SIGNING, import_extra
from metrale_orch.ownership import not_own

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from metrale_orch.cache.objects import DecodedObject
    from metrale_orch.cache.settings import CacheSettings

__all__ = [
    "LOCAL_KEY",
    "PublicKey",
    "Signer",
    "Signing",
    "Trust",
    "Verdict",
    "generate_key_pair",
    "load_signer",
    "local_signer",
    "write_key_pair",
]

_PEM_START = b"-----BEGIN"

#: How a checked entry stands: signed by a trusted key, not signed, or signed otherwise
#: (a key not trusted, a forged or truncated signature, a malformed section).
Verdict = Literal["verified", "unsigned", "untrusted"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object, size: int) -> bytes | None:
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == size else None


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicKey:
    """An Ed25519 public key (32 raw bytes) and the label of its line."""

    raw: bytes
    label: str = ""

    @classmethod
    def from_line(cls, line: str) -> PublicKey:
        """Parse ``ed25519:<base64> [label]``; raises ``ValueError``."""
        raw, label = parse_public_key_line(line)
        return cls(raw=raw, label=label)

    def line(self) -> str:
        """The line to paste into ``cache_trusted_keys``."""
        text = PUBLIC_KEY_PREFIX + _b64(self.raw)
        return f"{text} {self.label}" if self.label else text


class Signer:
    """Signs entries with one private key. Its ``repr`` shows the public key only."""

    __slots__ = ("_private", "public")

    def __init__(self, private: Ed25519PrivateKey, label: str = "") -> None:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self._private = private
        raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public = PublicKey(raw=raw, label=label)

    def section(self, message: bytes) -> Mapping[str, str]:
        """The header's ``sig`` section for ``message`` (deterministic, as Ed25519 is)."""
        signature = self._private.sign(message)
        return {"alg": "ed25519", "pub": _b64(self.public.raw), "sig": _b64(signature)}

    def __repr__(self) -> str:
        return f"Signer({self.public.line()})"


def _signer_from_pem(data: bytes, where: str) -> Signer:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        private = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        # the library's text names no key material; keep only its first line
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SigningKeyError(where, f"not an unencrypted PEM private key ({reason})") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningKeyError(where, f"a {type(private).__name__}, not an Ed25519 private key")
    return Signer(private)


class _KeyRefused(PermissionError):
    """A private key file that is not the user's own; its text names the path and the fix."""


def _read_key_file(path: Path) -> bytes:
    """The bytes of the private key file at ``path`` when it is the user's own: owned by
    this user and read or written by no one else (ssh's rule for a private key). Raises
    OSError: :class:`_KeyRefused` saying what is wrong and what to run."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        problem = not_own(st, secret=True)
        if problem:
            fix = (
                f"run `chmod 600 {path}`"
                if st.st_uid == os.getuid()
                else "a private key must be a file of your own: copy it and `chmod 600` the copy"
            )
            raise _KeyRefused(errno.EPERM, f"the key file {path} is {problem}: {fix}")
        return fh.read()


def load_signer(spec: str, where: str) -> Signer:
    """The signer of ``spec``: PEM text, or the path of a PEM file (I/O).

    ``where`` names the setting's source in messages (never the key itself). Raises
    :class:`SigningKeyError` for an unreadable file, one that is not the user's own
    (another user's, or readable or writable by group or others: the message names the
    ``chmod 600`` to run), or anything but an Ed25519 key.
    """
    data = spec.encode()
    if not data.lstrip().startswith(_PEM_START):
        try:
            data = _read_key_file(Path(spec))
        except _KeyRefused as exc:
            raise SigningKeyError(where, str(exc.strerror)) from None
        except OSError as exc:
            # Not quoted: a one-line value that is no file may be the key itself (a PEM
            # body without its armour, a base64 seed).
            raise SigningKeyError(
                where,
                f"cannot read it as a key file ({why(exc)}); the value is not shown, as it "
                "may be a key: give the path of a PEM file, or the PEM text with its "
                "-----BEGIN PRIVATE KEY----- lines",
            ) from None
        where = f"{where} (key file {spec})"
    return _signer_from_pem(data, where)


def generate_key_pair(label: str = "") -> tuple[bytes, PublicKey]:
    """A fresh Ed25519 key: (unencrypted PKCS#8 PEM, its public key). Raises
    :class:`~metrale_orch.extras.ExtraMissing` without ``cryptography``."""
    import_extra(SIGNING, "a signing key")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return pem, Signer(private, label).public


def _create_private_file(path: Path, data: bytes) -> bool:
    """Create ``path`` (mode 0600) holding ``data`` unless it exists; True if created."""
    tmp = path.parent / f".tmp-{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.link(tmp, path)  # create-only: the first writer wins
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_key_pair(path: Path, label: str = "") -> PublicKey:
    """Write a fresh private key to ``path`` (mode 0600, never over an existing file) and
    return its public key. Raises ``FileExistsError`` or ``OSError``."""
    pem, public = generate_key_pair(label)
    if not _create_private_file(path, pem):
        raise FileExistsError(path)
    return public


def local_signer(path: Path) -> Signer:
    """This user's own key at ``path`` (:func:`~metrale_orch.config.default_local_key`;
    made on first use, mode 0600 in a 0700 directory). Raises ``OSError`` (one that is
    not the user's own: its text names the path and what to run) or
    :class:`SigningKeyError` when it cannot be used."""
    make_private_dir(path.parent)
    if not path.exists():
        pem, _ = generate_key_pair()
        _create_private_file(path, pem)
    return _signer_from_pem(_read_key_file(path), f"local signing key {path}")


class Trust:
    """Which public keys an entry's signature must come from (thread-safe)."""

    def __init__(self, keys: Iterable[bytes]) -> None:
        self.keys = frozenset(keys)
        self._loaded: dict[bytes, Ed25519PublicKey] = {}
        self._lock = threading.Lock()

    def _key(self, raw: bytes) -> Ed25519PublicKey:
        with self._lock:
            key = self._loaded.get(raw)
            if key is None:
                from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

                key = self._loaded[raw] = Ed25519PublicKey.from_public_bytes(raw)
            return key

    def check(self, obj: DecodedObject) -> tuple[Verdict, str]:
        """(verdict, why when not verified) of a decoded object's signature section."""
        from cryptography.exceptions import InvalidSignature

        sig = obj.sig
        if sig is None:
            return "unsigned", "unsigned"
        if not isinstance(sig, dict) or sig.get("alg") != "ed25519":
            return "untrusted", "malformed signature section"
        pub = _unb64(sig.get("pub"), 32)
        if pub is None:
            return "untrusted", "malformed signature section (public key)"
        if pub not in self.keys:
            return "untrusted", f"signed by {PUBLIC_KEY_PREFIX}{_b64(pub)}, not a trusted key"
        signature = _unb64(sig.get("sig"), 64)
        if signature is None:
            return "untrusted", "truncated or malformed signature"
        try:
            self._key(pub).verify(signature, obj.message)
        except InvalidSignature:
            return "untrusted", "signature does not match the entry (forged, or for other bytes)"
        return "verified", ""


class Signing:
    """One cache's signer and trust, from its settings. Thread-safe; this user's local key
    (``local_key``, None for none) is read (or made) on first use, and one that cannot be
    used is ``local_problem``."""

    def __init__(
        self,
        *,
        trusted_keys: Sequence[str],
        signing_key: str,
        signing_key_where: str,
        local_key: Path | None,
    ) -> None:
        """Raises :class:`SigningKeyError` for a key that cannot be used, and
        :class:`~metrale_orch.extras.ExtraMissing` without ``cryptography``."""
        import_extra(SIGNING, "cache signing (cache_trusted_keys, cache_signing_key)")
        self.trusted = frozenset(PublicKey.from_line(line).raw for line in trusted_keys)
        self.verifying = bool(self.trusted)
        self.own = load_signer(signing_key, signing_key_where) if signing_key else None
        self.remote = Trust(self.trusted)
        self._local_key = local_key
        self._lock = threading.Lock()
        self._local: tuple[Signer | None, Trust] | None = None
        self.local_problem = ""

    @classmethod
    def of(cls, settings: CacheSettings) -> Signing | None:
        """The signing of a cache's ``settings``; None when no key is set. Raises as
        the constructor does."""
        if not (settings.trusted_keys or settings.signing_key):
            return None
        return cls(
            trusted_keys=settings.trusted_keys,
            signing_key=settings.signing_key,
            signing_key_where=settings.signing_key_where,
            local_key=settings.local_key,
        )

    @property
    def publishes_trusted(self) -> bool:
        """Whether what this cache signs is served by readers of the same trusted keys."""
        if not self.verifying:
            return True
        return self.own is not None and self.own.public.raw in self.trusted

    def _local_state(self) -> tuple[Signer | None, Trust]:
        with self._lock:
            if self._local is None:
                mine: Signer | None = None
                path = self._local_key
                try:
                    mine = None if path is None else local_signer(path)
                except _KeyRefused as exc:
                    self.local_problem = str(exc.strerror)
                except (OSError, SigningKeyError) as exc:
                    detail = why(exc) if isinstance(exc, OSError) else str(exc)
                    self.local_problem = f"{path}: {detail}"
                keys = set(self.trusted)
                keys.update(s.public.raw for s in (self.own, mine) if s is not None)
                self._local = (mine, Trust(keys))
            return self._local

    def signer(self) -> Signer | None:
        """Who signs a put: the signing key, else (verifying) this user's local key."""
        if self.own is not None:
            return self.own
        return self._local_state()[0] if self.verifying else None

    def local_trust(self) -> Trust:
        """The keys a local entry may be signed by: the trusted ones and this user's."""
        return self._local_state()[1]
