"""Does each PTX assemble? ``ptxas`` for the hardware's arch, its answers cached.

The ``ptxas`` is the one beside the toolchain's ``nvcc``
(:func:`~metrale_orch.resources.collect.locate_ptxas`, as the register report finds it;
none there is :class:`~metrale_orch.resources.errors.PtxasMissing`, saying what to
install). Answers ("" for assembled, else the reason) are cached in
``<build_dir>/.state/coverage.json`` keyed by the PTX's content hash, the arch and the
``ptxas`` binary (real path, size, mtime), so a second run over an unchanged build runs
no ptxas. An answer never holds a path: the same bytes elsewhere get the same answer.
The cache is best effort: an unreadable one is ignored, a failed write logged.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.fsutil import bytes_hash, write_atomic
from metrale_orch.proc import ProcessError
from metrale_orch.resources.collect import locate_ptxas, ptxas_stamp, run_ptxas
from metrale_orch.toolchain.definitions import Toolchain

__all__ = ["CACHE_NAME", "Assembler", "ptxas_complaint"]

log = logging.getLogger(__name__)

#: The answer cache, in ``<build_dir>/.state/``.
CACHE_NAME = "coverage.json"
_SCHEMA = 1
#: A line of ptxas's that reports an error (``..., line 25; error   : ...``).
_ERROR = re.compile(r"\berror\s*:", re.I)


def ptxas_complaint(output: str, path: str) -> str:
    """ptxas's first error lines, joined, without the file's path (pure); its last line
    when it wrote none that says ``error :``."""
    lines = [ln.strip().replace(f"{path}, ", "").replace(path, "") for ln in output.splitlines()]
    errors = [ln for ln in lines if _ERROR.search(ln)] or [ln for ln in lines if ln][-1:]
    return "; ".join(" ".join(ln.split()) for ln in errors[:3]) or "ptxas failed"


@dataclass(slots=True)
class Assembler:
    """The ptxas answers of one run: the cache loaded from ``path``, what this run used."""

    path: Path
    environ: Mapping[str, str]
    entries: dict[str, str]
    used: set[str] = field(default_factory=set)
    dirty: bool = False
    runs: int = 0
    hits: int = 0
    #: (toolchain, arch) -> (ptxas, its stamp).
    ptxas: dict[tuple[str, str], tuple[Path, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, environ: Mapping[str, str]) -> Assembler:
        """The cache at ``path`` (empty when missing, unreadable or of another schema)."""
        entries: dict[str, str] = {}
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            doc = None
        except (OSError, ValueError) as exc:
            log.warning("%s: ignoring an unreadable coverage cache (%s)", path, exc)
            doc = None
        if isinstance(doc, dict) and doc.get("schema") == _SCHEMA:
            found = doc.get("entries")
            if isinstance(found, dict):
                entries = {k: v for k, v in found.items() if isinstance(v, str)}
        return cls(path=path, environ=environ, entries=entries)

    def problem(self, toolchain: Toolchain, arch: str, ptx: Path, data: bytes) -> str | None:
        """Why ptxas refuses the PTX at ``ptx`` (whose bytes are ``data``) for ``arch``, or
        None when it assembles. Raises ``PtxasMissing``, or ``ProcessError`` when ptxas
        could not run to an exit (it is then not an answer about the PTX)."""
        memo = (toolchain.name, arch)
        if memo not in self.ptxas:
            ptxas = locate_ptxas(toolchain, self.environ, arch)
            self.ptxas[memo] = (ptxas, ptxas_stamp(ptxas))
        ptxas, stamp = self.ptxas[memo]
        key = f"{arch}|{bytes_hash(data)}|{stamp}"
        self.used.add(key)
        answer = self.entries.get(key)
        if answer is not None:
            self.hits += 1
            return answer or None
        self.runs += 1
        try:
            run_ptxas(ptxas, ptx, arch, self.environ)
            answer = ""
        except ProcessError as exc:
            if exc.returncode is None:
                raise
            answer = ptxas_complaint(exc.output, str(ptx))
        self.entries[key] = answer
        self.dirty = True
        return answer or None

    def save(self, *, prune: bool) -> None:
        """Write the cache when this run changed it; ``prune`` drops what it did not use."""
        if prune and self.entries.keys() - self.used:
            self.entries = {k: v for k, v in self.entries.items() if k in self.used}
            self.dirty = True
        if not self.dirty:
            return
        doc = {"schema": _SCHEMA, "entries": self.entries}
        try:
            write_atomic(self.path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
        except OSError as exc:
            log.warning("%s: cannot save the coverage cache (%s)", self.path, exc)
