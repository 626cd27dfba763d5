"""``metrale-orch profile``: where the last build's time went, and the builds before it.

Reads ``<build_dir>/profile.json`` (written by every ``doit build`` that ran
something; open it in Perfetto or ``chrome://tracing`` for the timeline) and
prints the slowest compiles (target, module, the compiler's own seconds, outcome) and
the totals, where the compiles' wait for a slot is a step of its own. When the last
build compiled nothing (the cache served it), the newest build of the history
(``<build_dir>/.state/profile-history.json``) that compiled is shown instead, and named;
``--list`` lists the kept builds, ``--build N`` shows one.
The reading and adding up live in :mod:`metrale_orch.steps.profile` and
:mod:`metrale_orch.steps.history`; this module parses the arguments and formats them.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from metrale_orch.cli._size import human_bytes
from metrale_orch.errors import UsageError
from metrale_orch.paths import PROFILE_NAME, profile_history, root_relative
from metrale_orch.steps.errors import HistoryMissing
from metrale_orch.steps.history import KEEP, BuildRecord, last_compiling, read_history
from metrale_orch.steps.profile import ProfileSummary, read_profile, summarize_profile

if TYPE_CHECKING:
    from metrale_orch.cli import Context

__all__ = ["format_builds", "format_summary", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``profile`` to ``sub``."""
    p = sub.add_parser(
        "profile",
        help="show the last build's slowest compiles and where its time went",
        description="The slowest compiles of the last `doit build` that ran something, and "
        f"its totals, from <build_dir>/{PROFILE_NAME} (Chrome trace events: open it in "
        "Perfetto or chrome://tracing for the timeline). When it compiled nothing, the "
        "last build that did, from the build history (<build_dir>/.state/).",
    )
    p.add_argument(
        "--top", type=int, default=10, metavar="N", help="how many compiles to list (10)"
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--list",
        type=int,
        nargs="?",
        const=KEEP,
        metavar="N",
        help=f"list the last N builds kept (all {KEEP} by default), newest first",
    )
    which.add_argument(
        "--build", type=int, metavar="N", help="show build #N of the list instead of the last"
    )
    p.set_defaults(run=_run_profile)


def _run_profile(args: argparse.Namespace, ctx: Context) -> int:
    for option, value, least in (("--top", args.top, 0), ("--list", args.list, 1)):
        if value is not None and value < least:
            raise UsageError(f"{option} {value}: expected a number, {least} or more")
    build_dir = ctx.config().build_dir
    history_path = profile_history(build_dir)
    kept = root_relative(history_path, ctx.root)
    if args.list is not None or args.build is not None:
        history = read_history(history_path, kept)
        if not history:
            raise HistoryMissing(kept)
        if args.list is not None:
            ctx.out.write(format_builds(history[::-1][: args.list], kept))
        else:
            ctx.out.write(_format_record(_kept_build(history, args.build), args.top))
        return 0
    path = build_dir / PROFILE_NAME
    summary = summarize_profile(read_profile(path), top=args.top)
    shown = root_relative(path, ctx.root)
    earlier = None if summary.compiles else last_compiling(read_history(history_path, kept))
    if earlier is None:
        ctx.out.write(format_summary(summary, shown))
        return 0
    said = f"no compiles in the last build ({shown}); the last that compiled, from {kept}:"
    ctx.out.write(said + "\n")
    ctx.out.write(_format_record(earlier, args.top))
    return 0


def _kept_build(history: Sequence[BuildRecord], build: int) -> BuildRecord:
    """Build #``build`` of ``history``; raises UsageError naming those kept."""
    for record in history:
        if record.build == build:
            return record
    first, last = history[0].build, history[-1].build
    held = f"1 build, #{last}" if first == last else f"{len(history)} builds, #{first} to #{last}"
    raise UsageError(f"--build {build}: not kept; the history holds {held} (see --list)")


