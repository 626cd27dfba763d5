"""One setting's value, checked and converted (pure but for ``~`` and the root): the
kinds a setting can be (text, a path, seconds, a count, a table, gRPC headers, the
signing key, trusted key lines), and the public key lines of ``cache_trusted_keys``.

A malformed value is a :class:`ConfigError` naming where it was set and the key; a key
line's message never quotes the line (it may be a private key pasted by mistake).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType

from metrale_orch.errors import MetraleError

__all__ = [
    "CACHE_MODES",
    "MAX_BYTES",
    "MAX_JOBS",
    "PUBLIC_KEY_PREFIX",
    "ConfigError",
    "Setting",
    "convert",
    "key_line_name",
    "key_line_problem",
    "parse_public_key_line",
    "size_bytes",
]

CACHE_MODES = ("read-write", "read-only", "off")


class ConfigError(MetraleError):
    """A configuration value is malformed or unknown; names where and which key."""

    where: str
    key: str
    problem: str

    template = "{where}: {key}: {problem}"


#: A size people type: ``500M``, ``2G``, ``1.5GiB``, ``4096`` (powers of 1024).
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
#: What a size may look like, for messages.
_SIZE_HINT = 'a number of bytes, or a number with K, M, G or T (powers of 1024) such as "40M"'
#: The largest size a setting takes (``memory``, ``size_budget``): 1024T, a pebibyte. A
#: larger one is a typo, and one past a C integer overflows where it is used.
MAX_BYTES = 1024**5
#: A ``size_budget`` key: a hardware, or a target ``hw/model/quant``.
_BUDGET_KEY = re.compile(r"[^/\s]+(/[^/\s]+/[^/\s]+)?")


def size_bytes(text: str) -> int | None:
    """Bytes for ``500M``, ``2G``, ``1.5GiB``, ``4096`` (powers of 1024), or None when
    ``text`` is no such size (pure)."""
    m = _SIZE_RE.fullmatch(text)
    if m is None:
        return None
    number, unit, _ = m.groups()
    # Decimal, not float: exact, and a number of 400 digits is no OverflowError.
    return int(Decimal(number) * _SIZE_UNITS[unit.lower()])


#: A converted setting: text, a path, seconds, a count, a table, key lines, or None.
Setting = str | Path | float | int | Mapping[str, object] | tuple[str, ...] | None

#: How a public key line starts (``metrale-orch cache keygen`` prints one).
PUBLIC_KEY_PREFIX = "ed25519:"
_PEM_START = "-----BEGIN"
#: A label shown in a message about its line: short, and nothing like key material.
_SHOWN_LABEL = re.compile(r"[A-Za-z0-9][\w.@:-]{0,31}")


def parse_public_key_line(text: str) -> tuple[bytes, str]:
    """(32 raw Ed25519 public key bytes, label) of ``ed25519:<base64> [label]`` (pure).

    Raises ``ValueError`` saying what is wrong, never quoting the line (it may be a
    private key pasted by mistake).
    """
    body, _, label = text.strip().partition(" ")
    if not body.startswith(PUBLIC_KEY_PREFIX):
        raise ValueError(f"does not start with {PUBLIC_KEY_PREFIX!r}")
    try:
        raw = base64.b64decode(body[len(PUBLIC_KEY_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the key after 'ed25519:' is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"the key is {len(raw)} bytes, an Ed25519 public key is 32")
    return raw, label.strip()


def _looks_private(text: str) -> bool:
    """Whether ``text`` looks like a private key: PEM armour (``-----BEGIN``, ``PRIVATE
    KEY-----``), or anything over several lines. A label is free text: ``private-ci`` is
    not armour, and a line `metrale-orch cache keygen --label private-ci` printed parses."""
    return _PEM_START in text or "KEY-----" in text.upper() or "\n" in text.strip()


def key_line_name(index: int, line: str) -> str:
    """How a message names the ``index``-th (0-based) line of ``cache_trusted_keys``: by
    its position, and its label when it has a short one (pure). Never any of its text
    but such a label: the line may be a private key."""
    name = f"line {index + 1} of cache_trusted_keys"
    _, _, label = line.strip().partition(" ")
    label = label.strip()
    if not _looks_private(line) and _SHOWN_LABEL.fullmatch(label):
        name += f" (label {label})"
    return name


def key_line_problem(line: str) -> str:
    """What is wrong with ``line`` as a ``cache_trusted_keys`` line, or "" (pure); says
    what to paste instead and never quotes the line."""
    if _looks_private(line):
        return (
            "looks like a private key, not a public key line (not shown): a private key "
            "never goes in cache_trusted_keys; paste the line `metrale-orch cache keygen` "
            "printed, ed25519:<base64> [label] (and make a new key if this one was shared)"
        )
    try:
        parse_public_key_line(line)
    except ValueError as exc:
        return (
            f"not a public key line ({exc}): paste the line `metrale-orch cache keygen` "
            "printed, ed25519:<base64> [label]"
        )
    return ""


_BOOLS = {"true": True, "1": True, "yes": True, "on": True,
          "false": False, "0": False, "no": False, "off": False}  # fmt: skip

#: The most ``jobs`` (and ``remote_jobs``) a setting may ask for: each local slot is a
#: thread of doit's (``num_process``) and a jobserver slot file; each remote one an Execute
#: stream (the actions in flight hold no thread: issue 45).
MAX_JOBS = 1024
#: The largest ``count`` (``log_max_bytes``, ``log_backups``): what a C ``long`` holds.
_MAX_COUNT = 2**63 - 1

#: Integer kinds: (least value, most value, what a value that is no integer must be, what
#: one out of range must be).
_INTEGERS: dict[str, tuple[int, int, str, str]] = {
    "count": (0, _MAX_COUNT, "an integer", f"a non-negative integer of at most {_MAX_COUNT}"),
    "jobs": (
        1,
        MAX_JOBS,
        "a positive integer (compiles at once)",
        f"a positive integer (compiles at once) of at most {MAX_JOBS}",
    ),
}

#: The longest a deadline may be: a year (Python's waits overflow past ~9.2e9 s, and a
#: REAPI Duration past ~3.2e11 s).
_MAX_SECONDS = 366 * 24 * 3600.0


def convert(kind: str, value: object, where: str, key: str, root: Path, from_text: bool) -> Setting:
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(where, key, f"must be a string, got {type(value).__name__}")
        return value
    if kind == "path":
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(where, key, "must be a non-empty path string")
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else root / p
    if kind == "optpath":
        if not isinstance(value, str):
            raise ConfigError(where, key, f"must be a path string, got {type(value).__name__}")
        if not value.strip():
            return None
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else root / p
    if kind == "mode":
        if not isinstance(value, str) or value.strip().lower() not in CACHE_MODES:
            raise ConfigError(where, key, f"must be one of {', '.join(CACHE_MODES)}, got {value!r}")
        return value.strip().lower()
    if kind == "seconds":
        return _seconds(value, where, key, from_text)
    if kind in _INTEGERS:
        return _integer(kind, value, where, key, from_text)
    if kind == "grpc":
        if not isinstance(value, str):
            raise ConfigError(where, key, f"must be a string, got {type(value).__name__}")
        text = value.strip()
        if text and not re.fullmatch(r"grpcs?://[^/\s]+(:\d+)?/?", text):
            raise ConfigError(
                where, key, f"must be grpc://host:port or grpcs://host:port, got {value!r}"
            )
        return text.rstrip("/")
    if kind == "bool":
        if isinstance(value, str) and from_text and value.strip().lower() in _BOOLS:
            return _BOOLS[value.strip().lower()]
        if not isinstance(value, bool):
            raise ConfigError(where, key, f"must be true or false, got {value!r}")
        return value
    if kind == "headers":
        table = convert("table", value, where, key, root, from_text)
        assert isinstance(table, Mapping)
        for name, header in table.items():
            if not isinstance(header, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name):
                raise ConfigError(
                    where,
                    key,
                    f"header {name!r}: a lower-case gRPC metadata name with a string value "
                    "is needed",
                )
        return table
    if kind == "memory":
        return _memory(value, where, key)
    if kind == "size_budget":
        table = convert("table", value, where, key, root, from_text)
        assert isinstance(table, Mapping)
        return MappingProxyType(
            {name: _budget(limit, where, key, name) for name, limit in sorted(table.items())}
        )
    if kind == "deploy":
        return _deploy(convert("table", value, where, key, root, from_text), where, key)
    if kind == "signing_key":
        return _signing_key(value, where, key, root)
    if kind == "public_keys":
        return _public_keys(value, where, key, from_text)
    if kind == "table":
        if from_text and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:  # JSONDecodeError, or an int past 4300 digits
                raise ConfigError(where, key, f"must be a JSON object: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError(where, key, "must be a table (a JSON object in the environment)")
        return MappingProxyType(dict(value))
    raise AssertionError(kind)


def _seconds(value: object, where: str, key: str, from_text: bool) -> float:
    """A deadline in seconds: positive and at most a year (never NaN or infinite)."""
    if from_text and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(
                where, key, f"must be a number of seconds, got {_shown(value)}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(where, key, f"must be a positive number of seconds, got {_shown(value)}")
    if not value <= _MAX_SECONDS:  # inf, or past what a process wait can take
        raise ConfigError(
            where, key, f"must be at most {_MAX_SECONDS:.0f} seconds (a year), got {_shown(value)}"
        )
    return float(value)


def _integer(kind: str, value: object, where: str, key: str, from_text: bool) -> int:
    """An integer of one of the :data:`_INTEGERS` kinds, within its range."""
    least, most, not_a_number, out_of_range = _INTEGERS[kind]
    if from_text and isinstance(value, str):
        try:
            value = int(value)
        except ValueError:  # not digits, or past Python's 4300 digits
            raise ConfigError(where, key, f"must be {not_a_number}, got {_shown(value)}") from None
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ConfigError(where, key, f"must be {out_of_range}, got {_shown(value)}")
    return value


def _budget(value: object, where: str, key: str, name: str) -> int:
    """One ``size_budget`` entry in bytes: ``"40M"`` or a whole number of bytes."""
    shown = f"{key}.{name}" if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'{key}."{name}"'
    if not _BUDGET_KEY.fullmatch(name):
        raise ConfigError(
            where, shown, "must name a hardware (hopper) or a target (hw/model/quant)"
        )
    return _bytes(value, where, shown)


def _bytes(value: object, where: str, shown: str) -> int:
    """A size in bytes: a whole number of bytes, or text such as ``"40M"``, of at most
    :data:`MAX_BYTES`."""
    size: int | None = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        size = value
    elif isinstance(value, str):
        size = size_bytes(value)
    if size is None:
        raise ConfigError(where, shown, f"must be {_SIZE_HINT}, got {_shown(value)}")
    if size > MAX_BYTES:
        raise ConfigError(where, shown, f"must be at most 1024T (a pebibyte), got {_shown(value)}")
    return size


def _shown(value: object) -> str:
    """``value`` as a message quotes it: its ``repr``, cut short past 40 characters (a
    number of 400 digits is one readable line)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _memory(value: object, where: str, key: str) -> int:
    """The ``memory`` setting in bytes: ``"16G"`` or a whole number of bytes; 0 or ""
    for the memory available when a build starts."""
    if isinstance(value, str) and not value.strip():
        return 0
    return _bytes(value, where, key)


