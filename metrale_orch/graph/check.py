"""Build readiness (SPEC 3.7): will the build accept this tree?

:func:`check_tree` reports, all at once, everything ``doit build`` would refuse,
by running the build's own validating functions over every target and every
hardware rather than restating their rules:

- ``toolchains/*.toml`` (:func:`~metrale_orch.toolchain.definitions.load_toolchains`;
  the configuration is the caller's, loaded and checked before, as every command's);
- every target's resolution (:func:`~metrale_orch.tree.resolve_all`: manifests,
  symlinks, shadows), containment (:func:`~metrale_orch.steps.staging.uncontained`),
  its stage (:func:`~metrale_orch.steps.staging.plan_stage`), vendor → toolchain
  (:func:`~metrale_orch.toolchain.definitions.select_toolchain`), ``[build]`` flag types
  (:func:`~metrale_orch.steps.target.merge_flags`), ``[modules]`` names
  (:func:`~metrale_orch.steps.target.module_names`), the whole plan
  (:func:`~metrale_orch.steps.plan.check_plan`: what ``plan_target`` refuses,
  ``[hardware] arch``, ``[defaults]``),
  its ``[shadow_exempt]`` tables (``_dropped.shadow_exemptions``), its
  ``SMOKE.toml`` cases (:func:`~metrale_orch.smoke.scan_cases`) and the includes
  that escape ``kernels/`` (:func:`~metrale_orch.steps.staging.beyond_layout`);
- every hardware's ``[defaults]`` and ``[hardware] sm_count`` and its vendor's
  toolchain, whether or not it has targets; ``kernels/LEVERS.toml``
  (:func:`~metrale_orch.defaults.read_tree_levers`).

Each step runs on its own, so one target's first error never hides another
file's. No kernel is compiled: a plan is checked without a toolchain identity (the
views that plan, ``rdeps``, use :data:`UNPROBED` for it). Each toolchain is found as
the build finds it, by the same function
(:func:`~metrale_orch.toolchain.readiness.ready_toolchain`: located, probed, and for
a toolchain with ``arch_check_args`` an empty kernel compiled for the arch, remembered
in the build's state directory): one that is not installed, or cannot build the arch,
is no problem (the build skips its targets) but is listed with the build's reason
(:attr:`CheckReport.skipped`), so ``check`` skips what the build skips; a variable
naming an unusable compiler, or a failing probe, is a problem. Beyond what the build
refuses, ``check`` also refuses symlinks no target reads, shadows whose winner
is byte-identical to its loser and kernel files duplicated byte for byte, and
warns about likely typos in manifests.

Problems are one line each, naming the file (and key) at fault, grouped by
that file (sorted by it, then by message), each with the targets it breaks.
:func:`report_lines` is the text both the ``check`` doit task and ``metrale-orch
check`` show.

Why here, in the build graph: the check runs the build's and smoke's own validators, so
it sits above ``steps`` and ``smoke`` (not in ``tree``, which imports neither); it needs
nothing of doit, and both the ``check`` task (:mod:`metrale_orch.tasks.actions`) and the
CLI only print its lines.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch import tree as lay
from metrale_orch.config import Config
from metrale_orch.defaults import read_tree_levers
from metrale_orch.errors import MetraleError, is_printable, printable
from metrale_orch.fsutil import file_hash
from metrale_orch.paths import STATE_DIR
from metrale_orch.smoke import scan_cases
from metrale_orch.steps.dropped import shadow_exemptions
from metrale_orch.steps.errors import BuildConfigError, ToolchainMissing
from metrale_orch.steps.hip_mirror import HipCompat, scan_hip_compat
from metrale_orch.steps.plan import check_plan, merge_flags, module_names
from metrale_orch.steps.plan_values import PlanMemo
from metrale_orch.steps.staging import (
    beyond_layout,
    containment_error,
    plan_stage,
    uncontained,
)
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains, select_toolchain
from metrale_orch.toolchain.probe import ProbeMemo
from metrale_orch.toolchain.readiness import start_finding, tool_key, wanted_toolchains
from metrale_orch.tree.beyond import IncludeMemo

__all__ = ["UNPROBED", "CheckReport", "check_tree", "report_lines"]

#: The toolchain identity ``check`` plans with (its plans compile nothing).
UNPROBED = "unprobed"

#: Targets named after a problem before "(and N more)".
_SHOWN_TARGETS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    """What ``check`` found (one line each, sorted).

    ``problems``: what the build would refuse (``check`` exits 2), grouped by the
    file each names; ``warnings``: likely typos (the build goes on); ``skipped``:
    targets whose compiler is not installed or cannot build their arch, one line per
    reason (the build's own).
    """

    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    skipped: tuple[str, ...]
    #: Targets the tree walks to (0 when the walk itself fails).
    targets: int
    #: Targets named by at least one problem.
    failing: int
    #: Targets the build skips: their compiler is not installed or cannot build the arch.
    skipping: int
    #: Distinct files the problems name.
    files: int

    @property
    def ok(self) -> bool:
        """The build will not refuse the tree."""
        return not self.problems


class _Found:
    """Messages found so far, each with the targets it breaks (de-duplicated)."""

    def __init__(self) -> None:
        self.by_message: dict[str, set[str]] = defaultdict(set)

    def add(self, message: str, target: str | None = None) -> None:
        targets = self.by_message[message]
        if target is not None:
            targets.add(target)

    def error(self, exc: MetraleError, target: str | None = None) -> None:
        self.add(str(exc), target)

    def lines(self) -> list[str]:
        """``message [target a, b (and N more)]``, sorted by file, then message."""
        return [
            _with_targets(message, self.by_message[message])
            for message in sorted(self.by_message, key=lambda m: (file_of(m), m))
        ]


def _with_targets(message: str, targets: Iterable[str]) -> str:
    """``message [target a, b (and N more)]`` (just ``message`` without targets), printable."""
    names = sorted(targets)
    if names:
        more = len(names) - _SHOWN_TARGETS
        suffix = f" (and {more} more)" if more > 0 else ""
        message = f"{message} [target {', '.join(names[:_SHOWN_TARGETS])}{suffix}]"
    return printable(message)


def file_of(message: str) -> str:
    """The root-relative file a problem message starts by naming, or "" (pure).

    Messages name their file first (``kernels/hw/HARDWARE.toml: [defaults] ...``,
    ``kernels/hw/m/q/x.cu:3: #include ...``, ``toolchains/hip.toml: ...``,
    ``pyproject.toml [tool.metrale-orch]: ...``); tree-wide ones do not.
    """
    token = message.split(" ", 1)[0].rstrip(":")
    head, sep, tail = token.rpartition(":")
    if sep and tail.isdigit():  # a line number
        token = head
    if token.startswith(("kernels/", "toolchains/")) or token.endswith(".toml"):
        return token
    return ""


def check_tree(root: Path, environ: Mapping[str, str], config: Config) -> CheckReport:
    """Check the tree at ``root`` as the build would see it under ``environ`` and
    ``config`` (the caller's: a configuration that does not load is its error, refused
    before any tree is read) (I/O: reads the toolchain files and every file name,
    manifest and source under kernels/; finds and probes each toolchain as the build
    does, compiling no kernel)."""
    found = _Found()
    skipped: dict[str, set[str]] = defaultdict(set)
    toolchains: Mapping[str, Toolchain] | None = None
    try:
        toolchains = load_toolchains(root)
    except MetraleError as exc:
        found.error(exc)
    build_keys = sorted({tc.flags_key for tc in (toolchains or {}).values()})
    snap = lay.TreeSnapshot(root)
    try:
        results = lay.resolve_all(root, snap)
    except lay.LayoutError as exc:
        found.add(f"the tree cannot be walked: {exc}")
        results = []
    scan = _scan_kernels(root, snap)
    _check_tree_files(root, snap, results, scan, found)
    memo = PlanMemo(root)
    steps = _Steps(root=root, config=config, toolchains=toolchains, environ=environ, memo=memo)

    # Each compiler found, probed and checked for the arch as the build finds it.
    state_dir = None if config is None else config.build_dir / STATE_DIR
    tools = start_finding(
        wanted_toolchains(results, toolchains or {}), environ, state_dir, ProbeMemo()
    )
    for target, layout in results:
        name = str(target)
        unsafe = lay.unsafe_target_name(target)  # a matrix row cannot name it
        if unsafe is not None:
            found.error(unsafe, name)
        if isinstance(layout, lay.LayoutError):
            continue
        for problem in steps.problems(layout):
            found.error(problem, name)
        if toolchains is None:
            continue
        try:
            outcome = tools[tool_key(select_toolchain(layout.hardware, toolchains), layout)]
        except MetraleError:
            continue  # reported above
        tool = outcome.result()
        if isinstance(tool, ToolchainMissing):
            skipped[str(tool)].add(name)
        elif isinstance(tool, MetraleError):  # an unusable compiler, root or probe
            found.error(tool, name)
    for problem in _hardware_problems(snap, toolchains, memo):
        found.error(problem)
    for problem in _levers_problems(root):
        found.error(problem)
    warnings = _warnings(snap, scan, build_keys)
    problems = found.lines()
    failing = set().union(*found.by_message.values()) if found.by_message else set()
    return CheckReport(
        problems=tuple(problems),
        warnings=tuple(printable(w) for w in sorted(warnings)),
        skipped=tuple(_with_targets(reason, names) for reason, names in sorted(skipped.items())),
        targets=len(results),
        failing=len(failing),
        skipping=len(set().union(*skipped.values())) if skipped else 0,
        files=len({file_of(m) for m in found.by_message} - {""}),
    )


def report_lines(report: CheckReport) -> list[tuple[Literal["out", "err"], str]]:
    """What ``check`` shows, line by line, each with its stream (pure): warnings, skipped
    targets and problems on stderr, then the verdict (stderr with problems, else stdout)."""
    lines: list[tuple[Literal["out", "err"], str]] = []
    lines += [("err", f"warning: {line}") for line in report.warnings]
    lines += [("err", f"skipped: {line}") for line in report.skipped]  # the build skips them
    if report.problems:
        lines += [("err", f"problem: {line}") for line in report.problems]
        count, files = len(report.problems), report.files
        where = f" in {files} file{'s' if files != 1 else ''}" if files else ""
        lines.append(
            (
                "err",
                f"check: {count} problem{'s' if count != 1 else ''}{where} "
                f"({report.failing} of {report.targets} targets affected)",
            )
        )
        return lines
    skipped = report.skipping
    how = f"; {skipped} skipped: cannot be built here" if skipped else ""
    lines.append(("out", f"check: ok (the build accepts all {report.targets} targets{how})"))
    return lines


# ---------------------------------------------------------------------------- the build's rules


class _Steps:
    """The build's validating steps for one target, sharing what targets share (the plan
    memo, the sources read, the HIP compat directory)."""

    def __init__(
        self,
        *,
        root: Path,
        config: Config,
        toolchains: Mapping[str, Toolchain] | None,
        environ: Mapping[str, str],
        memo: PlanMemo,
    ) -> None:
        self.root = root
        self.config = config
        self.toolchains = toolchains
        self.environ = environ
        self.memo = memo
        self._sources: dict[Path, bytes] = {}
        self._compat: HipCompat | None = None
        self.includes = IncludeMemo(root / "kernels", self.read)

    def read(self, path: Path) -> bytes:
        data = self._sources.get(path)
        if data is None:
            data = self._sources[path] = path.read_bytes()
        return data

    def hip_compat(self) -> HipCompat:
        """The project's HIP compat directory, as the build reads it for a HIP target."""
        if self._compat is None:
            self._compat = scan_hip_compat(self.root, self.config.hip_compat_dir)
        return self._compat

    def plan(self, layout: lay.Layout, toolchains: Mapping[str, Toolchain]) -> None:
        """What :func:`~metrale_orch.steps.plan.plan_target` refuses, as the build calls it
        (``dodo``): :func:`~metrale_orch.steps.plan.check_plan`."""
        toolchain = select_toolchain(layout.hardware, toolchains)
        check_plan(
            self.root,
            layout,
            toolchains,
            environ=self.environ,
            memo=self.memo,
            hip_compat=self.hip_compat() if toolchain.dialect == "hip" else None,
        )

    def problems(self, layout: lay.Layout) -> list[MetraleError]:
        """What the build of ``layout`` would refuse, each step on its own (reads the tree)."""
        root, memo = self.root, self.memo
        problems: list[MetraleError] = []

        def attempt(step: Callable[[], object]) -> bool:
            try:
                step()
            except MetraleError as exc:
                problems.append(exc)
                return False
            return True

        staged: Mapping[str, Path] | None = None
        try:
            staged = plan_stage(layout)
        except MetraleError as exc:
            problems.append(exc)
        tcs = self.toolchains
        if tcs is not None:
            attempt(
                lambda: merge_flags(layout, select_toolchain(layout.hardware, tcs).flags_key, root)
            )
            attempt(lambda: self.plan(layout, tcs))
        attempt(lambda: module_names(layout, root))
        # [shadow_exempt] of every KERNEL.toml the target reads: all malformed entries.
        exempt = shadow_exemptions(
            (memo.rel(layer.manifest.path), layer.manifest.doc)
            for layer in reversed(layout.layers)
            if layer.manifest is not None
        )
        problems.extend(BuildConfigError(*problem) for problem in exempt.problems)
        attempt(lambda: scan_cases(root, layout))
        if staged is not None:
            # Includes that escape kernels/ (SPEC 3.3.1): every one, named with its line.
            try:
                beyond = beyond_layout(root, layout, memo=self.includes, staged=staged)
                problems.extend(beyond.errors)
            except MetraleError as exc:
                problems.append(exc)
            except OSError:
                pass  # an unreadable source: resolution and containment report it
        return problems


