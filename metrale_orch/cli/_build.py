"""``metrale-orch status``, ``why`` and ``rdeps``: the build's state, read without building.

All three generate the same tasks ``doit`` would (``metrale_orch.dodo``; ``status``
and ``why`` through its task cache, ``rdeps`` resolving afresh for the plans) and
read doit's dependency database (``<root>/.doit.db``, sqlite3) through doit's
own ``Dependency`` API with the same content checker, so their answer is the
one ``doit build`` would act on. They never write the database.

- ``status [PATTERN] [--json]``: each target (``fnmatch`` wildcards, e.g.
  ``'hopper/*'``) as ``up to date``, ``stale``, ``error`` or ``skipped``.
- ``why TARGET``: which inputs changed, appeared or disappeared, which
  signature parts (layout, flags, toolchain, defaults, ...) differ from the
  last successful build, or which output is missing.
- ``rdeps FILE``: the targets whose inputs include the file, and in each the
  modules whose compile can read it (its source, or its textual include
  closure over the staged layout, as the cache keys it); a file no module
  includes (a manifest, an unused header) reaches the target but no module.
  Failing targets are listed too, marked ``(failing: <reason>)`` (their inputs
  are what their resolved layout reaches, or the files their tree error names),
  and skipped ones ``(skipped: <reason>)``.

Every view shows why: an error or a skip carries its reason; a target named
exactly (``why``, ``status``) while the tree does not load fails with that reason.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrale_orch.errors import MetraleError, UsageError

__all__ = ["TargetStatus", "register", "target_statuses"]

DB_NAME = ".doit.db"


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetStatus:
    """One target's state as ``doit build`` would see it."""

    target: str
    #: "up to date" | "stale" | "error" | "skipped"
    status: str
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

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "status": self.status}
        if self.detail:
            out["detail"] = self.detail
        for key in (
            "changed",
            "added",
            "removed",
            "signature",
            "missing_outputs",
            "changed_outputs",
        ):
            value = getattr(self, key)
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


def _strip(pattern: str) -> str:
    return pattern.removeprefix("build:")


@contextmanager
def _dependency(root: Path) -> Iterator[Any]:
    """doit's Dependency over the project's database, or None when it has none. Never writes."""
    db = root / DB_NAME
    if not db.exists():
        yield None
        return
    from doit.dependency import Dependency, SqliteDB

    from metrale_orch.tasks.checker import ContentChecker, TaskDataCodec

    dep = Dependency(SqliteDB, str(db), checker_cls=ContentChecker, codec_cls=TaskDataCodec)
    try:
        yield dep
    finally:
        dep.backend._conn.close()  # read-only use: no dump


@contextmanager
def _in_root(root: Path) -> Iterator[None]:
    """doit's file dependencies are relative to the root; check them from there."""
    old = os.getcwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(old)


def _statuses(
    root: Path, environ: Mapping[str, str], pattern: str | None, *, detailed: bool
) -> tuple[list[TargetStatus], list[Any]]:
    from doit.task import dict_to_task

    from metrale_orch.dodo import TREE_TASK, cached_build_specs, named_failures

    root = root.resolve()
    # The same task dicts `doit` would use, through its task cache (fast on a large tree).
    specs, _how = cached_build_specs(root, environ)
    if pattern is not None:
        pat = _strip(pattern)
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
        tasks = {s.target: dict_to_task({**s.task, "name": f"build:{s.target}"}) for s in chosen}
        for spec in chosen:
            if spec.kind == "error":
                out.append(TargetStatus(target=spec.target, status="error", detail=spec.message))
            elif spec.kind == "skip":
                out.append(TargetStatus(target=spec.target, status="skipped", detail=spec.message))
            else:
                out.append(_build_status(spec, tasks[spec.target], tasks, dep, detailed))
    return out, chosen


