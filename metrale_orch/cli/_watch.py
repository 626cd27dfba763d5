"""``metrale-orch watch [PATTERN...] [--once] [--smoke] [--remote]``: the warm edit loop.

Builds the targets PATTERN selects (as ``doit 'build:PATTERN'`` does; every target
without one) once, then watches what the build reads (``kernels/``, ``toolchains/``,
``pyproject.toml``) and after each burst of changes rebuilds exactly what the changed
files reach, through doit's own run in this process (:mod:`metrale_orch.watch.loop`).
One line per cycle: what changed, what each target did, the seconds; a failure's first
compiler lines under it; the static smoke checks of what was built (the numeric cases
too with ``--smoke``, where a device is present). Watch goes on after a failure; Ctrl-C
or SIGTERM stops the compiles and exits 130 or 143, as the build does.

With a remote executor set, watch compiles here unless ``--remote`` is given: an edit
loop wants latency, not a queue. Settings (``--root``, ``--set``, the environment,
``pyproject.toml``) apply as for ``metrale-orch doit``. This module parses and prints.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from metrale_orch.cli._doit import applied
from metrale_orch.config import setting_variables

if TYPE_CHECKING:
    from metrale_orch.cli import Context
    from metrale_orch.watch.changes import Changes
    from metrale_orch.watch.loop import CycleReport

__all__ = ["format_cycle", "register"]

#: How many targets a cycle line names before it only counts them.
_NAMED = 3
_KERNELS = "kernels/"


def _what(changes: Changes) -> str:
    """What started a cycle, in a few words."""
    marked = [
        *changes.changed,
        *(f"+{p}" for p in changes.added),
        *(f"-{p}" for p in changes.removed),
    ]
    if not marked:
        return "build"
    shown = [m.replace(_KERNELS, "", 1) for m in marked[:2]]
    more = f" and {len(marked) - 2} more" if len(marked) > 2 else ""
    verb = "changed" if not (changes.added or changes.removed) else "changed/added/removed"
    return f"{', '.join(shown)}{more} {verb}"


def _targets(report: CycleReport) -> str:
    """What the cycle's targets did."""
    if not report.targets:
        if report.stopped:
            return "stopped"
        return "up to date" if report.status == 0 else f"failed (status {report.status})"
    if len(report.targets) <= _NAMED:
        return ", ".join(
            f"{t.target} {t.outcome}" + (f" ({t.modules})" if t.modules else "")
            for t in report.targets
        )
    counts: dict[str, int] = {}
    for t in report.targets:
        counts[t.outcome] = counts.get(t.outcome, 0) + 1
    return ", ".join(f"{n} {word}" for word, n in sorted(counts.items()))


def format_cycle(report: CycleReport, clock: str, *, numeric: bool) -> list[str]:
    """The lines of one cycle (pure): one, plus a failure's compiler lines and the smoke
    lines when a check failed or the numbers were asked for."""
    smoke_failed = any(line.startswith("FAIL ") for line in report.smoke)
    line = f"[{clock}] {_what(report.changes)}: {_targets(report)}; {report.seconds:.2f} s"
    if report.smoke and not smoke_failed and not numeric:
        line += "; static smoke ok"
    lines = [line]
    for t in report.targets:
        lines.extend(f"    {t.target}: {e}" for e in t.errors)
    if smoke_failed or numeric:
        lines.extend(f"    {s}" for s in report.smoke)
    if report.stopped:
        lines.append(report.stopped)
    return lines


def _run(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.watch.cycle import pattern_words  # the build's imports: this command's
    from metrale_orch.watch.loop import WatchOptions, run_watch

    overrides = dict(ctx.overrides)
    if not args.remote:
        overrides["remote_executor"] = ""  # compile here: latency, not a queue
    variables = setting_variables(overrides)  # ConfigError for a key no run can take
    options = WatchOptions(words=pattern_words(args.patterns), once=args.once, numeric=args.smoke)

    def say(report: CycleReport) -> None:
        for line in format_cycle(report, time.strftime("%H:%M:%S"), numeric=args.smoke):
            ctx.out.write(line + "\n")
        ctx.out.flush()
        if report.number == 1 and not args.once and not report.stopped:
            ctx.err.write("watching kernels/, toolchains/, pyproject.toml (Ctrl-C to stop)\n")
            ctx.err.flush()

    with applied(ctx.root, variables):
        return run_watch(ctx.root, ctx.config(), options, say)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``watch`` to ``sub``."""
    parser = sub.add_parser(
        "watch",
        help="build, then rebuild what each saved change reaches (the warm edit loop)",
        description="Build the selected targets once, then watch kernels/, toolchains/ and "
        "pyproject.toml and rebuild exactly what each burst of changes reaches, with the "
        "static smoke checks of what was built. One line per cycle; Ctrl-C stops.",
    )
    parser.add_argument(
        "patterns",
        nargs="*",
        metavar="PATTERN",
        help="targets as for `doit build:PATTERN`, e.g. 'hopper/*' (default: every target)",
    )
    parser.add_argument("--once", action="store_true", help="build once, then exit")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="run the numeric smoke cases too after each cycle (where a device is present)",
    )
    parser.add_argument(
        "--remote",
        action="store_true",
        help="send compiles to the remote executor when one is set (default: compile here)",
    )
    parser.set_defaults(run=_run)
