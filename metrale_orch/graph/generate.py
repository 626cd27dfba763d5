"""Generation of the build graph from the tree: resolve, probe, plan (reads the tree).

Every target becomes a :class:`~metrale_orch.graph.specs.BuildSpec` (a build, a skip
for a missing toolchain, or an error saying why it does not plan). The slow path of
every run the task cache cannot answer (:mod:`metrale_orch.graph.cached`), and what
``metrale-orch rdeps`` runs for the plans. Never raises for a tree, configuration or
toolchain problem: those become failing (or, for a missing toolchain, skipping) specs.
Imports nothing of doit nor of its adapter (:mod:`metrale_orch.tasks` turns the specs
into doit's task dicts).

Importing this module imports the compile step's planning and the tree package (the
heavy part of the package): a run imports it only when the task cache misses.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.config import Config, load_config
from metrale_orch.errors import MetraleError, is_printable, printable
from metrale_orch.graph.cached import Generation, named_failures
from metrale_orch.graph.scope import in_scope
from metrale_orch.graph.selection import explicit_targets
from metrale_orch.graph.specs import BuildSpec, plan_build_spec
from metrale_orch.paths import (
    MANIFEST_NAME,
    STATE_DIR,
    TREE_TASK,
    rel_posix,
    target_dir,
)
from metrale_orch.steps.errors import ToolchainMissing
from metrale_orch.steps.hip_mirror import HipCompat, scan_hip_compat
from metrale_orch.steps.plan import plan_target
from metrale_orch.steps.plan_values import PlanMemo
from metrale_orch.steps.staging import beyond_layout
from metrale_orch.steps.subshell import check_compile_paths
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains, select_toolchain
from metrale_orch.toolchain.probe import FoundToolchain, ProbeMemo
from metrale_orch.toolchain.readiness import (
    ToolKey,
    probe_failed,
    ready_toolchain,
    start_finding,
    tool_key,
    wanted_toolchains,
)
from metrale_orch.tree import (
    Layout,
    LayoutError,
    ManifestError,
    Target,
    TreeSnapshot,
    layer_manifest_problem,
    misshapen_manifests,
    resolve_all,
    unnamable_message,
)

__all__ = [
    "GENERATION",
    "Resolution",
    "generate_specs",
    "resolve_build_specs",
    "resolve_tree",
    "resolved_toolchains",
    "select_targets",
    "spec_inputs",
    "used_toolchains",
]


def resolve_build_specs(
    root: Path,
    environ: Mapping[str, str],
    argv: Sequence[str] = (),
    *,
    config: Config | None = None,
) -> list[BuildSpec]:
    """Every ``build`` sub-task of the tree at ``root`` (reads the tree, probes compilers).

    Never raises for a tree, config or toolchain problem: those become failing
    (or, for a missing toolchain, skipping) sub-tasks. Always generates (with
    plans and layouts); the task cache (:mod:`metrale_orch.graph.cached`) is the no-op
    fast path. A target named in ``argv`` that the tree does not generate gets a failing
    sub-task saying why (:func:`~metrale_orch.graph.cached.named_failures`). ``config``:
    the caller's (None: loaded from ``environ``).
    """
    specs = generate_specs(root, environ, argv, config=config)[0]
    return specs + named_failures(root, specs, explicit_targets(argv))


@dataclass(frozen=True, slots=True)
class Resolution:
    """The tree's targets resolved, before any toolchain is asked (:func:`resolve_tree`), or
    why the tree cannot be resolved."""

    snapshot: TreeSnapshot | None = None
    #: Each target's layout as the build sees it: one that reads a misshapen layer
    #: manifest is that error.
    resolved: tuple[tuple[Target, Layout | LayoutError], ...] = ()
    error: MetraleError | None = None
    #: The manifests that are directories (resolution passes over them; the build
    #: refuses them).
    misshapen: tuple[ManifestError, ...] = ()


def resolve_tree(root: Path, environ: Mapping[str, str], config: Config) -> Resolution:
    """Resolve every target of the tree at ``root`` (reads the tree; runs no compiler, so
    the task cache can do it while the toolchains' probes finish). Never raises for a
    tree or environment problem: it is the result's ``error``."""
    try:
        # Before any compile: one error, not the same failure of every compile.
        check_compile_paths(build_dir=config.build_dir, environ=environ)
        snapshot = TreeSnapshot(root)
        misshapen = tuple(misshapen_manifests(root, snapshot))
        resolved = tuple(
            (
                t,
                lay
                if isinstance(lay, LayoutError)
                else layer_manifest_problem(lay, misshapen) or lay,
            )
            for t, lay in resolve_all(root, snapshot)
        )
        return Resolution(snapshot=snapshot, resolved=resolved, misshapen=misshapen)
    except MetraleError as exc:
        return Resolution(error=exc)


def select_targets(resolution: object, scope: Sequence[str]) -> Resolution:
    """``resolution`` (a :class:`Resolution`) of the targets in ``scope`` alone
    (:func:`~metrale_orch.graph.scope.in_scope`), the tree-wide outcome (its error, the
    misshapen manifests) kept: what a run scoped to them generates from (pure)."""
    if not isinstance(resolution, Resolution):
        raise TypeError(f"not a Resolution: {resolution!r}")
    kept = tuple((t, lay) for t, lay in resolution.resolved if in_scope(str(t), scope))
    return dataclasses.replace(resolution, resolved=kept)


def generate_specs(
    root: Path,
    environ: Mapping[str, str],
    argv: Sequence[str],
    *,
    config: Config | None = None,
    toolchains: Mapping[str, Toolchain] | None = None,
    probes: ProbeMemo | None = None,
    resolution: Resolution | None = None,
) -> tuple[list[BuildSpec], bool]:
    """The specs, and whether they may be cached (no tree-wide error, no failed probe).
    Each toolchain is probed once (once per ``probes``: the run's, shared with its build).
    ``resolution``: the tree as :func:`resolve_tree` resolved it (None: resolved here)."""
    if probes is None:
        probes = ProbeMemo()

    def error(name: str, message: str, resolved: Layout | LayoutError | None = None) -> BuildSpec:
        message = printable(message)  # it may name a file whose name is not UTF-8
        return BuildSpec(target=name, kind="error", message=message, resolved=resolved)

    try:
        if config is None:
            config = load_config(root, environ)
        if toolchains is None:
            toolchains = load_toolchains(root)
    except MetraleError as exc:
        return [error(TREE_TASK, str(exc))], False
    if resolution is None:
        resolution = resolve_tree(root, environ, config)
    if resolution.snapshot is None:
        failure = resolution.error
        # A HARDWARE.toml that is a directory reads as missing: name it, not the symptom.
        shapes = misshapen_manifests(root) if isinstance(failure, LayoutError) else []
        return [error(TREE_TASK, str(shapes[0] if shapes else failure))], False

    explicit = explicit_targets(argv)
    memo = PlanMemo(root)
    found: dict[ToolKey, FoundToolchain | MetraleError] = {}
    hip_compat: HipCompat | None = None  # the project's HIP compat directory, read once
    cacheable = True
    specs: list[BuildSpec] = []
    # A manifest that is a directory: resolution passes over it; the build refuses it.
    whole = [str(e) for e in resolution.misshapen if e.path.name != "KERNEL.toml"]
    if whole:
        more = f" (and {len(whole) - 1} more)" if len(whole) > 1 else ""
        specs.append(error(TREE_TASK, whole[0] + more))
    checked = resolution.resolved
    # Every toolchain the targets select is found (probed) at once, on threads, while the
    # first targets are planned: a target waits only for its own toolchain's probe.
    state_dir = config.build_dir / STATE_DIR
    pending = start_finding(wanted_toolchains(checked, toolchains), environ, state_dir, probes)
    for target, layout in checked:
        name = str(target)
        if isinstance(layout, LayoutError):
            specs.append(error(name, str(layout), layout))
            continue
        try:
            toolchain = select_toolchain(layout.hardware, toolchains)
            key = tool_key(toolchain, layout)
            if key not in found:
                started = pending.get(key)
                found[key] = (
                    started.result()
                    if started is not None
                    else ready_toolchain(toolchain, environ, state_dir, key[1], probes)
                )
                # A failed version probe may pass next time: never cached.
                cacheable = cacheable and not probe_failed(found[key])
            tool = found[key]
            if isinstance(tool, ToolchainMissing):
                reason = str(tool)
                specs.append(
                    BuildSpec(
                        target=name,
                        kind="skip",
                        message=reason,
                        explicit=name in explicit,
                        resolved=layout,
                    )
                )
                continue
            if isinstance(tool, MetraleError):
                raise tool
            if toolchain.dialect == "hip" and hip_compat is None:
                hip_compat = scan_hip_compat(root, config.hip_compat_dir)
            check_compile_paths(
                build_dir=config.build_dir,
                environ=environ,
                toolkit=tool.roots,
                host_compiler_env=toolchain.host_compiler_env,
                compat_dir=hip_compat.dir
                if toolchain.dialect == "hip" and hip_compat is not None
                else None,
            )
            plan = plan_target(
                root,
                layout,
                toolchains,
                identity=tool.identity,
                environ=environ,
                memo=memo,
                hip_compat=hip_compat if toolchain.dialect == "hip" else None,
            )
        except MetraleError as exc:
            specs.append(error(name, str(exc), layout))
            continue
        unnamable = _unnamable(plan.file_dep_rels)
        if unnamable is not None:  # doit's database and the keys hold names as UTF-8
            specs.append(error(name, unnamable_message(str(unnamable)), layout))
            continue
        out_dir = target_dir(config.build_dir, target.hardware, target.model, target.quant)
        spec = plan_build_spec(root=root, target=name, plan=plan, manifest=out_dir / MANIFEST_NAME)
        specs.append(dataclasses.replace(spec, layout=layout, resolved=layout))
    return specs, cacheable


def _unnamable(rels: Sequence[str]) -> str | None:
    """The first of ``rels`` that is not UTF-8, or None: one encode of them all (a name
    that is not UTF-8 makes the whole text fail), then one by one."""
    if is_printable("\n".join(rels)):
        return None
    return next((p for p in rels if not is_printable(str(p))), None)


def spec_inputs(root: Path, spec: BuildSpec) -> frozenset[str]:
    """The root-relative files ``spec``'s target reads, failing targets included (reads the
    tree for those): a build's file dependencies; for a target that is skipped or whose
    plan fails, what its resolved layout reaches (its inputs, the HARDWARE.toml and
    MODEL.toml files resolution read, the tree files its includes reach beyond the
    layout); for a target that does not resolve, the files its error names. Empty for a
    spec from the task cache that is not a build (it carries no resolution).
    """
    if spec.kind == "build":
        deps = set(spec.file_dep)
        if isinstance(spec.layout, Layout):
            with contextlib.suppress(MetraleError, OSError):
                beyond = beyond_layout(root, spec.layout).files.values()
                deps.update(rel_posix(p, root) for p in beyond)
        return frozenset(deps)
    resolved = spec.resolved
    files: set[Path] = set()
    if isinstance(resolved, Layout):
        files.update(resolved.inputs())
        files.update(resolved.hardware_manifests)
        files.update(resolved.model_manifests)
        # An escaping include or an unreadable source: the plan's failure reports it.
        with contextlib.suppress(MetraleError, OSError):
            files.update(beyond_layout(root, resolved).files.values())
    elif isinstance(resolved, LayoutError):
        for name in ("path", "manifest", "winner", "loser"):
            value = getattr(resolved, name, None)
            if isinstance(value, Path):
                files.add(value)
    return frozenset(rel_posix(p, root) for p in files)


def used_toolchains(
    specs: Sequence[BuildSpec], toolchains: Mapping[str, Toolchain]
) -> dict[str, tuple[str, ...]]:
    """The toolchains the targets of ``specs`` select, by name, with the arches those
    targets build for, sorted (pure): every toolchain found or probed for them, whether
    it built, skipped or failed them. A toolchain outside this set changes no spec: a
    target's toolchain follows from its HARDWARE.toml and the definitions alone
    (:func:`select_toolchain`)."""
    return _toolchain_arches((s.resolved for s in specs), toolchains)


def resolved_toolchains(
    resolution: Resolution, toolchains: Mapping[str, Toolchain]
) -> dict[str, tuple[str, ...]]:
    """:func:`used_toolchains` of the targets ``resolution`` resolved (pure): what the
    generation made from it will select."""
    return _toolchain_arches((layout for _target, layout in resolution.resolved), toolchains)


def _toolchain_arches(
    resolved: Iterable[object], toolchains: Mapping[str, Toolchain]
) -> dict[str, tuple[str, ...]]:
    arches: dict[str, set[str]] = {}
    for layout in resolved:
        if isinstance(layout, Layout):
            hw = layout.hardware
            with contextlib.suppress(MetraleError):
                name = select_toolchain(hw, toolchains).name
                # "" for a target without an arch: its plan carries the probe without one.
                arches.setdefault(name, set()).add(hw.arch or "")
    return {name: tuple(sorted(found)) for name, found in sorted(arches.items())}


#: The generation, as the task cache asks for it on a miss.
GENERATION = Generation(
    resolve_tree=resolve_tree,
    select=select_targets,
    resolved_toolchains=resolved_toolchains,
    generate_specs=generate_specs,
    used_toolchains=used_toolchains,
)
