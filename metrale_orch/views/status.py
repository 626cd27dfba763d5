"""What ``metrale-orch status``, ``why`` and ``rdeps`` compute: the build's state, read
without building.

Each generates the same tasks ``doit`` would (``status`` and ``why`` through the
task cache, ``rdeps`` resolving afresh for the plans) and reads doit's dependency
database (``<root>/.doit.db``) through doit's own ``Dependency`` with the same
content checker (:mod:`metrale_orch.tasks.doit_api`), so the answer is the one
``doit build`` would act on. Nothing here writes the database or prints: the CLI
formats the values returned.

A target marked with ``doit ignore`` is ``ignored``, whatever its inputs: doit
skips it before any up-to-date check, and its sqlite backend stores the mark in
place of the task's record, so there is no saved state to compare with (reading
it anyway would call every input and signature part changed). ``doit forget``
drops the mark with the record: the target is then ``stale`` (no record) and
the next build runs it, from the cache when nothing changed.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.config import Config
from metrale_orch.errors import MetraleError, UsageError
from metrale_orch.paths import BUILD_TASK, DB_NAME, TREE_TASK, rel_posix
from metrale_orch.steps.includes import Includes, module_closure, parse_includes
from metrale_orch.steps.plan import plan_target
from metrale_orch.steps.plan_values import TargetPlan
from metrale_orch.steps.staging import plan_stage
from metrale_orch.tasks import specs as generation
from metrale_orch.tasks.check import UNPROBED
from metrale_orch.tasks.checker import SIGNATURE_KEY, ContentChecker, SignatureCheck, TaskDataCodec
from metrale_orch.tasks.creators import named_failures
from metrale_orch.tasks.dicts import BuildSpec
from metrale_orch.tasks.doit_api import (
    Dependency,
    Task,
    has_record,
    is_ignored,
    make_task,
    open_dependency,
)
from metrale_orch.toolchain.definitions import load_toolchains
from metrale_orch.tree import Layout

__all__ = [
    "IGNORED_DETAIL",
    "BrokenTree",
    "NoSuchTarget",
    "Reach",
    "Status",
    "TargetStatus",
    "rdeps",
    "statuses",
    "strip_base",
    "target_statuses",
]

#: A target's state as ``doit build`` would see it.
Status = Literal["up to date", "stale", "error", "skipped", "ignored"]

#: The detail of an ignored target: what marked it, and how to undo the mark.
IGNORED_DETAIL = "`doit ignore`d: `doit build` skips it until `doit forget {task}`"


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetStatus:
    """One target's state as ``doit build`` would see it."""

    target: str
    status: Status
    #: Why (the error, the skip reason, or the first reasons it is stale).
    detail: str = ""
    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    signature: tuple[str, ...] = ()
    missing_outputs: tuple[str, ...] = ()
    #: Installed files missing or altered since the build that installed them.
    changed_outputs: tuple[str, ...] = ()
    never_built: bool = False

    def reasons(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Why it is stale: ``(field, items)`` for each list field, in report order."""
        return (
            ("changed", self.changed),
            ("added", self.added),
            ("removed", self.removed),
            ("signature", self.signature),
            ("missing_outputs", self.missing_outputs),
            ("changed_outputs", self.changed_outputs),
        )

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"target": self.target, "status": self.status}
        if self.detail:
            out["detail"] = self.detail
        for key, value in self.reasons():
            if value:
                out[key] = list(value)
        if self.never_built:
            out["never_built"] = True
        return out


class NoSuchTarget(UsageError):
    """A target name or pattern that matches no target of the tree."""

    def __init__(self, pattern: str, known: list[str]) -> None:
        self.pattern = pattern
        close = [t for t in known if t.split("/")[0] == pattern.split("/")[0]][:5]
        hint = f" (targets of that hardware: {', '.join(close)})" if close else ""
        super().__init__(
            f"no target matches {pattern!r}{hint}; `metrale-orch status` lists every target"
        )


class BrokenTree(MetraleError):
    """The configuration or the walk of the tree fails: no target is known."""

    def __init__(self, command: str, message: str) -> None:
        self.message = message
        super().__init__(f"{command}: no target is known, the tree does not load: {message}")


def strip_base(pattern: str) -> str:
    """``pattern`` without the ``build:`` of a doit task name (pure)."""
    return pattern.removeprefix(BUILD_TASK + ":")


@contextmanager
def _dependency(root: Path) -> Iterator[Dependency | None]:
    """doit's Dependency over the project's database, or None when it has none. Never writes."""
    db = root / DB_NAME
    if not db.exists():
        yield None
        return
    with open_dependency(db, checker_cls=ContentChecker, codec_cls=TaskDataCodec) as dep:
        yield dep


@contextmanager
def _in_root(root: Path) -> Iterator[None]:
    """doit's file dependencies are relative to the root; check them from there."""
    old = os.getcwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(old)


def statuses(
    root: Path,
    environ: Mapping[str, str],
    pattern: str | None,
    *,
    detailed: bool,
    config: Config | None = None,
) -> tuple[list[TargetStatus], list[BuildSpec]]:
    """The status of each target matching ``pattern`` (all when None), and their specs
    (reads the tree, the task cache and doit's database), under ``config`` (None: the
    configuration ``environ`` gives, as a doit run's). Raises :class:`NoSuchTarget`."""
    root = root.resolve()
    # The same task dicts `doit` would use, through its task cache (fast on a large tree).
    specs, _how = generation.cached_build_specs(root, environ, config=config)
    if pattern is not None:
        pat = strip_base(pattern)
        chosen = [s for s in specs if fnmatch.fnmatchcase(s.target, pat)]
        if not chosen and "*" not in pat and any(s.target == TREE_TASK for s in specs):
            # The tree does not load: a named target fails with the reason, as in doit.
            chosen = named_failures(root, specs, [pat])
        if not chosen:
            raise NoSuchTarget(pattern, [s.target for s in specs])
    else:
        chosen = specs
    out: list[TargetStatus] = []
    with _in_root(root), _dependency(root) as dep:
        tasks = {
            s.target: make_task({**s.task, "name": f"{BUILD_TASK}:{s.target}"}) for s in chosen
        }
        for spec in chosen:
            task = tasks[spec.target]
            if dep is not None and is_ignored(dep, task):
                out.append(_ignored_status(spec, task))
            elif spec.kind == "error":
                out.append(TargetStatus(target=spec.target, status="error", detail=spec.message))
            elif spec.kind == "skip":
                out.append(TargetStatus(target=spec.target, status="skipped", detail=spec.message))
            else:
                out.append(_build_status(spec, task, dep, detailed))
    return out, chosen


def _ignored_status(spec: BuildSpec, task: Task) -> TargetStatus:
    """An ignored target: what doit does with it, and what it would be without the mark
    when the tree alone says so (a skip or an error; a build's state is unknown)."""
    detail = IGNORED_DETAIL.format(task=task.name)
    if spec.kind == "error":
        detail += f"; without the mark it fails: {spec.message}"
    elif spec.kind == "skip":
        detail += f"; without the mark it is skipped: {spec.message}"
    return TargetStatus(target=spec.target, status="ignored", detail=detail)


def _sorted_reason(reasons: Mapping[str, object], key: str) -> tuple[str, ...]:
    paths = reasons.get(key, ()) or ()
    return tuple(sorted(str(p) for p in paths)) if isinstance(paths, list | tuple) else ()


def _build_status(
    spec: BuildSpec, task: Task, dep: Dependency | None, detailed: bool
) -> TargetStatus:
    if dep is None or not has_record(dep, task.name):
        return TargetStatus(
            target=spec.target, status="stale", detail="never built", never_built=True
        )
    result = dep.get_status(task, {task.name: task}, get_log=detailed)
    if result.status == "up-to-date":
        return TargetStatus(target=spec.target, status="up to date")
    if not detailed:
        if result.status == "error":
            return TargetStatus(
                target=spec.target, status="error", detail=result.get_error_message() or ""
            )
        return TargetStatus(target=spec.target, status="stale")
    reasons: Mapping[str, object] = result.reasons
    saved = dep.get_values(task.name).get(SIGNATURE_KEY) or {}
    current: dict[str, str] = {}
    bad_outputs: tuple[str, ...] = ()
    changed_external: tuple[str, ...] = ()
    for utd in task.uptodate:
        check = utd[0] if isinstance(utd, tuple) else utd
        if isinstance(check, SignatureCheck):
            current = check.parts
            bad_outputs = check.stale_outputs
            changed_external = check.stale_external
    parts = sorted(k for k in {*saved, *current} if saved.get(k) != current.get(k))
    changed = _sorted_reason(reasons, "changed_file_dep")
    added = _sorted_reason(reasons, "added_file_dep")
    removed = _sorted_reason(reasons, "removed_file_dep")
    missing_in = _sorted_reason(reasons, "missing_file_dep")
    missing_out = _sorted_reason(reasons, "missing_target")
    # A newly added input is also reported as "changed" (no saved state): say it once.
    changed = tuple(p for p in changed if p not in added) + changed_external
    bits = []
    if missing_in:
        bits.append("missing inputs: " + ", ".join(missing_in))
    if changed:
        bits.append(f"{len(changed)} changed input(s)")
    if added:
        bits.append(f"{len(added)} new input(s)")
    if removed:
        bits.append(f"{len(removed)} removed input(s)")
    if parts:
        bits.append("signature: " + ", ".join(parts))
    if missing_out:
        bits.append("missing output")
    if bad_outputs:
        bits.append("output missing or altered: " + ", ".join(bad_outputs))
    status: Status = "error" if result.status == "error" else "stale"
    return TargetStatus(
        target=spec.target,
        status=status,
        detail="; ".join(bits),
        changed=changed + missing_in,
        added=added,
        removed=removed,
        signature=tuple(parts),
        missing_outputs=missing_out,
        changed_outputs=bad_outputs,
    )


def target_statuses(
    root: Path,
    environ: Mapping[str, str],
    pattern: str | None = None,
    config: Config | None = None,
) -> list[TargetStatus]:
    """Each target's status (with reasons), as ``doit build`` would see it."""
    return statuses(root, environ, pattern, detailed=True, config=config)[0]


# ------------------------------------------------------------------------------ rdeps


@dataclass(frozen=True, slots=True, kw_only=True)
class Reach:
    """A target a file reaches, and the modules whose compile can read it."""

    target: str
    modules: tuple[str, ...] = ()
    #: The skip reason of a target whose compiler is not installed, else None.
    skipped: str | None = None
    #: The failure of a target that does not resolve or plan, else None.
    failing: str | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"target": self.target, "modules": list(self.modules)}
        if self.skipped is not None:
            out["skipped"] = self.skipped
        if self.failing is not None:
            out["failing"] = self.failing
        return out


