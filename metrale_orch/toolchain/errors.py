"""The toolchain's errors: a definition or selection that is wrong, a compiler not installed.

Each keeps its data as attributes (fields, see :class:`~metrale_orch.errors.MetraleError`)
and says what and where in its text. Imports nothing of the package but its shared
helpers, so every toolchain module (and every build step) may raise them.
"""

from __future__ import annotations

from dataclasses import KW_ONLY

from metrale_orch.errors import MetraleError

__all__ = ["ArchUnsupported", "ToolchainError", "ToolchainMissing"]


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


class ArchUnsupported(ToolchainMissing):
    """The toolchain's compiler is installed but cannot build the hardware's arch (its
    clang does not know it, or lacks its device libraries): like a missing compiler, the
    build skips the target (a failure when it is named); says what the compiler said."""

    _: KW_ONLY
    arch: str = ""
    #: The compiler's own first error line.
    reason: str = ""

    def __str__(self) -> str:
        return (
            f"toolchain {self.toolchain!r} cannot build {self.arch}: `{self.program}` says: "
            f"{self.reason}; to build it, install {self.hint} whose compiler supports "
            f"{self.arch}"
        )
