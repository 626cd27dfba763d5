"""The matrix rows: which targets each CI job builds, on which runner, with which smoke.

:func:`scan_tree` reads the tree (each hardware's toolchain and targets, weighed by
module count); :func:`plan_rows`, :func:`plan_matrix` and :func:`plan_smoke_matrix`
turn it, the runner map (:mod:`~metrale_orch.matrix.runners`) and the kept compile
seconds into rows, a large hardware split into shards balanced by time
(:mod:`~metrale_orch.matrix.balance`: greedy LPT, total tie-breaks). Rows are sorted by
(hardware, shard), targets sorted, and every target of a selected hardware is in
exactly one row.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

from metrale_orch.matrix.balance import allocate_rows, plan_costs, plan_lpt, row_cost
from metrale_orch.matrix.errors import NoMatch, ShardSpecError, UnmappedHardware
from metrale_orch.matrix.runners import Placement, RunnerClass, Runners
from metrale_orch.paths import STATE_DIR
from metrale_orch.steps.times import (
    TARGET_TIMES,
    read_target_seconds,
    write_target_seconds,
)
from metrale_orch.toolchain.definitions import load_toolchains, select_toolchain
from metrale_orch.tree import LayoutError, TreeSnapshot, resolve_all, unsafe_target_name

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
    #: The expected compile seconds of the row's targets (kept times, a never-built
    #: target estimated from its module count); None without kept times, and in a
    #: smoke-only row.
    seconds: float | None
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
            "seconds": self.seconds,
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
    its error). Raises ``LayoutError`` when the tree cannot be walked or a target's name
    cannot be a task name in a row (``UnsafeTargetName``: whitespace, ``*?[]=``), and
    ``ToolchainError`` when a hardware's toolchain cannot be chosen.
    """
    snap = TreeSnapshot(root)
    toolchains = load_toolchains(root)
    by_hw: dict[str, list[TargetLoad]] = {}
    for target, layout in resolve_all(root, snap):
        unsafe = unsafe_target_name(target)
        if unsafe is not None:
            raise unsafe
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


def keep_seconds(build_dir: Path, found: Path) -> tuple[int, int]:
    """Merge every ``target-times.json`` under ``found`` (the build rows' of a CI run, in
    sorted path order) into ``<build_dir>/.state``'s summary: a target keeps its older
    seconds unless a row compiled it again. Returns (files, targets kept). Raises
    ``OSError`` when the summary cannot be written."""
    state = Path(build_dir) / STATE_DIR
    seconds = read_target_seconds(state)
    files = sorted(p.parent for p in Path(found).rglob(TARGET_TIMES))
    for directory in files:
        seconds.update(read_target_seconds(directory))
    write_target_seconds(state, seconds)
    return len(files), len(seconds)


# --------------------------------------------------------------------------- planning


def parse_shards(specs: Iterable[str]) -> tuple[int | None, dict[str, int]]:
    """``["8", "hopper=3"]`` -> ``(8, {"hopper": 3})``: the rows in all (``--shards N``,
    None when not given) and the rows of given hardware. Raises :class:`ShardSpecError`."""
    total: int | None = None
    per_hw = []
    for spec in specs:
        if "=" in spec:
            per_hw.append(spec)
            continue
        try:
            n = int(spec)
        except ValueError:
            raise ShardSpecError(
                spec, "expected N or HW=N, e.g. --shards 8 or --shards hopper=3"
            ) from None
        if n < 1:
            raise ShardSpecError(spec, "N must be at least 1")
        if total is not None and total != n:
            raise ShardSpecError(spec, f"the number of rows is given twice ({total} and {n})")
        total = n
    return total, parse_shard_specs(per_hw)


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


def plan_shards(
    targets: Sequence[TargetLoad], count: int, costs: Mapping[str, float] | None = None
) -> tuple[tuple[TargetLoad, ...], ...]:
    """Split ``targets`` into ``min(count, len(targets))`` non-empty shards (greedy LPT).

    Each target weighs its ``costs`` entry (seconds, :func:`~.balance.plan_costs`), else
    its module count (at least 1). Costliest target first (ties by name), each into the
    lightest shard (ties by fewer targets, then lower index). The result depends only
    on the set of targets, and the loads of any two shards differ by at most the
    heaviest target's weight. Each shard's targets are sorted by name; shard 1 holds the
    alphabetically first target.
    """
    by_name = {t.name: t for t in targets}
    weights = {
        t.name: costs[t.name] if costs is not None else float(max(1, t.modules)) for t in targets
    }
    return tuple(tuple(by_name[n] for n in part) for part in plan_lpt(weights, count))


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
    total_shards: int | None
    times: Mapping[str, float] | None


