"""What a compile read: the compiler's dependency list, recorded and verified.

A cache entry is valid only for the exact inputs the compiler read (as ccache's
direct mode and Bazel's action cache do). Every compile writes the compiler's
own dependency list (nvcc ``-Xcompiler=-MD,-MF,<file>``: every file the
preprocessor opened, digraphs, line splices and ``-isystem=`` resolved by the
compiler itself); :func:`record_inputs` turns it, plus the files a flag makes
the compiler read (``--options-file``, ``-include``, ``-imacros``), into a
sorted list of ``[kind, path, xxh3-128]`` stored in the entry:

- ``stage``: a staged file, by its path relative to the module's working
  directory (machine-independent; checked against the stage's own hashes);
- ``toolkit<i>``: a file under the i-th toolkit directory of the compiler's
  probe (``TOP``, its include directories), by its path below it, so the same
  toolkit installed elsewhere (a pip wheel in another virtualenv) still hits;
- ``system``: a file under one of the host compiler's own include directories
  (``/usr/include`` ...), by its absolute path;
- ``abs``: any other file (``-I/abs``, ``CPATH``, an absolute ``#include``), by
  its absolute path. These are the target's *external* inputs: besides
  verifying hits, they make the target stale when they change
  (:func:`external_stamps`).

:func:`inputs_match` is the lookup's check: every recorded file must still
have its recorded content. Hashes of files outside the stage are memoised per
process by ``stat`` (:class:`FileHasher`), so the ~200 system headers of a
compile cost milliseconds once per process.

Pure: :func:`parse_depfile`, :func:`flag_files`, :func:`classify`.
I/O: :class:`FileHasher`, :func:`record_inputs`, :func:`inputs_match`.
"""

from __future__ import annotations

import os
import posixpath
import stat
import threading
import time
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from metrale_orch.fsutil import FileState, change_ns, file_hash, settled_change

__all__ = [
    "FileHasher",
    "Input",
    "changed_inputs",
    "classify",
    "external_stamps",
    "flag_files",
    "flag_values",
    "hashed_state",
    "inputs_hold",
    "inputs_match",
    "parse_depfile",
    "record_inputs",
    "unknown_state",
]


class Input(NamedTuple):
    """A file a compile read, as recorded (see the module docstring): a tuple, so a cache
    entry's JSON (``[kind, path, digest]``) and equality are a plain triple's."""

    #: ``stage``, ``toolkit<i>``, ``system`` or ``abs``.
    kind: str
    #: Its path as the kind spells it (relative to the module's directory, below the
    #: toolkit directory, or absolute).
    path: str
    #: The xxh3-128 hex digest of its content ("" when it could not be had).
    digest: str


