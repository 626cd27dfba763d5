"""``coverage``: does the build hold every kernel each target's deployment will look up?

:func:`check_coverage` walks the selected targets of a build directory and returns every
problem as a value (:class:`~metrale_orch.gate.report.Problem`), one per line:

- every module of the target (the tree's modules, by their ``[modules]`` name) has an
  artefact in the last build, built for the hardware's declared arch;
- every PTX artefact assembles with ``ptxas`` for that arch (:mod:`~metrale_orch.gate.assemble`);
- with ``[tool.metrale-orch.deploy.<hw>] min_cuda``, no PTX is of an ISA newer than that
  CUDA release's driver loads (:mod:`~metrale_orch.gate.ptxisa`);
- every kernel the family and fusion files of the target's common layers name
  (:mod:`~metrale_orch.gate.families`) is exported by its module's artefact, wherever a
  target builds that module; a named module that no target of the hardware builds is a
  problem of the hardware;
- no entry is exported by two modules of one target (a loader could get either).

A target never built is a problem, unless the build skips it here (its toolchain is not
installed, or cannot build the arch): then, like a target whose artefacts no reader here
understands (Metal libraries, SCALE objects), it is *unchecked*, listed with the reason.
Tree, configuration and family-file mistakes raise (exit 2); a missing ``ptxas`` raises
:class:`~metrale_orch.resources.errors.PtxasMissing`.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.config import Config, source_label
from metrale_orch.errors import MetraleError
from metrale_orch.fsutil import bytes_hash
from metrale_orch.gate.assemble import CACHE_NAME, Assembler
from metrale_orch.gate.entries import ArtefactView, arch_problem, mangled_as, read_artefact
from metrale_orch.gate.errors import DeployError, UnreadableArtefact
from metrale_orch.gate.families import KernelLists, NamedKernel
from metrale_orch.gate.ptxisa import Version, isa_problem, parse_version
from metrale_orch.gate.report import Coverage, CoverageReport, Problem, Unchecked
from metrale_orch.manifest import ManifestError, ManifestModule, read_manifest
from metrale_orch.paths import MANIFEST_NAME, STATE_DIR, rel_posix, target_dir
from metrale_orch.resources.collect import select_targets
from metrale_orch.steps.plan import module_names
from metrale_orch.toolchain.archcheck import find_toolchain_for_arch
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains, select_toolchain
from metrale_orch.toolchain.errors import ToolchainMissing
from metrale_orch.tree import Layout, LayoutError, Role, Target, TreeSnapshot, resolve_all

__all__ = ["CHECKED_OUTPUTS", "check_coverage", "duplicate_problems"]

#: Toolchain output kinds whose artefacts the gate reads.
CHECKED_OUTPUTS = ("ptx", "cubin", "fatbin", "hsaco")
#: The module field of a problem of the whole target.
WHOLE_TARGET = "(target)"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Resolved:
    """One target of the tree as the gate needs it."""

    target: Target
    layout: Layout
    #: Its module names (after ``[modules]`` renames), sorted.
    modules: tuple[str, ...]


@dataclass(slots=True)
class _Run:
    root: Path
    build_dir: Path
    environ: Mapping[str, str]
    toolchains: Mapping[str, Toolchain]
    lists: KernelLists
    assembler: Assembler
    min_cuda: Mapping[str, Version]
    modules: int = 0
    named: int = 0
    #: (content hash, arch, toolchain) -> what :func:`_judge` said of such an artefact.
    judged: dict[tuple[str, str, str], tuple[ArtefactView | None, str]] = field(
        default_factory=dict
    )


def check_coverage(config: Config, pattern: str | None, environ: Mapping[str, str]) -> Coverage:
    """The coverage report of ``config.build_dir`` for the targets ``pattern`` selects (an
    fnmatch wildcard over ``hw/model/quant``; all when None).

    Raises ``LayoutError`` when a selected hardware's targets do not resolve,
    ``NoTargetMatches`` when the pattern selects nothing, :class:`DeployError` for a
    ``deploy`` setting naming no hardware of the tree, ``KernelListError`` for a
    misshapen family or fusion file, ``BuildConfigError`` for a bad ``[modules]`` table,
    ``ToolchainError`` for a bad toolchain and ``PtxasMissing`` when a PTX needs a ptxas
    that is not installed. A run over every target also drops cache entries it did not use.
    """
    root = Path(os.path.abspath(config.root))
    build_dir = Path(os.path.abspath(config.build_dir))
    resolved = resolve_all(root, TreeSnapshot(root))
    selected = select_targets([t for t, _ in resolved], pattern)
    hardware = sorted({t.hardware for t in selected})
    by_hw = _resolved_targets(root, resolved, hardware)
    run = _Run(
        root=root,
        build_dir=build_dir,
        environ=environ,
        toolchains=load_toolchains(root),
        lists=KernelLists(root),
        assembler=Assembler.load(build_dir / STATE_DIR / CACHE_NAME, environ),
        min_cuda=_min_cuda(config, {t.hardware for t, _ in resolved}),
    )
    problems: list[Problem] = []
    unchecked: list[Unchecked] = []
    chosen = set(selected)
    for hw in hardware:
        targets = by_hw[hw]
        for item in targets:
            if item.target in chosen:
                found = _check_target(run, item)
                if isinstance(found, Unchecked):
                    unchecked.append(found)
                else:
                    problems += found
        problems += _unbuilt_named(run, hw, targets)
    run.assembler.save(prune=pattern is None)
    report = CoverageReport(
        build_dir=rel_posix(build_dir, root),
        problems=tuple(sorted(set(problems))),
        unchecked=tuple(sorted(unchecked)),
        targets=len(selected) - len(unchecked),
        modules=run.modules,
        named=run.named,
    )
    return Coverage(report=report, ptxas_runs=run.assembler.runs, cache_hits=run.assembler.hits)


def _resolved_targets(
    root: Path,
    resolved: Sequence[tuple[Target, Layout | LayoutError]],
    hardware: Sequence[str],
) -> dict[str, list[_Resolved]]:
    """Every target of each of ``hardware`` with its module names; raises the first
    resolution error among them (the gate needs each hardware's every target)."""
    out: dict[str, list[_Resolved]] = {hw: [] for hw in hardware}
    for target, layout in resolved:
        if target.hardware not in out:
            continue
        if isinstance(layout, LayoutError):
            raise layout
        names = module_names(layout, root)
        out[target.hardware].append(
            _Resolved(target=target, layout=layout, modules=tuple(sorted(names.values())))
        )
    return out


def _min_cuda(config: Config, hardware: set[str]) -> dict[str, Version]:
    """hardware -> its declared minimum CUDA release; raises :class:`DeployError` for a
    table naming no hardware of the tree."""
    where = source_label(config, "deploy")
    out: dict[str, Version] = {}
    for hw, facts in sorted(config.deploy.items()):
        if hw not in hardware:
            known = ", ".join(sorted(hardware)) or "none"
            raise DeployError(
                where, f"deploy.{hw}", f"no hardware {hw!r} in kernels/ (hardware: {known})"
            )
        text = facts.get("min_cuda")
        version = parse_version(text) if text is not None else None
        if version is not None:
            out[hw] = version
    return out


def _check_target(run: _Run, item: _Resolved) -> list[Problem] | Unchecked:
    """The problems of one target, or why it cannot be checked here."""
    target, hw = str(item.target), item.layout.hardware
    toolchain = select_toolchain(hw, run.toolchains)
    arch = hw.arch or ""
    tdir = target_dir(run.build_dir, hw.name, item.target.model, item.target.quant)
    manifest_path = tdir / MANIFEST_NAME
    shown = rel_posix(manifest_path, run.root)
    if not manifest_path.is_file():
        try:  # as the build decides to skip a target (its verdicts kept in .state/)
            find_toolchain_for_arch(
                toolchain, run.environ, state_dir=run.build_dir / STATE_DIR, arch=arch
            )
        except ToolchainMissing as exc:  # not installed, or cannot build the arch
            return Unchecked(target=target, reason=f"not built here: {exc}")
        except MetraleError:
            pass  # the build fails such a target: not built, as below
        return [Problem(target=target, module=WHOLE_TARGET, what=f"not built (no {shown})")]
    if toolchain.output not in CHECKED_OUTPUTS:
        return Unchecked(
            target=target,
            reason=f"toolchain {toolchain.name!r} writes {toolchain.output} artefacts; "
            f"the gate reads {', '.join(CHECKED_OUTPUTS)}",
        )
    if not arch:
        return [
            Problem(
                target=target,
                module=WHOLE_TARGET,
                what=f"{rel_posix(hw.path, run.root)} declares no [hardware] arch",
            )
        ]
    try:
        manifest = read_manifest(manifest_path)
    except (OSError, ManifestError) as exc:
        what = f"{shown} cannot be read ({exc}); rebuild the target"
        return [Problem(target=target, module=WHOLE_TARGET, what=what)]
    built = {m.name: m for m in manifest.modules}
    problems: list[Problem] = []
    views: dict[str, ArtefactView] = {}
    for module in item.modules:
        found = _module_artefact(run, toolchain, arch, tdir, module, built.get(module))
        if isinstance(found, str):
            problems.append(Problem(target=target, module=module, what=found))
            continue
        view, module_problems = found
        views[module] = view
        problems += (Problem(target=target, module=module, what=w) for w in module_problems)
        problems += _isa_problems(run, item.target.hardware, target, module, view)
    run.modules += len(views)
    problems += duplicate_problems(target, views)
    problems += _named_problems(run, item, views)
    return problems


def _module_artefact(
    run: _Run,
    toolchain: Toolchain,
    arch: str,
    tdir: Path,
    module: str,
    entry: ManifestModule | None,
) -> str | tuple[ArtefactView, list[str]]:
    """The module's artefact read, with its arch and ptxas problems; or why it has none."""
    if entry is None:
        return "no artefact: the last build of the target did not make it (rebuild the target)"
    if entry.outcome == "failed":
        return "failed to compile in the last build"
    # Text, not a Path: this runs once per module of a tree (a plain name, as the build writes).
    name = entry.artefact
    plain = "/" not in name and name not in ("", ".", "..")
    path = f"{tdir}{os.sep}{name}" if plain else os.fspath(tdir / name)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        shown = rel_posix(path, run.root)
        return f"artefact {shown} cannot be read ({exc.strerror or exc}); rebuild the target"
    memo = (bytes_hash(data), arch, toolchain.name)
    if memo not in run.judged:  # identical artefacts of other targets: read and judged once
        run.judged[memo] = _judge(run, toolchain, arch, Path(path), data)
    view, problem = run.judged[memo]
    if view is None:
        return f"{rel_posix(path, run.root)}: {problem}"
    return view, [f"{rel_posix(path, run.root)}: {problem}"] if problem else []


def _judge(
    run: _Run, toolchain: Toolchain, arch: str, path: Path, data: bytes
) -> tuple[ArtefactView | None, str]:
    """(the artefact read, or None; what is wrong with it, without its path, or "")."""
    try:
        view = read_artefact(data, "")
    except UnreadableArtefact as exc:
        return None, exc.problem
    wrong_arch = arch_problem(view, arch)
    if wrong_arch is not None:
        return view, wrong_arch
    if view.kind == "ptx":
        refused = run.assembler.problem(toolchain, arch, path, data)
        if refused is not None:
            return view, f"ptxas -arch={arch} refuses it: {refused}"
    return view, ""


def _isa_problems(
    run: _Run, hw: str, target: str, module: str, view: ArtefactView
) -> list[Problem]:
    min_cuda = run.min_cuda.get(hw)
    if min_cuda is None:
        return []
    out = []
    for isa in view.ptx_versions:
        why = isa_problem(isa, min_cuda)
        if why is not None:
            out.append(Problem(target=target, module=module, what=f"{why} (deploy.{hw}.min_cuda)"))
    return out


def duplicate_problems(target: str, views: Mapping[str, ArtefactView]) -> list[Problem]:
    """One problem per module exporting an entry an earlier module (by name) exports too
    (pure): a loader looking the entry up by name could get either."""
    owners: dict[str, list[str]] = defaultdict(list)
    for module in sorted(views):
        for entry in views[module].exports:
            owners[entry].append(module)
    out = []
    for entry, modules in sorted(owners.items()):
        for module in modules[1:]:
            what = (
                f"exports {entry}, as {modules[0]} does: a loader looking it up by name "
                "could get either"
            )
            out.append(Problem(target=target, module=module, what=what))
    return out


def _common_dirs(layout: Layout) -> list[Path]:
    return [layer.dir for layer in layout.layers if layer.role is Role.COMMON]


def _named_problems(run: _Run, item: _Resolved, views: Mapping[str, ArtefactView]) -> list[Problem]:
    """The named kernels of the target's common layers that its built modules lack."""
    out = []
    for named in run.lists.of(_common_dirs(item.layout)):
        view = views.get(named.module)
        if view is None:
            continue  # not a module of this target, or already a problem of its artefact
        run.named += 1
        if named.func not in view.exports:
            out.append(
                Problem(target=str(item.target), module=named.module, what=_missing(named, view))
            )
    return out


def _missing(named: NamedKernel, view: ArtefactView) -> str:
    head = f"kernel {named.func} (named by {named.source})"
    mangled = mangled_as(named.func, view.exports)
    if mangled is not None:
        return f'{head} is exported only as the C++ name {mangled}: declare it extern "C"'
    if not view.complete:
        return f"{head} is not among the exports the gate can read (compressed images)"
    exports = ", ".join(view.exports) or "none"
    return f"{head} is not exported (exports: {exports})"


def _unbuilt_named(run: _Run, hw: str, targets: Sequence[_Resolved]) -> list[Problem]:
    """A problem per named module that no target of ``hw`` builds."""
    built = {m for item in targets for m in item.modules}
    dirs: dict[tuple[Path, ...], None] = {tuple(_common_dirs(i.layout)): None for i in targets}
    missing: dict[tuple[str, str], list[str]] = defaultdict(list)
    for common in dirs:
        for named in run.lists.of(common):
            if named.module not in built:
                missing[named.module, named.source].append(named.func)
    return [
        Problem(
            target=hw,
            module=module,
            what=f"named by {source} ({', '.join(funcs)}), but no target of {hw} builds it",
        )
        for (module, source), funcs in sorted(missing.items())
    ]
