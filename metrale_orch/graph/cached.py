"""The build graph through the task cache: the no-op fast path.

Generating the specs (resolving every target, planning it) costs several times
doit's own up-to-date checks, so the specs come from the task cache
(:mod:`metrale_orch.graph.taskcache`, ``<build_dir>/.state/build-tasks.*.cache``)
while the tree's shape, its TOML files, the configuration, the toolchains, the
relevant environment and this package are unchanged; they are then equal to what
generation would give. A driver may store data of its own with them (``extra``: the
doit adapter records its ``smoke:<hw>`` task dicts there:
:mod:`metrale_orch.tasks.creators`), handed back on a hit.

This module never imports the generation itself (the compile step's planning), nor the
tree package but in :func:`named_failures` (a no-op runs without either): on a
miss it asks a :class:`Generation` handed in by the caller (which imports
:mod:`metrale_orch.graph.generate` only then). Also :func:`named_failures`: a failing
spec, with the reason, for a target named on the command line that the tree does not
generate, and :func:`start_order`. Imports nothing of doit nor of its adapter.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import metrale_orch
from metrale_orch.config import Config, load_config
from metrale_orch.errors import MetraleError, printable
from metrale_orch.fsutil import remove_all_but_newest, write_own
from metrale_orch.graph import taskcache
from metrale_orch.graph.selection import explicit_targets
from metrale_orch.graph.specs import BuildSpec
from metrale_orch.graph.taskkey import (
    generation_base,
    key_of,
    scoped_base,
    stamps_of,
    stored_key,
)
from metrale_orch.ownership import read_own
from metrale_orch.paths import STATE_DIR, TREE_TASK
from metrale_orch.toolchain import earlyruns
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains
from metrale_orch.toolchain.earlyruns import EarlyRuns
from metrale_orch.toolchain.probe import ProbeMemo
from metrale_orch.toolchain.stamps import Stamp, stamped_per_arch

if TYPE_CHECKING:
    from metrale_orch.tree import Target

__all__ = [
    "Generation",
    "cached_specs",
    "named_failures",
    "start_order",
]

#: ``(specs, config) -> data`` a driver stores with the specs a generation made (anything
#: ``marshal`` writes); called only when they are stored.
Extra = Callable[[Sequence[BuildSpec], Config], object]


@dataclass(frozen=True, slots=True)
class Generation:
    """How the specs are made when the task cache cannot answer
    (:data:`metrale_orch.graph.generate.GENERATION`)."""

    #: ``(root, environ, config) -> resolution``: the tree resolved, no compiler run
    #: (handed to ``generate_specs`` as ``resolution``).
    resolve_tree: Callable[[Path, Mapping[str, str], Config], object]
    #: ``(resolution, scope) -> resolution``: the resolution of the targets in ``scope``
    #: alone (:func:`~metrale_orch.graph.scope.in_scope`), the tree-wide outcome kept.
    select: Callable[[object, Sequence[str]], object]
    #: ``(resolution, toolchains) -> {name: arches}``: what ``used_toolchains`` will give
    #: for the specs made from that resolution.
    resolved_toolchains: Callable[..., Mapping[str, tuple[str, ...]]]
    #: ``(root, environ, argv, *, config=None, toolchains=None) -> (specs, cacheable)``.
    generate_specs: Callable[..., tuple[list[BuildSpec], bool]]
    #: ``(specs, toolchains) -> {name: arches}``: the toolchains the specs' targets select
    #: (every one whose programs can change a task), with the arches they build for.
    used_toolchains: Callable[
        [Sequence[BuildSpec], Mapping[str, Toolchain]], Mapping[str, tuple[str, ...]]
    ]


def cached_specs(
    root: Path,
    environ: Mapping[str, str],
    argv: Sequence[str],
    generation: Callable[[], Generation],
    *,
    driver: str,
    probes: ProbeMemo | None = None,
    scope: Sequence[str] | None = None,
    config: Config | None = None,
    extra: Extra | None = None,
) -> tuple[list[BuildSpec], object, str]:
    """The specs, the driver's ``extra`` data stored with them (None when not known), and
    how the specs were obtained. ``generation`` is called only on a miss; ``probes`` is
    the run's (its build reuses what was probed here). ``driver``: who turns the specs
    into work, with its version (doit's), part of the key: another driver's entry is
    another entry.

    ``scope``: a run that selects these ``build`` sub-tasks and no other task
    (:func:`~metrale_orch.graph.scope.selection_scope`) gets the specs of the targets in
    it alone: only the toolchains those targets select are probed, and its entry is
    cached under a base of its own (:func:`~metrale_orch.graph.taskkey.scoped_base`). A
    spec is the same whatever else is generated beside it. ``config``: the run's (None:
    loaded here)."""
    if probes is None:
        probes = ProbeMemo()
    try:
        if config is None:
            config = load_config(root, environ)
        toolchains = load_toolchains(root)
    except MetraleError:
        specs = generation().generate_specs(root, environ, argv, config=config, probes=probes)[0]
        return specs, None, "not cached: configuration error"
    state_dir = config.build_dir / STATE_DIR
    base = scoped_base(generation_base(root, environ, config, toolchains, doit=driver), scope)
    used = taskcache.read_uses(state_dir, base)
    arches: Mapping[str, Sequence[str]] = taskcache.read_arches(state_dir, base)
    # The entry this base stored last is read while the toolchains' probes (started when
    # doit imported the dodo file) finish; when it cannot answer, the work generation
    # does before it needs a toolchain is done meanwhile (_Early).
    last = taskcache.last_key(state_dir, base)
    scoped = scope is not None
    found = (
        None
        if last is None
        else taskcache.lookup(taskcache.cache_path(state_dir, last, scoped=scoped), last)
    )
    early = (
        None
        if found is not None and found.specs is not None
        else _Early(root, environ, config, generation, scope)
    )
    if early is not None:  # the toolchains the targets select are known before the stamps
        resolved = early.generation.resolved_toolchains(early.resolution, toolchains)
        used, arches = tuple(resolved), _of_per_arch(resolved, toolchains)
    # The toolchains are observed here, before generation asks for any of them, and an
    # entry is only ever keyed by these observations (see stored_key).
    stamps = stamps_of(config, environ, toolchains, probes, used, arches)
    _keep_plan(state_dir, environ, scope, probes.early)
    key = key_of(base, stamps)
    if found is None or key != last:
        found = taskcache.lookup(taskcache.cache_path(state_dir, key, scoped=scoped), key)
    if found.specs is not None:
        if key != last:  # the hint named another entry (or none): name this one next time
            per_arch = {n: a for n, a in arches.items() if n in stamps}
            taskcache.write_uses(state_dir, base, sorted(stamps), key, per_arch, scoped=scoped)
        explicit = explicit_targets(argv)
        specs = [_from_cached(c, explicit) for c in found.specs]
        return specs, found.extra, found.reason
    if early is None:
        early = _Early(root, environ, config, generation, scope)
    made = early.generation
    specs, cacheable = made.generate_specs(
        root,
        environ,
        argv,
        config=config,
        toolchains=toolchains,
        probes=probes,
        resolution=early.resolution,
    )
    stored: object = None
    if early.scanned is not None and cacheable:
        stored = None if extra is None else extra(specs, config)
        chosen = made.used_toolchains(specs, toolchains)
        _store(state_dir, base, stamps, early.scanned, specs, stored, chosen, toolchains, scoped)
    return specs, stored, found.reason


def _keep_plan(
    state_dir: Path, environ: Mapping[str, str], scope: Sequence[str] | None, early: EarlyRuns
) -> None:
    """Leave the dry runs the stamps asked for as the next run's plan of this kind (the
    whole tree's, or this scope's: :mod:`~metrale_orch.toolchain.earlyruns`)."""
    if not early.asked():
        return
    plan = early.plan_bytes(environ)
    path = state_dir / earlyruns.plan_name(scope)
    try:
        if read_own(path) == plan:  # anyone else's file is rewritten as this user's
            return
    except OSError:
        pass
    # Only a head start: a read-only build dir starts nothing early.
    with contextlib.suppress(OSError):
        write_own(path, plan)
        if scope is not None:  # the newest scoped plans are kept, as the scoped entries are
            others = (p for p in state_dir.glob(earlyruns.SCOPED_PLAN_GLOB) if p != path)
            remove_all_but_newest(others, taskcache.KEEP - 1)


def _store(
    state_dir: Path,
    base: str,
    stamps: Mapping[str, Stamp],
    scanned: taskcache.Scan,
    specs: Sequence[BuildSpec],
    extra: object,
    chosen: Mapping[str, Sequence[str]],
    toolchains: Mapping[str, Toolchain],
    scoped: bool,
) -> None:
    """Store what a generation made under the toolchains its targets did select, ``chosen``
    (and the arches they build for, of those probed per arch; see
    :func:`~metrale_orch.graph.taskkey.stored_key`), and the hints the next run reads
    first."""
    selected = sorted(chosen)
    per_arch = _of_per_arch(chosen, toolchains)
    stored = stored_key(base, stamps, selected, per_arch)
    if stored is not None:
        taskcache.store(
            taskcache.cache_path(state_dir, stored, scoped=scoped),
            stored,
            scanned,
            specs,
            extra,
        )
    taskcache.write_uses(state_dir, base, selected, stored, per_arch, scoped=scoped)


def _of_per_arch(
    arches: Mapping[str, Sequence[str]], toolchains: Mapping[str, Toolchain]
) -> dict[str, Sequence[str]]:
    """``arches`` (toolchain name -> the arches its targets build for) of the toolchains
    stamped per arch (:func:`~metrale_orch.toolchain.stamps.stamped_per_arch`)."""
    return {n: a for n, a in arches.items() if n in toolchains and stamped_per_arch(toolchains[n])}


class _Early:
    """What a generation does before it asks for any toolchain: the scan of the watched
    files (taken before generation reads the tree), the generation's import and the
    tree's resolution. Done while the probes finish when the entry last stored cannot
    answer, else only on a miss."""

    def __init__(
        self,
        root: Path,
        environ: Mapping[str, str],
        config: Config,
        generation: Callable[[], Generation],
        scope: Sequence[str] | None,
    ) -> None:
        package = Path(metrale_orch.__file__).parent
        self.scanned = taskcache.scan(root / "kernels", taskcache.package_files(package))
        self.generation = generation()
        self.resolution = self.generation.resolve_tree(root, environ, config)
        if scope is not None:
            self.resolution = self.generation.select(self.resolution, scope)


def start_order(config: Config | None, specs: Sequence[BuildSpec]) -> list[BuildSpec]:
    """``specs`` in the order doit should start them: the targets with the most compile
    seconds last time first, never-built ones before them (largest first), so a parallel
    build does not end on one long target (:mod:`metrale_orch.steps.times`). doit runs a
    group's sub-tasks in the order they were yielded. ``config``: the run's (None: it
    failed, the order is left alone)."""
    from metrale_orch.steps.times import longest_first, read_target_seconds

    if config is None:
        return list(specs)
    seconds = read_target_seconds(config.build_dir / STATE_DIR)
    by_name = {s.target: s for s in specs}
    if len(by_name) != len(specs):  # not one spec per target: leave the order alone
        return list(specs)
    sizes = {s.target: len(s.file_dep) for s in specs}
    return [by_name[name] for name in longest_first(list(by_name), seconds, sizes)]


def _from_cached(spec: BuildSpec, explicit: frozenset[str]) -> BuildSpec:
    """A spec the task cache stored, as this run's command line selects it: a skip of a
    target named exactly fails (the only fact of a spec that is not the tree's)."""
    if spec.kind == "skip" and spec.target in explicit:
        return dataclasses.replace(spec, explicit=True)
    return spec


def named_failures(root: Path, specs: Sequence[BuildSpec], names: Iterable[str]) -> list[BuildSpec]:
    """A failing sub-task for each of ``names`` (targets named on the command line) that
    ``specs`` lacks, saying why the tree does not generate it (reads the tree).

    doit answers a name it has no task for with ``Invalid parameter``; that happens
    when the configuration or the walk of the tree failed (only the ``(tree)``
    sub-task exists then), and for a name that is no target of the tree. The
    reason, first that applies: the name is not ``hw/model/quant``; resolving the
    target fails (its HARDWARE.toml, model or quant, with the resolver's
    message); the tree-wide failure; the model has no such quant.
    """
    have = {spec.target for spec in specs}
    missing = sorted(set(names) - have - {TREE_TASK})
    if not missing:
        return []
    # The tree package only here: a no-op names no missing target, and never imports it.
    from metrale_orch.tree import LayoutError, Target, TreeSnapshot, discover, walk

    tree = next((s.message for s in specs if s.target == TREE_TASK), None)
    snap = TreeSnapshot(root)
    # The tree's targets, not only those generated (a run scoped to some has no others).
    with contextlib.suppress(LayoutError):
        have = have | {str(t) for t in walk(root, snap)}
    out: list[BuildSpec] = []
    for name in missing:
        canonical = False
        try:
            target = Target.parse(name)
        except ValueError as exc:
            message = f"{exc}; `doit list` shows every target"
        else:
            canonical = str(target) == name
            try:
                discover(root, target, snap)
            except LayoutError as exc:
                message = str(exc)
            else:
                message = tree if tree is not None else _not_a_target(target, have)
        message = printable(message)
        out.append(BuildSpec(target=name, kind="error", message=message, clean=canonical))
    return out


def _not_a_target(target: Target, have: Iterable[str]) -> str:
    prefix = f"{target.hardware}/{target.model}/"
    siblings = sorted(t for t in have if t.startswith(prefix))
    known = f"its targets: {', '.join(siblings)}" if siblings else "it has no targets"
    return (
        f"{target} is not a target of this tree: model {target.hardware}/{target.model} has "
        f"no quant directory {target.quant!r} ({known}); `doit list` shows every target"
    )
