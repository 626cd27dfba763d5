"""The errors of the resource report: one base, a subclass per case, each naming its file."""

from __future__ import annotations

from metrale_orch.errors import EXIT_FAILURE, MetraleError

__all__ = [
    "BadManifest",
    "NoTargetMatches",
    "PtxasMissing",
    "ReportParseError",
    "ResourcesError",
    "UnreadableArtefact",
]


class ResourcesError(MetraleError):
    """Base of the resource report's errors."""


class NoTargetMatches(ResourcesError):
    """The pattern selects no target of the tree (exit 2)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        super().__init__(
            f"no target matches {pattern!r}; `metrale-orch layout` lists every target "
            "(quote a wildcard: 'hopper/*')"
        )


class BadManifest(ResourcesError):
    """A target's ``manifest.json`` cannot be read or lacks a field the report needs."""

    exit_code = EXIT_FAILURE

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}; rebuild the target to rewrite it")


class UnreadableArtefact(ResourcesError):
    """An artefact a manifest lists is missing, or is neither PTX, a cubin nor a fatbin."""

    exit_code = EXIT_FAILURE

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class ReportParseError(ResourcesError):
    """``ptxas -v`` said something this parser does not understand."""

    exit_code = EXIT_FAILURE

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: cannot read ptxas's report: {problem}")


class PtxasMissing(ResourcesError):
    """No ``ptxas`` beside the toolchain's ``nvcc``."""

    exit_code = EXIT_FAILURE

    def __init__(self, path: str, program: str) -> None:
        self.path = path
        self.program = program
        super().__init__(
            f"{path} does not exist: the register report runs the ptxas that comes with "
            f"{program}; install the full CUDA toolkit there (or point the toolchain at one)"
        )
