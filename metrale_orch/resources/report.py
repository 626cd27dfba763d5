"""Register and spill reports as values: parsing ``ptxas -v``, and comparing two reports.

Everything here is pure. :func:`parse_ptxas_report` turns ptxas's verbose output into one
:class:`KernelResources` per entry point; :func:`kernels_from_cubin` does the same from
what a cubin records about itself (no spill counts: a cubin does not keep them);
:func:`diff_reports` compares two :class:`ResourceReport` values kernel by kernel.

Invariants: every tuple is sorted (targets by name, modules by artefact, kernels by name,
changes by target, kernel, arch); a report's ``build_dir`` is root-relative POSIX text
(absolute only for a build directory outside the root), its artefacts relative to it;
``to_dict`` and ``from_dict`` round-trip.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

from metrale_orch.resources.errors import ReportParseError

if TYPE_CHECKING:
    from metrale_orch.smoke.elf import CubinInfo

__all__ = [
    "ChangeKind",
    "KernelChange",
    "KernelResources",
    "ModuleResources",
    "ResourceReport",
    "SpillChange",
    "TargetResources",
    "TargetStatus",
    "diff_reports",
    "kernels_from_cubin",
    "parse_ptxas_report",
]

#: ``ok``: read; ``not-built``: no manifest; ``no-report``: the toolchain's artefacts have
#: no register report (HIP, Metal, SCALE); ``error``: a manifest or artefact could not be read.
TargetStatus = Literal["ok", "not-built", "no-report", "error"]
ChangeKind = Literal["changed", "added", "removed"]
#: How a kernel's spilling grew: ``new`` from none (or a new kernel that spills), ``more``
#: bytes than it already spilled.
SpillChange = Literal["new", "more"]
_STATUSES: Mapping[str, TargetStatus] = {
    "ok": "ok",
    "not-built": "not-built",
    "no-report": "no-report",
    "error": "error",
}

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelResources:
    """What one kernel (entry point) costs per thread and per block, for one arch.

    ``spill_store_bytes`` and ``spill_load_bytes`` are None when the source does not say
    (a cubin records registers, shared memory and stack frame, not spills).
    """

    kernel: str
    arch: str
    registers: int
    #: Static shared memory per block (``smem``).
    shared_bytes: int
    #: Per-thread stack frame (spill slots and local arrays live there).
    stack_bytes: int
    spill_store_bytes: int | None
    spill_load_bytes: int | None

    @property
    def spills(self) -> bool:
        """Whether ptxas spilled registers of this kernel to local memory."""
        return bool(self.spill_store_bytes or self.spill_load_bytes)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view (:meth:`from_dict` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> KernelResources:
        """Read :meth:`to_dict`'s form back; raises ``ValueError`` on any other shape."""
        return cls(
            kernel=_str(doc, "kernel"),
            arch=_str(doc, "arch"),
            registers=_int(doc, "registers"),
            shared_bytes=_int(doc, "shared_bytes"),
            stack_bytes=_int(doc, "stack_bytes"),
            spill_store_bytes=_opt_int(doc, "spill_store_bytes"),
            spill_load_bytes=_opt_int(doc, "spill_load_bytes"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleResources:
    """The kernels of one installed artefact; ``artefact`` is its path under the build
    directory (``hopper/qwen3-8b/bf16/rmsnorm.ptx``), so two builds' reports compare."""

    module: str
    artefact: str
    kernels: tuple[KernelResources, ...]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view."""
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> ModuleResources:
        """Read :meth:`to_dict`'s form back; raises ``ValueError`` on any other shape."""
        return cls(
            module=_str(doc, "module"),
            artefact=_str(doc, "artefact"),
            kernels=tuple(KernelResources.from_dict(k) for k in _dicts(doc, "kernels")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetResources:
    """One target's report, or why it has none (``detail``: one line)."""

    target: str
    status: TargetStatus
    arch: str = ""
    detail: str = ""
    modules: tuple[ModuleResources, ...] = ()

    @property
    def kernels(self) -> tuple[KernelResources, ...]:
        """Every kernel of every module, in report order."""
        return tuple(k for m in self.modules for k in m.kernels)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view."""
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> TargetResources:
        """Read :meth:`to_dict`'s form back; raises ``ValueError`` on any other shape."""
        status = _str(doc, "status")
        if status not in _STATUSES:
            raise ValueError(f"status: unknown value {status!r}")
        return cls(
            target=_str(doc, "target"),
            status=_STATUSES[status],
            arch=_str(doc, "arch"),
            detail=_str(doc, "detail"),
            modules=tuple(ModuleResources.from_dict(m) for m in _dicts(doc, "modules")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceReport:
    """The report of one build directory (``build_dir`` root-relative when under the root)."""

    build_dir: str
    targets: tuple[TargetResources, ...]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view."""
        return {"build_dir": self.build_dir, "targets": [t.to_dict() for t in self.targets]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> ResourceReport:
        """Read :meth:`to_dict`'s form back; raises ``ValueError`` on any other shape."""
        return cls(
            build_dir=_str(doc, "build_dir"),
            targets=tuple(TargetResources.from_dict(t) for t in _dicts(doc, "targets")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelChange:
    """One kernel whose resources differ between two reports (``old``/``new`` None when it
    is only in the other)."""

    target: str
    kernel: str
    arch: str
    kind: ChangeKind
    old: KernelResources | None
    new: KernelResources | None

    @property
    def spill_change(self) -> SpillChange | None:
        """``new`` when the kernel spills where it did not, ``more`` when it spilled and
        now spills more bytes (stores or loads); None when its spilling did not grow."""
        if self.new is None:
            return None
        before = (0, 0) if self.old is None else _spill_bytes(self.old)
        after = _spill_bytes(self.new)
        if after[0] <= before[0] and after[1] <= before[1]:
            return None
        return "more" if any(before) else "new"

    @property
    def new_spill(self) -> bool:
        """The kernel spills where it did not (not: spills more than it did)."""
        return self.spill_change == "new"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view: the fields, and ``spill`` (:attr:`spill_change`)."""
        return {**asdict(self), "spill": self.spill_change}


# ------------------------------------------------------------------------------- parsing


def parse_ptxas_report(text: str, *, where: str = "ptxas output") -> tuple[KernelResources, ...]:
    """The entry points of ``ptxas -v`` output (stdout and stderr together), sorted by name.

    Device functions that are not entry points are left out. Raises
    :class:`ReportParseError` naming ``where`` when an entry point lacks its register or
    stack-frame line (a ptxas whose output this parser does not know).
    """
    arch_of: dict[str, str] = {}
    registers: dict[str, int] = {}
    shared: dict[str, int] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    entry = ""  # the entry whose "Used N registers" line comes next
    props = ""  # the function whose stack-frame line comes next
    for line in text.splitlines():
        if found := _ENTRY.search(line):
            entry, arch_of[found.group(1)] = found.group(1), found.group(2)
        elif found := _PROPERTIES.search(line):
            props = found.group(1)
        elif (found := _FRAME.search(line)) and props:
            frames[props] = (int(found.group(1)), int(found.group(2)), int(found.group(3)))
            props = ""
        elif (found := _USED.search(line)) and entry:
            registers[entry] = int(found.group(1))
            smem = _SMEM.search(line)
            shared[entry] = int(smem.group(1)) if smem else 0
            entry = ""
    kernels = []
    for name in sorted(arch_of):
        if name not in registers or name not in frames:
            missing = "register" if name not in registers else "stack-frame"
            raise ReportParseError(where, f"entry function {name!r} has no {missing} line")
        stack, stores, loads = frames[name]
        kernels.append(
            KernelResources(
                kernel=name,
                arch=arch_of[name],
                registers=registers[name],
                shared_bytes=shared[name],
                stack_bytes=stack,
                spill_store_bytes=stores,
                spill_load_bytes=loads,
            )
        )
    return tuple(kernels)


def kernels_from_cubin(info: CubinInfo, arch: str) -> tuple[KernelResources, ...]:
    """The kernels a parsed cubin records, for ``arch`` (the target's, which names ``a``
    and ``f`` variants the cubin may not); spills unknown (None)."""
    return tuple(
        KernelResources(
            kernel=k.name,
            arch=arch,
            registers=k.registers or 0,
            shared_bytes=k.shared_bytes,
            stack_bytes=k.frame_bytes or 0,
            spill_store_bytes=None,
            spill_load_bytes=None,
        )
        for k in sorted(info.kernels, key=lambda k: k.name)
    )


# ---------------------------------------------------------------------------------- diff


def diff_reports(old: ResourceReport, new: ResourceReport) -> tuple[KernelChange, ...]:
    """Kernels whose resources differ from ``old`` to ``new``, sorted by target, kernel,
    arch. Only targets read in a report (status ``ok``) take part: a kernel of a target
    that one side did not build is ``added`` or ``removed``."""
    before = _index(old)
    after = _index(new)
    changes = []
    for key in sorted(before.keys() | after.keys()):
        was, now = before.get(key), after.get(key)
        if was == now:
            continue
        kind: ChangeKind = "added" if was is None else "removed" if now is None else "changed"
        changes.append(
            KernelChange(target=key[0], kernel=key[1], arch=key[2], kind=kind, old=was, new=now)
        )
    return tuple(changes)


def _index(report: ResourceReport) -> dict[tuple[str, str, str], KernelResources]:
    return {
        (t.target, k.kernel, k.arch): k
        for t in report.targets
        if t.status == "ok"
        for k in t.kernels
    }


def _spill_bytes(k: KernelResources) -> tuple[int, int]:
    return (k.spill_store_bytes or 0, k.spill_load_bytes or 0)


# ------------------------------------------------------------------------ dict readers


def _str(doc: Mapping[str, object], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value


def _int(doc: Mapping[str, object], key: str) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key}: expected a whole number >= 0, got {value!r}")
    return value


def _opt_int(doc: Mapping[str, object], key: str) -> int | None:
    return None if doc.get(key) is None else _int(doc, key)


def _dicts(doc: Mapping[str, object], key: str) -> Iterable[Mapping[str, object]]:
    value = doc.get(key)
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{key}: expected a list of tables")
    return value
