"""Artefacts already obtained in a run (held by the run's ``BuildSession``).

A module whose key was compiled or fetched earlier in the run is reused from
memory when the files its compile read still match.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from metrale_orch.steps.deps import Input

__all__ = ["ArtefactMemo", "Obtained", "Origin"]

#: How the first target to need an artefact got it: compiled in this run, or from a tier.
Origin = Literal["compiled", "local", "remote"]


@dataclass(frozen=True, slots=True)
class Obtained:
    """An artefact, the inputs its compile read, and how the run got it (a target reusing
    it built from this run's compile, or from a cache)."""

    data: bytes
    inputs: tuple[Input, ...]
    origin: Origin = "compiled"


class ArtefactMemo:
    """Per-process: artefacts compiled or fetched by key, and one in-flight owner per key.

    Bounded by bytes (oldest dropped first); the cache is the durable store. A
    memoised artefact is reused only when its recorded inputs still match, like
    a cache entry (two targets may share a key while a file the scan missed
    differs between their stages).
    """

    def __init__(self, max_bytes: int = 256 * 1024 * 1024) -> None:
        self._lock = threading.Lock()
        self._data: OrderedDict[tuple[str, str], Obtained] = OrderedDict()
        self._size = 0
        self._max = max_bytes
        self._claims: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def claim(self, key: str) -> AsyncIterator[None]:
        """Hold ``key`` for the ``async with`` block: one pipeline per key at a time (the
        others wait on the event loop, holding no thread, then find the artefact here)."""
        with self._lock:
            lock = self._claims.setdefault(key, asyncio.Lock())
        async with lock:
            yield

    def get(self, key: str, artefact: str) -> Obtained | None:
        with self._lock:
            got = self._data.get((key, artefact))
            if got is not None:
                self._data.move_to_end((key, artefact))
            return got

    def holds(self, key: str, artefact: str) -> bool:
        """Whether the artefact of ``key`` is held (it may be dropped before it is read)."""
        with self._lock:
            return (key, artefact) in self._data

    def put(self, key: str, artefact: str, obtained: Obtained) -> None:
        size = len(obtained.data)
        with self._lock:
            if size > self._max:
                return
            old = self._data.pop((key, artefact), None)
            if old is not None:
                self._size -= len(old.data)
            self._data[(key, artefact)] = obtained
            self._size += size
            while self._size > self._max:
                _, dropped = self._data.popitem(last=False)
                self._size -= len(dropped.data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._claims.clear()
            self._size = 0