#: Flags whose value is a file the compiler reads.
_FILE_FLAGS = (
    "--options-file",
    "-optf",
    "-include",
    "--pre-include",
    "-imacros",
)


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a Make-style dependency file, in order, unique (pure).

    Handles line continuations, ``\\ `` (an escaped space), ``\\#`` and ``$$``;
    every target (each word before a ``:`` at the end of a word) is dropped.
    """
    joined = text.replace("\\\r\n", " ").replace("\\\n", " ")
    words: list[str] = []
    current: list[str] = []
    i = 0
    n = len(joined)
    while i < n:
        c = joined[i]
        if c == "\\" and i + 1 < n and joined[i + 1] in " #\\":
            current.append(joined[i + 1])
            i += 2
            continue
        if c == "$" and i + 1 < n and joined[i + 1] == "$":
            current.append("$")
            i += 2
            continue
        if c in " \t\r\n":
            if current:
                words.append("".join(current))
                current = []
            i += 1
            continue
        current.append(c)
        i += 1
    if current:
        words.append("".join(current))
    # One rule: targets, a separator, prerequisites. Later ``name:`` words are the
    # phony rules ``-MP`` adds for headers already listed.
    deps: list[str] = []
    seen_separator = False
    for word in words:
        if not seen_separator:
            seen_separator = word == ":" or (word.endswith(":") and not _is_drive(word))
            continue
        if word == ":" or word.endswith(":"):
            continue
        deps.append(word)
    return list(dict.fromkeys(deps))


def _is_drive(word: str) -> bool:
    return len(word) == 2 and word[0].isalpha()


def flag_values(
    flags: Sequence[str], names: Sequence[str], *, glued: Container[str] = ()
) -> Iterator[tuple[str, str]]:
    """``(name, value)`` for each ``name value`` and ``name=value`` in ``flags`` and, for a
    name in ``glued``, each ``namevalue`` (pure; the first of ``names`` that matches wins)."""
    it = iter(flags)
    for flag in it:
        for name in names:
            if flag == name:
                value = next(it, None)
                if value is not None:
                    yield name, value
                break
            if flag.startswith(name + "="):
                yield name, flag[len(name) + 1 :]
                break
            if name in glued and flag.startswith(name):
                yield name, flag[len(name) :]
                break


def flag_files(flags: Sequence[str]) -> Iterator[str]:
    """The files flags make the compiler read: ``--options-file``/``-optf``, ``-include``/
    ``--pre-include``, ``-imacros`` values, as written (pure)."""
    for name, value in flag_values(flags, _FILE_FLAGS):
        for part in value.split(",") if name in ("--options-file", "-optf") else [value]:
            if part:
                yield part


def classify(
    path: str,
    *,
    stage_dir: str,
    cwd: str,
    roots: Sequence[str],
    system_dirs: Sequence[str] = (),
) -> tuple[str, str]:
    """``(kind, spelling)`` of a file a compile read (pure; see the module docstring).

    ``path`` is as the compiler wrote it (relative to ``cwd``, the module's
    absolute working directory, or absolute); ``stage_dir`` is the absolute
    stage root, ``roots`` the probe's toolkit directories and ``system_dirs``
    the host compiler's include directories (normalised).
    """
    full = os.path.normpath(os.path.join(cwd, path))
    prefix = stage_dir.rstrip(os.sep) + os.sep
    if full.startswith(prefix):
        return "stage", posixpath.relpath(full.replace(os.sep, "/"), cwd.replace(os.sep, "/"))
    for i, root in enumerate(roots):
        root_prefix = root.rstrip(os.sep) + os.sep
        if full.startswith(root_prefix):
            return f"toolkit{i}", full[len(root_prefix) :].replace(os.sep, "/")
    for folder in system_dirs:
        if full.startswith(folder.rstrip(os.sep) + os.sep):
            return "system", full
    return "abs", full


class FileHasher:
    """xxh3-128 of files outside the stage, memoised by ``(size, mtime, ctime, inode)``.

    One per process; thread-safe. A file that cannot be read as a regular file
    hashes to ``""`` (never equal to a recorded hash).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: path -> (stat stamp, digest, settled change time when it was hashed)
        self._memo: dict[str, tuple[tuple[int, int, int, int], str, int]] = {}

    def digest(self, path: str) -> str:
        try:
            st = os.stat(path)
        except OSError:
            return ""
        if not stat.S_ISREG(st.st_mode):
            return ""
        stamp = (st.st_size, st.st_mtime_ns, change_ns(st), st.st_ino)
        with self._lock:
            got = self._memo.get(path)
        if got is not None and got[0] == stamp:
            return got[1]
        taken = time.time_ns()
        try:
            digest = file_hash(path)
        except OSError:
            return ""
        with self._lock:
            self._memo[path] = (stamp, digest, settled_change(st, taken))
        return digest

    def stamp(self, path: str) -> tuple[int, int, int, int] | None:
        """``(mtime_ns, size, change_ns, inode)`` of ``path`` when it was last hashed (the
        change time 0 when it was not settled then), or None."""
        with self._lock:
            got = self._memo.get(path)
        if got is None:
            return None
        (size, mtime, _change, ino), _digest, settled = got
        return mtime, size, settled, ino

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()


def _current(
    kind: str,
    path: str,
    *,
    module_cwd: str,
    staged: Mapping[str, str],
    roots: Sequence[str],
    hasher: FileHasher,
) -> str:
    """The current content hash of a recorded input, or "" when it cannot be had."""
    if kind == "stage":
        return staged.get(posixpath.normpath(posixpath.join(module_cwd, path)), "")
    if kind in ("abs", "system"):
        return hasher.digest(path) if os.path.isabs(path) else ""
    if kind.startswith("toolkit"):
        try:
            index = int(kind[len("toolkit") :])
        except ValueError:
            return ""
        if not 0 <= index < len(roots) or path.startswith("/") or ".." in path.split("/"):
            return ""
        return hasher.digest(os.path.join(roots[index], path))
    return ""


