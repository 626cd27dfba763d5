"""What a build installed, in bytes: per target, module and arch, and the size budget.

:func:`check_sizes` reads each selected target's ``manifest.json`` (as the register
report does), takes the size of every artefact it lists, and for a fatbin the size of
each image inside it (``sm_100a`` for machine code, ``compute_100a`` for PTX, nvcc's
names); a target's size is the sum of its artefacts' files. The budget
(``[tool.metrale-orch.size_budget]``, bytes by hardware or by ``hw/model/quant``; a
target's own key over its hardware's) bounds each target: one over it is a
:class:`TargetBudget` whose ``over`` is true. A budget key that names nothing of the
tree is an error (a typo would otherwise check nothing).

A kernel entry that two modules of one target export (read by
:func:`~metrale_orch.gate.entries.read_artefact`, as the coverage check reads them) is a
:class:`Duplicate` of that target: its code is installed twice, and a loader asking for
the name could get either.

Invariants: targets sorted by name, modules by artefact, images by arch; paths
root-relative POSIX (artefacts relative to the build directory).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.errors import MetraleError
from metrale_orch.gate.entries import read_artefact
from metrale_orch.gate.errors import UnreadableArtefact as NoEntries
from metrale_orch.paths import MANIFEST_NAME, rel_posix, target_dir
from metrale_orch.resources.collect import read_target_manifest, select_targets
from metrale_orch.resources.errors import UnknownBudgetKey, UnreadableArtefact
from metrale_orch.smoke.elf import ElfError, is_fatbin, parse_fatbin
from metrale_orch.tree import Target, TreeSnapshot, walk

__all__ = [
    "ImageSize",
    "ModuleSize",
    "SizeCheck",
    "SizeReport",
    "SizeStatus",
    "TargetBudget",
    "TargetSize",
    "budget_key_name",
    "budget_of",
    "check_sizes",
    "collect_sizes",
    "unknown_budget_keys",
]

#: ``ok``: read; ``not-built``: no manifest; ``error``: a manifest or artefact unreadable.
SizeStatus = Literal["ok", "not-built", "error"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageSize:
    """The bytes of one arch in an artefact (the whole file but for a fatbin)."""

    arch: str
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleSize:
    """One installed artefact: its path under the build directory, its file's bytes,
    and its images by arch."""

    module: str
    artefact: str
    bytes: int
    images: tuple[ImageSize, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Duplicate:
    """A kernel entry that several modules of one target export (sorted)."""

    entry: str
    modules: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetSize:
    """One target's artefacts, or why it has none (``detail``: one line), and the entries
    two of its modules export."""

    target: str
    status: SizeStatus
    arch: str = ""
    detail: str = ""
    modules: tuple[ModuleSize, ...] = ()
    duplicates: tuple[Duplicate, ...] = ()

    @property
    def bytes(self) -> int:
        """The sum of its artefacts' files."""
        return sum(m.bytes for m in self.modules)


@dataclass(frozen=True, slots=True, kw_only=True)
class SizeReport:
    """The sizes of one build directory (``build_dir`` root-relative when under the root)."""

    build_dir: str
    targets: tuple[TargetSize, ...]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view (each target with its total ``bytes``)."""
        return {
            "build_dir": self.build_dir,
            "targets": [{**asdict(t), "bytes": t.bytes} for t in self.targets],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetBudget:
    """A built target's size against the budget that applies to it (``key``: the
    ``size_budget`` key, a hardware or the target itself)."""

    target: str
    bytes: int
    key: str
    limit: int

    @property
    def over(self) -> bool:
        """Whether the target is larger than its budget."""
        return self.bytes > self.limit

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view."""
        return {**asdict(self), "over": self.over}


@dataclass(frozen=True, slots=True, kw_only=True)
class SizeCheck:
    """A size report and the budget of each built target that has one (sorted)."""

    report: SizeReport
    budgets: tuple[TargetBudget, ...]

    @property
    def breaches(self) -> tuple[TargetBudget, ...]:
        """The targets over their budget."""
        return tuple(b for b in self.budgets if b.over)

    @property
    def duplicates(self) -> tuple[tuple[str, Duplicate], ...]:
        """(target, duplicate) of every entry two modules of one target export."""
        return tuple((t.target, d) for t in self.report.targets for d in t.duplicates)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view."""
        return {
            **self.report.to_dict(),
            "budgets": [b.to_dict() for b in self.budgets],
            "over_budget": [b.target for b in self.breaches],
        }


def duplicates_of(exports: Mapping[str, tuple[str, ...]]) -> tuple[Duplicate, ...]:
    """The entries that more than one module exports, from ``module -> its entries``
    (pure; sorted by entry)."""
    by_entry: dict[str, list[str]] = {}
    for module, entries in exports.items():
        for entry in entries:
            by_entry.setdefault(entry, []).append(module)
    return tuple(
        Duplicate(entry=entry, modules=tuple(sorted(modules)))
        for entry, modules in sorted(by_entry.items())
        if len(modules) > 1
    )


# -------------------------------------------------------------------------------- pure


def budget_of(target: str, budgets: Mapping[str, int]) -> tuple[str, int] | None:
    """(key, bytes) of the budget that bounds ``target`` (``hw/model/quant``): its own
    key, else its hardware's; None when neither is set (pure)."""
    for key in (target, target.split("/", 1)[0]):
        if key in budgets:
            return key, budgets[key]
    return None