def _hardware_problems(
    snap: lay.TreeSnapshot, toolchains: Mapping[str, Toolchain] | None, memo: PlanMemo
) -> list[MetraleError]:
    """Every hardware's ``[defaults]`` (with ``[hardware] sm_count``) and vendor → toolchain,
    whether or not it has targets (one that does not load is the walk's problem)."""
    problems: list[MetraleError] = []
    for name, kind in snap.listing("kernels") or ():
        if kind != "dir" or not snap.is_file(f"kernels/{name}/{lay.HARDWARE_TOML}"):
            continue
        try:
            hardware = snap.hardware(name)
        except lay.LayoutError:
            continue
        try:
            memo.defaults(hardware)
        except MetraleError as exc:
            problems.append(exc)
        if toolchains is not None:
            try:
                select_toolchain(hardware, toolchains)
            except MetraleError as exc:
                problems.append(exc)
    return problems


def _levers_problems(root: Path) -> list[MetraleError]:
    """``kernels/LEVERS.toml`` (SPEC 2.5), through the reader the build uses."""
    try:
        read_tree_levers(root / "kernels")
    except MetraleError as exc:
        return [exc]
    return []


# ---------------------------------------------------------------------------- the tree's files


def _check_tree_files(
    root: Path,
    snap: lay.TreeSnapshot,
    results: Sequence[tuple[lay.Target, lay.Layout | lay.LayoutError]],
    scan: _Scan,
    found: _Found,
) -> None:
    """Resolution errors, misshapen manifests, symlinks, containment, pointless forks,
    byte-identical duplicates and undecodable names."""
    kernels = root / "kernels"
    # Manifests that are directories: resolution passes over them, the build refuses them.
    misshapen = lay.misshapen_manifests(root, snap)
    for shape_error in misshapen:
        found.error(shape_error)
    reported_links: set[Path] = set()
    contained: dict[Path, str] = {}  # what uncontained examined, shared by the targets
    for target, result in results:
        name = str(target)
        if isinstance(result, lay.LayoutError):
            found.error(result, name)
            if isinstance(result, lay.SymlinkError):
                reported_links.add(result.path)
            continue
        shape = lay.layer_manifest_problem(result, misshapen)
        if shape is not None:
            found.error(shape, name)
        for s in result.shadows:
            if s.winner.is_file() and s.loser.is_file() and _digest(s.winner) == _digest(s.loser):
                found.add(
                    f"{snap.rel(s.winner)} shadows {snap.rel(s.loser)} with identical bytes: "
                    f"a pointless fork; delete {snap.rel(s.winner)} and its [shadow] "
                    f"{lay.stem_of(s.name)} key",
                    name,
                )
        # What the build would refuse to stage (staging.check_contained): files outside
        # kernels/ (a redirect or use reaching out) or reached through a symlinked directory.
        for path, problem in uncontained(kernels, result.input_set(), contained):
            link = _link_above(kernels, path)
            if link is not None:
                found.add(_link_message(snap.rel(link)), name)
                reported_links.add(link)
            else:
                refused = containment_error(root, result, path, snap.rel(path), problem)
                found.add(refused.detail, name)
    for link in lay.symlinks(root):
        if link not in reported_links:  # a link no target reads is still refused
            found.add(_link_message(snap.rel(link)))
    for message in (*scan.unnamable, *_duplicates(scan.kernel_files, snap)):
        found.add(message)


