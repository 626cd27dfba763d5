"""The register/spill resource report: per kernel, per arch, what ptxas made of each build.

:mod:`~metrale_orch.resources.report` holds the values and the pure parts (parsing
``ptxas -v``, comparing two reports); :mod:`~metrale_orch.resources.collect` the I/O
(reading a build directory's manifests and artefacts, running ptxas, the cache in
``.state/``). It reads the tree, the toolchains and the artefact readers of
:mod:`metrale_orch.smoke.elf`; nothing but the CLI imports it.
"""

from __future__ import annotations

from metrale_orch.resources.collect import (
    CACHE_NAME,
    Collected,
    collect_resources,
    run_ptxas,
    select_targets,
)
from metrale_orch.resources.errors import (
    BadManifest,
    NoTargetMatches,
    PtxasMissing,
    ReportParseError,
    ResourcesError,
    UnreadableArtefact,
)
from metrale_orch.resources.report import (
    KernelChange,
    KernelResources,
    ModuleResources,
    ResourceReport,
    TargetResources,
    diff_reports,
    kernels_from_cubin,
    parse_ptxas_report,
)

__all__ = [
    "CACHE_NAME",
    "BadManifest",
    "Collected",
    "KernelChange",
    "KernelResources",
    "ModuleResources",
    "NoTargetMatches",
    "PtxasMissing",
    "ReportParseError",
    "ResourceReport",
    "ResourcesError",
    "TargetResources",
    "UnreadableArtefact",
    "collect_resources",
    "diff_reports",
    "kernels_from_cubin",
    "parse_ptxas_report",
    "run_ptxas",
    "select_targets",
]