def unknown_budget_keys(budgets: Iterable[str], targets: Iterable[str]) -> tuple[str, ...]:
    """The budget keys that name neither a hardware nor a target of ``targets`` (pure)."""
    names = set(targets)
    known = names | {t.split("/", 1)[0] for t in names}
    return tuple(sorted(set(budgets) - known))


def budget_key_name(key: str) -> str:
    """How a message names a budget key: ``size_budget.hopper``,
    ``size_budget."hw/model/quant"`` (TOML's spelling)."""
    return f"size_budget.{key}" if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f'size_budget."{key}"'


def _budgets(report: SizeReport, budgets: Mapping[str, int]) -> tuple[TargetBudget, ...]:
    out = []
    for t in report.targets:
        found = budget_of(t.target, budgets) if t.status == "ok" else None
        if found is not None:
            out.append(TargetBudget(target=t.target, bytes=t.bytes, key=found[0], limit=found[1]))
    return tuple(out)


def _image_arch(kind: str, sm: int, named: str | None) -> str:
    """nvcc's name of a fatbin image's arch: ``sm_90a`` for machine code, ``compute_90a``
    for PTX (``named``: the arch the image itself records, when it parsed)."""
    arch = named or f"sm_{sm}"
    return arch.replace("sm_", "compute_", 1) if kind == "ptx" else arch


# --------------------------------------------------------------------------------- I/O


def check_sizes(
    root: Path,
    build_dir: Path,
    pattern: str | None,
    budgets: Mapping[str, int],
    budget_source: str,
) -> SizeCheck:
    """The sizes of the targets ``pattern`` selects, checked against ``budgets`` (set in
    ``budget_source``, for messages). Raises :class:`UnknownBudgetKey` for a key that
    names nothing of the tree, ``LayoutError`` when the tree does not resolve,
    :class:`NoTargetMatches` when the pattern selects nothing."""
    root = Path(os.path.abspath(root))
    targets = walk(root, TreeSnapshot(root))
    unknown = unknown_budget_keys(budgets, (str(t) for t in targets))
    if unknown:
        raise UnknownBudgetKey(budget_source, budget_key_name(unknown[0]))
    report = collect_sizes(root, build_dir, select_targets(targets, pattern))
    return SizeCheck(report=report, budgets=_budgets(report, budgets))


def collect_sizes(root: Path, build_dir: Path, targets: Iterable[Target]) -> SizeReport:
    """The sizes of ``targets``' installed artefacts in ``build_dir``, sorted by target; a
    target that cannot be read is its ``error`` line, so it hides no other."""
    build_dir = Path(os.path.abspath(build_dir))
    out = []
    for target in sorted(targets, key=str):
        try:
            out.append(_size_target(root, build_dir, target))
        except MetraleError as exc:  # the package's own: this target's line, then the next
            detail = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
            out.append(TargetSize(target=str(target), status="error", detail=detail))
    return SizeReport(build_dir=rel_posix(build_dir, root), targets=tuple(out))


def _size_target(root: Path, build_dir: Path, target: Target) -> TargetSize:
    tdir = target_dir(build_dir, target.hardware, target.model, target.quant)
    manifest = tdir / MANIFEST_NAME
    shown = rel_posix(manifest, root)
    if not manifest.is_file():
        return TargetSize(target=str(target), status="not-built", detail=f"not built (no {shown})")
    doc = read_target_manifest(manifest, shown)
    modules = []
    exports: dict[str, tuple[str, ...]] = {}
    for module in sorted(doc.modules, key=lambda m: (m.artefact, m.name)):
        path = tdir / module.artefact
        size, images, exports[module.name] = _artefact_size(path, doc.arch, rel_posix(path, root))
        modules.append(
            ModuleSize(
                module=module.name,
                artefact=rel_posix(path, build_dir),
                bytes=size,
                images=images,
            )
        )
    return TargetSize(
        target=str(target),
        status="ok",
        arch=doc.arch,
        modules=tuple(modules),
        duplicates=duplicates_of(exports),
    )


def _artefact_size(
    path: Path, arch: str, shown: str
) -> tuple[int, tuple[ImageSize, ...], tuple[str, ...]]:
    """(the file's bytes, its images, the entries it exports: none when no kernel reader
    knows it, a Metal library say)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnreadableArtefact(shown, f"cannot be read ({exc.strerror or exc})") from None
    try:
        exports = read_artefact(data, shown).exports
    except NoEntries:
        exports = ()
    whole = (ImageSize(arch=arch, bytes=len(data)),)
    if not is_fatbin(data):
        return len(data), whole, exports
    try:
        entries = parse_fatbin(data).entries
    except ElfError:
        return len(data), whole, exports  # its bytes are known; its breakdown is not
    images = [
        ImageSize(
            arch=_image_arch(
                e.kind,
                e.sm,
                e.elf.arch if e.elf else e.ptx.target if e.ptx else None,
            ),
            bytes=e.size,
        )
        for e in entries
    ]
    return len(data), tuple(sorted(images, key=lambda i: (i.arch, i.bytes))), exports