def _warnings(snap: lay.TreeSnapshot, scan: _Scan, build_keys: Sequence[str]) -> set[str]:
    """Likely typos in every manifest under kernels/ (the build goes on)."""
    warnings: set[str] = set()
    for path in scan.manifests:
        kind = lay.MANIFEST_KINDS[path.name]
        try:
            doc = snap.toml(path)
        except lay.LayoutError:
            continue  # resolution reports a manifest that does not parse
        if doc is not None:
            warnings.update(lay.manifest_warnings(snap.rel(path), doc, kind, build_keys=build_keys))
    return warnings


def _digest(path: Path) -> str:
    return file_hash(os.fspath(path))


def _link_message(rel: str) -> str:
    return f"{rel}: is a symlink; kernel trees hold real files only"


def _link_above(kernels: Path, path: Path) -> Path | None:
    """The first symlink on the way from ``kernels`` down to ``path``, if any."""
    try:
        parts = Path(os.path.abspath(path)).relative_to(os.path.abspath(kernels)).parts
    except ValueError:
        return None
    current = kernels
    for part in parts:
        current = current / part
        if current.is_symlink():
            return current
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Scan:
    """One pass over every name under kernels/ (symlinked directories not followed)."""

    #: A problem per name that is not valid UTF-8 (its children are not listed).
    unnamable: tuple[str, ...]
    #: Every HARDWARE.toml, MODEL.toml and KERNEL.toml file, sorted.
    manifests: tuple[Path, ...]
    #: Every regular kernel file (source or header), sorted.
    kernel_files: tuple[Path, ...]


