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

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.fsutil import bytes_hash
from metrale_orch.proc import ProcessError
from metrale_orch.resources.answers import Answers
from metrale_orch.resources.collect import locate_ptxas, ptxas_stamp, run_ptxas
from metrale_orch.toolchain.definitions import Toolchain

__all__ = ["CACHE_NAME", "Assembler", "ptxas_complaint"]


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
    """The ptxas answers of one run (kept in :class:`~metrale_orch.resources.answers.Answers`
    at ``<build_dir>/.state/coverage.json``): "" when the PTX assembles, else why not."""

    environ: Mapping[str, str]
    answers: Answers
    runs: int = 0
    hits: int = 0
    #: (toolchain, arch) -> (ptxas, its stamp).
    ptxas: dict[tuple[str, str], tuple[Path, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, environ: Mapping[str, str]) -> Assembler:
        """The answers kept at ``path`` (none when missing, unreadable or of another schema)."""
        return cls(environ=environ, answers=Answers.load(path, _SCHEMA, "the coverage cache"))

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
        answer = self.answers.get(key)
        if isinstance(answer, str):
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
        self.answers.put(key, answer)
        return answer or None

    def save(self, *, prune: bool) -> None:
        """Keep the answers when this run changed them; ``prune`` drops what it did not use."""
        self.answers.save(prune=prune)