#: The keys of a ``[tool.metrale-orch.deploy.<hw>]`` table.
_DEPLOY_KEYS = ("min_cuda",)


def _deploy(value: Setting, where: str, key: str) -> Mapping[str, Mapping[str, str]]:
    """``hw -> {"min_cuda": "MAJOR.MINOR"}``: a table of tables whose keys are known and
    whose versions are quoted ``MAJOR.MINOR`` strings."""
    assert isinstance(value, Mapping)
    out: dict[str, Mapping[str, str]] = {}
    for hw, table in sorted(value.items()):
        if not isinstance(table, dict):
            raise ConfigError(
                where, f"{key}.{hw}", "must be a table, e.g. [tool.metrale-orch.deploy.hopper]"
            )
        facts: dict[str, str] = {}
        for name, fact in sorted(table.items()):
            if name not in _DEPLOY_KEYS:
                known = ", ".join(_DEPLOY_KEYS)
                raise ConfigError(where, f"{key}.{hw}.{name}", f"unknown key (known keys: {known})")
            if not isinstance(fact, str) or not re.fullmatch(r"\d{1,3}\.\d{1,3}", fact.strip()):
                raise ConfigError(
                    where,
                    f"{key}.{hw}.{name}",
                    f'must be a CUDA version as a quoted "MAJOR.MINOR" string, e.g. "12.8"; '
                    f"got {fact!r}",
                )
            facts[name] = fact.strip()
        out[hw] = MappingProxyType(facts)
    return MappingProxyType(out)


