"""``metrale-orch coverage [PATTERN] [--json]``: does the build hold every kernel each
target's deployment will look up? (the checks are :mod:`metrale_orch.gate`; this module
parses arguments and formats).

Exit codes: 0 and a one-line summary when there is no problem; 1 with one line per
problem (``<target>: <module>: <what>``) otherwise; 2 for a usage, tree or configuration
error.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from metrale_orch.canonical import readable_json
from metrale_orch.cli._command import Subparsers, add_command, add_pattern
from metrale_orch.errors import EXIT_FAILURE, EXIT_OK, printable

if TYPE_CHECKING:
    from metrale_orch.cli import Context


def register(sub: Subparsers) -> None:
    """Add ``coverage``."""
    p = add_command(
        sub,
        "coverage",
        run_coverage,
        help="check the build exports every kernel the tree's family and fusion files name",
        description=(
            "For every selected target of the last build: each module has an artefact for "
            "the hardware's arch; each PTX assembles with ptxas (answers cached in the "
            "build directory's .state/); no PTX ISA is newer than "
            "[tool.metrale-orch.deploy.<hw>] min_cuda allows; every kernel named by the "
            "hardware's KERNEL_FAMILIES.toml or FUSIONS.toml (common layers, own or "
            "inherited) is exported by its module, and each named module is built by some "
            "target; no entry is exported by two modules of one target. One line per "
            "problem, exit 1; `doit coverage` builds first."
        ),
    )
    add_pattern(p)
    p.add_argument("--json", action="store_true", help="print JSON")


def run_coverage(args: argparse.Namespace, ctx: Context) -> int:
    # Imported here, as cli/_resources does: the gate imports the toolchains, the plan and
    # the artefact readers, which no other command should pay for.
    from metrale_orch.gate import check_coverage

    got = check_coverage(ctx.config(), args.pattern, ctx.environ)
    if args.json:
        print(readable_json(got.report.to_dict()), file=ctx.out)
    else:
        for line in got.lines():
            print(printable(line), file=ctx.out)
    return EXIT_OK if got.report.ok else EXIT_FAILURE
