"""Resolution: the targets of a tree (:func:`walk`) and the layout of each (:func:`discover`).

SPEC section 1. The functions here read the tree only through a
:class:`~metrale_orch.tree.TreeSnapshot` (one per pass; a fresh one when
none is given) and return frozen values or raise a
:class:`~metrale_orch.tree.LayoutError`. Invariants of a :class:`Layout`
that :func:`discover` returns:

- every win of one layer over another is in ``shadows`` with its declared
  reason, and every ``[shadow]`` key of every layer names a win;
- no entry's file is a symlink; every entry is a kernel file of the tree;
- resolution depends only on the tree's contents, never on listing order.

Beside resolution, for the build and ``check``: :func:`misshapen_manifests`
(manifest names that are not files), :func:`symlinks`, and the single-file
readers (:func:`hardware`, :func:`kernel_manifest`, ...).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import MappingProxyType

from metrale_orch.errors import is_printable, printable
from metrale_orch.tree.errors import (
    DeadShadow,
    LayoutError,
    ManifestError,
    NoKernelDirectory,
    UnknownModel,
    UnnamableFile,
)
from metrale_orch.tree.names import (
    COMMON,
    HARDWARE_TOML,
    KERNEL_TOML,
    MODEL_TOML,
    join_rel,
    stem_of,
)
from metrale_orch.tree.snapshot import TreeSnapshot, declared
from metrale_orch.tree.values import (
    ROLE_ORDER,
    Hardware,
    KernelManifest,
    Layout,
    Role,
    Shadow,
    Target,
    Tier,
)

__all__ = [
    "discover",
    "hardware",
    "kernel_manifest",
    "kernel_source_dir",
    "layer_manifest_problem",
    "misshapen_manifests",
    "redirect_manifest",
    "resolve_all",
    "supports_quant",
    "symlinks",
    "walk",
]


def hardware(kernels_dir: Path | str, hw: str) -> Hardware:
    """``kernels/<hw>/HARDWARE.toml`` with ``inherits`` checked.

    Raises UnknownHardware, ManifestError, RetiredKey, UnknownVendor, InheritsError.
    """
    kernels_dir = Path(kernels_dir)
    return TreeSnapshot(kernels_dir.parent).hardware(hw)


def kernel_manifest(directory: Path | str) -> KernelManifest | None:
    """Parse ``<directory>/KERNEL.toml`` if it exists. Raises ManifestError."""
    directory = Path(directory)
    snap = _snapshot_for(directory)
    return snap.kernel_manifest(snap.rel(directory))


def kernel_source_dir(model_dir: Path | str) -> Path:
    """The source model directory of ``model_dir`` (itself without a redirect).

    Raises ManifestError, RedirectError.
    """
    model_dir = Path(model_dir)
    snap = _snapshot_for(model_dir)
    rel = snap.rel(model_dir)
    source = snap.kernel_source_dir(rel)
    return model_dir if source == rel else snap.path(source)


def supports_quant(model_dir: Path | str, quant: str) -> bool:
    """Whether the model's ``supported_quants`` admits ``quant``. Raises ManifestError."""
    model_dir = Path(model_dir)
    snap = _snapshot_for(model_dir)
    return snap.supports_quant(snap.rel(model_dir), quant)


def _snapshot_for(path: Path) -> TreeSnapshot:
    # Root = the directory holding the nearest `kernels` ancestor, for relative messages.
    for anc in path.parents:
        if anc.name == "kernels":
            return TreeSnapshot(anc.parent)
    return TreeSnapshot(path.parent)


def discover(
    root: Path | str, target: Target | str, snapshot: TreeSnapshot | None = None
) -> Layout:
    """Resolve one target (SPEC 1.2-1.6); the first failure in SPEC 1.5's order wins.

    Raises a LayoutError subclass.
    """
    snap = snapshot if snapshot is not None else TreeSnapshot(root)
    if isinstance(target, str):
        target = Target.parse(target)
    return _resolve(snap, target)


