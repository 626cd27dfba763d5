"""The errors of the resource report: one base, a subclass per case, each naming its file."""

from __future__ import annotations

from metrale_orch.errors import EXIT_FAILURE, FileProblem, MetraleError

__all__ = [
    "BadManifest",
    "LockFileError",
    "NoTargetMatches",
    "PtxasMissing",
    "ReportParseError",
    "ResourcesError",
    "UnknownBudgetKey",
    "UnreadableArtefact",
]


class ResourcesError(MetraleError):
    """Base of the resource report's errors."""


class NoTargetMatches(ResourcesError):
    """The pattern selects no target of the tree (exit 2)."""

    pattern: str

    template = (
        "no target matches {pattern!r}; `metrale-orch layout` lists every target "
        "(quote a wildcard: 'hopper/*')"
    )


class BadManifest(FileProblem, ResourcesError):
    """A target's ``manifest.json`` cannot be read or lacks a field the report needs."""

    exit_code = EXIT_FAILURE
    template = "{path}: {problem}; rebuild the target to rewrite it"


class UnreadableArtefact(FileProblem, ResourcesError):
    """An artefact a manifest lists is missing, or is neither PTX, a cubin nor a fatbin."""

    exit_code = EXIT_FAILURE


class ReportParseError(ResourcesError):
    """``ptxas -v`` said something this parser does not understand."""

    where: str
    problem: str

    exit_code = EXIT_FAILURE
    template = "{where}: cannot read ptxas's report: {problem}"


class PtxasMissing(ResourcesError):
    """No ``ptxas`` beside the toolchain's ``nvcc``."""

    path: str
    program: str

    exit_code = EXIT_FAILURE
    template = (
        "{path} does not exist: the register report runs the ptxas that comes with "
        "{program}; install the full CUDA toolkit there (or point the toolchain at one)"
    )


class LockFileError(FileProblem, ResourcesError):
    """``kernels.lock`` is missing, unreadable or malformed (exit 2: the user's file)."""


class UnknownBudgetKey(ResourcesError):
    """A ``size_budget`` key names neither a hardware nor a target of the tree (exit 2)."""

    where: str
    key: str

    template = (
        "{where}: {key}: names no hardware or target of the tree; a key is a hardware "
        "(hopper) or a target (hw/model/quant) that `metrale-orch layout` lists"
    )