def _modules_reaching(plan: TargetPlan, layout: Layout, rel: str, root: Path) -> list[str]:
    """Names of the modules whose compile can read ``rel``: its own source, or a file in
    its include closure over the target's staged layout: the build's own
    :func:`~metrale_orch.steps.includes.module_closure`, seen from the plan (the closure the
    cache keys on, without the flags only the build adds)."""
    staged = {srel: rel_posix(src, root) for srel, src in plan_stage(layout).items()}
    includes: dict[str, Includes] = {}
    for srel, src_rel in staged.items():
        try:
            includes[srel] = parse_includes((root / src_rel).read_bytes())
        except OSError:
            includes[srel] = Includes()
    names = []
    for module in plan.modules:
        closure = module_closure(module, staged=staged, includes_of=includes, before=plan.flags)
        if rel_posix(module.source, root) == rel or any(staged[c] == rel for c in closure.files):
            names.append(module.name)
    return sorted(names)


def _skipped_plan(root: Path, spec: BuildSpec, environ: Mapping[str, str]) -> TargetPlan | None:
    """The plan of a target skipped for a missing compiler (no identity: never keyed), or
    None when it cannot be planned."""
    if not isinstance(spec.resolved, Layout):
        return None
    try:
        toolchains = load_toolchains(root)
        return plan_target(root, spec.resolved, toolchains, identity=UNPROBED, environ=environ)
    except MetraleError:
        return None


