"""``metrale-orch sass-diff BASE_BUILD_DIR [PATTERN] [--json]``: the kernels whose machine
code changed from a base build directory to this project's build directory, each with the
unified diff of its normalised SASS (the comparison is :mod:`metrale_orch.sass`; this
module parses arguments and formats).

Exit codes: 0 when no kernel changed; 1 when one did (for CI), or a target could not be
compared; 2 for a usage error, a missing disassembler, or an artefact that is missing or
not what its manifest records.
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
    from metrale_orch.sass import KernelDiff, SassDiff


def register(sub: Subparsers) -> None:
    """Add ``sass-diff``."""
    p = add_command(
        sub,
        "sass-diff",
        run_sass_diff,
        help="the kernels whose machine code changed since a base build directory",
        description=(
            "For each kernel whose machine code changed between BASE_BUILD_DIR and this "
            "project's build directory: a one-line count and the unified diff of its SASS "
            "(cuobjdump or nvdisasm; PTX is assembled with ptxas for its arch first), with "
            "register numbers, branch addresses and labels normalised so that a rebuild of "
            "the same source shows nothing. Modules whose artefacts are byte-identical are "
            "not disassembled; a change is shown once, with every target that installs the "
            "same artefacts. Every artefact is first checked against its manifest's hash. "
            "Exit 1 when any kernel changed, 0 when none, 2 when either directory's "
            "artefacts are not those its manifests list."
        ),
    )
    p.add_argument("base", metavar="BASE_BUILD_DIR", type=Path, help="the build to compare with")
    add_pattern(p)
    p.add_argument("--json", action="store_true", help="print JSON")


def run_sass_diff(args: argparse.Namespace, ctx: Context) -> int:
    # Imported here, as cli/_resources imports the report: the comparison needs the
    # toolchains and the artefact readers, which no other command should pay for.
    from metrale_orch.sass import compare_builds

    if not args.base.is_dir():
        raise UsageError(
            f"sass-diff {args.base}: not a directory; name the base build directory "
            "(a copy of an earlier build's build/)"
        )
    got = compare_builds(ctx.root, args.base, ctx.config().build_dir, args.pattern, ctx.environ)
    code = EXIT_FAILURE if got.changes or got.failed else EXIT_OK
    if args.json:
        doc = {
            "base": got.base,
            "build": got.build,
            "changes": [c.to_dict() for c in got.changes],
            "notes": [
                {"target": n.target, "status": n.status, "detail": n.detail} for n in got.notes
            ],
            "modules": got.modules,
            "disassembled": got.disassembled,
        }
        print(readable_json(doc), file=ctx.out)
        return code
    for change in got.changes:
        print(printable(_count_line(change)), file=ctx.out)
        for line in change.diff:
            print(printable(line), file=ctx.out)
    for note in got.notes:
        if note.status == "error":
            print(printable(f"{note.target}: {note.detail}"), file=ctx.out)
    print(printable(_summary(got)), file=ctx.out)
    return code


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _count_line(c: KernelDiff) -> str:
    """The change's line, naming every target that installs it (one change, one diff)."""
    where = f"{', '.join(c.targets)}: {c.module}: {c.kernel} ({c.arch})"
    if c.kind == "added":
        return f"{where}: new, {_plural(c.added, 'line')}"
    if c.kind == "removed":
        return f"{where}: gone, was {_plural(c.removed, 'line')}"
    return f"{where}: {_plural(c.changed_lines, 'line')} changed (+{c.added} -{c.removed})"


def _summary(got: SassDiff) -> str:
    changed = len(got.changes)
    what = f"{_plural(changed, 'kernel')} changed" if changed else "no kernel changed"
    installing = len({t for c in got.changes for t in c.targets})
    if installing > 1:
        what += f" in {_plural(installing, 'target')}"
    skipped = [
        f"{_plural(n, 'target')} {label}"
        for status, label in (
            ("no-sass", "without SASS"),
            ("not-built", "built in neither"),
            ("error", "not compared"),
        )
        if (n := sum(note.status == status for note in got.notes))
    ]
    tail = "; " + ", ".join(skipped) if skipped else ""
    return (
        f"sass-diff {got.base} → {got.build}: {what} ({_plural(got.modules, 'module')}, "
        f"{got.disassembled} disassembled{tail})"
    )
