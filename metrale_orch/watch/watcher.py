"""The file watcher: a coroutine on an event loop it is given, handing bursts of paths to
the edit loop (watchfiles: inotify, FSEvents, ReadDirectoryChangesW through Rust's notify).

:func:`watch_tree` watches the directories of the watched set recursively and the project
root itself (not recursively, for ``pyproject.toml`` and for a watched directory that
appears or disappears, after which the watch starts again over what exists). Each batch
watchfiles yields (once ``step`` ms pass with no new event, at most ``debounce`` ms after
the first) becomes one :class:`Burst` of root-relative paths, whatever the events say
happened to them: the loop confirms by content. A batch too large to be an edit (a branch
switch), an error of the watcher, or a restart is a burst that asks for a rescan of
everything. It runs on the build's own event loop
(:class:`~metrale_orch.executor.loop.ActionLoop`), beside the compiles it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import watchfiles

from metrale_orch.executor.loop import ActionLoop

__all__ = ["Burst", "WatchTiming", "watch_tree", "watching"]

#: A batch naming more paths than this is treated as a rescan (a branch switch).
MAX_PATHS = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class Burst:
    """Paths (root-relative, POSIX) something happened to, or a request to look at all."""

    paths: frozenset[str] = frozenset()
    rescan: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchTiming:
    """watchfiles' grouping of events: a batch ends ``step_ms`` after the last event, and at
    the latest ``debounce_ms`` after the first."""

    step_ms: int = 10
    debounce_ms: int = 400


def _relative(root: Path, changes: Iterable[tuple[object, str]]) -> frozenset[str]:
    out = set()
    for _change, path in changes:
        with contextlib.suppress(ValueError):
            out.add(Path(path).relative_to(root).as_posix())
    return frozenset(out)


async def watch_tree(
    root: Path,
    roots: tuple[str, ...],
    put: Callable[[Burst], None],
    stop: asyncio.Event,
    timing: WatchTiming,
) -> None:
    """Watch ``roots`` (root-relative files and directories) under ``root`` until ``stop``
    is set, handing each batch to ``put`` (called on the loop; see the module docstring)."""
    watcher = _Watcher(root=Path(root), roots=roots, put=put, timing=timing)
    first = True
    while not stop.is_set():
        if not first:
            put(Burst(rescan=True))  # events may have been missed between two watches
        first = False
        try:
            await watcher.round(stop)
        except Exception:  # the watcher failed (an overflow, a directory gone): rescan
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Watcher:
    """What :func:`watch_tree` watches, and where its bursts go."""

    root: Path
    roots: tuple[str, ...]
    put: Callable[[Burst], None]
    timing: WatchTiming

    async def round(self, stop: asyncio.Event) -> None:
        """One watch over the directories that exist now, until ``stop`` or until one of
        them appears or goes."""
        ending = asyncio.Event()
        dirs = [self.root / r for r in self.roots if (self.root / r).is_dir()]
        top = frozenset(r.split("/", 1)[0] for r in self.roots)
        tasks = [asyncio.ensure_future(self._stream([self.root], ending, top, dirs))]
        if dirs:
            tasks.append(asyncio.ensure_future(self._stream(dirs, ending, None, dirs)))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.set()
            stopping.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                raise result

    async def _stream(
        self, paths: list[Path], ending: asyncio.Event, top: frozenset[str] | None, dirs: list[Path]
    ) -> None:
        """Hand over every batch of ``paths`` (recursively; ``top``: the root alone, only
        the entries so named) until ``ending``, or a watched directory appears or goes."""

        def at_top(_change: watchfiles.Change, path: str) -> bool:
            return top is not None and Path(path).name in top

        async for changes in watchfiles.awatch(
            *paths,
            watch_filter=None if top is None else at_top,
            debounce=self.timing.debounce_ms,
            step=self.timing.step_ms,
            stop_event=ending,
            recursive=top is None,
        ):
            rels = _relative(self.root, changes)
            self.put(Burst(paths=rels, rescan=len(rels) > MAX_PATHS))
            if top is not None and any(
                (self.root / r).is_dir() != (self.root / r in dirs) for r in rels
            ):
                return  # a watched directory appeared or went: watch again


@contextlib.contextmanager
def watching(
    root: Path,
    roots: tuple[str, ...],
    put: Callable[[Burst], None],
    timing: WatchTiming,
    loop: ActionLoop,
) -> Iterator[None]:
    """Watch ``roots`` under ``root`` on ``loop`` (the one the builds' compiles run on)
    for the ``with`` block."""
    stop = asyncio.Event()
    running = loop.submit(watch_tree(root, roots, put, stop, timing))
    try:
        yield
    finally:
        loop.call(stop.set)
        with contextlib.suppress(Exception):
            running.result(timeout=6)
