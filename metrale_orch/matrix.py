"""The CI matrix: one GitHub Actions ``strategy.matrix`` row per hardware tree.

``metrale-orch matrix`` turns the kernel tree and ``ci/runners.toml`` into the
JSON object a workflow feeds to ``strategy.matrix``
(``{"include": [row, ...]}``). Each row names a hardware, the runner labels of
the runner class it runs on, its targets, the doit task selector that builds them, its
smoke task, and whether the hardware's toolchain is installed on that runner
class. A large hardware may be split into several rows ("shards") by target,
balanced by module count.

A hardware builds on one runner class and smokes on another when the runner map
says so (:class:`Placement`): compiles need no GPU, so a CPU class compiles and
fills the shared cache, and the GPU class only smokes, from cache hits. Its build
rows then carry no smoke task, and :func:`plan_smoke_matrix` gives it one
smoke-only row on the smoke class, as it does for a hardware split into shards.

Invariants:

* :func:`plan_rows`, :func:`plan_matrix`, :func:`plan_smoke_matrix`,
  :func:`parse_runners`, :func:`parse_shard_specs` and :func:`plan_shards` are
  pure functions of values; only :func:`load_runners` and :func:`scan_tree`
  read files.
* Output is deterministic: rows sorted by (hardware, shard), targets sorted,
  shard assignment independent of input order (greedy LPT with total
  tie-breaks).
* Every target of a selected hardware appears in exactly one row.

``ci/runners.toml``::

    [runners.h100]                       # a runner class
    labels = ["self-hosted", "linux", "gpu-h100"]
    toolchains = ["nvcc"]                # toolchain names installed on it

    [runners.cpu]
    labels = ["self-hosted", "linux", "cpu"]
    toolchains = ["nvcc"]

    [hardware]                           # hardware tree -> runner class(es)
    hopper = { build = "cpu", smoke = "h100" }   # compile on CPU, smoke on the GPU
    b200 = "h100"                        # one class builds and smokes

    [default]                            # optional: for unlisted hardware
    runner = "h100"                      # or build = "cpu" and smoke = "h100"
"""

from __future__ import annotations

import fnmatch
import heapq
import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TypedDict, Unpack

from metrale_orch.errors import MetraleError
from metrale_orch.toolchain.definitions import load_toolchains, select_toolchain
from metrale_orch.tree import LayoutError, TreeSnapshot, resolve_all

__all__ = [
    "DEFAULT_RUNNERS_FILE",
    "HardwareInfo",
    "MatrixError",
    "MatrixRow",
    "NoMatch",
    "Placement",
    "RowOptions",
    "RunnerClass",
    "Runners",
    "RunnersError",
    "ShardSpecError",
    "TargetLoad",
    "UnmappedHardware",
    "load_runners",
    "parse_runners",
    "parse_shard_specs",
    "plan_matrix",
    "plan_rows",
    "plan_shards",
    "plan_smoke_matrix",
    "scan_tree",
    "unmapped_hardware",
]

#: Where ``metrale-orch matrix`` looks for the runner map, relative to the root.
DEFAULT_RUNNERS_FILE = "ci/runners.toml"

