"""``metrale-orch resources [PATTERN] [--json] [--diff OTHER_BUILD_DIR | --lock | --check]``:
registers, static shared memory, stack frame and spills per kernel per arch (the report,
and the ``kernels.lock`` baseline, are :mod:`metrale_orch.resources`; this module parses
arguments and formats).

Exit codes: 0; 1 when a target's manifest or artefacts could not be read, with ``--diff``
when a kernel spills where it did not (or spills more), with ``--check`` when the build
breaks ``kernels.lock``; 2 for a usage error or a missing or malformed ``kernels.lock``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch.canonical import readable_json
from metrale_orch.cli._command import Subparsers, add_command, add_pattern
from metrale_orch.errors import EXIT_FAILURE, EXIT_OK, UsageError, printable

if TYPE_CHECKING:
    from metrale_orch.cli import Context
    from metrale_orch.resources import (
        Collected,
        KernelChange,
        KernelResources,
        LockCheck,
        LockProblem,
        ResourceReport,
    )

_HEADER = ("target", "kernel", "arch", "regs", "smem B", "stack B", "spill st B", "spill ld B")


def register(sub: Subparsers) -> None:
    """Add ``resources``."""
    p = add_command(
        sub,
        "resources",
        run_resources,
        help="registers, shared memory, stack and spills per kernel per arch (ptxas -v)",
        description=(
            "Per kernel per arch of every built target: registers, static shared memory, "
            "stack frame and local-memory spill stores/loads, from `ptxas -v` on the PTX "
            "the build installed (a cubin's own records for cubin artefacts; those keep no "
            "spill counts). Answers are cached in the build directory's .state/ by "
            "artefact hash. Toolchains without a report (HIP, Metal, SCALE) and targets "
            "never built get one line each."
        ),
    )
    add_pattern(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--diff",
        metavar="OTHER_BUILD_DIR",
        type=Path,
        help="print only what changed from OTHER_BUILD_DIR to this build; exit 1 when a "
        "kernel spills where it did not, or spills more (for CI)",
    )
    mode.add_argument(
        "--lock",
        action="store_true",
        help="write kernels.lock at the root: the selected targets' kernels replace their "
        "entries, other targets' entries are kept (commit it)",
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="compare this build with kernels.lock; exit 1 on a new spill, more spill "
        "bytes, a new stack frame, register growth or a kernel the lock lacks (for CI)",
    )
    p.add_argument(
        "--max-register-growth",
        metavar="N",
        type=_count,
        default=0,
        help="with --check: registers a kernel may gain over kernels.lock (default 0)",
    )
    p.add_argument(
        "--format",
        choices=("text", "markdown"),
        default="text",
        help="with --check: markdown writes the problems as a table (a PR comment, a CI "
        "job summary)",
    )


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def run_resources(args: argparse.Namespace, ctx: Context) -> int:
    # Imported here, as cli/_build imports the build: every command builds the parser, which
    # imports this module, and the report needs the toolchains and the artefact readers
    # (~0.1 s of imports that no other command should pay).
    from metrale_orch.resources import collect_resources

    environ = ctx.environ
    build_dir = ctx.config().build_dir
    if not args.check and (args.format != "text" or args.max_register_growth):
        option = "--format" if args.format != "text" else "--max-register-growth"
        raise UsageError(f"{option} goes with --check")
    if args.lock and args.json:
        raise UsageError("--lock writes kernels.lock and prints no JSON; leave out --json")
    if args.check and args.json and args.format != "text":
        raise UsageError("--check takes --json or --format markdown, not both")
    if args.lock:
        return _run_lock(args.pattern, build_dir, ctx)
    if args.check:
        return _run_check(args, build_dir, ctx)
    if args.diff is not None:
        if not args.diff.is_dir():
            raise UsageError(
                f"--diff {args.diff}: not a directory; name the build directory to compare with"
            )
        old = collect_resources(ctx.root, args.diff, args.pattern, environ)
        new = collect_resources(ctx.root, build_dir, args.pattern, environ)
        return _print_diff(old.report, new.report, args.json, ctx)
    got = collect_resources(ctx.root, build_dir, args.pattern, environ)
    failed = any(t.status == "error" for t in got.report.targets)
    if args.json:
        print(readable_json(got.report.to_dict()), file=ctx.out)
    else:
        _print_report(got, ctx)
    return EXIT_FAILURE if failed else EXIT_OK


def _bytes(value: int | None) -> str:
    return "?" if value is None else str(value)


def _numbers(k: KernelResources) -> tuple[str, ...]:
    return (
        str(k.registers),
        str(k.shared_bytes),
        str(k.stack_bytes),
        _bytes(k.spill_store_bytes),
        _bytes(k.spill_load_bytes),
    )


def _print_report(got: Collected, ctx: Context) -> None:
    report = got.report
    rows = [
        (t.target, k.kernel, k.arch, *_numbers(k))
        for t in report.targets
        if t.status == "ok"
        for k in sorted(t.kernels, key=lambda k: (k.kernel, k.arch))
    ]
    if rows:
        widths = [max(len(r[i]) for r in (_HEADER, *rows)) for i in range(len(_HEADER))]
        for row in (_HEADER, *rows):
            cells = [
                cell.ljust(w) if i < 3 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ]
            print(printable("  ".join(cells).rstrip()), file=ctx.out)
    for t in report.targets:
        if t.status != "ok":
            print(printable(f"{t.target}: {t.detail}"), file=ctx.out)
    kernels = [k for t in report.targets for k in t.kernels]
    built = sum(t.status == "ok" for t in report.targets)
    spilling = sum(k.spills for k in kernels)
    print(
        f"resources: {len(kernels)} kernels in {built} built target{'s' * (built != 1)}, "
        f"{spilling} spilling; {got.ptxas_runs} ptxas run{'s' * (got.ptxas_runs != 1)}, "
        f"{got.cache_hits} from the cache ({report.build_dir}/.state)",
        file=ctx.out,
    )


def _change_fields(old: KernelResources, new: KernelResources) -> str:
    parts = []
    for label, a, b, unit in (
        ("regs", old.registers, new.registers, ""),
        ("smem", old.shared_bytes, new.shared_bytes, " B"),
        ("stack", old.stack_bytes, new.stack_bytes, " B"),
        ("spill stores", old.spill_store_bytes, new.spill_store_bytes, " B"),
        ("spill loads", old.spill_load_bytes, new.spill_load_bytes, " B"),
    ):
        if a != b:
            parts.append(f"{label} {_bytes(a)} → {_bytes(b)}{unit}")
    return ", ".join(parts)


def _summary(k: KernelResources) -> str:
    return (
        f"regs {k.registers}, smem {k.shared_bytes} B, stack {k.stack_bytes} B, "
        f"spill stores {_bytes(k.spill_store_bytes)} B, "
        f"spill loads {_bytes(k.spill_load_bytes)} B"
    )


def _change_line(c: KernelChange) -> str:
    if c.old is not None and c.new is not None:
        what = _change_fields(c.old, c.new)
    elif c.new is not None:
        what = f"new ({_summary(c.new)})"
    else:
        assert c.old is not None
        what = f"gone (was {_summary(c.old)})"
    mark = f"  [{c.spill_change} spill]" if c.spill_change else ""
    return f"{c.target} {c.kernel} {c.arch}: {what}{mark}"


def _print_diff(old: ResourceReport, new: ResourceReport, as_json: bool, ctx: Context) -> int:
    from metrale_orch.resources import diff_reports  # see run_resources

    changes = diff_reports(old, new)
    spills = sum(c.spill_change == "new" for c in changes)
    more = sum(c.spill_change == "more" for c in changes)
    code = EXIT_FAILURE if spills or more else EXIT_OK
    if as_json:
        doc = {
            "old": old.build_dir,
            "new": new.build_dir,
            "changes": [c.to_dict() for c in changes],
            "new_spills": spills,
            "more_spills": more,
        }
        print(readable_json(doc), file=ctx.out)
        return code
    for c in changes:
        print(printable(_change_line(c)), file=ctx.out)
    for side, report in (("old", old), ("new", new)):
        for t in report.targets:
            if t.status == "error":
                print(printable(f"{t.target} ({side}): {t.detail}"), file=ctx.out)
    compared = sum(1 for t in new.targets for _ in t.kernels)
    summary = (
        f"{len(changes)} kernel{'s' * (len(changes) != 1)} changed" if changes else "no change"
    )
    print(
        printable(
            f"diff {old.build_dir} → {new.build_dir}: {summary} "
            f"({compared} kernels now), {spills} new spill{'s' * (spills != 1)}"
            + (f", {more} more spill{'s' * (more != 1)}" if more else "")
        ),
        file=ctx.out,
    )
    return code


# --------------------------------------------------------------- kernels.lock: --lock, --check


def _run_lock(pattern: str | None, build_dir: Path, ctx: Context) -> int:
    from metrale_orch.resources import (  # see run_resources
        LOCK_NAME,
        ResourceLock,
        collect_resources,
        read_lock,
        update_lock,
        write_lock,
    )

    path = ctx.root / LOCK_NAME
    # A partial lock keeps the other targets' entries: the old file must read first.
    old = read_lock(path, LOCK_NAME) if path.exists() else ResourceLock()
    report = collect_resources(ctx.root, build_dir, pattern, ctx.environ).report
    broken = [t for t in report.targets if t.status == "error"]
    for t in broken:
        print(printable(f"{t.target}: {t.detail}"), file=ctx.out)
    if broken:
        print(f"{LOCK_NAME} not written: {len(broken)} target(s) could not be read", file=ctx.out)
        return EXIT_FAILURE
    new = update_lock(old, report)
    for t in report.targets:
        kept = len(old.kernels_of(t.target))
        if t.status == "not-built" and kept:
            print(
                printable(f"{t.target}: not built; its {kept} locked kernels are kept"),
                file=ctx.out,
            )
    try:
        write_lock(path, new)
    except OSError as exc:
        raise UsageError(f"{LOCK_NAME}: cannot be written ({exc.strerror or exc})") from None
    locked = sum(len(t.kernels) for t in new.targets)
    fresh = sum(1 for t in report.targets if t.status == "ok" for _ in t.kernels)
    print(
        printable(
            f"{LOCK_NAME}: {locked} kernels of {len(new.targets)} targets "
            f"({fresh} from this build{', ' + repr(pattern) if pattern else ''})"
        ),
        file=ctx.out,
    )
    return EXIT_OK


def _run_check(args: argparse.Namespace, build_dir: Path, ctx: Context) -> int:
    from metrale_orch.resources import LOCK_NAME, check_lock, collect_resources, read_lock

    lock = read_lock(ctx.root / LOCK_NAME, LOCK_NAME)  # a bad lock stops before any ptxas
    report = collect_resources(ctx.root, build_dir, args.pattern, ctx.environ).report
    result = check_lock(lock, report, args.max_register_growth)
    if args.json:
        print(readable_json(result.to_dict()), file=ctx.out)
    elif args.format == "markdown":
        print(_check_markdown(result), file=ctx.out)
    else:
        for problem in result.problems:
            print(printable(_problem_line(problem, result.max_register_growth)), file=ctx.out)
        print(printable(_check_summary(result)), file=ctx.out)
    return EXIT_FAILURE if result.problems else EXIT_OK


#: How a problem is named in a line and a table.
_ISSUES = {
    "new-spill": "new spill",
    "more-spill": "more spill bytes",
    "new-stack": "new stack frame",
    "register-growth": "register growth",
    "missing": "not in kernels.lock",
    "not-built": "not built",
    "error": "unreadable",
}


def _spills(k: KernelResources) -> str:
    return f"spill stores {_bytes(k.spill_store_bytes)} B, loads {_bytes(k.spill_load_bytes)} B"


def _sides(p: LockProblem, growth: int) -> tuple[str, str]:
    """(the lock's side, this build's side) of a problem, as short text."""
    was, now = p.locked, p.now
    if now is None:  # a whole target: detail says it all
        return "", p.detail
    if was is None:
        return "absent", _summary(now)
    if p.issue in ("new-spill", "more-spill"):
        return _spills(was), _spills(now)
    if p.issue == "new-stack":
        return f"stack {was.stack_bytes} B", f"stack {now.stack_bytes} B"
    gained = now.registers - was.registers
    return f"{was.registers} regs", f"{now.registers} regs (+{gained}, allowed +{growth})"


def _problem_line(p: LockProblem, growth: int) -> str:
    was, now = _sides(p, growth)
    if not p.kernel:
        return f"{p.target}: {now}"
    return f"{p.target} {p.kernel} {p.arch}: {_ISSUES[p.issue]}: {was} → {now}"


def _check_summary(result: LockCheck) -> str:
    checked = (
        f"{result.kernels} kernel{'s' * (result.kernels != 1)} of {result.targets} "
        f"built target{'s' * (result.targets != 1)}"
    )
    stale = (
        f"; {result.drift} changed within limits (`metrale-orch resources --lock` records them)"
        if result.drift
        else ""
    )
    n = len(result.problems)
    if n:
        return (
            f"resources --check: {n} problem{'s' * (n != 1)} against kernels.lock; "
            f"{checked} checked (--max-register-growth {result.max_register_growth}){stale}"
        )
    return f"resources --check: {checked} match kernels.lock{stale}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _check_markdown(result: LockCheck) -> str:
    lines = ["### Kernel resources against `kernels.lock`", ""]
    if result.problems:
        lines += [
            "| target | kernel | arch | problem | kernels.lock | this build |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for p in result.problems:
            was, now = _sides(p, result.max_register_growth)
            kernel = f"`{p.kernel}`" if p.kernel else ""
            cells = (p.target, kernel, p.arch, _ISSUES[p.issue], was, now)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    lines.append(_check_summary(result))
    return printable("\n".join(lines))
