"""Comparing the machine code of two build directories (the I/O of the SASS diff).

:func:`compare_builds` walks the targets a pattern selects, reads each target's
``manifest.json`` in the base build directory and in this one, and pairs their modules by
name. Every artefact a manifest lists is hashed and checked against it first: a missing
file, or one whose bytes are not the manifest's, ends the comparison
(:class:`~metrale_orch.sass.errors.ArtefactMismatch`, exit 2), as a base copied
incompletely or edited by hand would otherwise compare as "no change". A module whose
artefact has the same content hash (and arch) on both sides has the same machine code and
is not disassembled; the others are disassembled on both sides
(:func:`~metrale_orch.sass.tools.disassemble`), normalised
(:func:`~metrale_orch.sass.listing.parse_listing`) and compared function by function
(:func:`~metrale_orch.sass.diff.diff_functions`), once per distinct pair of artefacts: the
targets that install the same pair share one change. A module or target present on one
side only shows its kernels as added or removed.

The disassembler is looked for at the first target whose toolchain writes PTX, cubins or
fatbins, whether or not anything changed: a machine without one fails
(:class:`~metrale_orch.sass.errors.DisassemblerMissing`), never skips. Other toolchains'
targets (HIP, Metal, SCALE) get a ``no-sass`` note, targets built on neither side a
``not-built`` note, and a target that cannot be read an ``error`` note, so one broken
target never hides the others.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.errors import MetraleError
from metrale_orch.fsutil import file_hash
from metrale_orch.manifest import (
    Manifest,
    ManifestError,
    ManifestModule,
    odd_artefact,
    read_manifest,
)
from metrale_orch.paths import MANIFEST_NAME, rel_posix, target_dir
from metrale_orch.resources.collect import select_targets
from metrale_orch.sass.diff import KernelDiff, SassDiff, TargetNote, diff_functions
from metrale_orch.sass.errors import (
    ArtefactMismatch,
    DisassemblerMissing,
    UndisassemblableArtefact,
)
from metrale_orch.sass.listing import FunctionCode, parse_listing
from metrale_orch.sass.tools import Disassembler, disassemble, find_disassembler
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains, select_toolchain
from metrale_orch.tree import Target, TreeSnapshot, walk

__all__ = ["SASS_OUTPUTS", "compare_builds"]

#: Output kinds whose artefacts hold (or assemble to) NVIDIA machine code.
SASS_OUTPUTS = ("ptx", "cubin", "fatbin")

#: A module's pair of artefacts: its name, then (content hash, arch) in the base and in
#: this build ("" where it is absent).
_Pair = tuple[str, str, str, str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Group:
    """The changes of one distinct pair of artefacts, and the targets installing it."""

    diffs: tuple[KernelDiff, ...]
    targets: list[str]


@dataclass(slots=True)
class _Run:
    root: Path
    environ: Mapping[str, str]
    site_dirs: tuple[Path, ...] | None
    #: toolchain name -> its disassembler.
    tools: dict[str, Disassembler] = field(default_factory=dict)
    #: Each distinct pair of artefacts compared so far, in the order first met.
    groups: dict[_Pair, _Group] = field(default_factory=dict)
    modules: int = 0
    disassembled: int = 0

    def tool(self, toolchain: Toolchain) -> Disassembler:
        if toolchain.name not in self.tools:
            self.tools[toolchain.name] = find_disassembler(
                toolchain, self.environ, site_dirs=self.site_dirs
            )
        return self.tools[toolchain.name]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Side:
    """One build directory's view of a target: its directory and manifest (None: not
    built there)."""

    tdir: Path
    manifest: Manifest | None


def compare_builds(
    root: Path,
    base_dir: Path,
    build_dir: Path,
    pattern: str | None,
    environ: Mapping[str, str],
    *,
    site_dirs: Iterable[Path] | None = None,
) -> SassDiff:
    """The kernels whose normalised SASS differs from ``base_dir`` to ``build_dir``, for the
    targets ``pattern`` selects (all when None).

    Raises ``LayoutError`` when the tree does not resolve, ``NoTargetMatches`` when the
    pattern selects nothing, :class:`DisassemblerMissing` when no disassembler is
    installed, :class:`ArtefactMismatch` when an artefact a manifest lists is missing or
    not the bytes it names; any other problem of one target is that target's ``error`` note.
    """
    root = Path(os.path.abspath(root))
    base_dir = Path(os.path.abspath(base_dir))
    build_dir = Path(os.path.abspath(build_dir))
    snap = TreeSnapshot(root)
    targets = select_targets(walk(root, snap), pattern)
    toolchains = load_toolchains(root)
    run = _Run(
        root=root, environ=environ, site_dirs=None if site_dirs is None else tuple(site_dirs)
    )
    notes: list[TargetNote] = []
    for target in targets:
        try:
            hardware = snap.hardware(target.hardware)
            toolchain = select_toolchain(hardware, toolchains)
            if toolchain.output not in SASS_OUTPUTS:
                detail = f"no SASS: toolchain {toolchain.name!r} writes {toolchain.output}"
                notes.append(TargetNote(target=str(target), status="no-sass", detail=detail))
                continue
            tool = run.tool(toolchain)
            base, new = _side(run, base_dir, target), _side(run, build_dir, target)
            if base.manifest is None and new.manifest is None:
                detail = f"not built in either build directory (no {MANIFEST_NAME})"
                notes.append(TargetNote(target=str(target), status="not-built", detail=detail))
                continue
            _compare_target(run, tool, toolchain, str(target), base, new)
        except (DisassemblerMissing, ArtefactMismatch):
            raise
        except MetraleError as exc:  # the package's own: this target's note, then the next
            detail = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
            notes.append(TargetNote(target=str(target), status="error", detail=detail))
    return SassDiff(
        base=rel_posix(base_dir, root),
        build=rel_posix(build_dir, root),
        changes=_changes(run.groups.values()),
        notes=tuple(notes),
        modules=run.modules,
        disassembled=run.disassembled,
    )


def _side(run: _Run, build_dir: Path, target: Target) -> _Side:
    tdir = target_dir(build_dir, target.hardware, target.model, target.quant)
    path = tdir / MANIFEST_NAME
    shown = rel_posix(path, run.root)
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        return _Side(tdir=tdir, manifest=None)
    except OSError as exc:
        raise UndisassemblableArtefact(shown, f"cannot be read ({exc.strerror or exc})") from None
    except ManifestError as exc:
        raise UndisassemblableArtefact(shown, f"cannot be read ({exc}); rebuild it") from None
    odd = odd_artefact(manifest)
    if odd is not None:
        raise UndisassemblableArtefact(shown, f"artefact {odd!r} is not a file")
    return _Side(tdir=tdir, manifest=manifest)


def _modules(run: _Run, side: _Side) -> dict[str, ManifestModule]:
    """The side's modules by name, each artefact checked against its manifest's hash.

    Raises :class:`ArtefactMismatch` for a missing or unreadable artefact, or one whose
    bytes are not those the manifest names."""
    if side.manifest is None:
        return {}
    manifest = rel_posix(side.tdir / MANIFEST_NAME, run.root)
    for module in side.manifest.modules:
        path = side.tdir / module.artefact
        try:
            same = file_hash(str(path)) == module.xxh3
        except FileNotFoundError:
            problem = "is missing"
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror or exc})"
        else:
            if same:
                continue
            problem = "is not the bytes its hash there names"
        raise ArtefactMismatch(rel_posix(path, run.root), manifest, problem)
    return {m.name: m for m in side.manifest.modules}


def _compare_target(
    run: _Run, tool: Disassembler, toolchain: Toolchain, target: str, base: _Side, new: _Side
) -> None:
    """Add the target's modules to ``run.groups``: a pair of artefacts already compared
    for another target gains this target; a new pair is disassembled and compared."""
    old_modules, new_modules = _modules(run, base), _modules(run, new)
    old_arch = base.manifest.arch if base.manifest is not None else ""
    new_arch = new.manifest.arch if new.manifest is not None else ""
    for name in sorted(old_modules.keys() | new_modules.keys()):
        run.modules += 1
        was, now = old_modules.get(name), new_modules.get(name)
        if was is not None and now is not None and (was.xxh3, old_arch) == (now.xxh3, new_arch):
            continue  # the same bytes for the same arch: the same machine code
        pair = (name, *_content(was, old_arch), *_content(now, new_arch))
        if pair in run.groups:
            run.groups[pair].targets.append(target)
            continue
        run.disassembled += 1
        diffs = diff_functions(
            target,
            name,
            _code(run, tool, toolchain, base, was, old_arch),
            _code(run, tool, toolchain, new, now, new_arch),
            base_label=_label(run, base, was),
            new_label=_label(run, new, now),
        )
        run.groups[pair] = _Group(diffs=diffs, targets=[target])


def _content(module: ManifestModule | None, arch: str) -> tuple[str, str]:
    return ("", "") if module is None else (module.xxh3, arch)


def _changes(groups: Iterable[_Group]) -> tuple[KernelDiff, ...]:
    """One change per kernel of each distinct pair, naming every target that installs it,
    sorted by (first target, module, kernel, arch) (pure)."""
    out = [
        dataclasses.replace(diff, targets=tuple(sorted(group.targets)))
        for group in groups
        for diff in group.diffs
    ]
    return tuple(sorted(out, key=lambda c: (c.target, c.module, c.kernel, c.arch)))


def _label(run: _Run, side: _Side, module: ManifestModule | None) -> str:
    if module is None:
        return "/dev/null"
    return rel_posix(side.tdir / module.artefact, run.root)


def _code(
    run: _Run,
    tool: Disassembler,
    toolchain: Toolchain,
    side: _Side,
    module: ManifestModule | None,
    arch: str,
) -> tuple[FunctionCode, ...]:
    if module is None:
        return ()
    path = side.tdir / module.artefact
    shown = rel_posix(path, run.root)
    return parse_listing(disassemble(tool, toolchain, path, arch, run.environ, shown=shown))
