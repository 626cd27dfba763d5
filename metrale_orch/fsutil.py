"""Atomic file writes (the one way this package replaces a file), the digests (of a file,
bytes or text: xxh3-64 for file states, xxh3-128 for content), and the one rule for
trusting a file's stat instead of its bytes.

A reader never sees a partial file: data goes to a temporary name in the same
directory (unique per process and thread) and is renamed into place. No fsync:
the rename makes an interrupted process safe, which is what the build promises;
a power loss may need ``doit forget`` and a rebuild.

A saved file state (:data:`FileState`) is ``[mtime_ns, size, digest, change_ns,
inode]``. A later stat proves the file unchanged only when all four of mtime, size,
change time and inode are equal and the change time was *settled* when the state was
taken: older than :data:`RACY_NS` at that moment (git's "racy" entries). mtime alone
proves nothing: ``os.utime`` sets it back, ``tar --mtime`` gives every release the
same one, and coarse file systems (whole seconds, FAT's two) give an edit in the same
tick the same one. The change time (POSIX ``ctime``) is set by every write, rename,
``utime`` or ``chmod`` and cannot be set back; an unsettled one is recorded as ``0``,
which no real change time equals, so that state is compared by content (and then
refreshed) on its next check.

A memo whose content can change what a build serves or how it keys is read with
:func:`read_own` (or :func:`read_json_object`) and written with :func:`write_own`: it is
used only when it is the user's own (:func:`metrale_orch.ownership.not_own`), and
rebuilt as the user's own file otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from metrale_orch.ownership import not_own, read_own, read_regular

_BLOCK = 1 << 20

#: ``[mtime_ns, size, digest, change_ns, inode]`` of a file as a build left or read it
#: (saved states; ``change_ns`` is 0 when it was not settled, see the module docstring).
FileState = list[int | str]

#: How old a change time must be, when a stat is recorded, to be trusted later: a file
#: changed within this window of the stat could change again in the same clock tick
#: (coarse or whole-second file systems included) without its stat changing.
RACY_NS = 2 * 10**9


def change_ns(st: os.stat_result) -> int:
    """The time of the file's last change of any kind: POSIX ``ctime`` (set by every write,
    rename, ``utime`` and ``chmod``; it cannot be set back). On Windows ``st_ctime`` is
    the creation time, so mtime is the best there is."""
    return st.st_ctime_ns if os.name == "posix" else st.st_mtime_ns


def settled_change(st: os.stat_result, taken_ns: int) -> int:
    """``change_ns(st)`` when it was older than :data:`RACY_NS` at ``taken_ns`` (the moment
    ``st`` was taken), else 0: the change time a saved state may be trusted by."""
    change = change_ns(st)
    return change if change < taken_ns - RACY_NS else 0


def file_state(st: os.stat_result, digest: str, taken_ns: int) -> FileState:
    """The saved state of a file whose stat ``st`` (taken at ``taken_ns``) goes with bytes
    hashing to ``digest``."""
    return [st.st_mtime_ns, st.st_size, digest, settled_change(st, taken_ns), st.st_ino]


def unchanged_since(st: os.stat_result, state: object) -> bool:
    """Whether ``st`` proves the file still holds what the saved ``state`` describes, with
    no read: mtime, size, change time and inode equal, the change time settled. A state
    of another shape (an older record) proves nothing."""
    if not (isinstance(state, list | tuple) and len(state) == 5):
        return False
    return bool(
        st.st_mtime_ns == state[0]
        and st.st_size == state[1]
        and change_ns(st) == state[3]
        and st.st_ino == state[4]
        and state[3] != 0
    )


def file_digest(path: str) -> str:
    """xxh3-64 hex digest of a file's bytes (raises ``OSError``): the one digest of file
    states (doit's saved states, installed outputs, a build's inputs, the task cache)."""
    return _hexdigest(path, xxhash.xxh3_64())


def file_hash(path: str) -> str:
    """xxh3-128 hex digest of a file's bytes (raises ``OSError``): the content hash of
    files a compile read and of compiler binaries (cache keys and recorded inputs)."""
    return _hexdigest(path, xxhash.xxh3_128())


def _hexdigest(path: str, h: xxhash.xxh3_64 | xxhash.xxh3_128) -> str:
    with open(path, "rb") as fh:
        while chunk := fh.read(_BLOCK):
            h.update(chunk)
    return h.hexdigest()


def bytes_digest(data: bytes | bytearray | memoryview) -> str:
    """xxh3-64 hex digest of ``data``: :func:`file_digest` of bytes in hand (pure)."""
    return xxhash.xxh3_64_hexdigest(data)


def bytes_hash(data: bytes | bytearray | memoryview) -> str:
    """xxh3-128 hex digest of ``data``: :func:`file_hash` of bytes in hand (pure), the
    content hash of artefacts, cache objects and key documents."""
    return xxhash.xxh3_128_hexdigest(data)


def text_hash(text: str) -> str:
    """:func:`bytes_hash` of ``text`` as UTF-8, lone surrogates (undecodable bytes of a
    file name or an output) as the bytes they stand for (pure)."""
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogateescape"))


__all__ = [
    "RACY_NS",
    "FileState",
    "SameBytes",
    "TomlTooDeep",
    "bytes_digest",
    "bytes_hash",
    "change_ns",
    "file_digest",
    "file_hash",
    "file_state",
    "load_json_object",
    "parse_toml",
    "read_json_object",
    "remove_all_but_newest",
    "settled_change",
    "text_hash",
    "unchanged_since",
    "write_atomic",
    "write_if_changed",
    "write_own",
]


def write_own(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` as the user's own file (:func:`write_atomic`, private:
    mode 0600 whatever the umask, a new temporary, no link followed), into a directory the
    user owns (made 0700 when missing): a memo :func:`read_own` will trust. Raises
    OSError: ``PermissionError`` when the directory is another user's (nothing written)."""
    head = os.path.dirname(os.fspath(path)) or "."
    try:
        st = os.stat(head)
    except FileNotFoundError:
        os.makedirs(head, mode=0o700, exist_ok=True)
        st = os.stat(head)
    problem = not_own(st, directory=True)
    if problem:
        raise PermissionError(errno.EPERM, f"the directory is {problem}", head)
    write_atomic(path, data, private=True)


