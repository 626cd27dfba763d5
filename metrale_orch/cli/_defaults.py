"""``metrale-orch defaults HW [--json]``: a hardware's serving defaults under this environment.

Reads ``kernels/HW/HARDWARE.toml`` and resolves it against the command's
environment (``ctx.environ``, not the process-wide cache), then prints the
summary line or, with ``--json``, every lever's value and source.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from typing import TYPE_CHECKING

from metrale_orch.defaults import (
    DefaultsError,
    UnknownHardwareError,
    format_levers,
    read_defaults,
    resolve,
)
from metrale_orch.errors import UsageError

if TYPE_CHECKING:
    from metrale_orch.cli import Context


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``defaults`` to ``sub``."""
    parser = sub.add_parser(
        "defaults",
        help="show a hardware's serving defaults resolved against the environment",
        description="Print the target-defaults summary line of kernels/HW/HARDWARE.toml, "
        "resolved against the METRALE_* variables of this environment.",
    )
    parser.add_argument("hw", metavar="HW", help="hardware directory under kernels/")
    parser.add_argument(
        "--json", action="store_true", help="print every lever's value and source as JSON"
    )
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace, ctx: Context) -> int:
    hw: str = args.hw
    if hw in ("", ".", "..") or "/" in hw or "\\" in hw:
        raise UsageError(f"defaults: {hw!r} is not a hardware name (a directory under kernels/)")
    rel = f"kernels/{hw}/HARDWARE.toml"
    path = ctx.root / "kernels" / hw / "HARDWARE.toml"
    if path.exists() and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        raise DefaultsError(
            f"{rel}: is {what}, not a TOML file: make it a file (or remove it)", path=rel
        )
    if not path.is_file():
        raise UnknownHardwareError(path=rel, hw=hw)
    try:
        tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        print(f"warning: {rel} does not parse ({exc}); the build uses the baseline", file=ctx.err)
    levers = resolve(read_defaults(ctx.root / "kernels", hw), ctx.environ.get)
    if args.json:
        print(json.dumps(levers.to_dict(), indent=2, sort_keys=True), file=ctx.out)
    else:
        print(format_levers(levers), file=ctx.out)
    return 0
