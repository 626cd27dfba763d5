"""What a full toolchain probe found, kept across runs with what re-checks it (I/O).

A full probe (:mod:`~metrale_orch.toolchain.probe`) runs up to five commands:
the compiler's version and dry run, the host compiler's version, dry run and
include search list. Of these only the two dry runs show what really runs:
every program and flag behind any wrapper, shim or ``update-alternatives``
link, whatever picks them (a file, an environment variable). So a run that has
a :class:`ProbeRecord` for the same toolchain, program, host compiler, keyed
environment and ``PATH`` runs only the two dry runs and reuses the recorded
identity when **all** of these are as recorded:

- both dry runs' (normalised) text;
- every file they lead to (the program, the real compiler programs, libdevice,
  the host compiler and its ``cc1plus``): the real path and its ``stat``, size,
  mtime, ctime and inode (ctime cannot be set back: a replaced or rewritten file
  is seen whatever its mtime says);
- every directory of the host's search list, and each one it said it ignored
  as nonexistent, still exists or is still absent.

Anything else runs the full probe and records it again. What is given up: a
version output (or search list) that changes while both dry runs and every
program they name stay byte-identical; no compile can then differ, as the
compile runs those very programs with those very flags.

Records live in ``<state_dir>/probes/<digest>.json``, one per probe (no two
writers share a file), at most :data:`MAX_RECORDS`; a record made by other code
of this package (``_CODE`` files), or in a file that is not the user's own
(:mod:`metrale_orch.ownership`), is never used.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import xxhash

from metrale_orch.canonical import canonical_json
from metrale_orch.fsutil import RACY_NS, change_ns, text_hash, write_own
from metrale_orch.ownership import read_own

__all__ = ["MAX_RECORDS", "RECORDS_DIR", "ProbeRecord", "RecordStore", "dir_states", "file_stamps"]

RECORDS_DIR = "probes"
#: Records kept per state directory (the oldest beyond it are removed).
MAX_RECORDS = 64
_SCHEMA = 1
#: The modules whose code decides an identity: a record of other code is not used.
_CODE = ("probe.py", "dryrun.py", "argv.py", "records.py", "definitions.py")
_NONEXISTENT = 'ignoring nonexistent directory "'

#: ``[real path, size, mtime_ns, ctime_ns, inode]``, or ``[path]`` for a missing file.
Stamp = list[str | int]


def file_stamps(paths: Iterable[str]) -> list[Stamp]:
    """The stamp of each of ``paths`` (links followed), in order."""
    out: list[Stamp] = []
    for path in paths:
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            out.append([path])
            continue
        out.append([real, st.st_size, st.st_mtime_ns, change_ns(st), st.st_ino])
    return out


def dir_states(search_output: str, listed: Sequence[str]) -> list[list[str | bool]]:
    """``[directory, exists]`` as the host compiler saw them: each directory of its search
    list (``listed``) exists, each its ``-v`` output ignored as nonexistent does not;
    sorted. (Not stat-ed here: one made since the compiler looked must differ.)"""
    states: dict[str, bool] = {}
    for line in search_output.splitlines():
        if line.startswith(_NONEXISTENT) and line.endswith('"'):
            states[line[len(_NONEXISTENT) : -1]] = False
    states.update(dict.fromkeys(listed, True))
    return [[d, states[d]] for d in sorted(states)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeRecord:
    """A full probe's result and what must hold for a later run to reuse it."""

    #: Both dry runs' text: ``{"dryrun": ..., "host_dryrun": ...}`` (absent: not run).
    witness: dict[str, str]
    #: :func:`file_stamps` of every file the dry runs lead to, in the probe's order.
    files: list[Stamp]
    #: :func:`dir_states` of the host compiler's search list.
    dirs: list[list[str | bool]]
    identity: str
    roots: tuple[str, ...] = ()
    system_dirs: tuple[str, ...] = ()

    def holds(self, witness: dict[str, str], files: list[Stamp]) -> bool:
        """Whether a run that saw ``witness`` and ``files`` may reuse this record (I/O:
        checks the recorded directories)."""
        return (
            witness == self.witness
            and files == self.files
            and all(os.path.isdir(str(d)) == present for d, present in self.dirs)
        )

    def settled(self, now_ns: int) -> bool:
        """Whether every stamp was settled when taken (its change time older than
        :data:`~metrale_orch.fsutil.RACY_NS`): a file rewritten within the same clock
        tick as its stamp could keep the stamp, so such a record is not kept."""
        return all(len(s) < 5 or int(s[3]) < now_ns - RACY_NS for s in self.files)

    def to_json(self) -> dict[str, object]:
        return {
            "schema": _SCHEMA,
            "witness": dict(sorted(self.witness.items())),
            "files": self.files,
            "dirs": self.dirs,
            "identity": self.identity,
            "roots": list(self.roots),
            "system_dirs": list(self.system_dirs),
        }

    @classmethod
    def from_json(cls, data: object) -> ProbeRecord | None:
        """The record ``data`` holds, or None for anything of another shape."""
        if not isinstance(data, dict) or data.get("schema") != _SCHEMA:
            return None
        try:
            witness, files, dirs = data["witness"], data["files"], data["dirs"]
            if not (
                isinstance(witness, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in witness.items())
                and isinstance(files, list)
                and all(isinstance(s, list) for s in files)
                and isinstance(dirs, list)
                and all(isinstance(d, list) and len(d) == 2 for d in dirs)
                and isinstance(data["identity"], str)
            ):
                return None
            return cls(
                witness=witness,
                files=files,
                dirs=dirs,
                identity=data["identity"],
                roots=tuple(str(r) for r in data["roots"]),
                system_dirs=tuple(str(d) for d in data["system_dirs"]),
            )
        except (KeyError, TypeError):
            return None


@functools.cache
def _code_digest() -> str:
    """Digest of the code that decides an identity (read once per process)."""
    code = xxhash.xxh3_128()
    here = Path(__file__).parent
    for name in _CODE:
        with contextlib.suppress(OSError):
            code.update((here / name).read_bytes())
    return code.hexdigest()


class RecordStore:
    """The record of one probe (``key``: everything the probe ran with) under
    ``<state_dir>/probes``."""

    def __init__(self, state_dir: Path, key: str) -> None:
        digest = text_hash(canonical_json([_SCHEMA, _code_digest(), key]))
        self.folder = state_dir / RECORDS_DIR
        self.path = self.folder / f"{digest}.json"

    def load(self) -> ProbeRecord | None:
        try:
            data = json.loads(read_own(self.path))
        except (OSError, ValueError):
            return None
        return ProbeRecord.from_json(data)

    def save(self, record: ProbeRecord) -> None:
        """Keep ``record`` (when settled); only a speed-up, so a read-only or full build
        directory just probes in full next time."""
        if not record.settled(time.time_ns()):
            return
        text = json.dumps(record.to_json(), sort_keys=True, indent=1)
        with contextlib.suppress(OSError):
            write_own(self.path, text.encode("utf-8", "surrogateescape"))
            self._prune()

    def _prune(self) -> None:
        entries = [e for e in os.scandir(self.folder) if e.name.endswith(".json")]
        if len(entries) <= MAX_RECORDS:
            return
        entries.sort(key=lambda e: (e.stat().st_mtime_ns, e.name))
        for entry in entries[: len(entries) - MAX_RECORDS]:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