def read_json_object(path: Path) -> dict[str, object]:
    """The JSON object in the user's own file at ``path`` (:func:`read_own`; its string
    keys only), or {} when the file cannot be read, is anyone else's, is not JSON or holds
    something else: for state files that are only a memo, where damage costs the work
    they spare."""
    try:
        return load_json_object(path)
    except (OSError, ValueError):
        return {}


def load_json_object(path: Path, *, own: bool = True) -> dict[str, object]:
    """The JSON object in the regular file at ``path`` (its string keys only); ``own``: only
    when it is the user's own (:func:`read_own`, else :func:`read_regular`). Raises
    OSError (unreadable, anyone else's, not a regular file: a FIFO is not waited on) and
    ValueError (not JSON, nested too deeply to parse, not an object)."""
    data = read_own(path) if own else read_regular(path)
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__}, not an object")
    return {k: v for k, v in doc.items() if isinstance(k, str)}


class TomlTooDeep(tomllib.TOMLDecodeError):
    """A TOML document nested too deeply for the parser (it recurses per level)."""

    def __init__(self) -> None:
        ValueError.__init__(self, "nested too deeply to parse")


def parse_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads``, the one way this package parses TOML: a document nested too
    deeply for the parser raises :class:`TomlTooDeep` (a ``TOMLDecodeError``, which every
    reader turns into its file's one-line error), not ``RecursionError``."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise TomlTooDeep from None


def remove_all_but_newest(paths: Iterable[Path], keep: int) -> None:
    """Remove all but the ``keep`` most recently modified of ``paths`` (a memo's older
    entries). Raises OSError."""
    entries = sorted((p.stat().st_mtime_ns, p) for p in paths)
    for _mtime, old in entries[: max(0, len(entries) - keep)]:
        old.unlink()


def write_atomic(path: Path, data: bytes, *, private: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically, creating its directory. Raises OSError.

    ``private``: for a file whose content this user's runs will trust (code): it is
    readable and writable by the user alone whatever the umask, and its temporary file
    must be new (no link at its name is followed)."""
    # Called for every staged and installed file: the directory is created only when the
    # first open says it is missing, and a finished write removes nothing.
    name = os.fspath(path)
    tmp = _temporary_name(name)
    try:
        fh = _open_new(tmp, private)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
        fh = _open_new(tmp, private)
    try:
        with fh:
            fh.write(data)
        os.replace(tmp, name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _temporary_name(name: str) -> str:
    """Where a new ``name`` is made before it is renamed into place: beside it, unique per
    process and thread."""
    head, tail = os.path.split(name)
    return os.path.join(head, f".{tail}.{os.getpid()}.{threading.get_ident()}.tmp")


def _open_new(tmp: str, private: bool) -> BinaryIO:
    """The temporary file of :func:`write_atomic`, open for writing."""
    if not private:
        return open(tmp, "wb")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(tmp, flags, 0o600), "wb")


class SameBytes:
    """The files one run wrote by :meth:`write`, by their bytes' hash: a later file of the
    same bytes (a header staged for every target, an artefact installed in every target
    that shares it) becomes a hard link to the first, which needs no new inode; on ext4 a
    link costs a tenth of a create, and less CPU still after many files were removed.

    A file linked to must still be the one written (same inode, size and mtime; each link
    changes its change time), else the bytes are written anew. Every write of this
    package replaces a file by renaming (:func:`write_atomic`), so a later write of one of
    the names leaves the others as they were. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[str, tuple[str, tuple[int, int, int]]] = {}

    def write(self, path: Path, data: bytes, digest: str) -> None:
        """:func:`write_atomic` of ``data`` (whose :func:`bytes_hash` is ``digest``), or a
        link to the file of the same bytes written before. Raises OSError."""
        name = os.fspath(path)
        with self._lock:
            known = self._made.get(digest)
        if known is not None and _link_atomic(*known, name):
            return
        write_atomic(path, data)
        with contextlib.suppress(OSError):  # written: a later link is only a saving
            st = os.lstat(name)
            with self._lock:
                self._made[digest] = (name, _identity(st))


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def _link_atomic(source: str, identity: tuple[int, int, int], name: str) -> bool:
    """Make ``name`` a hard link to ``source`` when ``source`` is still the file of
    ``identity``; atomically (a link to a temporary name renamed over one in place).
    False when it cannot (the source changed or is gone, too many links, another file
    system): the caller writes the bytes instead."""
    try:
        st = os.lstat(source)
        if not stat.S_ISREG(st.st_mode) or _identity(st) != identity:
            return False
        try:
            os.link(source, name)
        except FileNotFoundError:  # its directory is new (the source was just there)
            os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
            os.link(source, name)
        except FileExistsError:
            tmp = _temporary_name(name)
            os.link(source, tmp)
            try:
                os.replace(tmp, name)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
    except OSError:
        return False
    return True


def write_if_changed(path: Path, data: bytes, same: SameBytes | None = None) -> bool:
    """:func:`write_atomic` unless ``path`` already holds ``data`` (through ``same``, when
    given: a link to a file of the same bytes); True when it wrote."""
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode) and st.st_size == len(data):
            with open(path, "rb") as fh:
                if fh.read() == data:
                    return False
    except OSError:
        pass
    if same is None:
        write_atomic(path, data)
    else:
        same.write(path, data, bytes_hash(data))
    return True
