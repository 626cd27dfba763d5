"""What a project's one-line ``dodo.py`` star-imports: doit's config and task creators.

    from metrale_orch.dodo import *  # noqa: F403

Tasks (generated on every doit invocation from the tree, see
:func:`resolve_build_specs`):

- ``build:<hw>/<model>/<quant>`` per walked target (the group ``build`` is the
  default task): ``doit``, ``doit build``, ``doit 'build:hopper/*'``,
  ``doit -n 2 -P process build``, ``doit list --all --status``,
  ``doit clean``, ``doit forget`` behave as doit users expect.
- ``check``: will the build accept this tree? (``metrale-orch check``).
- ``smoke:<hw>``: after that hardware's builds (provided by
  :mod:`metrale_orch.smoke`; yielded by ``task_build`` so the tree resolves once).

The root is doit's working directory while tasks load: the directory of the
dodo file, or the one given with ``doit -d``. Configuration comes from
:func:`metrale_orch.config.load_config` (``pyproject.toml`` and
``METRALE_ORCH_*``).

Missing toolchains: a target whose compiler is not installed becomes a task
that *succeeds* reporting ``skipped`` (one summary line per reason) when it was
selected broadly — the group ``build``, a wildcard such as ``build:metal/*``,
the default tasks, or a dependency of ``smoke:<hw>`` — and *fails* with what to
install when its full name was given on the command line (``doit
build:metal/m/q``). doit expands wildcards before any task sees the selection,
so the task loader reads the command line (``sys.argv``) to tell the two
apart; callers driving doit through its API get the broad behaviour.

Every view shows why: an error or skip sub-task's doc carries its reason (``doit
list --status`` prints it on the target's line), and a target named on the
command line that is not generated — the configuration or the walk of the tree
failed, or the name is no target — becomes a failing sub-task with the reason
(:func:`named_failures`) instead of doit's ``Invalid parameter``.

No-op speed: generating the tasks (resolving every target, planning it) costs
several times doit's own up-to-date checks, so ``task_build`` goes through a
task cache (:func:`cached_build_specs`, ``metrale_orch.tasks.taskcache``,
``<build_dir>/.state/build-tasks.*.cache``): while the tree's shape, its TOML
files, the configuration, the toolchains, the relevant environment and this
package are unchanged, the task dicts come from the cache, equal to what
generation would give. Deleting the files only costs one regeneration.
``task_build`` also keeps the cyclic garbage collector out of generation and
freezes what it loaded (``gc.freeze``) so doit's later collections skip it.

Nothing here runs at import time: the config below only names classes.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrale_orch.tasks.actions import install_sigterm_handler
from metrale_orch.tasks.checker import ContentChecker, TaskDataCodec
from metrale_orch.tasks.dicts import (
    BUILD,
    build_task,
    explicit_targets,
    plan_build_task,
    plan_error_task,
    plan_skip_task,
    rel_posix,
)
from metrale_orch.tasks.reporter import BuildReporter, end_interrupted

__all__ = ["DOIT_CONFIG", "task_build", "task_check"]  # what `import *` takes

#: Name of the sub-task carrying a failure of the whole tree (config or walk error).
TREE_TASK = "(tree)"

DOIT_CONFIG: dict[str, Any] = {
    "default_tasks": [BUILD],
    "backend": "sqlite3",
    "dep_file": ".doit.db",
    "check_file_uptodate": ContentChecker,
    "codec_cls": TaskDataCodec,
    "reporter": BuildReporter,
    "verbosity": 0,
    # A failing target (tree or compile error) must not stop the others.
    "continue": True,
    "minversion": "0.37.0",
    # `doit list` shows every target (sub-task), so `doit list --status` answers
    # "which targets are up to date" without `--all`.
    "subtasks": True,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildSpec:
    """One ``build`` sub-task with what it came from (for ``metrale-orch status/why/rdeps``)."""

    target: str
    #: "build", "skip" (toolchain missing) or "error" (tree, config or plan error).
    kind: str
    #: The skip reason or error message; "" for a build.
    message: str = ""
    #: The compile plan (``metrale_orch.build.compile.TargetPlan``) of a build, else None.
    plan: Any = None
    #: The resolved layout of a build, else None.
    layout: Any = None
    #: The doit task dict.
    task: Mapping[str, Any]
    #: What resolution gave: the Layout, the LayoutError, or None (tree-wide failure).
    resolved: Any = None


def resolve_build_specs(
    root: Path, environ: Mapping[str, str], argv: Sequence[str] = ()
) -> list[BuildSpec]:
    """Every ``build`` sub-task of the tree at ``root`` (reads the tree, probes compilers).

    Never raises for a tree, config or toolchain problem: those become failing
    (or, for a missing toolchain, skipping) sub-tasks. Always generates (with
    plans and layouts); :func:`cached_build_specs` is the no-op fast path. A target
    named in ``argv`` that the tree does not generate gets a failing sub-task saying
    why (:func:`named_failures`).
    """
    specs = _generate(root, environ, argv)[0]
    return specs + named_failures(root, specs, explicit_targets(argv))


def _generate(
    root: Path,
    environ: Mapping[str, str],
    argv: Sequence[str],
    *,
    config: Any = None,
    toolchains: Any = None,
) -> tuple[list[BuildSpec], bool]:
    """The specs, and whether they may be cached (no tree-wide error, no failed probe)."""
    from metrale_orch.build.errors import ToolchainMissing
    from metrale_orch.build.hip_mirror import scan_hip_compat
    from metrale_orch.build.plan import PlanMemo, plan_target
    from metrale_orch.build.probe import find_toolchain
    from metrale_orch.build.toolchains import load_toolchains, select_toolchain
    from metrale_orch.config import load_config
    from metrale_orch.errors import MetraleError, is_printable, printable
    from metrale_orch.tree import (
        LayoutError,
        TreeSnapshot,
        layer_manifest_problem,
        misshapen_manifests,
        resolve_all,
        unnamable_message,
    )

    def error(name: str, message: str, resolved: Any = None) -> BuildSpec:
        message = printable(message)  # it may name a file whose name is not UTF-8
        task = plan_error_task(root=root, target=name, message=message)
        return BuildSpec(target=name, kind="error", message=message, task=task, resolved=resolved)

    try:
        if config is None:
            config = load_config(root, environ)
        if toolchains is None:
            toolchains = load_toolchains(root)
        snapshot = TreeSnapshot(root)
        resolved = resolve_all(root, snapshot)
    except MetraleError as exc:
        # A HARDWARE.toml that is a directory reads as missing: name it, not the symptom.
        shapes = misshapen_manifests(root) if isinstance(exc, LayoutError) else []
        return [error(TREE_TASK, str(shapes[0] if shapes else exc))], False

    explicit = explicit_targets(argv)
    memo = PlanMemo(root)
    found: dict[tuple[str, str], Any] = {}
    hip_compat = None  # the project's HIP compat directory, read for the first HIP target
    cacheable = True
    specs: list[BuildSpec] = []
    # A manifest that is a directory: resolution passes over it; the build refuses it.
    misshapen = misshapen_manifests(root, snapshot)
    whole = [str(e) for e in misshapen if e.path.name != "KERNEL.toml"]
    if whole:
        more = f" (and {len(whole) - 1} more)" if len(whole) > 1 else ""
        specs.append(error(TREE_TASK, whole[0] + more))
    for target, layout in resolved:
        name = str(target)
        if not isinstance(layout, LayoutError):
            layout = layer_manifest_problem(layout, misshapen) or layout
        if isinstance(layout, LayoutError):
            specs.append(error(name, str(layout), layout))
            continue
        try:
            toolchain = select_toolchain(layout.hardware, toolchains)
            # The arch picks the compiler of some toolchains (SCALE's per-arch nvcc).
            tool_key = (toolchain.name, layout.hardware.arch or "")
            if tool_key not in found:
                try:
                    found[tool_key] = find_toolchain(
                        toolchain, environ, state_dir=config.build_dir / ".state", arch=tool_key[1]
                    )
                except ToolchainMissing as missing:
                    found[tool_key] = missing
                except MetraleError as exc:
                    # A failed version probe may pass next time: never cached.
                    found[tool_key] = exc
                    cacheable = False
            tool = found[tool_key]
            if isinstance(tool, ToolchainMissing):
                reason = str(tool)
                task = plan_skip_task(
                    root=root, target=name, reason=reason, explicit=name in explicit
                )
                specs.append(
                    BuildSpec(target=name, kind="skip", message=reason, task=task, resolved=layout)
                )
                continue
            if isinstance(tool, MetraleError):
                raise tool
            if toolchain.dialect == "hip" and hip_compat is None:
                hip_compat = scan_hip_compat(root, config.hip_compat_dir)
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
        unnamable = next((p for p in plan.file_dep_rels if not is_printable(str(p))), None)
        if unnamable is not None:  # doit's database and the keys hold names as UTF-8
            specs.append(error(name, unnamable_message(str(unnamable)), layout))
            continue
        out_dir = config.build_dir / target.hardware / target.model / target.quant
        task = plan_build_task(
            root=root,
            target=name,
            file_deps=plan.file_dep_rels,
            signature=plan.signature,
            manifest=out_dir / "manifest.json",
        )
        specs.append(
            BuildSpec(
                target=name, kind="build", plan=plan, layout=layout, task=task, resolved=layout
            )
        )
    return specs, cacheable


def cached_build_specs(
    root: Path, environ: Mapping[str, str], argv: Sequence[str] = ()
) -> tuple[list[BuildSpec], str]:
    """:func:`resolve_build_specs` through the task cache (``metrale_orch.tasks.taskcache``).

    Returns the specs and how they were obtained: ``"hit"`` (the specs carry no
    ``plan``/``layout``/``resolved``), or the reason of a miss (generated, and
    cached when possible). The task dicts are the same either way.
    """
    specs, _smoke, how = _cached_tasks(root, environ, argv)
    return specs + named_failures(root, specs, explicit_targets(argv)), how


def _cached_tasks(
    root: Path, environ: Mapping[str, str], argv: Sequence[str]
) -> tuple[list[BuildSpec], list[dict[str, Any]] | None, str]:
    """The specs, the ``smoke`` task dicts when known (None: call
    :func:`smoke_task_dicts`), and how the specs were obtained."""
    import metrale_orch
    from metrale_orch.build.toolchains import load_toolchains
    from metrale_orch.config import load_config
    from metrale_orch.errors import MetraleError
    from metrale_orch.tasks import taskcache as _taskcache

    try:
        config = load_config(root, environ)
        toolchains = load_toolchains(root)
    except MetraleError:
        specs = _generate(root, environ, argv)[0]
        return specs, None, "not cached: configuration error"
    key = generation_key(root, environ, config, toolchains)
    path = _taskcache.cache_path(config.build_dir / ".state", key)
    found = _taskcache.lookup(path, key)
    if found.specs is not None:
        explicit = explicit_targets(argv)
        specs = [_from_cached(root, c, explicit) for c in found.specs]
        return specs, _replay(found.extra), found.reason
    package = Path(metrale_orch.__file__).parent
    scanned = _taskcache.scan(root / "kernels", _taskcache.package_files(package))
    specs, cacheable = _generate(root, environ, argv, config=config, toolchains=toolchains)
    smoke = None
    if scanned is not None and cacheable:
        smoke = smoke_task_dicts(root, environ, specs)
        recorded = _record(smoke)
        _taskcache.store(
            path,
            key,
            scanned,
            [_to_cached(s) for s in specs],
            None if recorded is None else [recorded],
        )
    return specs, smoke, found.reason


#: Marks a module-level function in a recorded task dict: (_FUNCTION, module, name).
_FUNCTION = "\0function"


def _record(value: Any) -> Any:
    """``value`` (task dicts) as data the task cache can store, or None when it holds
    anything but plain data and module-level functions (then it is not cached)."""
    import importlib
    import types

    class Unrecordable(Exception):
        pass

    def walk(v: Any) -> Any:
        if v is None or isinstance(v, str | int | float | bool):
            return v
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, tuple):
            return tuple(walk(x) for x in v)
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, types.FunctionType):
            name, where = str(v.__qualname__), str(v.__module__)
            if "." not in name and getattr(importlib.import_module(where), name, None) is v:
                return (_FUNCTION, where, name)
        raise Unrecordable

    try:
        return walk(value)
    except Unrecordable:
        return None


def _replay(extra: Any) -> list[dict[str, Any]] | None:
    """The task dicts :func:`_record` recorded (in ``[recorded]``), else None."""
    import importlib

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, tuple):
            if len(v) == 3 and v[0] == _FUNCTION:
                return getattr(importlib.import_module(v[1]), v[2])
            return tuple(walk(x) for x in v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    if not isinstance(extra, list) or len(extra) != 1 or not isinstance(extra[0], list):
        return None
    try:
        return list(walk(extra[0]))
    except (ImportError, AttributeError):
        return None


def generation_key(
    root: Path, environ: Mapping[str, str], config: Any, toolchains: Mapping[str, Any]
) -> str:
    """Digest of what task generation depends on besides the watched files (I/O: finds
    each toolchain's program): versions, root, configuration, toolchain definitions
    and programs, and the environment variables any of them reads."""
    import json

    import doit
    import xxhash

    import metrale_orch
    from metrale_orch.build.hip_mirror import scan_hip_compat
    from metrale_orch.build.probe import toolchain_stamp
    from metrale_orch.tasks import taskcache as _taskcache

    names = {"PATH", "HOME", "XDG_CACHE_HOME"}
    names.update(k for k in environ if k.startswith("METRALE_"))
    for tc in toolchains.values():
        names.update(tc.home_env)
        names.update(tc.env_allowlist)
        if tc.env_prefixes:
            names.update(k for k in environ if k.startswith(tc.env_prefixes))
        if tc.host_compiler_env:
            names.add(tc.host_compiler_env)
    # Probed on every invocation (a wrapper can switch the real compiler without a
    # change any stat would see); only the real binaries' hashes are remembered.
    state_dir = config.build_dir / ".state"
    doc = {
        "schema": _taskcache.SCHEMA,
        "python": [sys.version, sys.executable],
        "doit": str(doit.__version__),
        "package": metrale_orch.__version__,
        "root": os.fspath(root),
        "build_dir": os.fspath(config.build_dir),
        "config": config.to_dict(),
        "env": {name: environ.get(name) for name in sorted(names)},
        "toolchains": {name: tc.to_dict() for name, tc in sorted(toolchains.items())},
        "programs": {
            name: toolchain_stamp(tc, environ, state_dir=state_dir)
            for name, tc in sorted(toolchains.items())
        },
        # The HIP targets' file deps and identity list its files: a new one regenerates.
        "hip_compat": scan_hip_compat(root, config.hip_compat_dir).digest,
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogateescape"))


def _to_cached(spec: BuildSpec) -> Any:
    from metrale_orch.tasks.taskcache import CachedSpec

    if spec.kind != "build":
        return CachedSpec(target=spec.target, kind=spec.kind, message=spec.message)
    (check,) = spec.task["uptodate"]
    return CachedSpec(
        target=spec.target,
        kind="build",
        file_dep=tuple(spec.task["file_dep"]),
        parts=dict(check.parts),
        manifest=spec.task["targets"][0],
    )


def _from_cached(root: Path, cached: Any, explicit: frozenset[str]) -> BuildSpec:
    name = cached.target
    if cached.kind == "build":
        task = build_task(
            root=root,
            target=name,
            file_dep=list(cached.file_dep),
            parts=cached.parts,
            manifest=cached.manifest,
        )
    elif cached.kind == "skip":
        task = plan_skip_task(
            root=root, target=name, reason=cached.message, explicit=name in explicit
        )
    else:
        task = plan_error_task(root=root, target=name, message=cached.message)
    return BuildSpec(target=name, kind=cached.kind, message=cached.message, task=task)


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
    from metrale_orch.errors import printable
    from metrale_orch.tree import LayoutError, Target, TreeSnapshot, discover

    have = {spec.target for spec in specs}
    missing = sorted(set(names) - have - {TREE_TASK})
    if not missing:
        return []
    tree = next((s.message for s in specs if s.target == TREE_TASK), None)
    snap = TreeSnapshot(root)
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


def _not_a_target(target: Any, have: Iterable[str]) -> str:
    prefix = f"{target.hardware}/{target.model}/"
    siblings = sorted(t for t in have if t.startswith(prefix))
    known = f"its targets: {', '.join(siblings)}" if siblings else "it has no targets"
    return (
        f"{target} is not a target of this tree: model {target.hardware}/{target.model} has "
        f"no quant directory {target.quant!r} ({known}); `doit list` shows every target"
    )


def spec_inputs(root: Path, spec: BuildSpec) -> frozenset[str]:
    """The root-relative files ``spec``'s target reads, failing targets included (reads the
    tree for those): a build's file dependencies; for a target that is skipped or whose
    plan fails, what its resolved layout reaches (its inputs, the HARDWARE.toml and
    MODEL.toml files resolution read, the tree files its includes reach beyond the
    layout); for a target that does not resolve, the files its error names. Empty for a
    spec from the task cache that is not a build (it carries no resolution).
    """
    from metrale_orch.build.staging import beyond_layout
    from metrale_orch.errors import MetraleError
    from metrale_orch.tree import Layout, LayoutError

    if spec.kind == "build":
        deps = set(spec.task.get("file_dep", ()))
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


def load_build_tasks(
    root: Path, environ: Mapping[str, str], argv: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The ``build`` sub-task dicts of :func:`resolve_build_specs`."""
    return [dict(spec.task) for spec in resolve_build_specs(root, environ, argv)]