def _build_status(spec: Any, task: Any, tasks: Any, dep: Any, detailed: bool) -> TargetStatus:
    from metrale_orch.tasks.checker import SIGNATURE_KEY, SignatureCheck

    if dep is None or not dep._in(task.name):
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
    reasons = result.reasons
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
    changed = tuple(sorted(reasons.get("changed_file_dep", ()) or ()))
    added = tuple(sorted(reasons.get("added_file_dep", ()) or ()))
    removed = tuple(sorted(reasons.get("removed_file_dep", ()) or ()))
    missing_in = tuple(sorted(reasons.get("missing_file_dep", ()) or ()))
    missing_out = tuple(sorted(reasons.get("missing_target", ()) or ()))
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
    status = "error" if result.status == "error" else "stale"
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
    root: Path, environ: Mapping[str, str], pattern: str | None = None
) -> list[TargetStatus]:
    """Each target's status (with reasons), as ``doit build`` would see it."""
    return _statuses(root, environ, pattern, detailed=True)[0]


# ------------------------------------------------------------------------------ commands


def _run_status(args: argparse.Namespace, ctx: Any) -> int:
    statuses, _ = _statuses(ctx.root, ctx.environ, args.pattern, detailed=True)
    counts: dict[str, int] = {}
    for st in statuses:
        counts[st.status] = counts.get(st.status, 0) + 1
    if args.json:
        doc = {
            "targets": [st.to_dict() for st in statuses],
            "counts": dict(sorted(counts.items())),
        }
        ctx.out.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return 0
    width = max((len(st.status) for st in statuses), default=0)
    for st in statuses:
        line = f"{st.status:<{width}}  {st.target}"
        if st.detail:
            line += f"  ({st.detail.splitlines()[0]})"
        ctx.out.write(line + "\n")
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    ctx.out.write(f"{len(statuses)} target(s): {summary}\n" if statuses else "no targets\n")
    return 0


def _run_why(args: argparse.Namespace, ctx: Any) -> int:
    target = _strip(args.target)
    if "*" in target:
        raise UsageError(f"why takes one target, not a pattern: {args.target!r}")
    statuses, _ = _statuses(ctx.root, ctx.environ, target, detailed=True)
    st = statuses[0]
    w = ctx.out.write
    if st.status == "up to date":
        w(f"{st.target} is up to date\n")
        return 0
    if st.status == "skipped":
        w(f"{st.target} is skipped: {st.detail}\n")
        return 0
    if st.status == "error" and not (st.changed or st.added or st.removed):
        w(f"{st.target} does not build: {st.detail}\n")
        return 0
    w(f"{st.target} is stale:\n")
    if st.never_built:
        w("  never built successfully (no record in .doit.db)\n")
    for path in st.changed:
        w(f"  changed input: {path}\n")
    for path in st.added:
        w(f"  new input: {path}\n")
    for path in st.removed:
        w(f"  removed input: {path}\n")
    for part in st.signature:
        w(f"  signature part changed: {part}\n")
    for path in st.missing_outputs:
        w(f"  missing output: {path}\n")
    for path in st.changed_outputs:
        w(f"  output missing or altered since it was built: {path}\n")
    return 0


def _rel_to_root(root: Path, text: str) -> str:
    p = Path(text)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, root / p]
    for cand in candidates:
        try:
            return cand.resolve().relative_to(root).as_posix()
        except ValueError:
            continue
    raise UsageError(f"{text} is not under the project root {root}")


def _modules_reaching(plan: Any, layout: Any, rel: str, root: Path) -> list[str]:
    """Names of the modules whose compile can read ``rel``: its own source, or a file in
    its include closure over the target's staged layout (the closure the cache keys on)."""
    import posixpath

    from metrale_orch.build.includes import (
        Includes,
        include_dirs,
        parse_includes,
        pre_includes,
        resolve_closure,
    )
    from metrale_orch.build.staging import plan_stage
    from metrale_orch.tasks.dicts import rel_posix

    staged = {srel: rel_posix(src, root) for srel, src in plan_stage(layout).items()}
    includes: dict[str, Includes] = {}
    for srel, src_rel in staged.items():
        try:
            includes[srel] = parse_includes((root / src_rel).read_bytes())
        except OSError:
            includes[srel] = Includes()
    names = []
    for module in plan.modules:
        roots = [module.staged] + [
            posixpath.normpath(posixpath.join(module.cwd, p))
            for p in pre_includes(plan.flags)
            if not p.startswith("/")
        ]
        closure = resolve_closure(
            roots, staged=staged, includes_of=includes, dirs=include_dirs(module.cwd, plan.flags)
        )
        if rel_posix(module.source, root) == rel or any(staged[c] == rel for c in closure):
            names.append(module.name)
    return sorted(names)


