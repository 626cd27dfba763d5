"""A cache of the generated ``build`` tasks: a no-op ``doit`` skips resolution and planning.

Generating the tasks (walk, resolve every target, probe toolchains, plan) costs
far more than doit's own up-to-date checks. Its result is a function of:

- the *shape* of ``kernels/`` (every directory's entries, with their kinds) and
  the *content* of every TOML file under it: resolution reads no other file
  content (kernel sources enter the tasks only as ``file_dep`` paths, whose
  content doit's checker sees);
- the configuration and the toolchain definitions (the caller loads both on
  every run and puts them, by value, into the key);
- the environment the generation reads, the program of each toolchain the targets
  select as found on ``PATH`` and probed (see
  :func:`~metrale_orch.toolchain.stamps.toolchain_stamp` and :func:`read_uses`), the
  root, the build dir, the versions of Python and doit, and the source files of this
  package.

The first three go into a *key* computed on every run (cheap); the tree and
the package files are *watched*: the cache file records, for each watched
directory, its stat and a digest of its sorted (name, kind) listing, and for
each watched file, its stat and the xxh3 of its bytes. A run trusts a watched
item when its stat (mtime_ns, ctime_ns, size, inode) is unchanged and was not
*racy* when recorded; otherwise it re-reads the item and compares the digest
(a fresh checkout: new stats, same content, still a hit). Racy, as in git's
index: an item whose change time is within :data:`RACY_NS` of the moment its
stat was taken could change again within the same clock tick without its stat
changing, so it is always compared by content until a later run records it
again. Any later modification sets the change time (``ctime``; it cannot be set
back, unlike mtime) beyond that moment, so a trusted stat is a sound proof.

Watched items are stat-ed *before* generation reads them, so a change during
generation shows up as a mismatch the next time. A directory holding a symlink
or a special file is never cached (resolution may follow a link outside the
tree). A miss regenerates and rewrites; a hit whose content checks passed
rewrites only the header (the stats), so the next run is stat-only again.

File format (``<build_dir>/.state/build-tasks.<key>.cache``, one per key, the
:data:`KEEP` newest kept): a magic line, a line
with the Python version, the header's length and its xxh3-128, the header
(schema, key, scan time, watches, the body's xxh3-128), then the body (one row
per target). Both are ``marshal`` data (lists, dicts, strings, integers only),
read only after their digest matched and only by the interpreter version that
wrote them: about 5x faster to load than JSON, and a path shared by many
targets is stored and loaded as one string. Written to a temporary file and
renamed, so readers see a whole file or none; anything unreadable is a miss.
"""

from __future__ import annotations

import json
import logging
import marshal
import os
import stat
import sys
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import xxhash

from metrale_orch.fsutil import (
    RACY_NS,
    bytes_digest,
    bytes_hash,
    change_ns,
    file_digest,
    parse_toml,
    read_json_object,
    remove_all_but_newest,
    write_own,
)
from metrale_orch.graph.specs import BuildSpec
from metrale_orch.ownership import read_own

__all__ = [
    "CACHE_GLOB",
    "KEEP",
    "RACY_NS",
    "SCHEMA",
    "Lookup",
    "Scan",
    "cache_path",
    "last_key",
    "lookup",
    "read_arches",
    "read_uses",
    "scan",
    "store",
    "write_uses",
]

#: Version of the file format; part of the key.
SCHEMA = 4
#: File names under ``<build_dir>/.state``: ``build-tasks.<key prefix>.cache``, one per
#: key (so shells with different environments do not evict each other's entry).
CACHE_GLOB = "build-tasks.*.cache"
#: How many entries (keys) of each kind are kept, the whole tree's and those of runs
#: scoped to some targets (``doit build:hopper/m/q``, see :func:`cache_path`); older ones
#: of the same kind are removed when one is written.
KEEP = 8
#: Which toolchains the targets of each base's last generation selected, and the key its
#: entry was stored under (hints: see :func:`read_uses` and :func:`last_key`).
USES_NAME = "build-tasks.uses.json"
_MARSHAL_VERSION = 4