def smoke_task_dicts(
    root: Path, environ: Mapping[str, str], specs: Sequence[BuildSpec]
) -> list[dict[str, Any]]:
    """``smoke:<hw>`` task dicts from :mod:`metrale_orch.smoke`, sharing the build's resolution.

    HOOK(smoke): the smoke module owns these tasks (``smoke_tasks(root, config,
    layouts_by_hw)``); each depends on its hardware's ``build:<hw>/...`` tasks.
    They are yielded by :func:`task_build` with ``basename = "smoke"`` so the tree
    is resolved once per doit invocation. Nothing when the module is absent.
    """
    try:
        from metrale_orch.smoke import smoke_tasks
    except ImportError:
        return []
    from metrale_orch.config import load_config
    from metrale_orch.errors import MetraleError
    from metrale_orch.tree import Target

    try:
        config = load_config(root, environ)
    except MetraleError:
        return []
    by_hw: dict[str, list[tuple[Any, Any]]] = {}
    for spec in specs:
        if spec.target == TREE_TASK:
            continue
        try:
            target = Target.parse(spec.target)
        except ValueError:  # a name given on the command line that is no target
            continue
        by_hw.setdefault(target.hardware, []).append((target, spec.resolved))
    out: list[dict[str, Any]] = [
        {"basename": "smoke", "name": None, "doc": "smoke-test the built kernels of each hardware"}
    ]
    for task in smoke_tasks(root, config, by_hw):
        out.append({**task, "basename": "smoke"})
    return out if len(out) > 1 else []


