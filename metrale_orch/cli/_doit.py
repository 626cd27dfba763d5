"""``metrale-orch doit ARGS``: ``doit ARGS`` (same arguments, same working directory, same
exit status), except that a ``pyproject.toml`` or ``doit.cfg`` doit cannot read is one
line naming the file (for TOML, the line and column), exit 2, instead of doit's
traceback (see :mod:`metrale_orch.tasks.launch` for why ``doit`` itself cannot say it).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metrale_orch.cli import Context

__all__ = ["register"]


def _run(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.tasks.launch import run_doit  # doit's import: only for this command

    return run_doit(args.doit_args)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``doit`` to ``sub``."""
    parser = sub.add_parser(
        "doit",
        help="run doit (doit ARGS), reading pyproject.toml and doit.cfg first",
        description="`doit ARGS` in the current directory, with one clear line instead of "
        "a traceback when doit cannot read pyproject.toml or doit.cfg.",
        add_help=False,  # `metrale-orch doit --help` is doit's
        prefix_chars="\0",  # every argument after `doit` is doit's, options included
    )
    parser.add_argument("doit_args", nargs=argparse.REMAINDER, metavar="ARGS")
    parser.set_defaults(run=_run)