_log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ fingerprints


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_mtime_ns, change_ns(st), st.st_size, st.st_ino, stat.S_IFMT(st.st_mode))


def _kind(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    return "other"


def _listing(path: str) -> list[tuple[str, str]]:
    """Sorted (name, kind) of a directory's entries (raises OSError)."""
    with os.scandir(path) as it:
        return sorted((e.name, _kind(e)) for e in it)


def _listing_digest(items: Iterable[tuple[str, str]]) -> str:
    h = xxhash.xxh3_64()
    for name, kind in items:
        h.update(f"{kind}\0{name}\0".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _is_toml(name: str) -> bool:
    return name.lower().endswith(".toml")


# ------------------------------------------------------------------------------ scan

#: One watched item: (kind, path, mtime_ns, change_ns, size, inode, file type, digest).
#: Read back from marshal data, it is checked by unpacking (a bad one is a miss).
Watch = tuple[str, str, int, int, int, int, int, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Scan:
    """Every watched item's stat and content digest, taken before generation."""

    #: Wall-clock time (ns) before the first stat.
    started_ns: int
    #: (kind, path, mtime_ns, change_ns, size, inode, file type, digest), sorted; kind:
    #: "d" a tree directory, "f" a tree file (both never links), "p" a package file
    watches: tuple[Watch, ...]


def scan(kernels: Path, package_files: Iterable[Path]) -> Scan | None:
    """Stat and fingerprint the tree's directories and TOML files and ``package_files``.

    None when the tree cannot be cached: ``kernels`` is not a directory, it
    holds a symlink or a special file anywhere, or a manifest names a place
    outside it (see :func:`_may_escape`). I/O; call it *before* the generation
    reads the tree.
    """
    started = time.time_ns()
    watches: list[Watch] = []
    stack = [os.fspath(kernels)]
    try:
        if not stat.S_ISDIR(os.lstat(stack[0]).st_mode):
            return None
        while stack:
            directory = stack.pop()
            st = os.lstat(directory)
            items = _listing(directory)
            watches.append(("d", directory, *_stat_key(st), _listing_digest(items)))
            for name, kind in items:
                path = os.path.join(directory, name)
                if kind == "dir":
                    stack.append(path)
                elif kind != "file":
                    _log.debug("task cache: not caching, %s is a %s", path, kind)
                    return None
                elif _is_toml(name):
                    fst = os.lstat(path)
                    with open(path, "rb") as fh:
                        data = fh.read()
                    if _may_escape(name, data):
                        _log.debug("task cache: not caching, %s may name a path outside", path)
                        return None
                    watches.append(("f", path, *_stat_key(fst), bytes_digest(data)))
        for file in package_files:
            path = os.fspath(file)
            fst = os.stat(path)
            watches.append(("p", path, *_stat_key(fst), file_digest(path)))
    except OSError as exc:
        _log.debug("task cache: not caching, scan failed: %s", exc)
        return None
    watches.sort()
    return Scan(started_ns=started, watches=tuple(watches))


#: Manifest keys whose value the resolver joins to a path: ``[hardware] inherits``
#: (``kernels/<value>``) and ``[model] kernel_source`` (``<hw dir>/<value>``).
_PATH_KEYS = {"hardware.toml": ("hardware", "inherits"), "model.toml": ("model", "kernel_source")}


def _may_escape(name: str, data: bytes) -> bool:
    """Whether a manifest's path-valued key could lead resolution outside ``kernels/``.

    Only a value with a path separator can; such a tree is rare (and an error or
    a redirect outside the tree), so it is simply not cached. Conservative: an
    unparseable file that mentions the key counts as escaping.
    """
    table_key = _PATH_KEYS.get(name.lower())
    if table_key is None or table_key[1].encode() not in data:
        return False
    try:
        doc = parse_toml(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return True
    table = doc.get(table_key[0])
    value = table.get(table_key[1]) if isinstance(table, dict) else None
    return isinstance(value, str) and ("/" in value or "\\" in value or os.sep in value)


def package_files(package_dir: Path) -> list[Path]:
    """This package's ``*.py`` and ``*.toml`` files (what generation's code is made of)."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        out.extend(Path(dirpath, f) for f in sorted(filenames) if f.endswith((".py", ".toml")))
    return out


# ------------------------------------------------------------------------------ store

#: First bytes of a cache file; then ``<python> <header length> <header digest>\n``.
_MAGIC = b"metrale-orch build-tasks\n"


def _python() -> bytes:
    # marshal's format belongs to the interpreter: another one never reads this file.
    return "".join(sys.version.split()).encode("ascii", "replace")


def _pack(key: str, started_ns: int, watches: Sequence[Sequence[object]], body: bytes) -> bytes:
    header = marshal.dumps(
        {
            "schema": SCHEMA,
            "key": key,
            "started_ns": started_ns,
            "watches": [list(w) for w in watches],
            "body": bytes_hash(body),
        },
        _MARSHAL_VERSION,
    )
    line = b"%s %d %s\n" % (_python(), len(header), bytes_hash(header).encode())
    return _MAGIC + line + header + body


def _encode_body(specs: Sequence[BuildSpec], extra: object = None) -> bytes:
    # One str object per distinct path: marshal writes it once and back-references it,
    # and loading shares it again, so ~45 000 edges cost ~9 000 strings.
    interned: dict[str, str] = {}
    rows = [
        [
            spec.target,
            spec.kind,
            spec.message,
            tuple([interned.setdefault(p, p) for p in spec.file_dep]),
            dict(spec.parts),
            spec.manifest,
        ]
        for spec in specs
    ]
    return marshal.dumps([rows, extra], _MARSHAL_VERSION)


def _write(path: Path, data: bytes) -> None:
    try:
        write_own(path, data)
    except OSError as exc:
        # Only a speed-up: a read-only build dir regenerates on every run.
        _log.debug("task cache: cannot write %s: %s", path, exc)


#: The name prefix of a scoped run's entry (see :func:`cache_path`).
_SCOPED = "scope-"


def cache_path(state_dir: Path, key: str, *, scoped: bool = False) -> Path:
    """The cache file of ``key`` under ``state_dir`` (pure); ``scoped``: a run's that named
    some targets (``build-tasks.scope-<key>.cache``), kept apart from the whole tree's
    entries so that runs of many scopes never evict those (:func:`store`)."""
    return Path(state_dir) / f"build-tasks.{_SCOPED if scoped else ''}{key[:16]}.cache"


def _scoped_name(path: Path) -> bool:
    return path.name.startswith(f"build-tasks.{_SCOPED}")


def store(
    path: Path, key: str, scanned: Scan, specs: Sequence[BuildSpec], extra: object = None
) -> None:
    """Write the cache file (temporary file + rename; errors are ignored), then remove
    all but the :data:`KEEP` most recently written entries of its kind beside it (the
    whole tree's, or scoped runs', :func:`cache_path`).

    ``extra``: anything ``marshal`` writes (lists, tuples, dicts, strings,
    numbers, booleans, None), handed back by :func:`lookup` as ``Lookup.extra``.
    """
    try:
        body = _encode_body(specs, extra)
    except ValueError:  # extra held something marshal cannot write
        body = _encode_body(specs)
    _write(path, _pack(key, scanned.started_ns, scanned.watches, body))
    try:
        kind = _scoped_name(path)
        others = (p for p in path.parent.glob(CACHE_GLOB) if p != path and _scoped_name(p) == kind)
        remove_all_but_newest(others, KEEP - 1)
    except OSError:
        pass


def read_uses(state_dir: Path, base: str) -> tuple[str, ...] | None:
    """The toolchains the last generation under ``base`` (the generation key without the
    programs) found its targets selecting, sorted, or None when not known.

    Only a hint of which toolchains to probe: the key puts the names in with the
    probed stamps, so a wrong or stale hint gives another key, a miss, never a
    wrong hit. An entry stored under a key was generated when the targets selected
    exactly those toolchains, and a hit means the watched tree is unchanged, so the
    targets still select them; an unselected toolchain cannot change a task.
    """
    names = _read_hint(state_dir, base).get("toolchains")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return tuple(sorted(names))


def last_key(state_dir: Path, base: str) -> str | None:
    """The key the last generation under ``base`` stored its entry under, or None (not
    known, or that generation stored none). Only a hint of which entry to read before
    the toolchains are stamped: a hit is still only the entry of the key they give."""
    key = _read_hint(state_dir, base).get("key")
    return key if isinstance(key, str) and key else None


def read_arches(state_dir: Path, base: str) -> dict[str, tuple[str, ...]]:
    """The arches the last generation under ``base`` found the targets of each toolchain
    probed per arch building for (name -> sorted arches; {} when not known). A hint like
    :func:`read_uses`: the stamps of those arches go into the key, so a wrong hint is a
    miss, and an entry is only stored when its targets used exactly the stamped arches."""
    arches = _read_hint(state_dir, base).get("arches")
    if not isinstance(arches, dict):
        return {}
    return {
        name: tuple(sorted(values))
        for name, values in arches.items()
        if isinstance(name, str)
        and isinstance(values, list)
        and all(isinstance(v, str) for v in values)
    }


def _read_hint(state_dir: Path, base: str) -> dict[str, object]:
    """``base``'s record in the uses file (``{"toolchains": [...], "key": ...}``; a list
    alone, as written before the key was kept, is the toolchains), else {}."""
    value = read_json_object(Path(state_dir) / USES_NAME).get(base)
    if isinstance(value, list):
        return {"toolchains": value}
    return value if isinstance(value, dict) else {}


def write_uses(
    state_dir: Path,
    base: str,
    names: Iterable[str],
    key: str | None = None,
    arches: Mapping[str, Iterable[str]] | None = None,
    *,
    scoped: bool = False,
) -> None:
    """Remember ``names`` as the toolchains of ``base``, ``key`` as the key its entry was
    stored under (None: none was stored) and ``arches`` (see :func:`read_arches`); the
    newest :data:`KEEP` bases of each kind (``scoped``: a run's that named some targets,
    or the whole tree's) are kept and errors are ignored, as for the cache files."""
    path = Path(state_dir) / USES_NAME
    doc = read_json_object(path)
    doc.pop(base, None)
    doc[base] = {
        "toolchains": sorted(names),
        "key": key,
        "arches": {n: sorted(set(a)) for n, a in sorted((arches or {}).items())},
        "scoped": scoped,
    }
    items = list(doc.items())
    of_kind = [b for b, v in items if (isinstance(v, dict) and v.get("scoped") is True) == scoped]
    dropped = set(of_kind[:-KEEP])
    kept = {b: v for b, v in items if b not in dropped}
    _write(path, json.dumps(kept, indent=1).encode() + b"\n")


# ------------------------------------------------------------------------------ lookup


@dataclass(frozen=True, slots=True, kw_only=True)
class Lookup:
    """The outcome of :func:`lookup`."""

    #: The cached specs on a hit, else None.
    specs: tuple[BuildSpec, ...] | None
    #: What :func:`store` was given as ``extra`` (None on a miss).
    extra: object = None
    #: "hit", or why not (for logs and tests).
    reason: str
    #: Watched items compared by content on this hit (stat changed or racy).
    compared: int = 0
    #: Whether the header was rewritten with fresh stats.
    refreshed: bool = False


def _miss(reason: str) -> Lookup:
    _log.debug("task cache: miss: %s", reason)
    return Lookup(specs=None, reason=reason)


_TYPE_OF = {"d": stat.S_IFDIR, "f": stat.S_IFREG, "p": stat.S_IFREG}


def _check(watch: Watch, started_ns: int) -> tuple[bool, Watch | None]:
    """(still valid, the refreshed watch when it had to be compared by content)."""
    kind, path, mtime, change, size, ino, fmt, digest = watch
    try:
        # Tree items must stay what they were (no symlink); package files may be links.
        st = os.stat(path) if kind == "p" else os.lstat(path)
    except OSError:
        return False, None
    now = _stat_key(st)
    if now == (mtime, change, size, ino, fmt) and change < started_ns - RACY_NS:
        return True, None
    if now[4] != _TYPE_OF[kind]:
        return False, None
    try:
        current = _listing_digest(_listing(path)) if kind == "d" else file_digest(path)
    except OSError:
        return False, None
    if current != digest:
        return False, None
    return True, (kind, path, *now, digest)


def _unpack(data: bytes) -> tuple[dict[str, object], bytes] | str:
    """(header, body bytes) of a cache file, or why it cannot be read."""
    if not data.startswith(_MAGIC):
        return "not a task cache file"
    line, sep, rest = data[len(_MAGIC) :].partition(b"\n")
    parts = line.split(b" ")
    if not sep or len(parts) != 3:
        return "unreadable header"
    python, length, digest = parts
    if python != _python():
        return "written by another Python"
    try:
        n = int(length)
    except ValueError:
        return "unreadable header"
    head, body = rest[:n], rest[n:]
    if len(head) != n or bytes_hash(head).encode() != digest:
        return "header does not match its digest"
    try:
        header = marshal.loads(head)
    except (ValueError, EOFError, TypeError):
        return "unreadable header"
    if not isinstance(header, dict):
        return "unreadable header"
    return header, body


def lookup(path: Path, key: str) -> Lookup:
    """The cached specs when the file at ``path`` is for ``key`` and every watch holds.

    A hit whose content comparisons let some stats be trusted from now on
    rewrites the header. I/O; never raises for a bad or missing file.
    """
    try:
        data = read_own(path)
    except PermissionError as exc:  # anyone else's: never unmarshalled
        return _miss(f"cache file not this user's own ({exc.strerror})")
    except OSError:
        return _miss("no cache file")
    started = time.time_ns()
    unpacked = _unpack(data)
    if isinstance(unpacked, str):
        return _miss(unpacked)
    header, body = unpacked
    if header.get("schema") != SCHEMA:
        return _miss("other schema")
    if header.get("key") != key:
        return _miss("key changed (configuration, toolchains, environment or versions)")
    if header.get("body") != bytes_hash(body):
        return _miss("body does not match its digest")
    started_ns = header.get("started_ns")
    watches = header.get("watches")
    if not isinstance(started_ns, int) or not isinstance(watches, list):
        return _miss("unreadable header")
    fresh: list[Sequence[object]] = []
    compared = 0
    settled = False  # some item compared by content now has a stat worth trusting
    trusted_before = started_ns - RACY_NS
    lstat, fmt_of, posix = os.lstat, stat.S_IFMT, os.name == "posix"
    for watch in watches:
        try:
            kind, item, mtime, change, size, ino, fmt, _digest = watch
            # The common case inline (~2 000 items per run): an unchanged, settled stat.
            if posix and kind != "p" and change < trusted_before:
                st = lstat(item)
                if (
                    st.st_ctime_ns == change
                    and st.st_mtime_ns == mtime
                    and st.st_size == size
                    and st.st_ino == ino
                    and fmt_of(st.st_mode) == fmt
                ):
                    fresh.append(watch)
                    continue
            ok, refreshed = _check(watch, started_ns)
        except OSError:
            ok, refreshed = False, None
        except (TypeError, ValueError):
            return _miss("unreadable watch")
        if not ok:
            return _miss(f"changed: {watch[1]}")
        if refreshed is not None:
            compared += 1
            settled = settled or refreshed[3] < started - RACY_NS
            fresh.append(refreshed)
        else:
            fresh.append(watch)
    try:
        specs, extra = _decode_body(body)
    except (ValueError, EOFError, TypeError, IndexError, KeyError):
        return _miss("unreadable body")
    if settled:
        _write(path, _pack(key, started, fresh, body))
    return Lookup(specs=specs, extra=extra, reason="hit", compared=compared, refreshed=settled)


def _decode_body(body: bytes) -> tuple[tuple[BuildSpec, ...], object]:
    rows, extra = marshal.loads(body)
    specs = tuple(
        [
            BuildSpec(
                target=target,
                kind=kind,
                message=message,
                file_dep=file_dep,
                parts=parts,
                manifest=manifest,
            )
            for target, kind, message, file_dep, parts, manifest in rows
        ]
    )
    return specs, extra
