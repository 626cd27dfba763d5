"""What ``task_build`` yields, through the task cache: the no-op fast path.

Generating the tasks (resolving every target, planning it) costs several times
doit's own up-to-date checks, so the specs come from the task cache
(:mod:`metrale_orch.tasks.taskcache`, ``<build_dir>/.state/build-tasks.*.cache``)
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
import importlib
import json
import os
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

import metrale_orch
from metrale_orch.config import EXECUTION_KEYS, Config, load_config
from metrale_orch.errors import MetraleError, printable
from metrale_orch.fsutil import remove_all_but_newest, write_own
from metrale_orch.ownership import read_own
from metrale_orch.paths import STATE_DIR, TREE_TASK
from metrale_orch.steps.hip_mirror import scan_hip_compat
from metrale_orch.tasks import taskcache
from metrale_orch.tasks.checker import SignatureCheck
from metrale_orch.tasks.dicts import (
    BuildSpec,
    SpecKind,
    TaskDict,
    build_task,
    explicit_targets,
    plan_error_task,
    plan_skip_task,
)
from metrale_orch.tasks.doit_api import doit_version
from metrale_orch.toolchain import earlyruns
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains
from metrale_orch.toolchain.probe import ProbeMemo
from metrale_orch.toolchain.stamps import Stamp, stamped_per_arch, toolchain_stamps

if TYPE_CHECKING:
    from metrale_orch.tree import Target

__all__ = [
    "Generation",
    "cached_tasks",
    "generation_base",
    "generation_key",
    "named_failures",
    "scoped_base",
    "stamp_wanted",
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
    #: ``(root, environ, specs) -> smoke task dicts``.
    smoke_task_dicts: Callable[[Path, Mapping[str, str], Sequence[BuildSpec]], list[TaskDict]]
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
) -> tuple[list[BuildSpec], list[TaskDict] | None, str]:
    """The specs, the ``smoke`` task dicts when known (None: ask the generation's
    ``smoke_task_dicts``), and how the specs were obtained. ``generation`` is called
    only on a miss; ``probes`` is the run's (its build reuses what was probed here).

    ``scope``: a run that selects these ``build`` sub-tasks and no other task
    (:func:`~metrale_orch.tasks.dicts.build_scope`) gets the specs of the targets in it
    alone, and no smoke task: only the toolchains those targets select are probed, and
    its entry is cached under a base of its own (:func:`scoped_base`). A spec is the
    same whatever else is generated beside it."""
    if probes is None:
        probes = ProbeMemo()
    try:
        config = load_config(root, environ)
        toolchains = load_toolchains(root)
    except MetraleError:
        specs = generation().generate_specs(root, environ, argv, probes=probes)[0]
        return specs, None, "not cached: configuration error"
    state_dir = config.build_dir / STATE_DIR
    base = scoped_base(generation_base(root, environ, config, toolchains), scope)
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
    # entry is only ever keyed by these observations (see _stored_key).
    stamps = _stamps(config, environ, toolchains, probes, used, arches)
    _keep_plan(state_dir, environ, scope)
    key = _key_of(base, stamps)
    if found is None or key != last:
        found = taskcache.lookup(taskcache.cache_path(state_dir, key, scoped=scoped), key)
    if found.specs is not None:
        if key != last:  # the hint named another entry (or none): name this one next time
            per_arch = {n: a for n, a in arches.items() if n in stamps}
            taskcache.write_uses(state_dir, base, sorted(stamps), key, per_arch, scoped=scoped)
        explicit = explicit_targets(argv)
        specs = [_from_cached(root, c, explicit) for c in found.specs]
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
            smoke = made.smoke_task_dicts(root, environ, specs)
        chosen = made.used_toolchains(specs, toolchains)
        _store(state_dir, base, stamps, early.scanned, specs, smoke, chosen, toolchains, scoped)
    return specs, smoke, found.reason


def _keep_plan(state_dir: Path, environ: Mapping[str, str], scope: Sequence[str] | None) -> None:
    """Leave the dry runs the stamps asked for as the next run's plan of this kind (the
    whole tree's, or this scope's: :mod:`~metrale_orch.toolchain.earlyruns`)."""
    if not earlyruns.asked():
        return
    plan = earlyruns.plan_bytes(environ)
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
    (and the arches they build for, of those probed per arch; see :func:`_stored_key`),
    and the hints the next run reads first."""
    recorded = record_task_dicts(smoke)
    selected = sorted(chosen)
    per_arch = _of_per_arch(chosen, toolchains)
    stored = _stored_key(base, stamps, selected, per_arch)
    if stored is not None:
        taskcache.store(
            taskcache.cache_path(state_dir, stored, scoped=scoped),
            stored,
            scanned,
            [_to_cached(s) for s in specs],
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


def start_order(
    root: Path, environ: Mapping[str, str], specs: Sequence[BuildSpec]
) -> list[BuildSpec]:
    """``specs`` in the order doit should start them: the targets with the most compile
    seconds last time first, never-built ones before them (largest first), so a parallel
    build does not end on one long target (:mod:`metrale_orch.steps.times`). doit runs a
    group's sub-tasks in the order they were yielded."""
    from metrale_orch.steps.times import longest_first, read_target_seconds

    try:
        state_dir = load_config(root, environ).build_dir / STATE_DIR
    except MetraleError:
        return list(specs)
    seconds = read_target_seconds(state_dir)
    by_name = {s.target: s for s in specs}
    if len(by_name) != len(specs):  # not one spec per target: leave the order alone
        return list(specs)
    sizes = {
        s.target: len(dep) if isinstance(dep := s.task.get("file_dep"), list) else 0 for s in specs
    }
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


def generation_base(
    root: Path, environ: Mapping[str, str], config: Config, toolchains: Mapping[str, Toolchain]
) -> str:
    """Digest of what task generation depends on besides the watched files and the
    toolchains' programs (no compiler runs): versions, root, configuration, every
    toolchain's definition, and the environment variables any of them reads."""
    names = {"PATH", "HOME", "XDG_CACHE_HOME"}
    names.update(k for k in environ if k.startswith("METRALE_"))
    for tc in toolchains.values():
        names.update(tc.home_env)
        names.update(tc.env_allowlist)
        if tc.env_prefixes:
            names.update(k for k in environ if k.startswith(tc.env_prefixes))
        if tc.host_compiler_env:
            names.add(tc.host_compiler_env)
    doc = {
        "schema": taskcache.SCHEMA,
        "python": [sys.version, sys.executable],
        "doit": doit_version(),
        "package": metrale_orch.__version__,
        "root": os.fspath(root),
        "build_dir": os.fspath(config.build_dir),
        "config": _generation_config(config),
        "env": {name: environ.get(name) for name in sorted(names)},
        "toolchains": {name: tc.to_dict() for name, tc in sorted(toolchains.items())},
        # The HIP targets' file deps and identity list its files: a new one regenerates.
        "hip_compat": scan_hip_compat(root, config.hip_compat_dir).digest,
    }
    return _digest(doc)


def generation_key(
    root: Path,
    environ: Mapping[str, str],
    config: Config,
    toolchains: Mapping[str, Toolchain],
    probes: ProbeMemo | None = None,
    used: Iterable[str] | None = None,
) -> str:
    """Digest of what task generation depends on besides the watched files (I/O: finds
    and probes toolchains): :func:`generation_base`, and the programs of the toolchains
    ``used`` (default: those the last generation under the same base selected, else
    all), with their names.

    Probed on every invocation (a wrapper can switch the real compiler without a change
    any stat would see); only the real binaries' hashes are remembered. A toolchain no
    target selects changes no task, so it is not probed: hipcc on a tree of NVIDIA
    targets costs a no-op nothing (:func:`~metrale_orch.tasks.taskcache.read_uses`).
    """
    base = generation_base(root, environ, config, toolchains)
    state_dir = config.build_dir / STATE_DIR
    if used is None:
        used = taskcache.read_uses(state_dir, base)
    arches = taskcache.read_arches(state_dir, base)
    return _key_of(base, _stamps(config, environ, toolchains, probes, used, arches))


def _stamps(
    config: Config,
    environ: Mapping[str, str],
    toolchains: Mapping[str, Toolchain],
    probes: ProbeMemo | None,
    used: Iterable[str] | None,
    arches: Mapping[str, Iterable[str]],
) -> dict[str, Stamp]:
    """The stamps of the toolchains ``used`` (None: all of them), those probed per arch
    also for their ``arches``, probed now."""
    state_dir = config.build_dir / STATE_DIR
    probed = _selected(toolchains, used)
    return toolchain_stamps(probed, environ, state_dir=state_dir, memo=probes, arches=arches)


def scoped_base(base: str, scope: Sequence[str] | None) -> str:
    """``base`` (:func:`generation_base`) of a run scoped to ``scope`` (the whole tree:
    ``base`` itself): a scoped entry is another entry, with hints of its own."""
    return base if scope is None else _digest({"base": base, "scope": sorted(set(scope))})


def _key_of(base: str, stamps: Mapping[str, Stamp]) -> str:
    """The key of ``base`` with these toolchains' stamps."""
    return _digest({"base": base, "used": sorted(stamps), "programs": dict(stamps)})


def _stored_key(
    base: str,
    stamps: Mapping[str, Stamp],
    selected: Sequence[str],
    per_arch: Mapping[str, Sequence[str]],
) -> str | None:
    """The key an entry generated after ``stamps`` were taken is stored under: that of
    the toolchains its targets ``selected``, from those same stamps; None (not stored)
    when a selected toolchain was not stamped before generation, or one probed per arch
    and found was not stamped for exactly the arches its targets build for (``per_arch``).

    Stamping it afterwards would pair what generation saw with a later look at the
    toolchain: a compiler installed, or put earlier on ``PATH``, while the targets were
    planned would give the entry the key of the new compiler and specs made for the
    old one (a skip, or another identity in every plan), and the next run would hit
    it. Not storing costs one more generation: the next run's hint names the toolchain
    (and the arches) and stamps it first."""
    if not set(selected) <= set(stamps):
        return None
    for name, arches in per_arch.items():
        stamp = stamps[name]
        if stamp[0] == "found" and _stamped_arches(stamp) != sorted(set(arches)):
            return None
    return _key_of(base, {name: stamps[name] for name in selected})


def _stamped_arches(stamp: Stamp) -> list[str]:
    """The arches a found toolchain's stamp holds per-arch rows of (sorted): its fourth
    item, or the third of one under ``{root}`` (:data:`~metrale_orch.toolchain.stamps.Stamp`)."""
    if len(stamp) > 3:
        per_arch = stamp[3]
    elif len(stamp) == 3 and isinstance(stamp[2], list):
        per_arch = stamp[2]
    else:
        per_arch = []
    return sorted(str(row[0]) for row in per_arch if isinstance(row, list) and row)


def _selected(
    toolchains: Mapping[str, Toolchain], used: Iterable[str] | None
) -> dict[str, Toolchain]:
    """The toolchains named in ``used`` that are defined (all when ``used`` is None)."""
    if used is None:
        return dict(toolchains)
    return {n: toolchains[n] for n in sorted(set(used) & set(toolchains))}


def _digest(doc: object) -> str:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogateescape"))


def stamp_wanted(
    root: Path,
    environ: Mapping[str, str],
    config: Config,
    probes: ProbeMemo,
    scope: Sequence[str] | None = None,
) -> dict[str, Stamp]:
    """The stamps the task cache's key of a run at ``root`` (scoped to ``scope``, see
    :func:`cached_tasks`) will ask ``probes`` for: those of the toolchains the last
    generation's targets selected, with the arches they built for (I/O; the early start
    of :mod:`metrale_orch.tasks.probes`). When that is not known: every toolchain for
    the whole tree, none for a scope (its generation finds which its targets select
    before it probes any). Raises MetraleError (toolchain definitions)."""
    toolchains = load_toolchains(root)
    base = scoped_base(generation_base(root, environ, config, toolchains), scope)
    state_dir = config.build_dir / STATE_DIR
    used = taskcache.read_uses(state_dir, base)
    if used is None and scope is not None:
        return {}
    wanted = _selected(toolchains, used)
    arches = taskcache.read_arches(state_dir, base)
    return toolchain_stamps(wanted, environ, state_dir=state_dir, memo=probes, arches=arches)


def _generation_config(config: Config) -> dict[str, object]:
    """The configuration as the generated tasks depend on it: everything but where and how
    many compiles run (``jobs``, the remote executor: :data:`EXECUTION_KEYS`), which
    changes no task."""
    doc = {k: v for k, v in config.to_dict().items() if k not in EXECUTION_KEYS}
    sources = doc.get("sources")
    if isinstance(sources, dict):
        doc["sources"] = {k: v for k, v in sources.items() if k not in EXECUTION_KEYS}
    return doc


def _to_cached(spec: BuildSpec) -> taskcache.CachedSpec:
    if spec.kind != "build":
        return taskcache.CachedSpec(target=spec.target, kind=spec.kind, message=spec.message)
    uptodate, file_dep, targets = (spec.task[k] for k in ("uptodate", "file_dep", "targets"))
    assert isinstance(uptodate, list) and isinstance(file_dep, list) and isinstance(targets, list)
    (check,) = uptodate
    assert isinstance(check, SignatureCheck)
    return taskcache.CachedSpec(
        target=spec.target,
        kind="build",
        file_dep=tuple(file_dep),
        parts=dict(check.parts),
        manifest=targets[0],
    )


def _from_cached(root: Path, cached: taskcache.CachedSpec, explicit: frozenset[str]) -> BuildSpec:
    name = cached.target
    kind: SpecKind
    if cached.kind == "build":
        kind = "build"
        task = build_task(
            root=root,
            target=name,
            file_dep=list(cached.file_dep),
            parts=cached.parts,
            manifest=cached.manifest,
        )
    elif cached.kind == "skip":
        kind = "skip"
        task = plan_skip_task(
            root=root, target=name, reason=cached.message, explicit=name in explicit
        )
    else:
        kind = "error"
        task = plan_error_task(root=root, target=name, message=cached.message)
    return BuildSpec(target=name, kind=kind, message=cached.message, task=task)


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
        task = plan_error_task(root=root, target=name, message=message, clean=canonical)
        out.append(BuildSpec(target=name, kind="error", message=message, task=task))
    return out


def _not_a_target(target: Target, have: Iterable[str]) -> str:
    prefix = f"{target.hardware}/{target.model}/"
    siblings = sorted(t for t in have if t.startswith(prefix))
    known = f"its targets: {', '.join(siblings)}" if siblings else "it has no targets"
    return (
        f"{target} is not a target of this tree: model {target.hardware}/{target.model} has "
        f"no quant directory {target.quant!r} ({known}); `doit list` shows every target"
    )
