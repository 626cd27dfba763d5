"""``metrale-orch layout`` and ``metrale-orch check``: look at and validate the tree."""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from metrale_orch import layout as lay
from metrale_orch.errors import MetraleError, UsageError, is_printable, printable

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
            "Validate the tree: every target resolves, no symlink under kernels/, nothing a "
            "target reads lies outside kernels/, no shadow whose winner is byte-identical to "
            "its loser, no kernel file duplicated byte for byte in another directory, every "
            "file name is UTF-8, the configuration and toolchain files are valid. Likely "
            "typos in manifests are warnings. Exit 0 when clean, 2 with the list of problems."
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
            print(printable(f"{target}  error: {result}"), file=ctx.out)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    """What ``check`` found: problems (the build would refuse these; exit 2) and
    warnings (likely typos; the build goes on), one line each, sorted."""

    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    #: Targets the tree walks to (0 when the walk itself fails).
    targets: int


def find_problems(root: Path) -> list[str]:
    """Every problem of the tree, one message each, sorted and de-duplicated."""
    return list(check_tree(root, {}).problems)


def check_tree(
    root: Path, environ: Mapping[str, str], overrides: Mapping[str, str] | None = None
) -> CheckReport:
    """Check the tree at ``root`` as the build would see it under ``environ`` (I/O: reads
    the configuration, the toolchain files and every file name and manifest under kernels/)."""
    from metrale_orch.config import load_config
    from metrale_orch.staging import uncontained
    from metrale_orch.toolchains import load_toolchains

    problems: dict[str, list[str]] = defaultdict(list)
    try:
        load_config(root, environ, overrides)
    except MetraleError as exc:
        problems.setdefault(str(exc), [])
    build_keys: set[str] = set()
    try:
        build_keys.update(tc.flags_key for tc in load_toolchains(root).values())
    except MetraleError as exc:
        problems.setdefault(str(exc), [])
    snap = lay.TreeSnapshot(root)
    kernels = root / "kernels"
    try:
        results = lay.resolve_all(root, snap)
    except lay.LayoutError as exc:
        problems.setdefault(f"the tree cannot be walked: {exc}", [])
        results = []
    # Manifests that are directories: resolution passes over them, the build refuses them.
    misshapen = lay.misshapen_manifests(root, snap)
    for shape_error in misshapen:
        problems.setdefault(str(shape_error), [])
    reported_links: set[Path] = set()
    for target, result in results:
        if not isinstance(result, lay.LayoutError):
            shape = lay.layer_manifest_problem(result, misshapen)
            if shape is not None:
                problems[str(shape)].append(str(target))
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
        # What the build would refuse to stage (staging.check_contained): files outside
        # kernels/ (a redirect or use reaching out) or reached through a symlinked directory.
        for path, problem in uncontained(kernels, result.inputs()):
            link = _link_above(kernels, path)
            if link is not None:
                problems[_link_message(snap.rel(link))].append(str(target))
                reported_links.add(link)
            elif result.source_model != result.target.model and _under_leaf(result, path):
                via = snap.rel(result.model_dir / "MODEL.toml")
                problems[
                    f"{snap.rel(path)}: {problem} (reached through [model] kernel_source of {via})"
                ].append(str(target))
            else:
                problems[f"{snap.rel(path)}: {problem}"].append(str(target))
    for link in lay.symlinks(root):
        if link not in reported_links:  # a link no target reads is still refused
            problems.setdefault(_link_message(snap.rel(link)), [])
    scan = _scan_kernels(root, snap)
    for message in (*scan.unnamable, *_duplicates(scan.kernel_files, snap)):
        problems.setdefault(message, [])
    warnings: set[str] = set()
    for path in scan.manifests:
        kind = lay.MANIFEST_KINDS[path.name]
        try:
            doc = snap.toml(path)
        except lay.LayoutError:
            continue  # resolution reports a manifest that does not parse
        if doc is not None:
            warnings.update(
                lay.manifest_warnings(snap.rel(path), doc, kind, build_keys=sorted(build_keys))
            )
    lines = []
    for message, targets in sorted(problems.items()):
        if targets:
            shown = ", ".join(sorted(set(targets))[:5])
            more = len(set(targets)) - 5
            suffix = f" (and {more} more)" if more > 0 else ""
            lines.append(printable(f"{message} [target {shown}{suffix}]"))
        else:
            lines.append(printable(message))
    return CheckReport(
        problems=tuple(lines),
        warnings=tuple(printable(w) for w in sorted(warnings)),
        targets=len(results),
    )


