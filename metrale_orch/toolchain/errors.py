"""The toolchain's errors: a definition or selection that is wrong, a compiler not installed.

Each keeps its data as attributes (fields, see :class:`~metrale_orch.errors.MetraleError`)
and says what and where in its text. Imports nothing of the package but its shared
helpers, so every toolchain module (and every build step) may raise them.
"""

from __future__ import annotations

from dataclasses import KW_ONLY

from metrale_orch.errors import MetraleError

__all__ = ["ToolchainError", "ToolchainMissing"]


class ToolchainError(MetraleError):
    """A toolchain definition or selection is wrong; names the file and the key."""

    exit_code = 2

    where: str
    key: str
    problem: str

    def __str__(self) -> str:
        if self.key:
            return f"{self.where}: {self.key}: {self.problem}"
        return f"{self.where}: {self.problem}"


class ToolchainMissing(MetraleError):
    """The selected toolchain's program is not installed; says what to install."""

    exit_code = 1

    toolchain: str
    program: str
    hint: str
    _: KW_ONLY
    detail: str = ""

    def __str__(self) -> str:
        what = self.detail or f"`{self.program}` was not found"
        return f"toolchain {self.toolchain!r} is not installed: {what}; install {self.hint}"
