"""The defaults' errors, and how their messages spell TOML values.

Every error is a :class:`DefaultsError` carrying the root-relative file
(``path``) and the offending ``key`` as attributes; messages say what, where
and what to do. Imports nothing of the package but :mod:`metrale_orch.errors`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence

from metrale_orch.errors import MetraleError

__all__ = [
    "LEVERS_PATH",
    "LEVERS_TOML",
    "AlreadyResolvedError",
    "DefaultsError",
    "DefaultsValueError",
    "LeverDeclarationError",
    "UnknownHardwareError",
    "UnknownLeverError",
    "seen",
    "toml_repr",
    "toml_type",
]

#: The file under ``kernels/`` where a tree declares levers of its own (SPEC 2.5).
LEVERS_TOML = "LEVERS.toml"
#: ... and its root-relative path, as messages and docs name it.
LEVERS_PATH = f"kernels/{LEVERS_TOML}"


class DefaultsError(MetraleError):
    """A ``[defaults]`` declaration, ``kernels/LEVERS.toml`` (or a baked copy) cannot be used.

    ``path`` is the root-relative file (``kernels/<hw>/HARDWARE.toml``) and
    ``key`` the offending key, where there is one.
    """

    def __init__(self, message: str, *, path: str = "", key: str = "") -> None:
        self.path = path
        self.key = key
        super().__init__(message)


def _at(table: str, key: str) -> str:
    return f"[{table}] {key}" if table else key


class DefaultsValueError(DefaultsError):
    """A key holds a value of the wrong type or out of range."""

    def __init__(
        self,
        *,
        path: str,
        table: str,
        key: str,
        value: object,
        expected: str,
        got: str | None = None,
    ) -> None:
        self.table = table
        self.value = value
        self.expected = expected
        super().__init__(
            f"{path}: {_at(table, key)} must be {expected}, got "
            f"{seen(value, expected) if got is None else got}; fix the value in {path}",
            path=path,
            key=key,
        )


class UnknownLeverError(DefaultsError):
    """``[defaults]`` holds keys that name no lever (a typo must not read as the baseline).

    ``keys`` are all of them, sorted; ``key`` is their comma-separated list.
    """

    def __init__(
        self, *, path: str, table: str, keys: Sequence[str], valid: tuple[str, ...]
    ) -> None:
        self.table = table
        self.keys = tuple(keys)
        self.valid = valid
        named = []
        for key in self.keys:
            near = difflib.get_close_matches(key, valid, n=1, cutoff=0.8)
            named.append(f"{key!r} (did you mean {near[0]!r}?)" if near else repr(key))
        what = "an unknown lever" if len(named) == 1 else f"{len(named)} unknown levers"
        where = f"[{table}] has" if table else "has"
        super().__init__(
            f"{path}: {where} {what}: {', '.join(named)}; known levers: {', '.join(valid)}. "
            f"A lever added upstream after this metrale-orch release is declared in "
            f"{LEVERS_PATH} (a [[lever]] with name, type, baseline, variables and rule; "
            f"see docs/defaults.md)",
            path=path,
            key=", ".join(self.keys),
        )


class UnknownHardwareError(DefaultsError):
    """No ``kernels/<hw>/HARDWARE.toml`` for the hardware asked for."""

    def __init__(self, *, path: str, hw: str) -> None:
        self.hw = hw
        super().__init__(
            f"{path} not found: no hardware {hw!r} in this tree "
            f"(run `metrale-orch` from the project root or pass --root)",
            path=path,
        )


class LeverDeclarationError(DefaultsError):
    """A ``[[lever]]`` entry of ``kernels/LEVERS.toml`` cannot be used.

    ``lever`` is the entry's ``name`` (or ``#<n>``, its 1-based position, when
    the name itself is the problem) and ``key`` the offending key; ``item``
    (``[i]``, ``[band][i]``) points into an array value.
    """

    def __init__(self, *, path: str, lever: str, key: str, problem: str, item: str = "") -> None:
        self.lever = lever
        self.item = item
        super().__init__(
            f"{path}: [[lever]] {lever}: {key}{item} {problem}; fix the entry in {path}",
            path=path,
            key=key,
        )


class AlreadyResolvedError(DefaultsError):
    """:func:`declare` was called with another declaration after :func:`resolved` ran."""

    def __init__(self, *, current: str, new: str) -> None:
        self.current = current
        self.new = new
        super().__init__(
            f"the process-wide target defaults were already resolved for {current or 'unknown'!r}; "
            f"declare {new or 'unknown'!r} before the first resolved() call"
        )


def toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "table"
    return type(value).__name__  # datetime, date, time


def toml_repr(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{...}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_repr(v) for v in value) + "]"
    return str(value)


def seen(value: object, expected: str = "") -> str:
    """``a boolean (true)``; a too large or negative integer where one is expected:
    ``-1, out of range``."""
    kind = toml_type(value)
    if kind == "integer" and expected.startswith("an integer"):
        return f"{toml_repr(value)}, out of range"
    article = "an" if kind[0] in "aeiou" else "a"
    return f"{article} {kind} ({toml_repr(value)})"