def task_build() -> Iterator[dict[str, Any]]:
    """Build kernel targets: build:<hw>/<model>/<quant> (wildcards: 'build:hopper/*')."""
    install_sigterm_handler()
    root = Path.cwd()
    # Loading allocates much and frees little: no cyclic-GC passes until the tasks are
    # made (doit turns each yielded dict into a Task before asking for the next).
    enabled = gc.isenabled()
    gc.disable()
    try:
        argv = sys.argv[1:]
        specs, smoke, _how = _cached_tasks(root, os.environ, argv)
        yield {"name": None, "doc": "build every target (skipping those without a toolchain)"}
        for spec in specs:
            yield dict(spec.task)
        # A target named on the command line but not generated fails with the reason
        # (never doit's "Invalid parameter"); no smoke task depends on it.
        for spec in named_failures(root, specs, explicit_targets(argv)):
            yield dict(spec.task)
        # HOOK(smoke): smoke:<hw> tasks (see smoke_task_dicts), replayed from the task
        # cache on a hit (the same dicts: plain data and the same action functions).
        yield from smoke if smoke is not None else smoke_task_dicts(root, os.environ, specs)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM while the tasks load: one line
        end_interrupted(exc, 0, sys.stderr)
    finally:
        if enabled:
            gc.enable()
    # The tasks (and this package) live until doit exits: moving them out of the
    # collector's sight keeps each later full collection from walking them all
    # again (a no-op run otherwise spends ~15 % of its time there).
    gc.freeze()


def task_check() -> dict[str, Any]:
    """Will the build accept this tree? Every problem at once, by file (metrale-orch check)."""
    from metrale_orch.tasks.actions import check_action

    return {
        "actions": [(check_action, [str(Path.cwd())])],
        "uptodate": [False],
        "verbosity": 2,
    }
