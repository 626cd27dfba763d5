"""What a build's kernels cost: the register/spill report (per kernel, per arch, what
ptxas made of each build) and its committed baseline ``kernels.lock``
(:mod:`~metrale_orch.resources.lock`).

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
    LockFileError,
    NoTargetMatches,
    PtxasMissing,
    ReportParseError,
    ResourcesError,
    UnknownBudgetKey,
    UnreadableArtefact,
)
from metrale_orch.resources.lock import (
    LOCK_NAME,
    LockCheck,
    LockProblem,
    ResourceLock,
    check_lock,
    lock_from_report,
    read_lock,
    update_lock,
    write_lock,
)
from metrale_orch.resources.report import (
    KernelChange,
    KernelResources,
    ModuleResources,
    ResourceReport,
    SpillChange,
    TargetResources,
    diff_reports,
    kernels_from_cubin,
    parse_ptxas_report,
)

__all__ = [
    "CACHE_NAME",
    "LOCK_NAME",
    "BadManifest",
    "Collected",
    "KernelChange",
    "KernelResources",
    "LockCheck",
    "LockFileError",
    "LockProblem",
    "ModuleResources",
    "NoTargetMatches",
    "PtxasMissing",
    "ReportParseError",
    "ResourceLock",
    "ResourceReport",
    "ResourcesError",
    "SpillChange",
    "TargetResources",
    "UnknownBudgetKey",
    "UnreadableArtefact",
    "check_lock",
    "collect_resources",
    "diff_reports",
    "kernels_from_cubin",
    "lock_from_report",
    "parse_ptxas_report",
    "read_lock",
    "run_ptxas",
    "select_targets",
    "update_lock",
    "write_lock",
]
