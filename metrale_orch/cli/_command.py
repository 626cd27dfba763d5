"""The preamble the command modules share: a command's subparser bound to the function that
runs it, and the optional PATTERN argument the reporting commands take (``coverage``,
``resources``, ``sass-diff``, ``size``, ``matrix``), so that each says it the same way."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from metrale_orch.cli import Context

#: What every module's ``register`` is handed: ``metrale-orch``'s subcommands.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
#: A command's body: the parsed arguments and the run's context in, the exit status out.
Run: TypeAlias = "Callable[[argparse.Namespace, Context], int]"

TARGET_PATTERN = "fnmatch wildcard over hw/model/quant, as `doit build:hopper/*` (quote it)"


def add_command(
    sub: Subparsers, name: str, run: Run, *, help: str, description: str
) -> argparse.ArgumentParser:
    """Add the subcommand ``name`` (its ``help`` line and ``description``), run by ``run``."""
    parser = sub.add_parser(name, help=help, description=description)
    parser.set_defaults(run=run)
    return parser


def add_pattern(parser: argparse.ArgumentParser, help: str = TARGET_PATTERN) -> None:
    """Add the optional ``PATTERN`` positional (the targets to report on; default: all)."""
    parser.add_argument("pattern", nargs="?", metavar="PATTERN", help=help)
