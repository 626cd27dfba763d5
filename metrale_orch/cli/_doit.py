"""``metrale-orch [--root DIR] [--set KEY=VALUE]... doit ARGS``: ``doit ARGS`` (same
arguments, same exit status), except that a ``pyproject.toml`` or ``doit.cfg`` doit cannot
read is one line naming the file (for TOML, the line and column), exit 2, instead of doit's
traceback (see :mod:`metrale_orch.tasks.launch` for why ``doit`` itself cannot say it).

The options before ``doit`` are obeyed as for every other command: doit runs in the root
that ``--root`` (or ``METRALE_ORCH_ROOT``) names, else in the working directory, and each
``--set`` reaches the run as the setting's environment variable, which the command line
outranks. A bad setting (``--set``, environment or ``pyproject.toml``) is refused before
doit starts, as every command refuses it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch.config import setting_variables

if TYPE_CHECKING:
    from metrale_orch.cli import Context

__all__ = ["applied", "register"]


@contextlib.contextmanager
def applied(workdir: Path | None, variables: Mapping[str, str]) -> Iterator[None]:
    """Run the block in ``workdir`` (None: here) with ``variables`` set, then put both back
    (tests call the CLI in their own process)."""
    old_cwd = os.getcwd()
    old_env = {name: os.environ.get(name) for name in variables}
    try:
        if workdir is not None:
            os.chdir(workdir)
        os.environ.update(variables)
        yield
    finally:
        os.chdir(old_cwd)
        for name, value in old_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.tasks.launch import run_doit  # doit's import: only for this command

    variables = setting_variables(ctx.overrides)  # ConfigError for a key no run can take
    rooted = args.root is not None or bool(ctx.environ.get("METRALE_ORCH_ROOT"))
    with applied(ctx.root if rooted else None, variables):
        return run_doit(args.doit_args)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``doit`` to ``sub``."""
    parser = sub.add_parser(
        "doit",
        help="run doit (doit ARGS) in the project root, with the options before `doit` "
        "applied, reading pyproject.toml and doit.cfg first",
        description="`doit ARGS` in the project root given by --root (else the current "
        "directory), with every --set applied to the run, and one clear line instead of "
        "a traceback when doit cannot read pyproject.toml or doit.cfg.",
        add_help=False,  # `metrale-orch doit --help` is doit's
        prefix_chars="\0",  # every argument after `doit` is doit's, options included
    )
    parser.add_argument("doit_args", nargs=argparse.REMAINDER, metavar="ARGS")
    parser.set_defaults(run=_run)