def plan_rows(
    hardware: Sequence[HardwareInfo],
    runners: Runners,
    *,
    pattern: str | None = None,
    allow_unmapped: bool = False,
    shard_size: int | None = None,
    shards: Mapping[str, int] | None = None,
    total_shards: int | None = None,
    times: Mapping[str, float] | None = None,
) -> tuple[MatrixRow, ...]:
    """The matrix rows, sorted by (hardware, shard).

    ``pattern`` (fnmatch) selects hardware by name, or targets by
    ``hw/model/quant``. ``shards`` maps a hardware to its number of rows;
    ``total_shards`` is the number of build rows in all, shared among the other
    selected hardware by time (:func:`~.balance.allocate_rows`, one row each at least);
    else ``shard_size`` splits every other hardware into rows of at most that many
    targets. ``times``: the kept compile seconds by target, which the split balances
    (module counts without them). Raises :class:`UnmappedHardware` (unless
    ``allow_unmapped``, which leaves such hardware out), :class:`ShardSpecError`,
    :class:`NoMatch`.
    """
    shards = dict(shards or {})
    names = tuple(sorted(hw.name for hw in hardware))
    _check_shard_options(names, shards, shard_size, total_shards)
    selected = [(hw, _select(hw, pattern)) for hw in sorted(hardware, key=lambda h: h.name)]
    selected = [(hw, targets) for hw, targets in selected if targets]
    if pattern is not None and not selected:
        raise NoMatch(pattern, names)
    unmapped = unmapped_hardware((hw for hw, _ in selected), runners, pattern)
    if unmapped and not allow_unmapped:
        raise UnmappedHardware(unmapped, runners.path)
    mapped = [
        (hw, ts, placement)
        for hw, ts in selected
        if (placement := runners.placement_for(hw.name)) is not None
    ]

    every = {t.name: t.modules for hw in hardware for t in hw.targets}
    costs, timed = plan_costs(every, times or {})
    per_hw = {hw.name: {t.name: costs[t.name] for t in ts} for hw, ts, _ in mapped}
    counts = {
        hw.name: shards.get(hw.name)
        or (math.ceil(len(ts) / shard_size) if shard_size is not None else 1)
        for hw, ts, _ in mapped
    }
    if total_shards is not None:
        counts = _allocate(per_hw, total_shards, shards)
    rows: list[MatrixRow] = []
    for hw, targets, placement in mapped:
        parts = plan_shards(targets, counts[hw.name], per_hw[hw.name])
        whole = len(targets) == len(hw.targets)
        rows.extend(_build_rows(hw, parts, whole, placement, runners, costs if timed else None))
    return tuple(rows)


def _check_shard_options(
    names: Sequence[str],
    shards: Mapping[str, int],
    shard_size: int | None,
    total_shards: int | None,
) -> None:
    for hw_name in sorted(shards):
        if hw_name not in names:
            raise ShardSpecError(
                f"{hw_name}={shards[hw_name]}",
                f"no hardware tree kernels/{hw_name} with targets (hardware: "
                f"{', '.join(names) or 'none'})",
            )
    if shard_size is not None and shard_size < 1:
        raise ShardSpecError(f"--shard-size {shard_size}", "N must be at least 1")
    if total_shards is not None and total_shards < 1:
        raise ShardSpecError(str(total_shards), "N must be at least 1")
    if total_shards is not None and shard_size is not None:
        raise ShardSpecError(
            str(total_shards), "--shards N and --shard-size both set the rows: give one"
        )


def _allocate(
    per_hw: Mapping[str, Mapping[str, float]], total: int, shards: Mapping[str, int]
) -> dict[str, int]:
    """``--shards N``: the rows of each selected hardware, N in all (see
    :func:`~.balance.allocate_rows`); ``shards`` fixes some hardware's count."""
    fixed = {hw: min(n, len(per_hw[hw])) for hw, n in shards.items() if hw in per_hw}
    others = sorted(hw for hw in per_hw if hw not in fixed)
    need = sum(fixed.values()) + len(others)
    if total < need:
        given = "".join(f"{hw}={n} plus " for hw, n in sorted(fixed.items()))
        raise ShardSpecError(
            str(total),
            f"{need} rows at least are needed: {given}one for each selected hardware "
            f"({', '.join(others)}), as a row builds one hardware's targets; give at least "
            f"{need}, or select fewer hardware with a PATTERN",
        )
    return allocate_rows(per_hw, total, fixed)


def _build_rows(
    hw: HardwareInfo,
    parts: Sequence[Sequence[TargetLoad]],
    whole: bool,
    placement: Placement,
    runners: Runners,
    seconds: Mapping[str, float] | None,
) -> list[MatrixRow]:
    """One hardware's build rows, one per shard, on its build class. The one row of an
    unsharded hardware also smokes, unless the hardware smokes on another class.
    ``seconds``: each target's expected seconds (None: no kept times)."""
    rows = []
    for index, part in enumerate(parts, start=1):
        if len(parts) == 1 and whole:
            build = f"build:{hw.name}/*"
        else:
            build = " ".join(f"build:{t.name}" for t in part)
        names = tuple(t.name for t in part)
        rows.append(
            MatrixRow(
                hw=hw.name,
                shard=index,
                shards=len(parts),
                runner=runners.classes[placement.build],
                placement=placement,
                toolchain=hw.toolchain,
                targets=names,
                modules=sum(t.modules for t in part),
                seconds=None if seconds is None else round(row_cost(seconds, names), 1),
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
            seconds=None,
            build="",
            smoke=f"smoke:{name}",
        )
        out.append(whole.to_dict())
    return {"include": out}
