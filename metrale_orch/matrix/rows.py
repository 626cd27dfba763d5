"""The matrix rows: which targets each CI job builds, on which runner, with which smoke.

:func:`scan_tree` reads the tree (each hardware's toolchain and targets, weighed by
module count); :func:`plan_rows`, :func:`plan_matrix` and :func:`plan_smoke_matrix`
turn it and the runner map (:mod:`~metrale_orch.matrix.runners`) into rows, a large
hardware split into shards balanced by :func:`plan_shards` (greedy LPT, total
tie-breaks). Rows are sorted by (hardware, shard), targets sorted, and every target of
a selected hardware is in exactly one row.
"""

from __future__ import annotations

import fnmatch
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

from metrale_orch.matrix.errors import NoMatch, ShardSpecError, UnmappedHardware
from metrale_orch.matrix.runners import Placement, RunnerClass, Runners
from metrale_orch.toolchain.definitions import load_toolchains, select_toolchain
from metrale_orch.tree import LayoutError, TreeSnapshot, resolve_all

# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetLoad:
    """One target and its weight for sharding (its module count)."""

    name: str
    modules: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareInfo:
    """What the matrix needs to know of one hardware tree."""

    name: str
    toolchain: str
    targets: tuple[TargetLoad, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MatrixRow:
    """One job of the matrix."""

    hw: str
    shard: int
    shards: int
    #: The class this row runs on: the build class for a build row, the smoke class for a
    #: smoke-only row (:func:`plan_smoke_matrix`).
    runner: RunnerClass
    #: The hardware's build and smoke classes (``build-runner``, ``smoke-runner``).
    placement: Placement
    toolchain: str
    targets: tuple[str, ...]
    modules: int
    #: doit task names, space-separated (``build:<hw>/*`` when the row covers the hardware).
    build: str
    #: ``smoke:<hw>``, or "" where the row is one shard of several (see ``plan_smoke_matrix``).
    smoke: str

    @property
    def name(self) -> str:
        return self.hw if self.shards == 1 else f"{self.hw} (shard {self.shard} of {self.shards})"

    @property
    def id(self) -> str:
        """A name safe for artefacts and file names."""
        return self.hw if self.shards == 1 else f"{self.hw}-shard{self.shard}of{self.shards}"

    def to_dict(self) -> dict[str, object]:
        return {
            "build": self.build,
            "build-runner": self.placement.build,
            "hw": self.hw,
            "id": self.id,
            "modules": self.modules,
            "name": self.name,
            "runner": self.runner.name,
            "runs-on": list(self.runner.labels),
            "shard": self.shard,
            "shards": self.shards,
            "smoke": self.smoke,
            "smoke-runner": self.placement.smoke,
            "target-count": len(self.targets),
            "targets": list(self.targets),
            "toolchain": self.toolchain,
            "toolchain-available": self.toolchain in self.runner.toolchains,
        }


# --------------------------------------------------------------------------- the tree


def scan_tree(root: Path) -> tuple[HardwareInfo, ...]:
    """Walk ``<root>/kernels`` and resolve every target to count its modules (I/O).

    The toolchain of each hardware is chosen as the build chooses it
    (``toolchains.select_toolchain``: ``[build] toolchain``, else by vendor).
    A target that fails to resolve is kept with zero modules (the build reports
    its error). Raises ``LayoutError`` when the tree cannot be walked and
    ``ToolchainError`` when a hardware's toolchain cannot be chosen.
    """
    snap = TreeSnapshot(root)
    toolchains = load_toolchains(root)
    by_hw: dict[str, list[TargetLoad]] = {}
    for target, layout in resolve_all(root, snap):
        modules = 0 if isinstance(layout, LayoutError) else len(layout.modules())
        by_hw.setdefault(target.hardware, []).append(TargetLoad(name=str(target), modules=modules))
    infos = []
    for hw in sorted(by_hw):
        infos.append(
            HardwareInfo(
                name=hw,
                toolchain=select_toolchain(snap.hardware(hw), toolchains).name,
                targets=tuple(sorted(by_hw[hw], key=lambda t: t.name)),
            )
        )
    return tuple(infos)


# --------------------------------------------------------------------------- planning


def parse_shard_specs(specs: Iterable[str]) -> dict[str, int]:
    """``["hopper=3", ...]`` -> ``{"hopper": 3}``. Raises :class:`ShardSpecError`."""
    out: dict[str, int] = {}
    for spec in specs:
        hw, sep, count = spec.partition("=")
        hw = hw.strip()
        if not sep or not hw:
            raise ShardSpecError(spec, "expected HW=N, e.g. --shards hopper=3")
        try:
            n = int(count)
        except ValueError:
            raise ShardSpecError(spec, f"N must be a whole number, got {count!r}") from None
        if n < 1:
            raise ShardSpecError(spec, "N must be at least 1")
        if hw in out and out[hw] != n:
            raise ShardSpecError(spec, f"{hw} is given twice ({out[hw]} and {n})")
        out[hw] = n
    return out


def _weight(t: TargetLoad) -> int:
    # Every target costs something (resolve, stage, manifest) even with no modules.
    return max(1, t.modules)


def plan_shards(targets: Sequence[TargetLoad], count: int) -> tuple[tuple[TargetLoad, ...], ...]:
    """Split ``targets`` into ``min(count, len(targets))`` non-empty shards (greedy LPT).

    Heaviest target first (ties by name), each into the lightest shard (ties by
    fewer targets, then lower index). The result depends only on the set of
    targets, and the loads of any two shards differ by at most the heaviest
    target's weight. Each shard's targets are sorted by name.
    """
    n = min(count, len(targets))
    if n <= 1:
        return (tuple(sorted(targets, key=lambda t: t.name)),) if targets else ()
    order = sorted(targets, key=lambda t: (-_weight(t), t.name))
    heap = [(0, 0, i) for i in range(n)]
    bins: list[list[TargetLoad]] = [[] for _ in range(n)]
    for t in order:
        load, size, i = heapq.heappop(heap)
        bins[i].append(t)
        heapq.heappush(heap, (load + _weight(t), size + 1, i))
    shards = [tuple(sorted(b, key=lambda t: t.name)) for b in bins]
    # Number shards by their first target so shard 1 holds the alphabetically first one.
    return tuple(sorted(shards, key=lambda s: s[0].name))


def _select(hw: HardwareInfo, pattern: str | None) -> tuple[TargetLoad, ...]:
    if pattern is None or fnmatch.fnmatchcase(hw.name, pattern):
        return hw.targets
    return tuple(t for t in hw.targets if fnmatch.fnmatchcase(t.name, pattern))


def unmapped_hardware(
    hardware: Iterable[HardwareInfo], runners: Runners, pattern: str | None = None
) -> tuple[str, ...]:
    """Hardware names (among those ``pattern`` selects) with no runner class, sorted."""
    return tuple(
        sorted(
            hw.name
            for hw in hardware
            if runners.placement_for(hw.name) is None and _select(hw, pattern)
        )
    )


class RowOptions(TypedDict, total=False):
    """The keyword options of :func:`plan_rows`, which the ``plan_*matrix`` views pass on."""

    pattern: str | None
    allow_unmapped: bool
    shard_size: int | None
    shards: Mapping[str, int] | None


def plan_rows(
    hardware: Sequence[HardwareInfo],
    runners: Runners,
    *,
    pattern: str | None = None,
    allow_unmapped: bool = False,
    shard_size: int | None = None,
    shards: Mapping[str, int] | None = None,
) -> tuple[MatrixRow, ...]:
    """The matrix rows, sorted by (hardware, shard).

    ``pattern`` (fnmatch) selects hardware by name, or targets by
    ``hw/model/quant``. ``shards`` maps a hardware to its number of rows;
    ``shard_size`` splits every other hardware into rows of at most that many
    targets. Raises :class:`UnmappedHardware` (unless ``allow_unmapped``, which
    leaves such hardware out), :class:`ShardSpecError`, :class:`NoMatch`.
    """
    shards = dict(shards or {})
    names = tuple(sorted(hw.name for hw in hardware))
    for hw_name in sorted(shards):
        if hw_name not in names:
            raise ShardSpecError(
                f"{hw_name}={shards[hw_name]}",
                f"no hardware tree kernels/{hw_name} with targets (hardware: "
                f"{', '.join(names) or 'none'})",
            )
    if shard_size is not None and shard_size < 1:
        raise ShardSpecError(f"--shard-size {shard_size}", "N must be at least 1")

    selected = [(hw, _select(hw, pattern)) for hw in sorted(hardware, key=lambda h: h.name)]
    selected = [(hw, targets) for hw, targets in selected if targets]
    if pattern is not None and not selected:
        raise NoMatch(pattern, names)
    unmapped = unmapped_hardware((hw for hw, _ in selected), runners, pattern)
    if unmapped and not allow_unmapped:
        raise UnmappedHardware(unmapped, runners.path)

    rows: list[MatrixRow] = []
    for hw, targets in selected:
        placement = runners.placement_for(hw.name)
        if placement is None:
            continue
        if hw.name in shards:
            count = shards[hw.name]
        elif shard_size is not None:
            count = math.ceil(len(targets) / shard_size)
        else:
            count = 1
        whole = len(targets) == len(hw.targets)
        rows.extend(_build_rows(hw, plan_shards(targets, count), whole, placement, runners))
    return tuple(rows)


def _build_rows(
    hw: HardwareInfo,
    parts: Sequence[Sequence[TargetLoad]],
    whole: bool,
    placement: Placement,
    runners: Runners,
) -> list[MatrixRow]:
    """One hardware's build rows, one per shard, on its build class. The one row of an
    unsharded hardware also smokes, unless the hardware smokes on another class."""
    rows = []
    for index, part in enumerate(parts, start=1):
        if len(parts) == 1 and whole:
            build = f"build:{hw.name}/*"
        else:
            build = " ".join(f"build:{t.name}" for t in part)
        rows.append(
            MatrixRow(
                hw=hw.name,
                shard=index,
                shards=len(parts),
                runner=runners.classes[placement.build],
                placement=placement,
                toolchain=hw.toolchain,
                targets=tuple(t.name for t in part),
                modules=sum(t.modules for t in part),
                build=build,
                smoke=f"smoke:{hw.name}" if len(parts) == 1 and not placement.split else "",
            )
        )
    return rows


def plan_matrix(
    hardware: Sequence[HardwareInfo], runners: Runners, **options: Unpack[RowOptions]
) -> dict[str, object]:
    """The ``strategy.matrix`` object ``{"include": [...]}`` (see :func:`plan_rows`)."""
    rows = plan_rows(hardware, runners, **options)
    return {"include": [row.to_dict() for row in rows]}


def plan_smoke_matrix(
    hardware: Sequence[HardwareInfo], runners: Runners, **options: Unpack[RowOptions]
) -> dict[str, object]:
    """One smoke-only row, on its smoke class, per hardware whose build rows do not smoke:
    one split into several shards, or one that smokes on another class than it builds on.

    ``smoke:<hw>`` depends on every build of the hardware, so a shard cannot run
    it without building the other shards' targets, and a GPU class that only smokes
    must not compile; the workflow runs these rows after every build row has
    published to the shared cache, and makes a miss there a failure
    (``require_hits``). Each row has the same keys as a build row, with ``build``
    empty and ``smoke`` set.
    """
    rows = plan_rows(hardware, runners, **options)
    out: list[dict[str, object]] = []
    for name in sorted({row.hw for row in rows}):
        mine = [row for row in rows if row.hw == name]
        if any(row.smoke for row in mine):
            continue
        first = mine[0]
        whole = MatrixRow(
            hw=name,
            shard=1,
            shards=1,
            runner=runners.classes[first.placement.smoke],
            placement=first.placement,
            toolchain=first.toolchain,
            targets=tuple(sorted(t for row in mine for t in row.targets)),
            modules=sum(row.modules for row in mine),
            build="",
            smoke=f"smoke:{name}",
        )
        out.append(whole.to_dict())
    return {"include": out}
