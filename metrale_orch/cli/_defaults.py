"""``metrale-orch defaults HW [--json]``: a hardware's serving defaults under this environment.

Reads ``kernels/LEVERS.toml`` (the tree's own levers) and
``kernels/HW/HARDWARE.toml`` and resolves them against the command's
environment (``ctx.environ``, not the process-wide cache), then prints the
summary line or, with ``--json``, every lever's value and source.
``metrale-orch defaults --docs`` prints the levers' Markdown reference, the
tree's own levers included.
"""

from __future__ import annotations

import argparse
import tomllib
from typing import TYPE_CHECKING

from metrale_orch.canonical import readable_json
from metrale_orch.defaults import (
    DefaultsError,
    UnknownHardwareError,
    format_levers,
    read_defaults,
    read_tree_levers,
    render_docs,
    resolve,
)
from metrale_orch.errors import UsageError
from metrale_orch.fsutil import parse_toml

if TYPE_CHECKING:
    from metrale_orch.cli import Context


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``defaults`` to ``sub``."""
    parser = sub.add_parser(
        "defaults",
        help="show a hardware's serving defaults resolved against the environment",
        description="Print the target-defaults summary line of kernels/HW/HARDWARE.toml, "
        "resolved against the METRALE_* variables of this environment (levers declared in "
        "kernels/LEVERS.toml included).",
    )
    parser.add_argument("hw", metavar="HW", nargs="?", help="hardware directory under kernels/")
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--json", action="store_true", help="print every lever's value and source as JSON"
    )
    what.add_argument(
        "--docs",
        action="store_true",
        help="print the levers' Markdown reference, this tree's own levers included (no HW)",
    )
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace, ctx: Context) -> int:
    hw: str | None = args.hw
    kernels = ctx.root / "kernels"
    if args.docs:
        if hw is not None:
            raise UsageError("defaults --docs takes no HW: the reference covers every hardware")
        print(render_docs(read_tree_levers(kernels).levers), end="", file=ctx.out)
        return 0
    if hw is None:
        raise UsageError("defaults: name a hardware (a directory under kernels/), or pass --docs")
    if hw in ("", ".", "..") or "/" in hw or "\\" in hw:
        raise UsageError(f"defaults: {hw!r} is not a hardware name (a directory under kernels/)")
    rel = f"kernels/{hw}/HARDWARE.toml"
    path = kernels / hw / "HARDWARE.toml"
    if path.exists() and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        raise DefaultsError(
            f"{rel}: is {what}, not a TOML file: make it a file (or remove it)", path=rel
        )
    if not path.is_file():
        raise UnknownHardwareError(path=rel, hw=hw)
    levers = read_tree_levers(kernels).levers
    try:
        parse_toml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        print(f"warning: {rel} does not parse ({exc}); the build uses the baseline", file=ctx.err)
    resolved = resolve(read_defaults(kernels, hw, levers=levers), ctx.environ.get)
    if args.json:
        print(readable_json(resolved.to_dict()), file=ctx.out)
    else:
        print(format_levers(resolved), file=ctx.out)
    return 0
