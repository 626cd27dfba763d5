"""The unit tier's guard: while it is on, starting a process of any kind fails the test.

``tests/unit/conftest.py`` turns it on (:func:`guarded`) around every phase of a unit
test. The five entry points it closes are the ones every way of starting a process goes
through (``subprocess`` and everything built on it, ``os.fork``, ``os.posix_spawn[p]``,
``os.system``). A call raises :class:`ProcessStarted`, a ``BaseException`` so a broad
``except Exception`` in the code under test cannot swallow it, and the guard remembers the
call so the phase fails even when the raise was caught anyway.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

ADVICE = (
    "a unit test started a process ({how}): tests that start doit, a server or a compiler"
    " belong in tests/scenarios/ (docs/development.md, 'Tests', says where a test goes)"
)


class ProcessStarted(BaseException):
    """A process was started under the guard (``BaseException``: not caught by accident)."""


def _closed(how: str, seen: list[str]) -> Callable[..., Any]:
    def refuse(*_args: object, **_kwargs: object) -> Any:
        seen.append(how)
        raise ProcessStarted(ADVICE.format(how=how))

    return refuse


_DOORS: tuple[tuple[object, str], ...] = (
    (_posixsubprocess, "fork_exec"),
    (os, "fork"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (subprocess.Popen, "_execute_child"),
)


@contextlib.contextmanager
def no_process_started() -> Iterator[list[str]]:
    """Close every door to a new process until the block ends; yields the list of the
    attempts (``"os.fork"`` …), so a caller can fail on one that was caught."""
    seen: list[str] = []
    saved = [(owner, name, getattr(owner, name)) for owner, name in _DOORS if hasattr(owner, name)]
    for owner, name, _ in saved:
        how = f"{getattr(owner, '__name__', 'subprocess.Popen')}.{name}"
        setattr(owner, name, _closed(how, seen))
    try:
        yield seen
    finally:
        for owner, name, door in saved:
            setattr(owner, name, door)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """:func:`no_process_started`, then fail the test if a process was started in the block
    (even one whose :class:`ProcessStarted` the code under test caught)."""
    with no_process_started() as seen:
        yield
    if seen:
        pytest.fail(ADVICE.format(how=", ".join(seen)), pytrace=False)
