"""``metrale-orch profile``: where the last build's time went.

Reads ``<build_dir>/profile.json`` (written by every ``doit build`` that ran
something; open it in Perfetto or ``chrome://tracing`` for the timeline) and
prints the slowest compiles (target, module, the compiler's own seconds, outcome) and
the totals, where the compiles' wait for a slot is a step of its own.
The reading and adding up live in :mod:`metrale_orch.steps.profile`; this
module parses the arguments and formats the summary.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from metrale_orch.cli._size import human_bytes
from metrale_orch.errors import UsageError
from metrale_orch.paths import PROFILE_NAME, root_relative
from metrale_orch.steps.profile import ProfileSummary, read_profile, summarize_profile

if TYPE_CHECKING:
    from metrale_orch.cli import Context

__all__ = ["format_summary", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``profile`` to ``sub``."""
    p = sub.add_parser(
        "profile",
        help="show the last build's slowest compiles and where its time went",
        description="The slowest compiles of the last `doit build` that ran something, and "
        f"its totals, from <build_dir>/{PROFILE_NAME} (Chrome trace events: open it in "
        "Perfetto or chrome://tracing for the timeline).",
    )
    p.add_argument(
        "--top", type=int, default=10, metavar="N", help="how many compiles to list (10)"
    )
    p.set_defaults(run=_run_profile)


def _run_profile(args: argparse.Namespace, ctx: Context) -> int:
    if args.top < 0:
        raise UsageError(f"--top {args.top}: expected a number of compiles, 0 or more")
    path = ctx.config().build_dir / PROFILE_NAME
    summary = summarize_profile(read_profile(path), top=args.top)
    ctx.out.write(format_summary(summary, root_relative(path, ctx.root)))
    return 0


def format_summary(summary: ProfileSummary, shown: str) -> str:
    """The text ``metrale-orch profile`` prints for ``summary`` read from ``shown`` (pure)."""
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
    else:
        lines.append(f"no compiles in the last build ({shown})")
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
