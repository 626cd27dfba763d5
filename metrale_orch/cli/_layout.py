"""``metrale-orch layout`` and ``metrale-orch check``: look at the tree, and ask whether
the build will accept it (the checks live in :mod:`metrale_orch.graph.check`).

``layout`` shows each module under the name the build installs it as: the build's own
:func:`~metrale_orch.steps.plan.module_names` (``[modules]`` renames), never re-derived.
``--json`` prints ``dump(root)`` exactly (SPEC 1.7); the names join it only with
``--installed-names``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING

from metrale_orch import tree as lay
from metrale_orch.canonical import readable_json
from metrale_orch.errors import UsageError, printable
from metrale_orch.graph.check import check_tree, report_lines
from metrale_orch.steps.plan import module_names
from metrale_orch.tree.picture import FORMATS, draw_layout

if TYPE_CHECKING:
    from metrale_orch.cli import Context


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``layout`` and ``check``."""
    p = sub.add_parser(
        "layout",
        help="show a target's layers, entries, modules and shadows",
        description="Show how a target resolves. Without TARGET, list every target.",
    )
    p.add_argument("target", nargs="?", help="hw/model/quant")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print the dump format (SPEC 1.7)")
    shape.add_argument(
        "--format",
        choices=FORMATS,
        help="draw TARGET as a graph: layers as clusters, shadows struck through with their "
        "reason, `use` and redirects as edges (Graphviz dot, or Mermaid for Markdown)",
    )
    p.add_argument(
        "--installed-names",
        action="store_true",
        help="with --json, add each resolved target's module_names ({stem: installed name}, "
        "after [modules] renames), or module_names_error for a bad [modules] table; text "
        "and pictures always show installed names",
    )
    p.set_defaults(run=run_layout)

    c = sub.add_parser(
        "check",
        help="will the build accept this tree? report every problem at once",
        description=(
            "Report everything the build would refuse, before any kernel is compiled: every "
            "target resolves and stays inside kernels/ (no symlinks, no escaping include), "
            "every hardware's [defaults], kernels/LEVERS.toml, [hardware] arch, [build] flags, "
            "[modules] names, SMOKE.toml, vendor -> toolchain, toolchains/*.toml and "
            "pyproject.toml [tool.metrale-orch] are valid; also no shadow whose winner is "
            "byte-identical to its loser, no kernel file duplicated byte for byte, every file "
            "name UTF-8. Problems are grouped by file. Targets whose compiler is not "
            "installed, or cannot build their arch, are listed (the build skips them); likely "
            "typos are warnings. Exit 0 when the build will accept the tree, 2 with the list "
            "of problems."
        ),
    )
    c.set_defaults(run=run_check)


def _parse_target(text: str) -> lay.Target:
    try:
        return lay.Target.parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run_layout(args: argparse.Namespace, ctx: Context) -> int:
    root = ctx.root
    if args.installed_names and not args.json:
        raise UsageError("--installed-names needs --json (text and pictures always show them)")
    names_of = partial(module_names, root=root) if args.installed_names else None
    if args.target is None:
        if args.format:
            raise UsageError(f"--format {args.format} needs a TARGET (hw/model/quant)")
        if args.json:
            print(readable_json(lay.dump(root, names_of)), file=ctx.out)
            return 0
        return _list_targets(ctx)
    target = _parse_target(args.target)
    snap = lay.TreeSnapshot(root)
    try:
        layout = lay.discover(root, target, snap)
    except lay.LayoutError as exc:
        if args.json:
            print(readable_json({str(target): {"error": str(exc)}}), file=ctx.out)
            return 2
        raise
    if args.json:
        view = lay.layout_to_dict(layout, root, names_of)
        print(readable_json({str(target): view}), file=ctx.out)
        return 2 if "module_names_error" in view else 0
    names = module_names(layout, root)  # a bad [modules] table: one line, exit 2
    if args.format:
        ctx.out.write(draw_layout(layout, root, args.format, names))
        return 0
    _print_layout(layout, snap, names, ctx)
    return 0


def _list_targets(ctx: Context) -> int:
    results = lay.resolve_all(ctx.root)
    failed = 0
    for target, result in results:
        if isinstance(result, lay.LayoutError):
            failed += 1
            print(printable(f"{target}  error: {result}"), file=ctx.out)
        else:
            mods = len(result.modules())
            print(f"{target}  {mods} module{'s' if mods != 1 else ''}", file=ctx.out)
    print(f"{len(results)} targets, {failed} failing", file=ctx.out)
    return 2 if failed else 0


def _print_layout(
    layout: lay.Layout, snap: lay.TreeSnapshot, names: Mapping[str, str], ctx: Context
) -> None:
    out, rel = ctx.out, snap.rel
    hw = layout.hardware
    inherits = f", inherits {hw.inherits}" if hw.inherits else ""
    redirect = (
        f" (kernel_source -> {layout.source_model})"
        if layout.source_model != layout.target.model
        else ""
    )
    print(f"target {layout.target}{redirect}", file=out)
    print(f"hardware {hw.name}: vendor {hw.vendor}, arch {hw.arch or '-'}{inherits}", file=out)
    print("layers:", file=out)
    for i, layer in enumerate(layout.layers):
        state = "exists" if snap.is_dir(layer.dir) else "missing"
        manifest = "  KERNEL.toml" if layer.manifest else ""
        print(
            f"  {i} {layer.role.value:<6} {layer.tier.value:<6} {rel(layer.dir)}  "
            f"({state}){manifest}",
            file=out,
        )
    for title, entries, subdirs in (
        ("leaf", layout.leaf, layout.leaf_subdirs),
        ("common", layout.common, layout.common_subdirs),
    ):
        print(f"{title} entries:", file=out)
        if not entries and not subdirs:
            print("  (none)", file=out)
        width = max((len(n) for n in entries), default=0)
        for name, entry in entries.items():
            used = "  [use]" if entry.used else ""
            print(f"  {name:<{width}}  {rel(entry.source)}  (layer {entry.layer}){used}", file=out)
        for name, path in subdirs.items():
            print(f"  {name}/  {rel(path)}  (subdirectory)", file=out)
    print("modules:", file=out)
    mods = layout.modules()
    width = max((len(stem) for stem, _ in mods), default=0)
    for stem, entry in mods:
        role = layout.role_of(entry).value
        name = names.get(stem, stem)
        installed = f"  installed as {name}" if name != stem else ""
        print(f"  {stem:<{width}}  {rel(entry.source)}  ({role}){installed}", file=out)
    if not mods:
        print("  (none)", file=out)
    print("shadows:", file=out)
    for s in layout.shadows:
        print(
            f"  {s.role.value} {s.name}: {rel(s.winner)} replaces {rel(s.loser)} "
            f"-- {s.reason.strip()}",
            file=out,
        )
    if not layout.shadows:
        print("  (none)", file=out)


def run_check(args: argparse.Namespace, ctx: Context) -> int:
    del args
    report = check_tree(ctx.root, ctx.environ, ctx.config())
    for stream, line in report_lines(report):
        print(line, file=ctx.out if stream == "out" else ctx.err)
    return 0 if report.ok else 2
