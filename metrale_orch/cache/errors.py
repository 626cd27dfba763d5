"""The cache's errors: raised for a misuse or an unreadable file, never for store trouble.

Each carries its data as attributes (the setting, the key part, the file) and
says what to do.
"""

from __future__ import annotations

from pathlib import Path

from metrale_orch.errors import MetraleError

__all__ = [
    "CacheError",
    "CacheKeyError",
    "CacheSettingsError",
    "CacheStatsError",
    "SigningKeyError",
    "SizeError",
    "TrustedKeyError",
    "why",
]


class CacheError(MetraleError):
    """Base of the cache's errors (a misuse or unreadable file; store trouble never raises)."""


class CacheSettingsError(CacheError):
    """A cache setting is out of range; names the setting and the value."""

    setting: str
    value: object
    problem: str

    template = "cache setting {setting}={value!r}: {problem}"


class CacheKeyError(CacheError):
    """A key is malformed, or key parts / meta hold a value that cannot be encoded."""

    what: str
    problem: str

    template = "cache key {what}: {problem}"


class CacheStatsError(CacheError):
    """A statistics file cannot be read; names the file."""

    path: Path
    problem: str

    template = "{path}: {problem} (delete it; the next build writes a fresh one)"


class SigningKeyError(CacheError):
    """The signing key cannot be read or is no Ed25519 private key; names where it was set
    (never its text) and says what to do."""

    where: str
    problem: str

    template = (
        "{where}: cache_signing_key: {problem} (write one with `metrale-orch cache keygen`, "
        "or unset cache_signing_key to publish unsigned)"
    )


class TrustedKeyError(CacheError):
    """A ``trusted_keys`` line is not a public key line: named by its position (and
    label), never quoted, for it may be a private key pasted by mistake."""

    line: str
    problem: str

    template = "cache setting trusted_keys, {line}: {problem}"


class SizeError(CacheError):
    """A size such as ``500M`` cannot be parsed."""

    text: str

    template = (
        "size {text!r} is not understood: use bytes or a number with K, M, G or T "
        "(powers of 1024), e.g. 500M or 2G, of at most 1024T"
    )


def why(exc: OSError) -> str:
    """A short reason for an ``OSError`` (its strerror, else its type and text)."""
    if exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