def record_inputs(
    read: Sequence[str],
    *,
    stage_dir: str,
    cwd: str,
    module_cwd: str,
    staged: Mapping[str, str],
    roots: Sequence[str],
    hasher: FileHasher,
    system_dirs: Sequence[str] = (),
) -> list[list[str]]:
    """``[kind, path, hash]`` of every file in ``read`` (as the compiler spelled them),
    sorted and unique. Staged files take their hash from ``staged`` (stage-relative
    path -> hash of the bytes staged, hence compiled); ``module_cwd`` is the
    module's working directory relative to the stage root."""
    out: dict[tuple[str, str], str] = {}
    for path in read:
        kind, spelled = classify(
            path, stage_dir=stage_dir, cwd=cwd, roots=roots, system_dirs=system_dirs
        )
        out[(kind, spelled)] = _current(
            kind,
            spelled,
            module_cwd=module_cwd,
            staged=staged,
            roots=roots,
            hasher=hasher,
        )
    return [[kind, path, digest] for (kind, path), digest in sorted(out.items())]


def inputs_match(
    recorded: object,
    *,
    module_cwd: str,
    staged: Mapping[str, str],
    roots: Sequence[str],
    hasher: FileHasher,
) -> bool:
    """True when every recorded input still has its recorded content (a well-formed,
    non-empty list is required: an entry without one is never trusted)."""
    if not isinstance(recorded, list) or not recorded:
        return False
    for item in recorded:
        if not (
            isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item)
        ):
            return False
    return inputs_hold(
        recorded,  # checked: [kind, path, digest] each
        module_cwd=module_cwd,
        staged=staged,
        roots=roots,
        hasher=hasher,
    )


def inputs_hold(
    inputs: Sequence[Sequence[str]],
    *,
    module_cwd: str,
    staged: Mapping[str, str],
    roots: Sequence[str],
    hasher: FileHasher,
) -> bool:
    """:func:`inputs_match` of inputs whose shape is known (:class:`Input` s this run
    recorded, or a record's lists already checked)."""
    if not inputs:
        return False
    for kind, path, digest in inputs:
        if not digest:
            return False
        now = _current(
            kind,
            path,
            module_cwd=module_cwd,
            staged=staged,
            roots=roots,
            hasher=hasher,
        )
        if now != digest:
            return False
    return True


def changed_inputs(
    recorded: object,
    *,
    module_cwd: str,
    staged: Mapping[str, str],
    roots: Sequence[str],
    hasher: FileHasher,
) -> list[Input]:
    """The recorded inputs whose content is not (or no longer) what was recorded, sorted:
    empty exactly when :func:`inputs_match` holds, but for a record that is no list of
    inputs or is empty (one :class:`Input` ``("record", "", "")`` then)."""
    if not isinstance(recorded, list) or not recorded:
        return [Input("record", "", "")]
    out: list[Input] = []
    for item in recorded:
        if not (
            isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item)
        ):
            return [Input("record", "", "")]
        kind, path, digest = item
        now = _current(kind, path, module_cwd=module_cwd, staged=staged, roots=roots, hasher=hasher)
        if not digest or now != digest:
            out.append(Input(kind, path, digest))
    return sorted(out)


def unknown_state(digest: str) -> FileState:
    """The saved state of a file whose stat is not known: its size never matches."""
    return [-1, -1, digest, 0, 0]


def hashed_state(hasher: FileHasher, path: str, digest: str) -> FileState:
    """The saved state of ``path`` with ``digest``, from the stat ``hasher`` hashed it by
    (:func:`unknown_state` when it was never hashed in this process)."""
    stamp = hasher.stamp(path)
    if stamp is None:
        return unknown_state(digest)
    mtime, size, settled, ino = stamp
    return [mtime, size, digest, settled, ino]


def external_stamps(inputs: Iterable[Input], hasher: FileHasher) -> dict[str, FileState]:
    """``path -> FileState`` (xxh3-128) of the ``abs`` inputs among ``inputs``, as they were
    when hashed (verified or recorded) in this process; a file whose stamp is unknown
    gets :func:`unknown_state`, which the next check sees as changed."""
    out: dict[str, FileState] = {}
    for kind, path, digest in inputs:
        if kind != "abs":
            continue
        out[path] = hashed_state(hasher, path, digest)
    return dict(sorted(out.items()))
