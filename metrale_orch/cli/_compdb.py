"""``metrale-orch compdb [PATTERN]``: write ``<build_dir>/compile_commands.json`` for
chosen targets without compiling (the staging and the database are
:mod:`metrale_orch.views.editor`'s; this module parses the arguments and formats).

Exit codes: 0; 1 or 2 when a chosen target could not be staged (its error's status:
2 for a tree or configuration error; the database of the others is written anyway);
1 when the build directory cannot be written.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from metrale_orch.errors import EXIT_FAILURE, EXIT_OK, printable
from metrale_orch.paths import COMPDB_NAME, root_relative

if TYPE_CHECKING:
    from metrale_orch.cli import Context
    from metrale_orch.views.editor import CompdbRun

__all__ = ["format_run", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``compdb``."""
    p = sub.add_parser(
        "compdb",
        help=f"write <build_dir>/{COMPDB_NAME} for editors (clangd) without compiling",
        description=(
            f"Stage the chosen targets as their build does and write <build_dir>/{COMPDB_NAME}"
            " (a JSON Compilation Database: clangd in VS Code, CLion, Neovim) from their "
            "compile commands, without compiling. Every `doit build` that runs writes it "
            "too, for every target built so far (a file several targets compile gets the "
            "first in sorted order); name a target to see a tree file as that target "
            "compiles it."
        ),
    )
    p.add_argument(
        "pattern",
        nargs="?",
        metavar="TARGET",
        help="hw/model/quant, or an fnmatch wildcard as `doit build:hopper/*` (quote it); "
        "default: every target",
    )
    p.set_defaults(run=run_compdb)


def run_compdb(args: argparse.Namespace, ctx: Context) -> int:
    # Imported here, as cli/_resources imports its report: every command builds the
    # parser, which imports this module, and staging needs the whole build step.
    from metrale_orch.views.editor import write_compdb

    config = ctx.config()

    def say(line: str) -> None:
        ctx.err.write(printable(line) + "\n")
        ctx.err.flush()

    try:
        run = write_compdb(ctx.root, ctx.environ, args.pattern, config=config, say=say)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        say(f"error: cannot write the compilation database{where}: {exc.strerror or exc}")
        return EXIT_FAILURE
    for line in format_run(run, root_relative(run.written.path, ctx.root.resolve())):
        ctx.out.write(printable(line) + "\n")
    for difference in run.differences:
        ctx.err.write(printable(f"warning: {difference}") + "\n")
    for failed in run.failed:
        ctx.err.write(printable(f"error: {failed.target}: {failed.reason}") + "\n")
    return max((f.exit_code for f in run.failed), default=EXIT_OK)


def format_run(run: CompdbRun, shown: str) -> list[str]:
    """The lines ``compdb`` prints on stdout (pure); ``shown`` names the database."""
    written = run.written
    noun = "target" if len(written.targets) == 1 else "targets"
    state = "" if written.changed else " (unchanged)"
    entries = "entry" if written.entries == 1 else "entries"
    lines = [f"{shown}: {written.entries} {entries} from {len(written.targets)} {noun}{state}"]
    reasons: dict[str, list[str]] = {}
    for skip in run.skipped:
        reasons.setdefault(skip.reason, []).append(skip.target)
    for reason, targets in sorted(reasons.items()):
        more = f", … {len(targets) - 3} more" if len(targets) > 3 else ""
        lines.append(f"skipped {len(targets)} target(s): {reason} ({', '.join(targets[:3])}{more})")
    return lines
