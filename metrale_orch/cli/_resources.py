"""``metrale-orch resources [PATTERN] [--json] [--diff OTHER_BUILD_DIR]``: registers, static
shared memory, stack frame and spills per kernel per arch (the report is
:mod:`metrale_orch.resources`; this module parses arguments and formats).

Exit codes: 0; 1 when a target's manifest or artefacts could not be read, or with
``--diff`` when a kernel spills where it did not (or spills more); 2 for a usage error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch.canonical import readable_json
from metrale_orch.errors import EXIT_FAILURE, EXIT_OK, UsageError, printable

if TYPE_CHECKING:
    from metrale_orch.cli import Context
    from metrale_orch.resources import Collected, KernelChange, KernelResources, ResourceReport

_HEADER = ("target", "kernel", "arch", "regs", "smem B", "stack B", "spill st B", "spill ld B")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``resources``."""
    p = sub.add_parser(
        "resources",
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
    p.add_argument(
        "pattern",
        nargs="?",
        metavar="PATTERN",
        help="fnmatch wildcard over hw/model/quant, as `doit build:hopper/*` (quote it)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--diff",
        metavar="OTHER_BUILD_DIR",
        type=Path,
        help="print only what changed from OTHER_BUILD_DIR to this build; exit 1 when a "
        "kernel spills where it did not, or spills more (for CI)",
    )
    p.set_defaults(run=run_resources)


def run_resources(args: argparse.Namespace, ctx: Context) -> int:
    # Imported here, as cli/_build imports the build: every command builds the parser, which
    # imports this module, and the report needs the toolchains and the artefact readers
    # (~0.1 s of imports that no other command should pay).
    from metrale_orch.resources import collect_resources

    environ = ctx.environ
    build_dir = ctx.config().build_dir
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
    mark = "  [new spill]" if c.new_spill else ""
    return f"{c.target} {c.kernel} {c.arch}: {what}{mark}"


def _print_diff(old: ResourceReport, new: ResourceReport, as_json: bool, ctx: Context) -> int:
    from metrale_orch.resources import diff_reports  # see run_resources

    changes = diff_reports(old, new)
    spills = sum(c.new_spill for c in changes)
    code = EXIT_FAILURE if spills else EXIT_OK
    if as_json:
        doc = {
            "old": old.build_dir,
            "new": new.build_dir,
            "changes": [c.to_dict() for c in changes],
            "new_spills": spills,
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
        ),
        file=ctx.out,
    )
    return code