def _scan_kernels(root: Path, snap: lay.TreeSnapshot) -> _Scan:
    kernels = root / "kernels"
    kernel_exts = {"cu", "metal", *lay.HEADER_EXTS}
    unnamable: list[str] = []
    manifests: list[Path] = []
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(kernels):
        base = Path(dirpath)
        for name in sorted([*dirnames, *filenames]):
            if not is_printable(name):
                unnamable.append(lay.unnamable_message(snap.rel(base / name)))
        dirnames[:] = sorted(d for d in dirnames if is_printable(d))
        for name in filenames:
            path = base / name
            if not is_printable(name) or path.is_symlink() or not path.is_file():
                continue
            if name in lay.MANIFEST_KINDS:
                manifests.append(path)
            elif "." in name and name.rpartition(".")[2] in kernel_exts:
                files.append(path)
    return _Scan(
        unnamable=tuple(unnamable),
        manifests=tuple(sorted(manifests)),
        kernel_files=tuple(sorted(files)),
    )


def _duplicates(paths: Iterable[Path], snap: lay.TreeSnapshot) -> list[str]:
    """Kernel files with the same name and bytes in different directories."""
    by_name: dict[str, list[Path]] = defaultdict(list)
    for path in paths:
        by_name[path.name].append(path)
    messages = []
    for name, same_name in sorted(by_name.items()):
        if len(same_name) < 2:
            continue
        groups: dict[str, list[Path]] = defaultdict(list)
        for p in same_name:
            groups[_digest(p)].append(p)
        for same in groups.values():
            if len(same) > 1:
                listed = ", ".join(snap.rel(p) for p in same)
                messages.append(
                    f"{name} is duplicated byte for byte in {listed}: keep one copy and "
                    "share it with [sources] use"
                )
    return messages