def _under_leaf(layout: lay.Layout, path: Path) -> bool:
    """Whether ``path`` lies (lexically) in one of ``layout``'s leaf layer directories."""
    text = os.path.normpath(path)
    for layer in layout.layers:
        if layer.role is lay.Role.LEAF:
            top = os.path.normpath(layer.dir)
            if text.startswith(top + os.sep):
                return True
    return False


def _link_message(rel: str) -> str:
    return f"{rel}: is a symlink; kernel trees hold real files only"


def _link_above(kernels: Path, path: Path) -> Path | None:
    """The first symlink on the way from ``kernels`` down to ``path``, if any."""
    try:
        parts = Path(os.path.abspath(path)).relative_to(os.path.abspath(kernels)).parts
    except ValueError:
        return None
    current = kernels
    for part in parts:
        current = current / part
        if current.is_symlink():
            return current
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Scan:
    """One pass over every name under kernels/ (symlinked directories not followed)."""

    #: A problem per name that is not valid UTF-8 (its children are not listed).
    unnamable: tuple[str, ...]
    #: Every HARDWARE.toml, MODEL.toml and KERNEL.toml file, sorted.
    manifests: tuple[Path, ...]
    #: Every regular kernel file (source or header), sorted.
    kernel_files: tuple[Path, ...]


def _scan_kernels(root: Path, snap: lay.TreeSnapshot) -> _Scan:
    kernels = root / "kernels"
    kernel_exts = {"cu", "metal", *lay.HEADER_EXTS}
    unnamable: list[str] = []
    manifests: list[Path] = []
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(kernels):
        base = Path(dirpath)
        for name in sorted([*dirnames, *filenames]):
            if not is_printable(name):
                unnamable.append(lay.unnamable_message(snap.rel(base / name)))
        dirnames[:] = sorted(d for d in dirnames if is_printable(d))
        for name in filenames:
            path = base / name
            if not is_printable(name) or path.is_symlink() or not path.is_file():
                continue
            if name in lay.MANIFEST_KINDS:
                manifests.append(path)
            elif "." in name and name.rpartition(".")[2] in kernel_exts:
                files.append(path)
    return _Scan(
        unnamable=tuple(unnamable),
        manifests=tuple(sorted(manifests)),
        kernel_files=tuple(sorted(files)),
    )


def _duplicates(paths: Sequence[Path], snap: lay.TreeSnapshot) -> list[str]:
    """Kernel files with the same name and bytes in different directories."""
    by_name: dict[str, list[Path]] = defaultdict(list)
    for path in paths:
        by_name[path.name].append(path)
    messages = []
    for name, same_name in sorted(by_name.items()):
        if len(same_name) < 2:
            continue
        groups: dict[str, list[Path]] = defaultdict(list)
        for p in same_name:
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
    report = check_tree(ctx.root, ctx.environ, ctx.overrides)
    for line in report.warnings:
        print(f"warning: {line}", file=ctx.err)
    if report.problems:
        for line in report.problems:
            print(f"problem: {line}", file=ctx.err)
        count = len(report.problems)
        print(f"check: {count} problem{'s' if count != 1 else ''}", file=ctx.err)
        return 2
    print(
        f"check: ok ({report.targets} targets resolve; no symlinks, forks or duplicates)",
        file=ctx.out,
    )
    return 0