def _signing_key(value: object, where: str, key: str, root: Path) -> str:
    """PEM text as is, else the absolute path of a key file ("" for none); never echoes
    the value (it may be the key itself)."""
    if not isinstance(value, str):
        kind = type(value).__name__
        raise ConfigError(where, key, f"must be a string (a path or a PEM key), got {kind}")
    text = value.strip()
    if not text or text.startswith(_PEM_START):
        return text
    if text.startswith(PUBLIC_KEY_PREFIX):
        raise ConfigError(
            where,
            key,
            "is a public key line (ed25519:...); this setting takes a private key: the path "
            "of a PEM file `metrale-orch cache keygen` wrote, or its text (public key lines "
            "go in cache_trusted_keys)",
        )
    if "\n" in text:
        raise ConfigError(
            where, key, "is neither a path nor a PEM private key (-----BEGIN PRIVATE KEY-----)"
        )
    p = Path(os.path.expanduser(text))
    return str(p if p.is_absolute() else root / p)


def _public_keys(value: object, where: str, key: str, from_text: bool) -> tuple[str, ...]:
    """The key lines of a TOML array (a JSON array or comma-separated in the environment)."""
    if from_text and isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError as exc:  # JSONDecodeError, or an int past 4300 digits
                raise ConfigError(where, key, f"must be a JSON array of strings: {exc}") from None
        else:
            value = [part for part in text.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            where, key, "must be a list of public key lines (ed25519:<base64> [label])"
        )
    lines: list[str] = []
    for i, line in enumerate(value):
        problem = key_line_problem(line)
        if problem:  # named by position, never quoted: it may be a private key
            raise ConfigError(where, key_line_name(i, line), problem)
        lines.append(" ".join(line.split()))
    return tuple(sorted(set(lines)))
