"""What ``task_build`` yields, through the task cache: the no-op fast path.

Generating the tasks (resolving every target, planning it) costs several times
doit's own up-to-date checks, so the specs come from the task cache
(:mod:`metrale_orch.graph.taskcache`, ``<build_dir>/.state/build-tasks.*.cache``)
while the tree's shape, its TOML files, the configuration, the toolchains, the
relevant environment and this package are unchanged; the task dicts are then
equal to what generation would give. The ``smoke:<hw>`` dicts are recorded with
them (plain data and module-level functions) and replayed.

This module never imports the generation itself (the compile step, smoke), nor the
tree package but in :func:`named_failures` (a no-op runs without either): on a
miss it asks a :class:`Generation` handed in by the caller (``metrale_orch.dodo``
imports :mod:`metrale_orch.tasks.specs` only then; ``specs.cached_build_specs`` is
this path with the generation at hand). Also :func:`named_failures`:
a failing sub-task, with the reason, for a target named on the command line that
the tree does not generate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import metrale_orch
from metrale_orch.config import Config, load_config
from metrale_orch.errors import MetraleError, printable
from metrale_orch.fsutil import remove_all_but_newest, write_own
from metrale_orch.graph import taskcache
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
from metrale_orch.tasks.dicts import TaskDict, explicit_targets
from metrale_orch.tasks.doit_api import doit_version
from metrale_orch.toolchain import earlyruns
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains
from metrale_orch.toolchain.earlyruns import EarlyRuns
from metrale_orch.toolchain.probe import ProbeMemo
from metrale_orch.toolchain.stamps import Stamp, stamped_per_arch

if TYPE_CHECKING:
    from metrale_orch.tree import Target

__all__ = [
    "Generation",
    "cached_tasks",
    "named_failures",
    "start_order",
]


@dataclass(frozen=True, slots=True)
class Generation:
    """How the specs are made when the task cache cannot answer
    (:data:`metrale_orch.tasks.specs.GENERATION`)."""

    #: ``(root, environ, config) -> resolution``: the tree resolved, no compiler run
    #: (handed to ``generate_specs`` as ``resolution``).
    resolve_tree: Callable[[Path, Mapping[str, str], Config], object]
    #: ``(resolution, scope) -> resolution``: the resolution of the targets in ``scope``
    #: alone (:func:`~metrale_orch.tasks.dicts.in_scope`), the tree-wide outcome kept.
    select: Callable[[object, Sequence[str]], object]
    #: ``(resolution, toolchains) -> {name: arches}``: what ``used_toolchains`` will give
    #: for the specs made from that resolution.
    resolved_toolchains: Callable[..., Mapping[str, tuple[str, ...]]]
    #: ``(root, environ, argv, *, config=None, toolchains=None) -> (specs, cacheable)``.
    generate_specs: Callable[..., tuple[list[BuildSpec], bool]]
    #: ``(root, environ, specs, config=None) -> smoke task dicts``.
    smoke_task_dicts: Callable[..., list[TaskDict]]
    #: ``(specs, toolchains) -> {name: arches}``: the toolchains the specs' targets select
    #: (every one whose programs can change a task), with the arches they build for.
    used_toolchains: Callable[
        [Sequence[BuildSpec], Mapping[str, Toolchain]], Mapping[str, tuple[str, ...]]
    ]


def cached_tasks(
    root: Path,
    environ: Mapping[str, str],
    argv: Sequence[str],
    generation: Callable[[], Generation],
    probes: ProbeMemo | None = None,
    scope: Sequence[str] | None = None,
    config: Config | None = None,
) -> tuple[list[BuildSpec], list[TaskDict] | None, str]:
    """The specs, the ``smoke`` task dicts when known (None: ask the generation's
    ``smoke_task_dicts``), and how the specs were obtained. ``generation`` is called
    only on a miss; ``probes`` is the run's (its build reuses what was probed here).

    ``scope``: a run that selects these ``build`` sub-tasks and no other task
    (:func:`~metrale_orch.tasks.dicts.build_scope`) gets the specs of the targets in it
    alone, and no smoke task: only the toolchains those targets select are probed, and
    its entry is cached under a base of its own
    (:func:`~metrale_orch.graph.taskkey.scoped_base`). A spec is the same whatever else is
    generated beside it. ``config``: the run's (None: loaded here)."""
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
    base = scoped_base(
        generation_base(root, environ, config, toolchains, doit=doit_version()), scope
    )
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
        return specs, replay_task_dicts(found.extra), found.reason
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
    smoke: list[TaskDict] | None = None if scope is None else []  # a scoped run: no smoke
    if early.scanned is not None and cacheable:
        if smoke is None:
            smoke = made.smoke_task_dicts(root, environ, specs, config)
        chosen = made.used_toolchains(specs, toolchains)
        _store(state_dir, base, stamps, early.scanned, specs, smoke, chosen, toolchains, scoped)
    return specs, smoke, found.reason


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
    smoke: Sequence[TaskDict],
    chosen: Mapping[str, Sequence[str]],
    toolchains: Mapping[str, Toolchain],
    scoped: bool,
) -> None:
    """Store what a generation made under the toolchains its targets did select, ``chosen``
    (and the arches they build for, of those probed per arch; see
    :func:`~metrale_orch.graph.taskkey.stored_key`), and the hints the next run reads
    first."""
    recorded = record_task_dicts(smoke)
    selected = sorted(chosen)
    per_arch = _of_per_arch(chosen, toolchains)
    stored = stored_key(base, stamps, selected, per_arch)
    if stored is not None:
        taskcache.store(
            taskcache.cache_path(state_dir, stored, scoped=scoped),
            stored,
            scanned,
            specs,
            None if recorded is None else [recorded],
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


#: Marks a module-level function in a recorded task dict: (_FUNCTION, module, name).
_FUNCTION = "\0function"


class _Unrecordable(Exception):
    pass


def _record_value(v: object) -> object:
    if v is None or isinstance(v, str | int | float | bool):
        return v
    if isinstance(v, list):
        return [_record_value(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_record_value(x) for x in v)
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {k: _record_value(x) for k, x in v.items()}
    if isinstance(v, types.FunctionType):
        name, where = str(v.__qualname__), str(v.__module__)
        if "." not in name and getattr(importlib.import_module(where), name, None) is v:
            return (_FUNCTION, where, name)
    raise _Unrecordable


def record_task_dicts(value: object) -> object:
    """``value`` (task dicts) as data the task cache can store, or None when it holds
    anything but plain data and module-level functions (then it is not cached)."""
    try:
        return _record_value(value)
    except _Unrecordable:
        return None


def _replay_value(v: object) -> object:
    if isinstance(v, list):
        return [_replay_value(x) for x in v]
    if isinstance(v, tuple):
        if len(v) == 3 and v[0] == _FUNCTION:
            return getattr(importlib.import_module(v[1]), v[2])
        return tuple(_replay_value(x) for x in v)
    if isinstance(v, dict):
        return {k: _replay_value(x) for k, x in v.items()}
    return v


def replay_task_dicts(extra: object) -> list[TaskDict] | None:
    """The task dicts :func:`record_task_dicts` recorded (in ``[recorded]``), else None."""
    if not isinstance(extra, list) or len(extra) != 1 or not isinstance(extra[0], list):
        return None
    try:
        return [task for task in map(_replay_value, extra[0]) if isinstance(task, dict)]
    except (ImportError, AttributeError):
        return None


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