def rdeps(
    root: Path, environ: Mapping[str, str], rel: str, config: Config | None = None
) -> list[Reach]:
    """The targets whose inputs include the root-relative file ``rel``, failing and
    skipped ones marked (reads the tree, probes compilers), under ``config`` (None: the
    one ``environ`` gives). Raises :class:`BrokenTree` when the tree does not load."""
    specs = generation.resolve_build_specs(root, environ, config=config)
    if [s.target for s in specs] == [TREE_TASK]:
        raise BrokenTree("rdeps", specs[0].message)
    hits: list[Reach] = []
    for spec in specs:
        if spec.target == TREE_TASK or rel not in generation.spec_inputs(root, spec):
            continue
        if spec.kind == "build":
            assert spec.plan is not None and spec.layout is not None  # a generated build
            modules = _modules_reaching(spec.plan, spec.layout, rel, root)
            hits.append(Reach(target=spec.target, modules=tuple(modules)))
        elif spec.kind == "skip":
            plan = _skipped_plan(root, spec, environ)
            modules = []
            if plan is not None and isinstance(spec.resolved, Layout):
                modules = _modules_reaching(plan, spec.resolved, rel, root)
            hits.append(Reach(target=spec.target, modules=tuple(modules), skipped=spec.message))
        else:
            hits.append(Reach(target=spec.target, failing=spec.message))
    return hits
