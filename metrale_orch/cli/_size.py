"""``metrale-orch size [PATTERN] [--json | --format markdown]``: the bytes a build installed,
per target, module and arch, against ``[tool.metrale-orch.size_budget]`` (the sizes and
the budget check are :mod:`metrale_orch.gate.size`; this module parses arguments
and formats).

Exit codes: 0; 1 when a target is over its budget or its manifest or artefacts could not
be read; 2 for a usage error or a bad budget (a value, or a key naming nothing of the tree).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from metrale_orch.canonical import readable_json
from metrale_orch.cli._command import Subparsers, add_command, add_pattern
from metrale_orch.errors import EXIT_FAILURE, EXIT_OK, printable

if TYPE_CHECKING:
    from metrale_orch.cli import Context
    from metrale_orch.gate import Duplicate, ModuleSize, SizeCheck, TargetBudget

__all__ = ["register"]

_HEADER = ("target", "module", "arch", "bytes")


def register(sub: Subparsers) -> None:
    """Add ``size``."""
    p = add_command(
        sub,
        "size",
        run_size,
        help="bytes per target, module and arch of the installed artefacts, and the budget",
        description=(
            "The bytes of every built target's installed artefacts, per module and arch (a "
            "fatbin per image inside it), read from each target's manifest. A budget per "
            'hardware or target, [tool.metrale-orch.size_budget] (hopper = "40M", '
            '"hw/model/quant" = "12M"; a target\'s own key over its hardware\'s), bounds '
            "each target: one over it fails the command (for CI)."
        ),
    )
    add_pattern(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument(
        "--format",
        choices=("text", "markdown"),
        default="text",
        help="markdown: one table of the targets (a CI job summary)",
    )


def run_size(args: argparse.Namespace, ctx: Context) -> int:
    # Imported here, as cli/_resources does: the report's readers are needed by no other
    # command.
    from metrale_orch.config import source_label
    from metrale_orch.gate import check_sizes

    config = ctx.config()
    got = check_sizes(
        ctx.root,
        config.build_dir,
        args.pattern,
        config.size_budget,
        source_label(config, "size_budget"),
    )
    failed = (
        bool(got.breaches)
        or bool(got.duplicates)
        or any(t.status == "error" for t in got.report.targets)
    )
    if args.json:
        print(readable_json(got.to_dict()), file=ctx.out)
    elif args.format == "markdown":
        print(printable(_markdown(got)), file=ctx.out)
    else:
        _print_text(got, ctx)
    return EXIT_FAILURE if failed else EXIT_OK


def human_bytes(n: int) -> str:
    """``n`` bytes for people: ``812 B``, ``305.1 KiB``, ``40.0 MiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def _bytes(n: int) -> str:
    """``572 B``, ``3696 B (3.6 KiB)``: exact, and readable past a KiB."""
    return f"{n} B" if n < 1024 else f"{n} B ({human_bytes(n)})"


def _module_rows(target: str, m: ModuleSize) -> list[tuple[str, ...]]:
    """The module's row (its file's bytes); a fatbin of several images lists each below."""
    if len(m.images) == 1:
        return [(target, m.module, m.images[0].arch, str(m.bytes))]
    images = [("", "", f"  {i.arch}", str(i.bytes)) for i in m.images]
    return [(target, m.module, "fatbin", str(m.bytes)), *images]


def _budget_text(b: TargetBudget) -> str:
    from metrale_orch.gate import budget_key_name  # see run_size

    if b.over:
        return f"over its budget of {human_bytes(b.limit)} ({budget_key_name(b.key)})"
    return f"budget {human_bytes(b.limit)} ({budget_key_name(b.key)})"


def _print_text(got: SizeCheck, ctx: Context) -> None:
    report = got.report
    rows = [row for t in report.targets for m in t.modules for row in _module_rows(t.target, m)]
    if rows:
        widths = [max(len(r[i]) for r in (_HEADER, *rows)) for i in range(len(_HEADER))]
        for row in (_HEADER, *rows):
            cells = [
                cell.rjust(w) if i == 3 else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ]
            print(printable("  ".join(cells).rstrip()), file=ctx.out)
    budgets = {b.target: b for b in got.budgets}
    for t in report.targets:
        if t.status != "ok":
            print(printable(f"{t.target}: {t.detail}"), file=ctx.out)
            continue
        n = len(t.modules)
        line = f"{t.target}: {_bytes(t.bytes)} in {n} module{'s' * (n != 1)}"
        if t.target in budgets:
            line += f"; {_budget_text(budgets[t.target])}"
        print(printable(line), file=ctx.out)
    for target, dup in got.duplicates:
        print(printable(_duplicate_text(target, dup)), file=ctx.out)
    print(printable(_summary(got)), file=ctx.out)


def _duplicate_text(target: str, dup: Duplicate) -> str:
    return (
        f"{target}: duplicate entry {dup.entry}: exported by the modules "
        f"{', '.join(dup.modules)} (installed twice; a loader could get either)"
    )


def _summary(got: SizeCheck) -> str:
    built = [t for t in got.report.targets if t.status == "ok"]
    total = sum(t.bytes for t in built)
    over = len(got.breaches)
    return (
        f"size: {len(built)} built target{'s' * (len(built) != 1)}, {human_bytes(total)}; "
        f"{len(got.budgets)} with a budget, {over} over it"
        + (f"; {len(got.duplicates)} duplicate entries" if got.duplicates else "")
    )


def _markdown(got: SizeCheck) -> str:
    budgets = {b.target: b for b in got.budgets}
    lines = [
        "### Installed size",
        "",
        "| target | bytes | size | budget |",
        "| --- | ---: | ---: | --- |",
    ]
    for t in got.report.targets:
        if t.status != "ok":
            lines.append(f"| {t.target} | | | {t.detail.replace('|', '/')} |")
            continue
        b = budgets.get(t.target)
        budget = "" if b is None else _budget_text(b)
        if b is not None and b.over:
            budget = f"**{budget}**"
        lines.append(f"| {t.target} | {t.bytes} | {human_bytes(t.bytes)} | {budget} |")
    if got.duplicates:
        lines += ["", *(f"- {_duplicate_text(target, d)}" for target, d in got.duplicates)]
    lines += ["", _summary(got)]
    return "\n".join(lines)
