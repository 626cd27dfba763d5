"""The cached file-system view of one tree, and the one memo every pass cache uses.

:class:`FileView` lists directories and parses TOML files under a project
root, each once: every file is keyed by its root-relative POSIX spelling (the
spelling messages use too), and a ``Path`` is made once per file, for the
values handed out. :class:`Memo` is the one caching idiom of a resolution
pass for what can fail: it keeps a function's result *or* the
:class:`LayoutError` it raised, by key, so a failure is as cheap to repeat as
a success. The two lookups that cannot fail and run tens of thousands of
times a pass (a spelling's ``Path``, a directory's listing) are plain dicts
read inline. Nothing here
writes; a view holds what it read until it is dropped (one pass).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Final, Generic, Literal, TypeVar

from metrale_orch.fsutil import parse_toml
from metrale_orch.tree.errors import LayoutError, ManifestError

__all__ = ["FileView", "Kind", "Memo", "TomlDoc", "child_maker"]

#: What a directory's listing says a child is (a symlink is never followed).
Kind = Literal["link", "dir", "file", "other"]
#: A parsed TOML document (``tomllib``'s tables are dicts).
TomlDoc = dict[str, object]

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")
#: Not listed yet (a listing may be None: not a directory).
_UNLISTED: Final[dict[str, Kind]] = {}


class Memo(Generic[_K, _V]):
    """Results of one function by key, errors included, for one pass.

    ``memo.get(key, make, *args)`` returns the result stored for ``key``, or
    re-raises the :class:`LayoutError` stored for it, or calls
    ``make(*args)`` once and stores what it returns or raises.
    """

    __slots__ = ("_done",)

    def __init__(self, seed: Mapping[_K, _V] | None = None) -> None:
        self._done: dict[_K, _V | LayoutError] = dict(seed) if seed else {}

    def get(self, key: _K, make: Callable[..., _V], *args: object) -> _V:
        try:
            value = self._done[key]
        except KeyError:
            pass  # made below, outside the handler: an error must not chain a KeyError
        else:
            if isinstance(value, LayoutError):
                raise value
            return value
        try:
            made = make(*args)
        except LayoutError as exc:
            self._done[key] = exc
            raise
        self._done[key] = made
        return made


def child_maker(parent: Path) -> Callable[[str], Path]:
    """A function making ``parent / name`` for single components ``name``.

    The one use of a private ``pathlib`` method (``_make_child_relpath``,
    Python 3.11-3.12), which skips re-parsing the parent; elsewhere (and if it
    goes away) ``parent.joinpath``, with the same result.
    """
    make: Callable[[str], Path] | None = getattr(parent, "_make_child_relpath", None)
    return make if make is not None else parent.joinpath


class FileView:
    """Listings and parsed TOML files of one tree, memoised for one resolution pass.

    Make a new view (a :class:`~metrale_orch.tree.TreeSnapshot`) for each
    independent pass.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.kernels = self.root / "kernels"
        self._root_s = os.fspath(self.root)
        # os.path.join(root, rel) without its generality (rel is one str, rarely absolute).
        self._prefix = self._root_s if self._root_s.endswith("/") else self._root_s + "/"
        # Paths and listings never fail, and they are the hottest lookups of a pass (tens
        # of thousands): plain dicts, looked up inline. Everything that can fail is a Memo.
        self._paths: dict[str, Path] = {"": self.root, "kernels": self.kernels}
        self._child_kinds: dict[str, dict[str, Kind] | None] = {}
        self._listings: Memo[str, tuple[tuple[str, Kind], ...] | None] = Memo()
        self._tomls: Memo[str, TomlDoc | None] = Memo()

    # -- paths

    def path(self, rel: str) -> Path:
        """The Path of a root-relative POSIX spelling, made once per pass."""
        found = self._paths.get(rel)
        if found is None:
            head, _, tail = rel.rpartition("/")
            found = self._paths[rel] = child_maker(self.path(head))(tail)
        return found

    def rel(self, path: Path | str) -> str:
        """Root-relative POSIX spelling of a path under the root (a str is taken as one)."""
        if isinstance(path, str):
            return path
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return path.as_posix()

    def _fs(self, rel: str) -> str:
        """``os.path.join(root, rel)`` for a non-empty spelling."""
        return rel if rel[0] == "/" else self._prefix + rel

    # -- file system, memoised

    def listing(self, directory: Path | str) -> tuple[tuple[str, Kind], ...] | None:
        """Sorted (name, kind) children of a directory, or None when it is not one."""
        rel = self.rel(directory)
        return self._listings.get(rel, self._sorted_listing, rel)

    def _sorted_listing(self, rel: str) -> tuple[tuple[str, Kind], ...] | None:
        kinds = self.kinds_of(rel)
        return None if kinds is None else tuple(sorted(kinds.items()))

    def kinds_of(self, rel: str) -> dict[str, Kind] | None:
        """name -> kind of a directory's children (listing order), or None: not a directory."""
        kinds = self._child_kinds.get(rel, _UNLISTED)
        if kinds is _UNLISTED:
            kinds = self._child_kinds[rel] = self._scandir(rel)
        return kinds

    def _scandir(self, rel: str) -> dict[str, Kind] | None:
        kinds: dict[str, Kind] = {}
        try:
            with os.scandir(self._fs(rel) if rel else self._root_s) as it:
                for de in it:
                    # Without following links, a symlink is neither a file nor a directory.
                    if de.is_file(follow_symlinks=False):
                        kinds[de.name] = "file"
                    elif de.is_dir(follow_symlinks=False):
                        kinds[de.name] = "dir"
                    elif de.is_symlink():
                        kinds[de.name] = "link"
                    else:
                        kinds[de.name] = "other"
        except (FileNotFoundError, NotADirectoryError):
            return None
        return kinds

    def kind(self, rel: str) -> Kind | None:
        """The kind of a path as its parent's listing says (None: absent)."""
        head, _, tail = rel.rpartition("/")
        kinds = self.kinds_of(head)
        return None if kinds is None else kinds.get(tail)

    def is_dir(self, path: Path | str) -> bool:
        """A directory (not a symlink to one)."""
        return self.kinds_of(self.rel(path)) is not None

    def is_file(self, rel: str) -> bool:
        """A regular file, or a symlink to one (as the file system would read it)."""
        kind = self.kind(rel)
        return kind == "file" or (kind == "link" and os.path.isfile(self.path(rel)))

    def not_a_file(self, rel: str) -> bool:
        """Something is there that is not a regular file (a directory, a FIFO, a link to one)."""
        kind = self.kind(rel)
        if kind == "link":
            path = self.path(rel)
            return os.path.exists(path) and not os.path.isfile(path)
        return kind in ("dir", "other")

    def toml(self, path: Path | str) -> TomlDoc | None:
        """The parsed TOML file, None when it is not a file; raises ManifestError when bad."""
        rel = self.rel(path)
        return self._tomls.get(rel, self._parse_toml, rel)

    def _parse_toml(self, rel: str) -> TomlDoc | None:
        if not self.is_file(rel):
            return None
        try:
            with open(self._fs(rel), "rb") as fh:
                return parse_toml(fh.read().decode("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            error = ManifestError(self.path(rel), rel, None, f"cannot be read as TOML: {exc}")
        raise error  # outside the handler: the error stands alone, as it always has
