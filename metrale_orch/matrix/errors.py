"""The errors ``metrale-orch matrix`` raises: one base, a subclass per case."""

from __future__ import annotations

from metrale_orch.errors import MetraleError

__all__ = ["MatrixError", "NoMatch", "RunnersError", "ShardSpecError", "UnmappedHardware"]


class MatrixError(MetraleError):
    """Base of the errors ``metrale-orch matrix`` raises."""


class RunnersError(MatrixError):
    """``ci/runners.toml`` is missing, unreadable or malformed; names the file and key."""

    path: str
    key: str
    problem: str

    template = "{path}: {key}: {problem}"


class UnmappedHardware(MatrixError):
    """A hardware has no runner class and the runner map has no ``[default]``."""

    hardware: tuple[str, ...]
    path: str

    def __str__(self) -> str:
        return (
            f"{self.path}: [hardware]: no runner for hardware {', '.join(self.hardware)}; add "
            f'`{self.hardware[0]} = "<runner class>"` under [hardware], or a [default] runner, '
            "or pass --allow-unmapped to leave it out of the matrix"
        )


class ShardSpecError(MatrixError):
    """A ``--shards HW=N`` / ``--shard-size N`` value is malformed or names no hardware."""

    spec: str
    problem: str

    template = "--shards {spec}: {problem}"


class NoMatch(MatrixError):
    """The PATTERN matched no hardware and no target."""

    pattern: str
    hardware: tuple[str, ...]

    def __str__(self) -> str:
        known = ", ".join(self.hardware) or "(none)"
        return (
            f"pattern {self.pattern!r} matches no hardware and no target under kernels/ "
            f"(hardware: {known}); use a hardware name or an fnmatch pattern such as 'hopper/*'"
        )
