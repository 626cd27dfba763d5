"""What ``metrale-orch status``, ``why`` and ``rdeps`` compute: the build's state, read
without building.

Each generates the same tasks ``doit`` would (``status`` and ``why`` through the
task cache, ``rdeps`` resolving afresh for the plans) and reads doit's dependency
database (``<root>/.doit.db``) through doit's own ``Dependency`` with the same
content checker (:mod:`metrale_orch.tasks.doit_api`), so the answer is the one
``doit build`` would act on. Nothing here writes the database or prints: the CLI
formats the values returned.

``why`` (:func:`why_status`) also names the values behind the signature parts that
changed: a build saves its plan's record (:func:`~metrale_orch.steps.keyrecord.plan_record`)
with its state; the target is planned afresh (the tree read, its compiler probed) and the
two records compared by :func:`~metrale_orch.steps.keyrecord.record_changes`, the
comparison ``why-miss`` makes of cache entries. A record kept through a failed build
(:mod:`metrale_orch.tasks.database`) is the last good build's: the target is
``last_failed``, and what changed is what changed since that build.

A target marked with ``doit ignore`` is ``ignored``, whatever its inputs: doit
skips it before any up-to-date check, and its sqlite backend stores the mark in
place of the task's record, so there is no saved state to compare with (reading
it anyway would call every input and signature part changed). ``doit forget``
drops the mark with the record: the target is then ``stale`` (no record) and
the next build runs it, from the cache when nothing changed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.config import Config, load_config
from metrale_orch.errors import MetraleError, UsageError
from metrale_orch.graph import generate as generation
from metrale_orch.graph.cached import named_failures
from metrale_orch.graph.check import UNPROBED
from metrale_orch.graph.specs import BuildSpec
from metrale_orch.paths import BUILD_TASK, DB_NAME, TREE_TASK, rel_posix
from metrale_orch.steps.includes import Includes, module_closure, parse_includes
from metrale_orch.steps.keyrecord import Change, plan_record, record_changes
from metrale_orch.steps.plan import plan_target
from metrale_orch.steps.plan_values import TargetPlan
from metrale_orch.steps.staging import plan_stage
from metrale_orch.tasks.checker import ContentChecker, SignatureCheck, TaskDataCodec
from metrale_orch.tasks.dicts import task_dict
from metrale_orch.tasks.doit_api import (
    Dependency,
    Task,
    has_record,
    is_ignored,
    last_run_failed,
    make_task,
    open_dependency,
)
from metrale_orch.tasks.specs import cached_build_specs
from metrale_orch.tasks.values import BuildRecord
from metrale_orch.toolchain.definitions import load_toolchains
from metrale_orch.tree import Layout

__all__ = [
    "IGNORED_DETAIL",
    "BrokenTree",
    "NoSuchTarget",
    "Reach",
    "Status",
    "TargetStatus",
    "choose_specs",
    "rdeps",
    "select_specs",
    "signature_changes",
    "signature_part",
    "statuses",
    "strip_base",
    "target_statuses",
    "why_status",
]

#: A target's state as ``doit build`` would see it.
Status = Literal["up to date", "stale", "error", "skipped", "ignored"]

#: The detail of an ignored target: what marked it, and how to undo the mark.
IGNORED_DETAIL = "`doit ignore`d: `doit build` skips it until `doit forget {task}`"


#: The signature part each kind of :class:`~metrale_orch.steps.keyrecord.Change` of a
#: plan's record is about.
_SIGNATURE_PART = {
    "define": "flags",
    "flag": "flags",
    "arch": "arch",
    "toolchain": "toolchain",
    "environment": "env",
    "module": "modules",
}
#: Signature parts every module's command line is made of: when one changed, so did the
#: ``modules`` part, with no module added or removed.
_IN_EACH_ARGV = frozenset({"flags", "arch", "toolchain", "env"})


def signature_part(change: Change) -> str:
    """The signature part a difference of two plan records is about (pure): ``flags`` for a
    define or a flag."""
    return _SIGNATURE_PART.get(change.part, change.part)


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
    #: The last build failed; the record (and the installed files) are the last good one's.
    last_failed: bool = False
    #: The values behind the changed ``signature`` parts (:func:`why_status` only).
    signature_changes: tuple[Change, ...] = ()

    def unexplained(self) -> tuple[str, ...]:
        """The changed signature parts no :attr:`signature_changes` names a value of (the
        ``modules`` part when a part of every module's command line explains it)."""
        named = {signature_part(c) for c in self.signature_changes}
        return tuple(
            p
            for p in self.signature
            if p not in named and not (p == "modules" and named & _IN_EACH_ARGV)
        )

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
        if self.last_failed:
            out["last_failed"] = True
        if self.signature_changes:
            out["signature_changes"] = [
                {"part": signature_part(c), "text": c.text} for c in self.signature_changes
            ]
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


def select_specs(
    root: Path, environ: Mapping[str, str], pattern: str | None, config: Config | None = None
) -> list[BuildSpec]:
    """The build specs of the targets matching ``pattern`` (all when None), as ``doit``
    generates them under ``config`` (None: the one ``environ`` gives), through its task
    cache (reads the tree; probes compilers when the task cache misses): the lookup
    ``status``, ``why`` and ``why-miss`` share. Raises :class:`NoSuchTarget`."""
    specs, _how = cached_build_specs(root, environ, config=config)
    return choose_specs(root, specs, pattern)


def choose_specs(root: Path, specs: list[BuildSpec], pattern: str | None) -> list[BuildSpec]:
    """The specs ``pattern`` selects (all when None); a target named exactly while the tree
    does not load is a failing spec with the reason, as ``doit build:<target>`` says it.
    Raises :class:`NoSuchTarget`."""
    if pattern is None:
        return specs
    pat = strip_base(pattern).strip("/")
    chosen = [s for s in specs if fnmatch.fnmatchcase(s.target, pat)]
    if not chosen and "*" not in pat and any(s.target == TREE_TASK for s in specs):
        chosen = named_failures(root, specs, [pat])
    if not chosen:
        raise NoSuchTarget(pattern, [s.target for s in specs])
    return chosen


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
    chosen = select_specs(root, environ, pattern, config)
    out: list[TargetStatus] = []
    with _in_root(root), _dependency(root) as dep:
        tasks = {
            s.target: make_task({**task_dict(s, root), "name": f"{BUILD_TASK}:{s.target}"})
            for s in chosen
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
    saved = BuildRecord.from_values(dep.get_values(task.name)).signature or {}
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
    last_failed = last_run_failed(dep, task.name)
    bits = ["last build failed"] if last_failed else []
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
        last_failed=last_failed,
    )


def target_statuses(
    root: Path,
    environ: Mapping[str, str],
    pattern: str | None = None,
    config: Config | None = None,
) -> list[TargetStatus]:
    """Each target's status (with reasons), as ``doit build`` would see it."""
    return statuses(root, environ, pattern, detailed=True, config=config)[0]


def why_status(
    root: Path, environ: Mapping[str, str], target: str, config: Config | None = None
) -> TargetStatus:
    """The status of the one target ``target`` names, with the values behind its changed
    signature parts (reads the tree, the task cache and doit's database; plans the target
    afresh, probing its compiler, when a signature part changed). Raises
    :class:`NoSuchTarget`."""
    root = root.resolve()
    found, _specs = statuses(root, environ, target, detailed=True, config=config)
    st = found[0]
    if not st.signature:
        return st
    stored = _saved_record(root, st.target)
    current = _current_record(root, environ, st.target, config) if stored is not None else None
    if stored is None or current is None:
        return st
    return dataclasses.replace(st, signature_changes=signature_changes(current, stored))


def signature_changes(
    current: Mapping[str, object], stored: Mapping[str, object]
) -> tuple[Change, ...]:
    """What the plan record ``current`` differs from ``stored`` in
    (:func:`~metrale_orch.steps.keyrecord.record_changes`), sorted by signature part
    (pure)."""
    changes = record_changes(current, stored)
    return tuple(sorted(changes, key=lambda c: (signature_part(c), c.text)))


def _saved_record(root: Path, target: str) -> Mapping[str, object] | None:
    """The plan record the last good build of ``target`` saved, or None (a build saved
    before records were kept, or none)."""
    with _dependency(root) as dep:
        values = {} if dep is None else dep.get_values(f"{BUILD_TASK}:{target}")
    text = BuildRecord.from_values(values).plan
    try:
        record = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _current_record(
    root: Path, environ: Mapping[str, str], target: str, config: Config | None
) -> Mapping[str, object] | None:
    """The plan record of ``target`` as a build would plan it now under ``config`` (None:
    the one ``environ`` gives), or None when it does not plan (its error is the status's)."""
    if config is None:
        try:
            config = load_config(root, environ)
        except MetraleError:
            return None
    tree = generation.resolve_tree(root, environ, config)
    only = generation.select_targets(tree, [f"{BUILD_TASK}:{target}"])
    specs, _ = generation.generate_specs(root, environ, [], config=config, resolution=only)
    plans = [s.plan for s in specs if s.target == target and s.plan is not None]
    return plan_record(plans[0]) if plans else None


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