def _resolve(snap: TreeSnapshot, target: Target) -> Layout:
    hw = snap.hardware(target.hardware)
    try:
        model_dir, source_dir, _read = snap.model_dirs(target.hardware, target.model)
    except UnknownModel as exc:  # cached per model; name this target in the message
        raise UnknownModel(target, exc.model_dir, snap.rel(exc.model_dir)) from None
    quant = target.quant
    for mdir in (model_dir,) if source_dir == model_dir else (model_dir, source_dir):
        if not snap.supports_quant(mdir, quant):
            rel = join_rel(mdir, MODEL_TOML)
            raise ManifestError(
                snap.path(rel),
                rel,
                "[model] supported_quants",
                f"quant {quant!r} is not supported (target {target}); there is no "
                "common-only fallback for an unlisted quant: add it to the list to build it",
            )
    layers, exists, rels = snap.target_layers(hw, source_dir, quant)
    if not exists:
        raise NoKernelDirectory(
            target,
            tuple(layer.dir for layer in layers),
            tuple(snap.rel(layer.dir) for layer in layers),
        )

    ext = hw.source_ext
    shadows: list[Shadow] = []
    covered: set[tuple[int, str]] = set()
    leaf, leaf_stems, leaf_subdirs = snap.layer_scan(rels[0], 0, layers[0], ext)
    n_leaf = 1
    if hw.inherits is not None:
        n_leaf = 2
        # own over parent, by file name: the earlier layer keeps the name.
        pentries, pstems, psubdirs = snap.layer_scan(rels[1], 1, layers[1], ext)
        if pentries:
            if leaf:
                merged = dict(leaf)
                added = False
                for name, entry in pentries.items():
                    present = merged.get(name)
                    if present is None:
                        merged[name] = entry
                        added = True
                    else:
                        shadows.append(declared(snap, layers, present, entry, name, covered))
                leaf = dict(sorted(merged.items())) if added else merged
            else:
                leaf = pentries
        if pstems:
            leaf_stems = {**pstems, **leaf_stems} if leaf_stems else pstems
        if psubdirs:
            leaf_subdirs = (
                dict(sorted({**psubdirs, **leaf_subdirs}.items())) if leaf_subdirs else psubdirs
            )

    # The common layers are the same for every target of this hardware: merged once.
    common = snap.common_part(hw, layers, rels, n_leaf)

    # leaf over common, by stem, sources only; in the order of the leaf names.
    won = leaf_stems.keys() & common.by_stem.keys()
    if won:
        by_stem = common.by_stem
        for name in sorted([leaf_stems[stem] for stem in won]):
            loser = by_stem[stem_of(name)]
            shadows.append(declared(snap, layers, leaf[name], loser, name, covered))

    for index in range(n_leaf):
        manifest = layers[index].manifest
        if manifest is None or not manifest.shadow:
            continue
        for stem in snap.shadow_keys(rels[index], manifest):
            if (index, stem) not in covered:
                raise DeadShadow(manifest.path, snap.rel(manifest.path), stem, target)
    if common.dead is not None:
        path, stem = common.dead
        raise DeadShadow(path, snap.rel(path), stem, target)

    if common.shadows:
        shadows.extend(common.shadows)
    if len(shadows) > 1:
        shadows.sort(key=_shadow_order)
    return Layout(
        target=target,
        hardware=hw,
        layers=layers,
        leaf=MappingProxyType(leaf),
        common=common.entries,
        leaf_subdirs=MappingProxyType(leaf_subdirs),
        common_subdirs=common.subdirs,
        shadows=tuple(shadows),
        source_model=source_dir.rpartition("/")[2],
        model_dir=snap.path(model_dir),
        model_manifests=snap.model_manifests(hw, target.model, source_dir),
        hardware_manifests=snap.hardware_manifests(hw),
    )


def _shadow_order(s: Shadow) -> tuple[int, str, Path]:
    return ROLE_ORDER[s.role], s.name, s.loser


def walk(root: Path | str, snapshot: TreeSnapshot | None = None) -> list[Target]:
    """Every target of the tree, sorted; manifest errors abort (raise LayoutError)."""
    snap = snapshot if snapshot is not None else TreeSnapshot(root)
    # Listings are in name order, so the targets come out sorted by (hw, model, quant).
    targets: list[Target] = []
    for hw_name, kind in snap.listing("kernels") or ():
        # A file or a special file has no children: it holds no HARDWARE.toml.
        hw_dir = f"kernels/{hw_name}"
        if kind in ("file", "other") or not snap.is_file(f"{hw_dir}/{HARDWARE_TOML}"):
            continue
        _check_name(snap, hw_dir, hw_name)
        hw = snap.hardware(hw_name)
        for model, mkind in snap.listing(hw_dir) or ():
            model_dir = f"{hw_dir}/{model}"
            if mkind in ("file", "other") or not snap.is_file(join_rel(model_dir, MODEL_TOML)):
                continue
            _check_name(snap, model_dir, model)
            source_dir = snap.kernel_source_dir(model_dir)
            quants = dict.fromkeys(_subdir_names(snap, source_dir), source_dir)
            if hw.inherits is not None:
                psource = snap.parent_source_dir(hw.inherits, source_dir.rpartition("/")[2])
                for quant in _subdir_names(snap, psource):
                    quants.setdefault(quant, psource)
            for quant in sorted(quants):
                _check_name(snap, f"{quants[quant]}/{quant}", quant)
                targets.append(Target(hardware=hw_name, model=model, quant=quant))
    return targets


