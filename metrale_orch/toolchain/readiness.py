"""Whether each target's toolchain can build it: the one answer ``doit build`` and
``check`` both ask for (I/O: locates and probes compilers, runs the arch check).

:func:`ready_toolchain` is the toolchain found and probed for an arch
(:func:`~metrale_orch.toolchain.archcheck.find_toolchain_for_arch`, which picks the
compiler of some toolchains: SCALE's per-arch nvcc), or why not: a
:class:`~metrale_orch.toolchain.errors.ToolchainMissing` (a compiler that is not
installed, or one that cannot build the arch: hipcc's clang 15 and gfx1151) skips the
targets, any other error fails them. The build's generation and ``check`` both find
their toolchains here (:func:`start_finding` over :func:`wanted_toolchains`), so
``check`` skips exactly the targets the build skips.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from metrale_orch.errors import MetraleError
from metrale_orch.toolchain.archcheck import find_toolchain_for_arch
from metrale_orch.toolchain.definitions import Toolchain, select_toolchain
from metrale_orch.toolchain.errors import ToolchainMissing
from metrale_orch.toolchain.probe import FoundToolchain, ProbeMemo
from metrale_orch.tree import Layout, LayoutError, Target

__all__ = [
    "ToolKey",
    "probe_failed",
    "ready_toolchain",
    "start_finding",
    "tool_key",
    "wanted_toolchains",
]

#: (toolchain name, ``[hardware] arch`` or "") — what a toolchain is found for.
ToolKey = tuple[str, str]


def tool_key(toolchain: Toolchain, layout: Layout) -> ToolKey:
    """What ``layout``'s ``toolchain`` is found for (pure)."""
    return (toolchain.name, layout.hardware.arch or "")


def ready_toolchain(
    toolchain: Toolchain,
    environ: Mapping[str, str],
    state_dir: Path | None,
    arch: str,
    probes: ProbeMemo,
) -> FoundToolchain | MetraleError:
    """The toolchain found and probed for ``arch``, or why not (I/O): a
    :class:`ToolchainMissing` skips the targets, any other error fails them."""
    try:
        return find_toolchain_for_arch(
            toolchain, environ, state_dir=state_dir, arch=arch, memo=probes
        )
    except MetraleError as exc:
        return exc


def probe_failed(tool: FoundToolchain | MetraleError) -> bool:
    """Whether finding the toolchain failed other than by its absence (pure)."""
    return isinstance(tool, MetraleError) and not isinstance(tool, ToolchainMissing)


def wanted_toolchains(
    checked: Sequence[tuple[Target, Layout | LayoutError]], toolchains: Mapping[str, Toolchain]
) -> dict[ToolKey, Toolchain]:
    """(toolchain name, arch) -> toolchain of every target that resolved, as the targets'
    loop selects them (a target whose selection fails wants none; pure)."""
    wanted: dict[ToolKey, Toolchain] = {}
    for _target, layout in checked:
        if isinstance(layout, LayoutError):
            continue
        try:
            toolchain = select_toolchain(layout.hardware, toolchains)
        except MetraleError:
            continue
        wanted.setdefault(tool_key(toolchain, layout), toolchain)
    return wanted


def start_finding(
    wanted: Mapping[ToolKey, Toolchain],
    environ: Mapping[str, str],
    state_dir: Path | None,
    probes: ProbeMemo,
) -> dict[ToolKey, Future[FoundToolchain | MetraleError]]:
    """:func:`ready_toolchain` of each wanted (toolchain, arch), each on a thread of its own.

    A find is a few short compiler runs (or a wait for the probe another thread runs), so
    a pool smaller than the finds made the last toolchains' finds queue behind the first
    ones (four NVIDIA arches waiting on one nvcc probe held up the HIP and Metal per-arch
    dry runs until the targets' loop reached them)."""
    if not wanted:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(len(wanted), 32), thread_name_prefix="metrale-find")
    pending = {
        key: pool.submit(ready_toolchain, toolchain, environ, state_dir, key[1], probes)
        for key, toolchain in wanted.items()
    }
    pool.shutdown(wait=False)  # the submitted finds still run; each is waited for
    return pending
