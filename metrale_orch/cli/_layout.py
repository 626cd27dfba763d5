"""``metrale-orch layout`` and ``metrale-orch check``: look at and validate the tree."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from metrale_orch import layout as lay
from metrale_orch.errors import UsageError

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
    p.add_argument("--json", action="store_true", help="print the dump format (SPEC 1.7)")
    p.set_defaults(run=run_layout)

    c = sub.add_parser(
        "check",
        help="validate the whole tree and report every problem",
        description=(
            "Validate the tree: every target resolves, no symlink under kernels/, no shadow "
            "whose winner is byte-identical to its loser, no kernel file duplicated byte for "
            "byte in another directory. Exit 0 when clean, 2 with the list of problems."
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
    if args.target is None:
        if args.json:
            print(json.dumps(lay.dump(root), indent=2, sort_keys=True), file=ctx.out)
            return 0
        return _list_targets(ctx)
    target = _parse_target(args.target)
    snap = lay.TreeSnapshot(root)
    try:
        layout = lay.discover(root, target, snap)
    except lay.LayoutError as exc:
        if args.json:
            print(json.dumps({str(target): {"error": str(exc)}}, indent=2), file=ctx.out)
            return 2
        raise
    if args.json:
        view = {str(target): lay.layout_to_dict(layout, root)}
        print(json.dumps(view, indent=2, sort_keys=True), file=ctx.out)
        return 0
    _print_layout(layout, snap, ctx)
    return 0


def _list_targets(ctx: Context) -> int:
    results = lay.resolve_all(ctx.root)
    failed = 0
    for target, result in results:
        if isinstance(result, lay.LayoutError):
            failed += 1
            print(f"{target}  error: {result}", file=ctx.out)
        else:
            mods = len(result.modules())
            print(f"{target}  {mods} module{'s' if mods != 1 else ''}", file=ctx.out)
    print(f"{len(results)} targets, {failed} failing", file=ctx.out)
    return 2 if failed else 0


def _print_layout(layout: lay.Layout, snap: lay.TreeSnapshot, ctx: Context) -> None:
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
        print(f"  {stem:<{width}}  {rel(entry.source)}  ({role})", file=out)
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


def _digest(path: Path) -> str:
    return xxhash.xxh3_128_hexdigest(path.read_bytes())


def find_problems(root: Path) -> list[str]:
    """Every problem of the tree, one message each, sorted and de-duplicated."""
    problems: dict[str, list[str]] = defaultdict(list)
    snap = lay.TreeSnapshot(root)
    try:
        results = lay.resolve_all(root, snap)
    except lay.LayoutError as exc:
        problems[f"the tree cannot be walked: {exc}"] = []
        results = []
    reported_links: set[Path] = set()
    for target, result in results:
        if isinstance(result, lay.LayoutError):
            problems[str(result)].append(str(target))
            if isinstance(result, lay.SymlinkError):
                reported_links.add(result.path)
            continue
        for s in result.shadows:
            if s.winner.is_file() and s.loser.is_file() and _digest(s.winner) == _digest(s.loser):
                problems[
                    f"{snap.rel(s.winner)} shadows {snap.rel(s.loser)} with identical bytes: "
                    f"a pointless fork; delete {snap.rel(s.winner)} and its [shadow] "
                    f"{lay.stem_of(s.name)} key"
                ].append(str(target))
    for link in lay.symlinks(root):
        if link not in reported_links:  # a link no target reads is still refused
            problems[f"{snap.rel(link)}: is a symlink; kernel trees hold real files only"] = []
    for message in _duplicates(root, snap):
        problems[message] = []
    lines = []
    for message, targets in sorted(problems.items()):
        if targets:
            shown = ", ".join(sorted(set(targets))[:5])
            more = len(set(targets)) - 5
            suffix = f" (and {more} more)" if more > 0 else ""
            lines.append(f"{message} [target {shown}{suffix}]")
        else:
            lines.append(message)
    return lines


def _duplicates(root: Path, snap: lay.TreeSnapshot) -> list[str]:
    """Kernel files with the same name and bytes in different directories."""
    kernel_exts = {"cu", "metal", *lay.HEADER_EXTS}
    by_name: dict[str, list[Path]] = defaultdict(list)
    kernels = root / "kernels"
    if not kernels.is_dir():
        return []
    for path in sorted(kernels.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        if path.name.rpartition(".")[2] in kernel_exts and "." in path.name:
            by_name[path.name].append(path)
    messages = []
    for name, paths in sorted(by_name.items()):
        if len(paths) < 2:
            continue
        groups: dict[str, list[Path]] = defaultdict(list)
        for p in paths:
            groups[_digest(p)].append(p)
        for same in groups.values():
            if len(same) > 1:
                listed = ", ".join(snap.rel(p) for p in same)
                messages.append(
                    f"{name} is duplicated byte for byte in {listed}: keep one copy and "
                    "share it with [sources] use"
                )
    return messages


def run_check(args: argparse.Namespace, ctx: Context) -> int:
    del args
    problems = find_problems(ctx.root)
    if problems:
        for line in problems:
            print(f"problem: {line}", file=ctx.err)
        print(f"check: {len(problems)} problem{'s' if len(problems) != 1 else ''}", file=ctx.err)
        return 2
    count = len(lay.walk(ctx.root))
    print(f"check: ok ({count} targets resolve; no symlinks, forks or duplicates)", file=ctx.out)
    return 0
