"""The values of a SASS diff and the comparison of two modules' code (pure).

:func:`diff_functions` compares the normalised functions
(:class:`~metrale_orch.sass.listing.FunctionCode`) of one module in two builds and returns
one :class:`KernelDiff` per function whose code differs, appeared or went, with its unified
diff; :class:`SassDiff` is a whole comparison as the command reports it. A change is listed
once per distinct pair of artefacts, with every target that installs that pair
(:attr:`KernelDiff.targets`). Everything is sorted by (first target, module, kernel, arch).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from metrale_orch.sass.listing import FunctionCode

__all__ = ["ChangeKind", "KernelDiff", "NoteStatus", "SassDiff", "TargetNote", "diff_functions"]

ChangeKind = Literal["changed", "added", "removed"]
#: Why a target has no kernels compared: its toolchain writes no SASS, it is built in
#: neither directory, or it could not be read (a failure).
NoteStatus = Literal["no-sass", "not-built", "error"]
#: Lines of context around each change.
CONTEXT = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelDiff:
    """One function whose machine code differs between the two builds."""

    #: The first of :attr:`targets` (the one the diff's file names are of).
    target: str
    #: Every target installing the same pair of artefacts (same bytes on both sides), sorted.
    targets: tuple[str, ...]
    module: str
    kernel: str
    arch: str
    kind: ChangeKind
    #: Lines only in the new build / only in the base.
    added: int
    removed: int
    #: The unified diff, its ``---``/``+++`` header first.
    diff: tuple[str, ...]

    @property
    def changed_lines(self) -> int:
        return self.added + self.removed

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "targets": list(self.targets),
            "module": self.module,
            "kernel": self.kernel,
            "arch": self.arch,
            "kind": self.kind,
            "added": self.added,
            "removed": self.removed,
            "diff": list(self.diff),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetNote:
    """A target whose kernels were not compared, and why."""

    target: str
    status: NoteStatus
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SassDiff:
    """The comparison of a base build directory with this one."""

    #: The two build directories, root-relative POSIX (as given when outside the root).
    base: str
    build: str
    changes: tuple[KernelDiff, ...]
    notes: tuple[TargetNote, ...]
    #: Modules of the selected targets present in either build.
    modules: int
    #: Of those, the ones whose artefacts differed (disassembled and compared).
    disassembled: int

    @property
    def failed(self) -> bool:
        """True when a target could not be compared."""
        return any(n.status == "error" for n in self.notes)


def diff_functions(
    target: str,
    module: str,
    base: Sequence[FunctionCode],
    new: Sequence[FunctionCode],
    *,
    base_label: str,
    new_label: str,
) -> tuple[KernelDiff, ...]:
    """The functions of one module that differ between ``base`` and ``new``, each with
    its unified diff (headers ``--- <base_label> <kernel> (<arch>)``)."""
    old_by = {(f.name, f.arch): f for f in base}
    new_by = {(f.name, f.arch): f for f in new}
    out = []
    for name, arch in sorted(old_by.keys() | new_by.keys()):
        was, now = old_by.get((name, arch)), new_by.get((name, arch))
        a = was.lines if was is not None else ()
        b = now.lines if now is not None else ()
        if was is not None and now is not None and a == b:
            continue
        kind: ChangeKind = "added" if was is None else "removed" if now is None else "changed"
        lines = tuple(
            difflib.unified_diff(
                a,
                b,
                f"{base_label} {name} ({arch})",
                f"{new_label} {name} ({arch})",
                n=CONTEXT,
                lineterm="",
            )
        )
        body = lines[2:]
        out.append(
            KernelDiff(
                target=target,
                targets=(target,),
                module=module,
                kernel=name,
                arch=arch,
                kind=kind,
                added=sum(ln.startswith("+") for ln in body),
                removed=sum(ln.startswith("-") for ln in body),
                diff=lines,
            )
        )
    return tuple(out)
