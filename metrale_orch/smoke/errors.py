"""The smoke area's errors: one base, :class:`SmokeError`, under the package's ``MetraleError``.

Every error that leaves :mod:`metrale_orch.smoke` is one of these; the artefact
readers' :class:`~metrale_orch.smoke.elf.ElfError` and
:class:`~metrale_orch.smoke.ptx.PtxError` are part of the family too.
"""

from __future__ import annotations

from metrale_orch.errors import MetraleError

__all__ = ["SmokeCaseError", "SmokeError"]


class SmokeError(MetraleError):
    """Base of the smoke area's errors."""


class SmokeCaseError(SmokeError):
    """A ``SMOKE.toml`` case is malformed; names the file, the case and the key."""

    path: str
    case: str
    key: str
    problem: str

    def __str__(self) -> str:
        where = f"{self.path}: case {self.case!r}" if self.case else self.path
        return f"{where}: {self.key}: {self.problem} (see the smoke case format)"
