"""The release gate: checks of a finished build that need only the CPU.

- :mod:`~metrale_orch.gate.entries`: an artefact's exported kernel entries, its arches
  and PTX ISA versions, from its bytes (:func:`exported_entries`);
- :mod:`~metrale_orch.gate.families`: the kernels a hardware's ``KERNEL_FAMILIES.toml``
  and ``FUSIONS.toml`` name;
- :mod:`~metrale_orch.gate.ptxisa`: NVIDIA's PTX ISA / CUDA release table;
- :mod:`~metrale_orch.gate.assemble`: ``ptxas`` on each PTX, answers cached in ``.state/``;
- :mod:`~metrale_orch.gate.report` and :mod:`~metrale_orch.gate.coverage`: the coverage
  report (``metrale-orch coverage``, ``doit coverage``);
- :mod:`~metrale_orch.gate.size`: the bytes a build installed, the size budget and the
  entries two modules of one target export (``metrale-orch size``).

It reads the tree, the configuration, the toolchains, the build plan's module names, the
artefact readers of :mod:`metrale_orch.smoke` and the ``ptxas`` of
:mod:`metrale_orch.resources`; only the CLI and the doit integration import it.
"""

from __future__ import annotations

from metrale_orch.gate.assemble import CACHE_NAME
from metrale_orch.gate.coverage import check_coverage, duplicate_problems
from metrale_orch.gate.entries import ArtefactView, exported_entries, read_artefact
from metrale_orch.gate.errors import DeployError, GateError, KernelListError, UnreadableArtefact
from metrale_orch.gate.families import NamedKernel, family_kernels, fusion_kernels
from metrale_orch.gate.ptxisa import CUDA_OF_ISA, isa_problem
from metrale_orch.gate.report import Coverage, CoverageReport, Problem, Unchecked
from metrale_orch.gate.size import (
    Duplicate,
    ModuleSize,
    SizeCheck,
    SizeReport,
    TargetBudget,
    TargetSize,
    budget_key_name,
    check_sizes,
)

__all__ = [
    "CACHE_NAME",
    "CUDA_OF_ISA",
    "ArtefactView",
    "Coverage",
    "CoverageReport",
    "DeployError",
    "Duplicate",
    "GateError",
    "KernelListError",
    "ModuleSize",
    "NamedKernel",
    "Problem",
    "SizeCheck",
    "SizeReport",
    "TargetBudget",
    "TargetSize",
    "Unchecked",
    "UnreadableArtefact",
    "budget_key_name",
    "check_coverage",
    "check_sizes",
    "duplicate_problems",
    "exported_entries",
    "family_kernels",
    "fusion_kernels",
    "isa_problem",
    "read_artefact",
]
