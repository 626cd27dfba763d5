"""The release gate's errors: one base, :class:`GateError`, and a subclass per case.

A mistake in what the gate reads (a family or fusion file of the tree, a ``deploy``
setting) is a usage error (exit 2) naming the file and the key; a problem the gate
*finds* in a build is never an error but a line of its report.
"""

from __future__ import annotations

from metrale_orch.errors import FileProblem, MetraleError

__all__ = ["DeployError", "GateError", "KernelListError", "UnreadableArtefact"]


class GateError(MetraleError):
    """Base of the release gate's errors."""


class KernelListError(GateError):
    """A ``KERNEL_FAMILIES.toml`` or ``FUSIONS.toml`` of the tree cannot be read or has a
    misshapen kernel list; names the file and the key."""

    path: str
    key: str
    problem: str

    template = "{path}: {key}: {problem}"


class DeployError(GateError):
    """A ``[tool.metrale-orch.deploy.<hw>]`` setting the gate cannot use; names where it
    was set and the key."""

    where: str
    key: str
    problem: str

    template = "{where}: {key}: {problem}"


class UnreadableArtefact(FileProblem, GateError):
    """An artefact is neither PTX, a cubin, a fatbin nor an AMDGPU code object."""

    exit_code = 1