def _skipped_plan(root: Path, spec: Any, environ: Mapping[str, str]) -> Any:
    """The plan of a target skipped for a missing compiler (no identity: never keyed), or
    None when it cannot be planned."""
    from metrale_orch.build.plan import plan_target
    from metrale_orch.build.toolchains import load_toolchains
    from metrale_orch.errors import MetraleError
    from metrale_orch.readiness import UNPROBED
    from metrale_orch.tree import Layout

    if not isinstance(spec.resolved, Layout):
        return None
    try:
        toolchains = load_toolchains(root)
        return plan_target(root, spec.resolved, toolchains, identity=UNPROBED, environ=environ)
    except MetraleError:
        return None


class BrokenTree(MetraleError):
    """The configuration or the walk of the tree fails: no target is known."""

    def __init__(self, command: str, message: str) -> None:
        self.message = message
        super().__init__(f"{command}: no target is known, the tree does not load: {message}")


def _run_rdeps(args: argparse.Namespace, ctx: Any) -> int:
    from metrale_orch.dodo import TREE_TASK, resolve_build_specs, spec_inputs

    root = ctx.root.resolve()
    rel = _rel_to_root(root, args.file)
    specs = resolve_build_specs(root, ctx.environ)
    if [s.target for s in specs] == [TREE_TASK]:
        raise BrokenTree("rdeps", specs[0].message)
    hits: list[dict[str, Any]] = []
    for spec in specs:
        if spec.target == TREE_TASK or rel not in spec_inputs(root, spec):
            continue
        hit: dict[str, Any] = {"target": spec.target, "modules": []}
        if spec.kind == "build":
            hit["modules"] = _modules_reaching(spec.plan, spec.layout, rel, root)
        elif spec.kind == "skip":
            hit["skipped"] = spec.message
            plan = _skipped_plan(root, spec, ctx.environ)
            if plan is not None:
                hit["modules"] = _modules_reaching(plan, spec.resolved, rel, root)
        else:
            hit["failing"] = spec.message
        hits.append(hit)
    if args.json:
        ctx.out.write(json.dumps({"file": rel, "targets": hits}, indent=2, sort_keys=True) + "\n")
        return 0
    if not hits:
        ctx.out.write(f"{rel} reaches no target\n")
        return 0
    for hit in hits:
        mods = ", ".join(hit["modules"])
        if "failing" in hit:
            mods = f"(failing: {hit['failing']})"
        elif not mods:
            mods = "(an input; no module includes it)"
        if "skipped" in hit:
            mods += f" (skipped: {hit['skipped']})"
        ctx.out.write(f"{hit['target']}: {mods}\n")
    marks = [
        f"{n} {word}"
        for word, n in (
            ("failing", sum("failing" in h for h in hits)),
            ("skipped", sum("skipped" in h for h in hits)),
        )
        if n
    ]
    more = f" ({', '.join(marks)})" if marks else ""
    ctx.out.write(f"{rel} reaches {len(hits)} target(s){more}\n")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``status``, ``why`` and ``rdeps`` to ``sub``."""
    p = sub.add_parser(
        "status",
        help="show each target as up to date, stale, error or skipped",
        description="Each target's state as `doit build` would see it. PATTERN is an "
        "fnmatch wildcard over hw/model/quant (quote it: 'hopper/*').",
    )
    p.add_argument("pattern", nargs="?", help="targets to show, e.g. 'hopper/*' (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_run_status)

    p = sub.add_parser("why", help="say why a target is stale")
    p.add_argument("target", help="hw/model/quant")
    p.set_defaults(run=_run_why)

    p = sub.add_parser("rdeps", help="list the targets and modules a file reaches")
    p.add_argument("file", help="a file under kernels/ (or any input of a target)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_run_rdeps)