def _check_name(snap: TreeSnapshot, rel: str, name: str) -> None:
    """Refuse a target directory whose name is not UTF-8: no task could be named after it."""
    if not name.isascii() and not is_printable(name):
        raise UnnamableFile(snap.path(rel), rel)


def misshapen_manifests(
    root: Path | str, snapshot: TreeSnapshot | None = None
) -> list[ManifestError]:
    """A ManifestError for each manifest name in its place that is not a regular file (I/O).

    The places: ``kernels/<hw>/HARDWARE.toml``, ``kernels/<hw>/<model>/MODEL.toml``,
    ``kernels/<hw>/common/KERNEL.toml`` and ``kernels/<hw>/<model>/<quant>/KERNEL.toml``.
    Resolution passes over such a thing as absent (a directory named HARDWARE.toml
    is no manifest, SPEC 1.6) or as a subdirectory; the build and ``check`` refuse
    it instead, so a tree never silently loses a hardware, a model or a layer's
    settings. Sorted by path; with a shared snapshot, listings are read once.
    """
    snap = snapshot if snapshot is not None else TreeSnapshot(root)
    found: list[ManifestError] = []

    def look(rel: str) -> None:
        if snap.not_a_file(rel):
            what = "a directory" if os.path.isdir(snap.path(rel)) else "not a regular file"
            found.append(
                ManifestError(
                    snap.path(rel),
                    printable(rel),
                    None,
                    f"is {what}, not a TOML file: make it a file (or remove it)",
                )
            )

    for hw_name, kind in snap.listing("kernels") or ():
        if kind != "dir":
            continue
        hw_dir = f"kernels/{hw_name}"
        look(f"{hw_dir}/{HARDWARE_TOML}")
        for model, mkind in snap.listing(hw_dir) or ():
            if mkind != "dir":
                continue
            model_dir = f"{hw_dir}/{model}"
            if model == COMMON:
                look(f"{model_dir}/{KERNEL_TOML}")
                continue
            look(f"{model_dir}/{MODEL_TOML}")
            for quant, qkind in snap.listing(model_dir) or ():
                if qkind == "dir":
                    look(f"{model_dir}/{quant}/{KERNEL_TOML}")
    return sorted(found, key=lambda e: e.path)


def layer_manifest_problem(
    layout: Layout, problems: Iterable[ManifestError]
) -> ManifestError | None:
    """The first of ``problems`` (:func:`misshapen_manifests`) that is the KERNEL.toml of
    one of ``layout``'s layers, or None (pure)."""
    dirs = {layer.dir for layer in layout.layers}
    for problem in problems:
        if problem.path.name == KERNEL_TOML and problem.path.parent in dirs:
            return problem
    return None


def redirect_manifest(layout: Layout, path: Path) -> Path | None:
    """The MODEL.toml whose ``[model] kernel_source`` placed the leaf layer that holds
    ``path`` (lexically, ``..`` resolved), or None when no redirect did (pure).

    The own leaf comes from ``<model_dir>/MODEL.toml``; the parent leaf from the parent
    tree's namesake of the own source model (SPEC 1.2), so a redirect that leaves
    ``kernels/`` is named where it is written, even when another tree inherits it.
    """
    text = os.path.normpath(path)
    kernels = layout.model_dir.parent.parent
    for layer in layout.layers:
        if layer.role is not Role.LEAF or not text.startswith(os.path.normpath(layer.dir) + os.sep):
            continue
        if layer.tier is Tier.OWN:
            model_dir = layout.model_dir
        else:
            model_dir = kernels / layer.hardware / layout.source_model
        return model_dir / MODEL_TOML if layer.dir.parent != model_dir else None
    return None


def _subdir_names(snap: TreeSnapshot, directory: str) -> Iterator[str]:
    for name, kind in snap.listing(directory) or ():
        if kind == "dir" or (
            kind == "link" and os.path.isdir(snap.path(join_rel(directory, name)))
        ):
            yield name


def resolve_all(
    root: Path | str, snapshot: TreeSnapshot | None = None
) -> list[tuple[Target, Layout | LayoutError]]:
    """``walk`` then ``discover`` of every target, sharing one snapshot.

    A target that fails carries its error; a walk failure raises.
    """
    snap = snapshot if snapshot is not None else TreeSnapshot(root)
    out: list[tuple[Target, Layout | LayoutError]] = []
    for target in walk(snap.root, snap):
        try:
            out.append((target, _resolve(snap, target)))
        except LayoutError as exc:
            out.append((target, exc))
    return out


def symlinks(root: Path | str) -> list[Path]:
    """Every symlink under ``kernels/``, sorted, without descending into linked dirs."""
    kernels = Path(root) / "kernels"
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(kernels):
        base = Path(dirpath)
        for name in (*dirnames, *filenames):
            path = base / name
            if path.is_symlink():
                found.append(path)
    return sorted(found)
