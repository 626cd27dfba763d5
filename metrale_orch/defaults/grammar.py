"""The override grammar (SPEC 2.2): how a ``METRALE_*`` value overrides a declaration.

Pure functions of (declared value, raw variable text). The grammar follows the
reference system exactly: values are trimmed of Unicode ``White_Space``,
lower-cased in ASCII only, and a u32 is an optional ``+`` and ASCII digits
within ``0..=4294967295``. A value is tagged :attr:`Source.ENV` exactly when a
variable decided it. Imports nothing of the package.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, Literal, TypeVar

__all__ = [
    "DENSE_GEMV_BATCHM_MAX_M",
    "MAX_DECODE_SPLITS",
    "U32_MAX",
    "WHITESPACE",
    "Resolved",
    "Source",
    "SplitkPolicy",
    "env_resolved",
    "resolve_batchm_max",
    "resolve_max_m",
    "resolve_points",
    "resolve_policy",
    "resolve_toggle",
    "target_resolved",
]

#: The BF16 decode head's batched-GEMV row bound: ``lm_head_batchm_max`` is clamped to it.
DENSE_GEMV_BATCHM_MAX_M = 16
U32_MAX = 4294967295
MAX_DECODE_SPLITS = 16
_OFF_WORDS = frozenset({"0", "false", "off", "no"})
# Rust's `str::trim` (Unicode White_Space). Python's `str.strip()` also strips U+001C..U+001F.
WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_U32_TEXT = re.compile(r"\+?[0-9]+")


class Source(enum.Enum):
    """Where a resolved value came from."""

    #: ``kernels/<hw>/HARDWARE.toml [defaults]``, or the baseline.
    TARGET = "target"
    #: A ``METRALE_*`` variable.
    ENV = "env"

    @property
    def tag(self) -> str:
        """The suffix the summary line appends to the value."""
        return " (env)" if self is Source.ENV else ""


T = TypeVar("T")
#: Covariant: a ``Resolved[bool]`` is a ``Resolved[bool | int | ...]`` (the value is read-only).
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolved(Generic[T_co]):
    """A resolved lever and where it came from."""

    value: T_co
    source: Source

    @property
    def from_env(self) -> bool:
        """True when an environment variable decided the value."""
        return self.source is Source.ENV


def target_resolved(value: T) -> Resolved[T]:
    return Resolved(value=value, source=Source.TARGET)


def env_resolved(value: T) -> Resolved[T]:
    return Resolved(value=value, source=Source.ENV)


def _normal(raw: str) -> str:
    text = raw.strip(WHITESPACE)
    # ASCII-only lower-casing: a non-ASCII value can never equal a keyword.
    return text.lower() if text.isascii() else text


def _parse_u32(raw: str) -> int | None:
    text = raw.strip(WHITESPACE)
    if not _U32_TEXT.fullmatch(text):
        return None
    value = int(text)
    return value if value <= U32_MAX else None


def resolve_toggle(default_on: bool, raw: str | None, kill: bool) -> Resolved[bool]:
    """A boolean lever: the kill switch's presence, else ``raw``, else the declaration.

    ``raw`` is the positive variable's value (None: absent); any value but a
    trimmed, case-insensitive ``0``/``false``/``off``/``no`` is on, the empty
    string included.
    """
    if kill:
        return env_resolved(False)
    if raw is None:
        return target_resolved(default_on)
    return env_resolved(_normal(raw) not in _OFF_WORDS)


def resolve_batchm_max(default: int, raw: str | None) -> Resolved[int]:
    """The head band: a u32 > 0 -> min(v, 16) (env); anything else keeps the
    declaration, clamped to 16 as well."""
    value = None if raw is None else _parse_u32(raw)
    if value is not None and value > 0:
        return env_resolved(min(value, DENSE_GEMV_BATCHM_MAX_M))
    return target_resolved(min(default, DENSE_GEMV_BATCHM_MAX_M))


def resolve_max_m(default: int, raw: str | None) -> Resolved[int]:
    """A row cap: a u32 (0 = never) -> v (env); anything else keeps the declaration."""
    value = None if raw is None else _parse_u32(raw)
    return target_resolved(default) if value is None else env_resolved(value)


def resolve_points(
    declared: tuple[str, ...], raw: str | None, bands: Sequence[Sequence[str]]
) -> Resolved[tuple[str, ...]]:
    """Schedule points: ``raw`` split on ``,``, each part trimmed; exactly one part per
    band, each a name of its band (case-sensitive) -> those (env); anything else (a
    trailing comma makes one part too many, the empty string is one part) keeps
    the declaration."""
    if raw is not None:
        parts = tuple(part.strip(WHITESPACE) for part in raw.split(","))
        if len(parts) == len(bands) and all(
            part in names for part, names in zip(parts, bands, strict=True)
        ):
            return env_resolved(parts)
    return target_resolved(declared)


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitkPolicy:
    """How paged-decode attention picks its split count: legacy, auto or pinned(n)."""

    kind: Literal["legacy", "auto", "pinned"]
    #: The pinned count (1..=16); 0 for legacy and auto.
    n: int = 0

    LEGACY: ClassVar[SplitkPolicy]
    AUTO: ClassVar[SplitkPolicy]

    @classmethod
    def pinned(cls, n: int) -> SplitkPolicy:
        """A pinned split count, clamped to 1..=16."""
        return cls(kind="pinned", n=min(max(n, 1), MAX_DECODE_SPLITS))

    @classmethod
    def parse(cls, text: str) -> SplitkPolicy | None:
        """``legacy`` | ``auto`` | ``0``/``off``/``false``/``no`` (one split) | a u32
        count (clamped to 1..=16), trimmed and case-insensitive; None otherwise."""
        word = _normal(text)
        if word == "legacy":
            return cls.LEGACY
        if word == "auto":
            return cls.AUTO
        if word in _OFF_WORDS:
            return cls.pinned(1)
        count = _parse_u32(word)
        return None if count is None else cls.pinned(count)

    @property
    def label(self) -> str:
        """The spelling :meth:`parse` reads back as this policy."""
        return str(self.n) if self.kind == "pinned" else self.kind


SplitkPolicy.LEGACY = SplitkPolicy(kind="legacy")
SplitkPolicy.AUTO = SplitkPolicy(kind="auto")


def resolve_policy(declared: str, raw: str | None) -> tuple[SplitkPolicy, bool]:
    """The declaration (unparseable -> legacy), overridden by a parseable ``raw``.

    Returns ``(policy, from_env)``.
    """
    policy = SplitkPolicy.parse(declared) or SplitkPolicy.LEGACY
    override = None if raw is None else SplitkPolicy.parse(raw)
    return (policy, False) if override is None else (override, True)
