"""``metrale-orch matrix``: print the CI matrix (a GitHub Actions ``strategy.matrix``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch import matrix as mx
from metrale_orch.canonical import canonical_json, readable_json
from metrale_orch.cli._command import Subparsers, add_command, add_pattern
from metrale_orch.paths import STATE_DIR
from metrale_orch.steps.times import kept_problems

if TYPE_CHECKING:
    from metrale_orch.cli import Context


def register(sub: Subparsers) -> None:
    """Add ``matrix``."""
    p = add_command(
        sub,
        "matrix",
        run_matrix,
        help="print the CI matrix: one row per hardware on its build runner class",
        description=(
            'Print a GitHub Actions strategy.matrix object ({"include": [rows]}) as one line '
            "of JSON: one row per hardware tree with its targets, the runs-on labels of its "
            f"build runner class (from {mx.DEFAULT_RUNNERS_FILE}), the build selector "
            "(build:<hw>/*), the smoke task (smoke:<hw>, empty where the hardware smokes "
            "on another class: see --smoke-rows) and whether its toolchain is installed "
            "on that runner class. --shards N splits the build rows into N rows in all, "
            "balanced by the kept compile seconds (<build_dir>/.state/target-times.json; "
            "a target never built by its module count). Rows are sorted and stable."
        ),
    )
    add_pattern(p, "fnmatch pattern over hardware names (hopper, h*) or targets (hopper/qwen3/*)")
    p.add_argument(
        "--runners",
        type=Path,
        metavar="PATH",
        help=f"runner map (default: <root>/{mx.DEFAULT_RUNNERS_FILE})",
    )
    p.add_argument(
        "--allow-unmapped",
        action="store_true",
        help="leave hardware without a runner out of the matrix (with a warning) "
        "instead of failing",
    )
    p.add_argument(
        "--shard-size",
        type=int,
        metavar="N",
        help="split each hardware into rows of at most N targets, balanced by the kept "
        "compile seconds (module counts without them)",
    )
    p.add_argument(
        "--shards",
        action="append",
        default=[],
        metavar="N|HW=N",
        help="N: N build rows in all, shared among the hardware by their kept compile "
        "seconds (one each at least) and balanced within each (the slowest near "
        "total/N); HW=N: split hardware HW into N rows (repeatable; counted in N, and "
        "overrides --shard-size for HW)",
    )
    p.add_argument(
        "--smoke-rows",
        action="store_true",
        help="print instead one smoke-only row, on its smoke runner class, per hardware "
        "whose build rows do not smoke it (sharded, or smoked on another class than it "
        "builds on): for a job that runs smoke:<hw> after every build row, from cache hits",
    )
    p.add_argument(
        "--keep-times",
        type=Path,
        metavar="DIR",
        help="print no matrix: merge every target-times.json under DIR (the build rows' "
        "of a CI run) into the build directory's kept compile seconds, which the next "
        "--shards N balances by (a target a row did not compile keeps its older seconds)",
    )
    p.add_argument("--pretty", action="store_true", help="indent the JSON (for people)")


def run_matrix(args: argparse.Namespace, ctx: Context) -> int:
    if args.keep_times is not None:
        return _keep_times(args.keep_times, ctx)
    runners_file = args.runners if args.runners is not None else ctx.root / mx.DEFAULT_RUNNERS_FILE
    runners = mx.load_runners(runners_file, ctx.root)
    total, shards = mx.parse_shards(args.shards)
    if args.shard_size is not None and args.shard_size < 1:
        raise mx.ShardSpecError(f"--shard-size {args.shard_size}", "N must be at least 1")
    hardware = mx.scan_tree(ctx.root)
    times = mx.read_kept_seconds(ctx.config().build_dir)
    for problem in kept_problems(ctx.config().build_dir / STATE_DIR):
        print(f"warning: {problem}; the rows are balanced without it", file=ctx.err)
    plan = mx.plan_smoke_matrix if args.smoke_rows else mx.plan_matrix
    matrix = plan(
        hardware,
        runners,
        pattern=args.pattern,
        allow_unmapped=args.allow_unmapped,
        shard_size=args.shard_size,
        shards=shards,
        total_shards=total,
        times=times,
    )
    if args.allow_unmapped:
        unmapped = mx.unmapped_hardware(hardware, runners, args.pattern)
        if unmapped:
            print(
                f"warning: {runners.path}: no runner for {', '.join(unmapped)}; "
                "left out of the matrix",
                file=ctx.err,
            )
    text = readable_json(matrix) if args.pretty else canonical_json(matrix)
    print(text, file=ctx.out)
    return 0


def _keep_times(found: Path, ctx: Context) -> int:
    if not found.is_dir():
        raise mx.MatrixError(f"--keep-times {found}: not a directory")
    build_dir = ctx.config().build_dir
    try:
        files, targets = mx.keep_seconds(build_dir, found)
    except OSError as exc:
        raise mx.MatrixError(f"cannot keep the compile seconds under {build_dir}: {exc}") from None
    print(
        f"kept the compile seconds of {targets} targets ({files} files read from {found})",
        file=ctx.out,
    )
    return 0