# --------------------------------------------------------------------------- errors


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
class RunnerClass:
    """A kind of CI machine: the labels that select it and the toolchains installed on it."""

    name: str
    labels: tuple[str, ...]
    toolchains: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a hardware's CI jobs run: the runner class that builds it and the one that
    smoke-tests it (the same class for a plain ``hw = "<class>"`` entry)."""

    build: str
    smoke: str

    @classmethod
    def both(cls, name: str) -> Placement:
        """One class builds and smokes."""
        return cls(build=name, smoke=name)

    @property
    def split(self) -> bool:
        """Whether the smoke runs on another class than the build (then from cache hits)."""
        return self.build != self.smoke


def _no_classes() -> Mapping[str, RunnerClass]:
    return MappingProxyType({})


def _no_hardware() -> Mapping[str, Placement]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class Runners:
    """The parsed runner map: runner classes, hardware -> placement, the default placement."""

    #: The file as named in messages (root-relative where possible).
    path: str = DEFAULT_RUNNERS_FILE
    classes: Mapping[str, RunnerClass] = field(default_factory=_no_classes)
    hardware: Mapping[str, Placement] = field(default_factory=_no_hardware)
    default: Placement | None = None

    def placement_for(self, hw: str) -> Placement | None:
        """Where ``hw`` builds and smokes: its own entry, else the default, else None."""
        return self.hardware.get(hw, self.default)


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


# --------------------------------------------------------------------------- runners.toml


def _str_list(value: object, path: str, key: str, *, non_empty: bool) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise RunnersError(path, key, "must be an array of non-blank strings")
    if non_empty and not value:
        raise RunnersError(path, key, "must name at least one label")
    if len(set(value)) != len(value):
        raise RunnersError(path, key, "lists a value twice")
    return tuple(value)


def parse_runners(doc: Mapping[str, object], path: str = DEFAULT_RUNNERS_FILE) -> Runners:
    """Validate a parsed ``runners.toml``. Raises :class:`RunnersError` naming the key."""
    for key in sorted(doc):
        if key not in ("runners", "hardware", "default"):
            raise RunnersError(
                path, key, "unknown table (known: [runners.<class>], [hardware], [default])"
            )
    classes = _parse_classes(doc.get("runners", {}), path)
    hw_doc = doc.get("hardware", {})
    if not isinstance(hw_doc, dict):
        raise RunnersError(
            path,
            "hardware",
            'must be a table of <hardware> = "<runner class>" or '
            '{ build = "<class>", smoke = "<class>" }',
        )
    hardware = {
        hw: _parse_placement(hw_doc[hw], f"hardware.{hw}", classes, path) for hw in sorted(hw_doc)
    }
    return Runners(
        path=path,
        classes=MappingProxyType(classes),
        hardware=MappingProxyType(hardware),
        default=_parse_default(doc.get("default", {}), classes, path),
    )


def _parse_classes(classes_doc: object, path: str) -> dict[str, RunnerClass]:
    """The ``[runners.<class>]`` tables."""
    if not isinstance(classes_doc, dict):
        raise RunnersError(path, "runners", "must be a table of [runners.<class>] tables")
    classes: dict[str, RunnerClass] = {}
    for name in sorted(classes_doc):
        table = classes_doc[name]
        key = f"runners.{name}"
        if not isinstance(table, dict):
            raise RunnersError(path, key, "must be a table with labels = [...]")
        for k in sorted(table):
            if k not in ("labels", "toolchains"):
                raise RunnersError(path, f"{key}.{k}", "unknown key (known: labels, toolchains)")
        if "labels" not in table:
            raise RunnersError(path, f"{key}.labels", "missing (the runs-on labels of the class)")
        toolchains = _str_list(
            table.get("toolchains", []), path, f"{key}.toolchains", non_empty=False
        )
        classes[name] = RunnerClass(
            name=name,
            labels=_str_list(table["labels"], path, f"{key}.labels", non_empty=True),
            toolchains=tuple(sorted(toolchains)),
        )
    return classes


def _class_ref(value: object, key: str, classes: Mapping[str, RunnerClass], path: str) -> str:
    if not isinstance(value, str):
        raise RunnersError(path, key, "must be the name of a [runners.<class>] table")
    if value not in classes:
        known = ", ".join(sorted(classes)) or "none defined"
        raise RunnersError(path, key, f"unknown runner class {value!r} (classes: {known})")
    return value


def _parse_placement(
    value: object, key: str, classes: Mapping[str, RunnerClass], path: str
) -> Placement:
    """A ``[hardware]`` entry: ``"<class>"`` (builds and smokes there) or
    ``{ build = "<class>", smoke = "<class>" }``."""
    if not isinstance(value, dict):
        return Placement.both(_class_ref(value, key, classes, path))
    for k in sorted(value):
        if k not in ("build", "smoke"):
            raise RunnersError(path, f"{key}.{k}", "unknown key (known: build, smoke)")
    for k in ("build", "smoke"):
        if k not in value:
            raise RunnersError(
                path,
                f"{key}.{k}",
                f"missing: name the class that {'builds' if k == 'build' else 'smoke-tests'} "
                f'it, or give one class for both ({key.split(".", 1)[1]} = "<class>")',
            )
    return Placement(
        build=_class_ref(value["build"], f"{key}.build", classes, path),
        smoke=_class_ref(value["smoke"], f"{key}.smoke", classes, path),
    )


def _parse_default(
    default_doc: object, classes: Mapping[str, RunnerClass], path: str
) -> Placement | None:
    """``[default]``: ``runner`` (both), ``build`` and ``smoke`` (each overriding it)."""
    if not isinstance(default_doc, dict):
        raise RunnersError(
            path, "default", 'must be a table: [default] runner = "<class>" (or build, smoke)'
        )
    for k in sorted(default_doc):
        if k not in ("runner", "build", "smoke"):
            raise RunnersError(path, f"default.{k}", "unknown key (known: runner, build, smoke)")
    if not default_doc:
        return None
    named = {
        k: _class_ref(default_doc[k], f"default.{k}", classes, path)
        for k in ("runner", "build", "smoke")
        if k in default_doc
    }
    for k in ("build", "smoke"):
        if k not in named and "runner" not in named:
            raise RunnersError(
                path,
                f"default.{k}",
                f"missing: with [default] {'smoke' if k == 'build' else 'build'} = ..., "
                f'name the {k} class too, or runner = "<class>" for both',
            )
    return Placement(
        build=named.get("build", named.get("runner", "")),
        smoke=named.get("smoke", named.get("runner", "")),
    )


def load_runners(file: Path, root: Path) -> Runners:
    """Read and validate a runner map. Raises :class:`RunnersError`."""
    try:
        shown = file.resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        shown = str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunnersError(
            shown, "(file)", "does not exist; create it (see ci/README.md) or pass --runners PATH"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunnersError(shown, "(file)", f"cannot be read: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RunnersError(shown, "(file)", f"is not valid TOML: {exc}") from None
    return parse_runners(doc, shown)


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
