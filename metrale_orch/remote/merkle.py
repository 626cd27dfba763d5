"""REAPI input roots: a tree of ``Directory`` messages built from relative paths.

:func:`build_input_root` takes ``{relative POSIX path: file on disk | bytes |
InputFile}`` and returns the root digest and the blobs it names. Invariants:

- Canonical form (REAPI v2 ``Directory``): files and subdirectories sorted by
  name (code point order, which is UTF-8 byte order), no duplicates, no symlinks,
  ``node_properties`` absent, serialized deterministically. The same tree always
  has the same root digest, whatever order the mapping lists it in.
- Rejected before anything is hashed: absolute paths, empty, ``.`` or ``..``
  components, NUL, names that are not UTF-8 (an undecodable file name), and a path
  that is both a file and a directory (``a`` and ``a/b``).
- Files on disk are hashed by the caller's ``hasher`` (its own cache, if any) and
  stay on disk: the blob source maps their digest to the path, so the client streams
  them at upload time and never holds a big file in memory. Directory blobs are small
  and kept as bytes.
- A :class:`MerkleMemo` keeps directory digests by content (the tuple of their
  ``(name, digest, executable)`` entries), so thousands of actions sharing a subtree
  serialize and hash it once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.digest import Digest, digest_bytes, digest_file
from metrale_orch.remote.errors import InputRootError
from metrale_orch.remote.wire import digest_message

__all__ = [
    "Blob",
    "InputFile",
    "InputRoot",
    "MerkleMemo",
    "build_input_root",
    "directory_blob",
]

#: A blob's content: bytes in memory, or a file read (streamed) when it is uploaded.
Blob = bytes | Path

#: A directory's content as the memo keys it: (files as (name, digest, executable),
#: subdirectories as (name, digest)), each sorted by name.
_DirKey = tuple[tuple[tuple[str, Digest, bool], ...], tuple[tuple[str, Digest], ...]]


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input: a file on disk or bytes, and whether the worker must make it executable."""

    source: Path | bytes
    executable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class InputRoot:
    """A built input root: its digest and every blob the tree names (directories included)."""

    digest: Digest
    blobs: Mapping[Digest, Blob]


class MerkleMemo:
    """Directory digests and blobs by content, shared by every input root of a run.

    Thread-safe. At ``max_entries`` it starts afresh (a build's shared subtrees come back
    within moments; a bound keeps a long run's memory flat)."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        self._dirs: dict[_DirKey, tuple[Digest, bytes]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def directory(self, key: _DirKey) -> tuple[Digest, bytes]:
        """The digest and serialized ``Directory`` of ``key``, built once."""
        with self._lock:
            found = self._dirs.get(key)
            if found is not None:
                self.hits += 1
                return found
        built = directory_blob(*key)
        with self._lock:
            self.misses += 1
            if len(self._dirs) >= self.max_entries:
                self._dirs.clear()
            self._dirs[key] = built
        return built


def directory_blob(
    files: tuple[tuple[str, Digest, bool], ...], dirs: tuple[tuple[str, Digest], ...]
) -> tuple[Digest, bytes]:
    """The canonical ``Directory`` of entries already sorted by name: (digest, bytes) (pure)."""
    message = re_pb2.Directory(
        files=[
            re_pb2.FileNode(name=name, digest=digest_message(d), is_executable=executable)
            for name, d, executable in files
        ],
        directories=[re_pb2.DirectoryNode(name=name, digest=digest_message(d)) for name, d in dirs],
    )
    data = message.SerializeToString(deterministic=True)
    return digest_bytes(data), data


#: A directory while the tree is built: name -> subdirectory or file.
_Node = dict[str, "_Node | InputFile"]


def build_input_root(
    files: Mapping[str, Path | bytes | InputFile],
    *,
    hasher: Callable[[Path], Digest] = digest_file,
    memo: MerkleMemo | None = None,
) -> InputRoot:
    """The input root holding ``files`` (see the module docstring).

    A plain ``Path`` or ``bytes`` is a non-executable file; :class:`InputFile` says
    otherwise. Raises :class:`InputRootError` for a path that cannot be in a tree, and
    what ``hasher`` raises (``OSError`` for an unreadable file).
    """
    tree = _tree(files)
    blobs: dict[Digest, Blob] = {}
    root = _digest_tree(tree, hasher, memo if memo is not None else MerkleMemo(), blobs)
    return InputRoot(digest=root, blobs=MappingProxyType(blobs))


def _tree(files: Mapping[str, Path | bytes | InputFile]) -> _Node:
    root: _Node = {}
    for path in sorted(files):
        parts = _parts(path)
        node = root
        for depth, name in enumerate(parts[:-1]):
            child = node.setdefault(name, {})
            if isinstance(child, InputFile):
                prefix = "/".join(parts[: depth + 1])
                raise InputRootError(path, f"{prefix!r} is also an input file")
            node = child
        spec = files[path]
        if parts[-1] in node:
            raise InputRootError(path, "is also a directory of other inputs")
        node[parts[-1]] = spec if isinstance(spec, InputFile) else InputFile(spec)
    return root


def _parts(path: str) -> list[str]:
    if not isinstance(path, str) or not path:
        raise InputRootError(str(path), "an input path must be a non-empty string")
    if path.startswith("/"):
        raise InputRootError(path, "absolute; input paths are relative to the input root")
    parts = path.split("/")
    for name in parts:
        if name in ("", ".", ".."):
            raise InputRootError(path, f"has a {name or 'empty'!r} component; use a plain path")
        if "\0" in name:
            raise InputRootError(path, "contains NUL")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InputRootError(path, "is not valid UTF-8 (REAPI names are UTF-8)") from None
    return parts


def _digest_tree(
    node: _Node, hasher: Callable[[Path], Digest], memo: MerkleMemo, blobs: dict[Digest, Blob]
) -> Digest:
    files: list[tuple[str, Digest, bool]] = []
    dirs: list[tuple[str, Digest]] = []
    for name in sorted(node):
        child = node[name]
        if isinstance(child, InputFile):
            source = child.source
            digest = digest_bytes(source) if isinstance(source, bytes) else hasher(source)
            blobs.setdefault(digest, source)
            files.append((name, digest, child.executable))
        else:
            dirs.append((name, _digest_tree(child, hasher, memo, blobs)))
    digest, data = memo.directory((tuple(files), tuple(dirs)))
    blobs.setdefault(digest, data)
    return digest