def _format_record(record: BuildRecord, top: int) -> str:
    """:func:`format_summary` of a build of the history, named (pure)."""
    summary = record.summary
    named = f"build #{record.build}, {_when(record)}: {_selection(record)}"
    limited = dataclasses.replace(summary, slowest=summary.slowest[:top])
    empty = f"no compiles in build #{record.build} ({_when(record)}: {_selection(record)})"
    return format_summary(limited, named, empty=empty)


def format_summary(summary: ProfileSummary, shown: str, *, empty: str = "") -> str:
    """The text ``metrale-orch profile`` prints for ``summary`` read from ``shown`` (pure);
    ``empty``: its first line when it has no compiles."""
    lines = []
    if summary.slowest:
        lines.append(f"slowest compiles ({shown}):")
        rows = [("target", "module", "seconds", "outcome")] + [
            (c.target, c.module, f"{c.seconds:.2f}", c.outcome) for c in summary.slowest
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for target, module, seconds, outcome in rows:
            lines.append(
                f"  {target:<{widths[0]}}  {module:<{widths[1]}}  {seconds:>{widths[2]}}  {outcome}"
            )
    elif summary.compiles:  # only --top 0 lists none of a build's compiles
        lines.append(f"slowest compiles ({shown}): none listed (--top 0)")
    else:
        lines.append(empty or f"no compiles in the last build ({shown})")
    o = summary.outcomes
    workers = f" on {summary.workers} worker{'s' if summary.workers != 1 else ''}"
    lines.append(
        f"targets: {summary.targets} in {summary.wall_seconds:.1f} s"
        f"{workers if summary.workers else ''}"
    )
    shared = f"{summary.shared} shared, " if summary.shared else ""
    lines.append(
        f"modules: {o.get('compiled', 0)} compiled, {_hits(o.get('local', 0), 'local')}, "
        f"{_hits(o.get('remote', 0), 'remote')}, {shared}{o.get('failed', 0)} failed; "
        f"{human_bytes(summary.compiled_bytes)} compiled, "
        f"{human_bytes(summary.restored_bytes)} restored"
    )
    steps = [(_STEP_WORDS.get(k, k), v) for k, v in summary.steps.items() if k != "build"]
    if steps:
        lines.append("time by step: " + ", ".join(f"{k} {v:.2f} s" for k, v in steps))
    return "\n".join(lines) + "\n"


#: How ``time by step`` names a step whose name alone would mislead.
_STEP_WORDS = {"wait": "waiting for a compile slot"}


def _hits(n: int, tier: str) -> str:
    return f"{n} {tier} hit{'' if n == 1 else 's'}"


def format_builds(history: Sequence[BuildRecord], kept: str) -> str:
    """The table ``metrale-orch profile --list`` prints for ``history`` (newest first) kept
    in ``kept`` (pure): the build and when it ended left-aligned, counts right-aligned,
    its selection last."""
    head = ("build", "finished", "targets", "compiled", "hits", "shared", "failed", "wall")
    rows: list[tuple[str, ...]] = [(*head, "selection")]
    for r in history:
        o = r.summary.outcomes
        counts = (r.summary.targets, o.get("compiled", 0), o.get("local", 0) + o.get("remote", 0))
        more = (r.summary.shared, o.get("failed", 0))
        wall = f"{r.summary.wall_seconds:.1f} s"
        rows.append((f"#{r.build}", _when(r), *map(str, (*counts, *more)), wall, _selection(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [f"builds kept in {kept}, newest first:"]
    for row in rows:
        cells = [f"{row[0]:<{widths[0]}}", f"{row[1]:<{widths[1]}}"]
        cells += [f"{row[i]:>{widths[i]}}" for i in range(2, len(head))]
        lines.append("  " + "  ".join([*cells, row[-1]]))
    return "\n".join(lines) + "\n"


def _when(record: BuildRecord) -> str:
    """When a build ended, as people read it: ``2026-12-06 07:00:40 UTC`` (pure)."""
    return record.finished.replace("T", " ").replace("Z", " UTC")


def _selection(record: BuildRecord) -> str:
    """What doit was asked: ``doit build:hopper/*`` (``doit``: the default tasks) (pure)."""
    return " ".join(("doit", *record.words))
