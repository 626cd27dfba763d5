"""``metrale-orch status``, ``why`` and ``rdeps``: the build's state, read without building.

All three generate the same tasks ``doit`` would (``metrale_orch.dodo``; ``status``
and ``why`` through its task cache, ``rdeps`` resolving afresh for the plans) and
read doit's dependency database (``<root>/.doit.db``, sqlite3) through doit's
own ``Dependency`` API with the same content checker, so their answer is the
one ``doit build`` would act on. They never write the database.

- ``status [PATTERN] [--json] [--exit-code]``: each target (``fnmatch`` wildcards,
  e.g. ``'hopper/*'``) as ``up to date``, ``stale``, ``error``, ``skipped`` or
  ``ignored`` (marked by ``doit ignore``). ``--exit-code`` exits 1 when ``doit
  build`` has something to do: a stale or failing target. A skipped target (no
  compiler here) and an ignored one (doit skips it, as ``doit list --status``
  shows ``I``) are not.
- ``why TARGET``: which inputs changed, appeared or disappeared, which
  signature parts (layout, flags, toolchain, defaults, ...) differ from the
  last successful build, with the values that changed where the build's record
  names them (``flags: define added: FAST=1``, ``modules: added foo``: the
  comparison ``why-miss`` makes), or which output is missing; that the last
  build failed (what changed is then what changed since the last good build,
  whose artefacts are installed); for an ignored target, that it is ignored and
  what ``doit forget`` / ``doit build`` then do.
- ``rdeps FILE``: the targets whose inputs include the file, and in each the
  modules whose compile can read it (its source, or its textual include
  closure over the staged layout, as the cache keys it); a file no module
  includes (a manifest, an unused header) reaches the target but no module.
  Failing targets are listed too, marked ``(failing: <reason>)`` (their inputs
  are what their resolved layout reaches, or the files their tree error names),
  and skipped ones ``(skipped: <reason>)``.

Every view shows why: an error or a skip carries its reason; a target named
exactly (``why``, ``status``) while the tree does not load fails with that reason.
The logic lives in :mod:`metrale_orch.views.status`; this module parses the
arguments and formats the values it returns. Each command imports it when it runs: it
brings doit and the task generation, which the other commands (``check`` and ``layout``,
what pre-commit hooks run) do not need to start.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch.canonical import readable_json
from metrale_orch.errors import UsageError
from metrale_orch.paths import BUILD_TASK, DB_NAME

if TYPE_CHECKING:
    from metrale_orch.cli import Context
    from metrale_orch.views.status import TargetStatus

__all__ = ["register"]


def _run_status(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.views import status  # see the module docstring

    statuses, _ = status.statuses(
        ctx.root, ctx.environ, args.pattern, detailed=True, config=ctx.config()
    )
    counts: dict[str, int] = {}
    for st in statuses:
        counts[st.status] = counts.get(st.status, 0) + 1
    if args.json:
        doc = {
            "targets": [st.to_dict() for st in statuses],
            "counts": dict(sorted(counts.items())),
        }
        ctx.out.write(readable_json(doc) + "\n")
        return _status_code(args, counts)
    width = max((len(st.status) for st in statuses), default=0)
    for st in statuses:
        line = f"{st.status:<{width}}  {st.target}"
        if st.detail:
            line += f"  ({st.detail.splitlines()[0]})"
        ctx.out.write(line + "\n")
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    ctx.out.write(f"{len(statuses)} target(s): {summary}\n" if statuses else "no targets\n")
    return _status_code(args, counts)


def _status_code(args: argparse.Namespace, counts: Mapping[str, int]) -> int:
    """0, or with ``--exit-code`` 1 when a target is stale or in error (as ``git diff
    --exit-code``); skipped targets (no compiler here) and ignored ones (``doit build``
    skips them) are not a change."""
    return 1 if args.exit_code and (counts.get("stale") or counts.get("error")) else 0


#: How ``why`` words each of :meth:`status.TargetStatus.reasons`.
_WHY_LABELS = {
    "changed": "changed input",
    "added": "new input",
    "removed": "removed input",
    "signature": "signature part changed",
    "missing_outputs": "missing output",
    "changed_outputs": "output missing or altered since it was built",
}


def _run_why(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.views import status  # see the module docstring

    target = status.strip_base(args.target)
    if "*" in target:
        raise UsageError(f"why takes one target, not a pattern: {args.target!r}")
    st = status.why_status(ctx.root, ctx.environ, target, ctx.config())
    w = ctx.out.write
    if st.status == "up to date":
        w(f"{st.target} is up to date\n")
        return 0
    if st.status == "skipped":
        w(f"{st.target} is skipped: {st.detail}\n")
        return 0
    if st.status == "ignored":
        _why_ignored(st, w)
        return 0
    if st.status == "error" and not (st.changed or st.added or st.removed):
        w(f"{st.target} does not build: {st.detail}\n")
        return 0
    w(f"{st.target} is stale:\n")
    if st.never_built:
        w(f"  never built successfully, or forgotten (no record in {DB_NAME})\n")
    if st.last_failed:
        w("  the last build failed: the last good build stays installed; since it:\n")
    for key, items in st.reasons():
        if key == "signature":
            items = st.unexplained()
            for change in st.signature_changes:
                w(f"  {status.signature_part(change)}: {change.text}\n")
        for item in items:
            w(f"  {_WHY_LABELS[key]}: {item}\n")
    return 0


def _why_ignored(st: TargetStatus, w: Callable[[str], object]) -> None:
    task = f"{BUILD_TASK}:{st.target}"
    w(f"{st.target} is ignored (marked by `doit ignore {task}`):\n")
    w("  `doit build` skips it and leaves its files as they are (`doit list --status`: I)\n")
    w(f"  its record in {DB_NAME} holds only the mark: nothing is known of its inputs\n")
    w(
        f"  `doit forget {task}` drops the mark; the next `doit build` then builds it "
        "again (from the cache when nothing changed)\n"
    )


def _rel_to_root(root: Path, text: str) -> str:
    p = Path(text)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, root / p]
    for cand in candidates:
        try:
            return cand.resolve().relative_to(root).as_posix()
        except ValueError:
            continue
    raise UsageError(f"{text} is not under the project root {root}")


def _run_rdeps(args: argparse.Namespace, ctx: Context) -> int:
    root = ctx.root.resolve()
    rel = _rel_to_root(root, args.file)
    from metrale_orch.views import status  # see the module docstring

    hits = [reach.to_dict() for reach in status.rdeps(root, ctx.environ, rel, ctx.config())]
    if args.json:
        ctx.out.write(readable_json({"file": rel, "targets": hits}) + "\n")
        return 0
    if not hits:
        ctx.out.write(f"{rel} reaches no target\n")
        return 0
    for hit in hits:
        modules = hit["modules"]
        mods = ", ".join(modules) if isinstance(modules, list) else ""
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
        help="show each target as up to date, stale, error, skipped or ignored",
        description="Each target's state as `doit build` would see it. PATTERN is an "
        "fnmatch wildcard over hw/model/quant (quote it: 'hopper/*').",
    )
    p.add_argument("pattern", nargs="?", help="targets to show, e.g. 'hopper/*' (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when any target is stale or in error (for CI: 'is anything to build?'); "
        "skipped and ignored targets are not",
    )
    p.set_defaults(run=_run_status)

    p = sub.add_parser("why", help="say why a target is stale")
    p.add_argument("target", help="hw/model/quant")
    p.set_defaults(run=_run_why)

    p = sub.add_parser("rdeps", help="list the targets and modules a file reaches")
    p.add_argument("file", help="a file under kernels/ (or any input of a target)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_run_rdeps)
