"""``metrale-orch why-miss TARGET [MODULE] [--remote] [--json] [--exit-code]``: why a
target's modules miss the cache, by the part of their key that differs.

The target is planned, staged and keyed as its build does, nothing compiled
(:mod:`metrale_orch.steps.whymiss`), under the project's build lock (staging writes the
build directory). Each module's key is looked up in the local tier, or with ``--remote``
the remote bucket tier (listed, headers only; a REAPI action cache cannot be listed).
One line per module that hits; for a module that misses, one line naming the nearest
stored entry of the module, then one line per difference
(``<target>: <module>: <what>``, sorted); a last line counts the misses.

Exit codes: 0 when it could explain (hits, misses, or nothing stored: an explanation is
not a failure); with ``--exit-code``, 1 when any module misses (as ``status --exit-code``);
1 when the remote tier cannot be read; 2 for a malformed or unknown target, an unknown
module, or a tree or configuration error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch.canonical import readable_json
from metrale_orch.errors import EXIT_FAILURE, EXIT_OK, printable
from metrale_orch.paths import BUILD_TASK

if TYPE_CHECKING:
    from metrale_orch.cli import Context
    from metrale_orch.steps.whymiss import ModuleMiss, WhyMiss

__all__ = ["format_lines", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``why-miss``."""
    p = sub.add_parser(
        "why-miss",
        help="say why a target's modules miss the cache, by the part of their key that differs",
        description="For each module of TARGET (or MODULE alone) whose key the local cache "
        "(--remote: the remote bucket) has no entry of, the nearest stored entry of the "
        "same module and what differs: the source, which header, which flag or define, the "
        "arch, the toolchain, an environment variable. Nothing is compiled: the target is "
        "staged and keyed as its build does.",
    )
    p.add_argument("target", help="hw/model/quant")
    p.add_argument("module", nargs="?", help="one module (its name, stem or entry file)")
    p.add_argument(
        "--remote",
        action="store_true",
        help="look in the remote bucket tier instead of the local one (lists the bucket and "
        "reads each entry's header: one request per entry)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--exit-code", action="store_true", help="exit 1 when any module misses (for CI)"
    )
    p.set_defaults(run=run_why_miss)


def run_why_miss(args: argparse.Namespace, ctx: Context) -> int:
    # Imported here: keying a target needs the whole build step (see cli/_compdb).
    from metrale_orch.steps.whymiss import explain_misses, parse_target
    from metrale_orch.tasks.runlock import BuildLock
    from metrale_orch.views.status import select_specs

    config = ctx.config()
    target = args.target.removeprefix(BUILD_TASK + ":")
    parse_target(target)  # a malformed name says so, before the tree is asked
    # A target the tree does not have is refused as `status` and `why` refuse it (keying
    # it would stage the hardware's common files alone and report them).
    select_specs(ctx.root.resolve(), ctx.environ, target, config)

    def say(line: str) -> None:
        ctx.err.write(printable(line) + "\n")
        ctx.err.flush()

    lock = BuildLock(Path(config.build_dir))
    lock.acquire(say)
    try:
        result = explain_misses(
            ctx.root.resolve(),
            target,
            config=config,
            environ=ctx.environ,
            module=args.module,
            remote=args.remote,
        )
    finally:
        lock.release()
    for warning in result.warnings:
        say(f"warning: {warning}")
    if args.json:
        ctx.out.write(readable_json(result.to_dict()) + "\n")
    else:
        for line in format_lines(result):
            ctx.out.write(printable(line) + "\n")
    return EXIT_FAILURE if args.exit_code and result.misses else EXIT_OK


def format_lines(result: WhyMiss) -> list[str]:
    """The lines ``why-miss`` prints (pure)."""
    lines: list[str] = []
    for module in result.modules:
        head = f"{result.target}: {module.module}: "
        lines.append(head + _summary(module, result))
        lines.extend(head + change.text for change in module.changes)
    n = len(result.modules)
    verb = "misses" if result.misses == 1 else "miss"
    lines.append(
        f"{result.target}: {result.misses} of {n} module{'s' if n != 1 else ''} "
        f"{verb} the {result.tier}"
    )
    return lines


def _summary(module: ModuleMiss, result: WhyMiss) -> str:
    key = module.key[:12]
    if module.outcome == "hit":
        return f"hit ({key})"
    if module.outcome == "stale":
        return f"miss: its entry {key} was compiled from files that changed since"
    if module.outcome == "untrusted":
        return f"miss: its entry {key} is not signed by a trusted key (cache_trusted_keys)"
    if not module.nearest:
        unrecorded = (
            f" ({result.unrecorded} stored entries have no record of their key's parts: "
            "stored before records were kept)"
            if result.unrecorded
            else ""
        )
        return f"miss ({key}): no stored entry of this module{unrecorded}"
    n = len(module.changes)
    return (
        f"miss ({key}): nearest entry {module.nearest[:12]} (stored by "
        f"{module.nearest_target}), {n} difference{'s' if n != 1 else ''}"
    )
