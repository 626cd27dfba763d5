"""The process-wide declaration and resolution: the one deliberate cache (SPEC 2.2).

A serving process installs its declaration (:func:`declare`) and resolves it
once (:func:`resolved`); the first completed resolution is kept for the life
of the process. The cache is explicit and :func:`reset_resolved` forgets it
(for tests). Thread-safe.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from metrale_orch.defaults.declaration import TargetDefaults, baseline
from metrale_orch.defaults.errors import AlreadyResolvedError
from metrale_orch.defaults.resolution import TargetLevers, format_levers, resolve

__all__ = ["declare", "declared", "reset_resolved", "resolved", "summary_line"]


@dataclass(slots=True)
class _Process:
    lock: threading.Lock = field(default_factory=threading.Lock)
    declared: TargetDefaults | None = None
    levers: TargetLevers | None = None


# The one deliberate cache (SPEC 2.2): explicit, and reset by reset_resolved().
_PROCESS = _Process()


def declare(defaults: TargetDefaults) -> None:
    """Install the declaration this process serves with (before :func:`resolved`).

    Raises:
        AlreadyResolvedError: a resolution of a different declaration is cached.
    """
    with _PROCESS.lock:
        current = _PROCESS.declared or baseline("")
        if _PROCESS.levers is not None and current != defaults:
            raise AlreadyResolvedError(current=current.hw, new=defaults.hw)
        _PROCESS.declared = defaults


def declared() -> TargetDefaults:
    """The installed declaration, or ``baseline("")`` (prints as ``unknown``)."""
    return _PROCESS.declared or baseline("")


def resolved(environ: Mapping[str, str] | None = None) -> TargetLevers:
    """The process-wide resolution: computed once (``environ`` defaults to
    ``os.environ``) and cached; later calls return the first result whatever
    ``environ`` they pass."""
    with _PROCESS.lock:
        if _PROCESS.levers is None:
            env = os.environ if environ is None else environ
            _PROCESS.levers = resolve(_PROCESS.declared or baseline(""), env.get)
        return _PROCESS.levers


def reset_resolved() -> None:
    """Forget the cached resolution and the installed declaration (for tests)."""
    with _PROCESS.lock:
        _PROCESS.levers = None
        _PROCESS.declared = None


def summary_line() -> str:
    """:func:`format_levers` of :func:`resolved`."""
    return format_levers(resolved())
