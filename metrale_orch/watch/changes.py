"""What really changed under the watched roots, decided by content.

A watcher's events say where to look, never what changed: an editor's save that writes
the same bytes, a temporary file created and removed within one burst, or a rename over
the source all arrive as events. :class:`FileTable` holds each watched file's saved state
(:data:`~metrale_orch.fsutil.FileState`: stat and xxh3 of its bytes, as doit's checker
keeps them) and answers, for the paths of a burst (:meth:`FileTable.confirm`) or for the
whole watched set (:meth:`FileTable.rescan`, when the events cannot be trusted: an
overflow, a watcher error, a branch switch), which files were added, removed or hold
other bytes. A file whose stat proves it unchanged is not read on a rescan; a path named
by an event is always read (its stat may lie within a clock tick).

The watched set (:func:`watched_roots`): ``kernels/``, ``toolchains/``, ``pyproject.toml``
and the HIP compat directory when one is set: everything task generation reads.
I/O: :func:`scan_files`, :meth:`FileTable.confirm`, :meth:`FileTable.rescan`.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.fsutil import FileState, file_digest, file_state, unchanged_since

__all__ = ["Changes", "FileTable", "scan_files", "watched_roots"]

#: The project file every generation reads beside the trees.
PYPROJECT = "pyproject.toml"


def watched_roots(root: Path, compat_dir: Path | None = None) -> tuple[str, ...]:
    """The root-relative places a build of ``root`` reads (pure): the trees, the toolchain
    definitions, the project's settings, the HIP compat directory (``compat_dir``, when set
    and inside ``root``)."""
    found = ["kernels", "toolchains", PYPROJECT]
    if compat_dir is not None:
        rel = compat_dir.relative_to(root) if compat_dir.is_relative_to(root) else compat_dir
        if not rel.is_absolute() and ".." not in rel.parts:
            found.append(rel.as_posix())
    return tuple(sorted(set(found)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Changes:
    """Root-relative POSIX paths whose content changed, appeared or disappeared, sorted."""

    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)

    def paths(self) -> tuple[str, ...]:
        """Every path of the change, sorted."""
        return tuple(sorted({*self.changed, *self.added, *self.removed}))


def _walk(root: Path, rel: str) -> Iterator[str]:
    """The root-relative files under ``rel`` (a file or a directory; nothing when absent),
    links and special files included (resolution refuses them: their presence counts)."""
    top = root / rel
    try:
        st = os.lstat(top)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        yield rel
        return
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        base = Path(dirpath).relative_to(root).as_posix()
        for name in sorted(filenames):
            yield f"{base}/{name}"
        for name in dirnames:  # a link to a directory is listed, never followed
            if os.path.islink(os.path.join(dirpath, name)):
                yield f"{base}/{name}"


def _state(path: str) -> FileState | None:
    """``path``'s state with its bytes hashed (a link: its target), None when absent."""
    taken = time.time_ns()
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return file_state(st, "link:" + os.readlink(path), taken)
        if not stat.S_ISREG(st.st_mode):
            return file_state(st, "other", taken)
        return file_state(st, file_digest(path), taken)
    except OSError:
        return None


def scan_files(root: Path, roots: Iterable[str]) -> dict[str, FileState]:
    """Every watched file's state, its bytes hashed (I/O)."""
    table: dict[str, FileState] = {}
    for rel in roots:
        for path in _walk(root, rel):
            state = _state(os.fspath(root / path))
            if state is not None:
                table[path] = state
    return table


class FileTable:
    """The watched files' states as the last cycle saw them (see the module docstring)."""

    def __init__(self, root: Path, roots: Iterable[str]) -> None:
        self.root = Path(root)
        self.roots = tuple(roots)
        self.states: dict[str, FileState] = scan_files(self.root, self.roots)

    def watches(self, rel: str) -> bool:
        """Whether the root-relative ``rel`` lies in the watched set (pure)."""
        return any(rel == r or rel.startswith(r + "/") for r in self.roots)

    def confirm(self, paths: Iterable[str]) -> Changes:
        """What changed at ``paths`` (root-relative): a file named is read; a directory
        stands for everything under it, read where its stat does not prove it unchanged.
        The table takes the new states (I/O)."""
        named: set[str] = set()
        under: set[str] = set()
        for rel in paths:
            if not self.watches(rel):
                continue
            inside = rel + "/"
            held = [p for p in self.states if p.startswith(inside)]
            if held or os.path.isdir(self.root / rel):
                under.update(held)
                under.update(_walk(self.root, rel))
            else:
                named.add(rel)
        fresh = {p: s for p in named if (s := _state(os.fspath(self.root / p))) is not None}
        fresh.update(self._restat(under - named))
        return self._apply(named | under, fresh)

    def rescan(self) -> Changes:
        """What changed anywhere in the watched set: every file stat-ed, read only where
        its stat does not prove it unchanged; the table takes the new states (I/O)."""
        found = {p for rel in self.roots for p in _walk(self.root, rel)}
        return self._apply(set(self.states) | found, self._restat(found))

    def _restat(self, paths: Iterable[str]) -> dict[str, FileState]:
        """The states of ``paths`` that exist: the saved one where the stat proves it
        still holds, else read."""
        fresh: dict[str, FileState] = {}
        for path in paths:
            old = self.states.get(path)
            try:
                st = os.lstat(self.root / path)
            except OSError:
                continue
            if old is not None and unchanged_since(st, old):
                fresh[path] = old
            elif (state := _state(os.fspath(self.root / path))) is not None:
                fresh[path] = state
        return fresh

    def _apply(self, wanted: set[str], fresh: Mapping[str, FileState]) -> Changes:
        changed, added, removed = [], [], []
        for path in sorted(wanted):
            old, new = self.states.get(path), fresh.get(path)
            if old is None and new is None:
                continue
            if old is None:
                added.append(path)
            elif new is None:
                removed.append(path)
            elif old[2] != new[2]:
                changed.append(path)
            if new is None:
                self.states.pop(path, None)
            else:
                self.states[path] = new
        return Changes(changed=tuple(changed), added=tuple(added), removed=tuple(removed))
