"""TreeSnapshot: one resolution pass's memoised view of a tree.

A :class:`TreeSnapshot` is the file view and the manifest reader plus the
per-target pieces resolution is made of (model directories, a target's
layers, each layer's scan, the merged common role of a hardware tree), each
computed once per pass and kept with its error, through :class:`Memo`.
One pass (``walk`` + ``discover`` of every target) shares one snapshot, so
each directory is listed and each manifest parsed once; independent calls
get fresh snapshots. Everything here only reads the tree.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import cast

from metrale_orch.errors import is_printable
from metrale_orch.tree.errors import (
    SelfShadow,
    SymlinkError,
    UndeclaredShadow,
    UnknownModel,
    UnnamableFile,
    UseCollides,
    UseError,
)
from metrale_orch.tree.files import Memo, child_maker
from metrale_orch.tree.manifests import ManifestReader
from metrale_orch.tree.names import (
    COMMON,
    HARDWARE_TOML,
    HEADER_EXTS,
    KERNEL_TOML,
    MODEL_TOML,
    ext_of,
    is_kernel_file,
    join_rel,
    stem_of,
)
from metrale_orch.tree.values import (
    Entry,
    Hardware,
    KernelManifest,
    Layer,
    Role,
    Shadow,
    Target,
    Tier,
)

__all__ = ["CommonPart", "LayerScan", "TargetLayers", "TreeSnapshot", "declared"]

#: A directory's part of a layer, per source extension: (first symlink child or None,
#: kernel files (name -> Path, in name order), sources (stem -> name), subdirectories
#: (name -> Path, in name order), the first entry or subdirectory whose name is not
#: valid UTF-8 or None). A source's name is its stem plus the one source extension, so
#: stem and name determine each other.
DirPart = tuple[str | None, dict[str, Path], dict[str, str], dict[str, Path], str | None]
#: A layer's scan: entries (name -> Entry, in name order), sources (stem -> name),
#: subdirectories (name -> Path, in name order); shared read-only by its targets.
LayerScan = tuple[dict[str, "Entry"], dict[str, str], dict[str, Path]]
#: (layers, whether any layer directory exists, layer directory spellings)
TargetLayers = tuple[tuple[Layer, ...], bool, tuple[str, ...]]

#: A used file: its path, its name, and its stem when it is a source (else None).
UsedFile = tuple[Path, str, str | None]


class TreeSnapshot(ManifestReader):
    """Listings, parsed manifests and resolution pieces of one tree, for one pass.

    Internally every file is keyed by its root-relative POSIX spelling (the
    spelling messages use too); ``Path`` objects are made once per file, for
    the values handed out. Results and errors are cached alike, so a pass
    scans each directory and parses each manifest once. Make a new snapshot
    for each independent pass.
    """

    def __init__(self, root: Path | str) -> None:
        super().__init__(root)
        self._model_dirs: Memo[tuple[str, str], tuple[str, str, tuple[Path, ...]]] = Memo()
        self._target_layers: Memo[tuple[str, str, str], TargetLayers] = Memo()
        self._common_layers: Memo[str, tuple[Layer, ...]] = Memo()
        self._model_manifests: Memo[tuple[str, str], tuple[Path, ...]] = Memo()
        self._hardware_manifests: Memo[str, tuple[Path, ...]] = Memo()
        self._dir_parts: Memo[tuple[str, str], DirPart | None] = Memo()
        self._layer_scans: Memo[tuple[str, int, str, str], LayerScan] = Memo()
        self._used_files: Memo[tuple[str, str, str], UsedFile | _Refused] = Memo()
        self._common_parts: Memo[str, CommonPart] = Memo()
        self._shadow_keys: Memo[str, tuple[str, ...]] = Memo()

    def model_dirs(self, hw: str, model: str) -> tuple[str, str, tuple[Path, ...]]:
        """(model dir, source model dir, MODEL.toml files read); raises UnknownModel etc."""
        return self._model_dirs.get((hw, model), self._load_model_dirs, hw, model)

    def _load_model_dirs(self, hw: str, model: str) -> tuple[str, str, tuple[Path, ...]]:
        model_dir = f"kernels/{hw}/{model}"
        if not self.is_dir(model_dir):
            target = Target(hardware=hw, model=model, quant="*")
            raise UnknownModel(target, self.path(model_dir), model_dir)
        source_dir = self.kernel_source_dir(model_dir)
        read = {join_rel(d, MODEL_TOML) for d in (model_dir, source_dir)}
        return model_dir, source_dir, tuple(self.path(r) for r in sorted(read) if self.is_file(r))

    def target_layers(self, hw: Hardware, source_dir: str, quant: str) -> TargetLayers:
        """(layers, whether any layer directory exists, the layer directories' spellings).

        Loads the layer manifests in SPEC order: own leaf, parent leaf (following the
        parent tree's redirect), own common, parent common.
        """
        key = (hw.name, source_dir, quant)
        return self._target_layers.get(key, self._load_layers, hw, source_dir, quant)

    def _load_layers(self, hw: Hardware, source_dir: str, quant: str) -> TargetLayers:
        own_leaf = join_rel(source_dir, quant)
        own_leaf_m = self.kernel_manifest(own_leaf)
        own_common = f"kernels/{hw.name}/{COMMON}"
        leaf = Layer(
            role=Role.LEAF,
            tier=Tier.OWN,
            hardware=hw.name,
            dir=self.path(own_leaf),
            manifest=own_leaf_m,
        )
        layers: tuple[Layer, ...]
        rels: tuple[str, ...]
        if hw.inherits is None:
            own_common_m = self.kernel_manifest(own_common)
            rels = (own_leaf, own_common)
            layers = (leaf, *self._common_layers_of(hw, rels[1:], (own_common_m,)))
        else:
            parent = hw.inherits
            psource, _read = self.parent_leaf_source(parent, source_dir.rpartition("/")[2])
            parent_leaf = join_rel(psource, quant)
            parent_leaf_m = self.kernel_manifest(parent_leaf)
            own_common_m = self.kernel_manifest(own_common)
            parent_common = f"kernels/{parent}/{COMMON}"
            parent_common_m = self.kernel_manifest(parent_common)
            rels = (own_leaf, parent_leaf, own_common, parent_common)
            pleaf = Layer(
                role=Role.LEAF,
                tier=Tier.PARENT,
                hardware=parent,
                dir=self.path(parent_leaf),
                manifest=parent_leaf_m,
            )
            layers = (
                leaf,
                pleaf,
                *self._common_layers_of(hw, rels[2:], (own_common_m, parent_common_m)),
            )
        kinds_of = self.kinds_of
        exists = any(kinds_of(d) is not None for d in rels)
        return layers, exists, rels

    def _common_layers_of(
        self, hw: Hardware, rels: tuple[str, ...], manifests: tuple[KernelManifest | None, ...]
    ) -> tuple[Layer, ...]:
        """The common layers of ``hw`` (the same for all its targets): made once per pass."""
        return self._common_layers.get(hw.name, self._make_common_layers, hw, rels, manifests)

    def _make_common_layers(
        self, hw: Hardware, rels: tuple[str, ...], manifests: tuple[KernelManifest | None, ...]
    ) -> tuple[Layer, ...]:
        tiers = ((Tier.OWN, hw.name), (Tier.PARENT, hw.inherits or ""))
        return tuple(
            Layer(
                role=Role.COMMON,
                tier=tiers[i][0],
                hardware=tiers[i][1],
                dir=self.path(rels[i]),
                manifest=manifests[i],
            )
            for i in range(len(rels))
        )

    def model_manifests(self, hw: Hardware, model: str, source_dir: str) -> tuple[Path, ...]:
        """MODEL.toml files a resolved target of ``hw/model`` read, sorted; once per pass."""
        key = (hw.name, model)
        return self._model_manifests.get(key, self._read_model_manifests, hw, model, source_dir)

    def _read_model_manifests(self, hw: Hardware, model: str, source_dir: str) -> tuple[Path, ...]:
        files = set(self.model_dirs(hw.name, model)[2])
        if hw.inherits is not None:
            name = source_dir.rpartition("/")[2]
            files.update(self.parent_leaf_source(hw.inherits, name)[1])
        return tuple(sorted(files))

    def hardware_manifests(self, hw: Hardware) -> tuple[Path, ...]:
        """HARDWARE.toml files a target of ``hw`` read (own, parent); once per pass."""
        return self._hardware_manifests.get(hw.name, self._read_hardware_manifests, hw)

    def _read_hardware_manifests(self, hw: Hardware) -> tuple[Path, ...]:
        read: tuple[Path, ...] = (hw.path,)
        if hw.inherits is not None:
            read += (self.path(f"kernels/{hw.inherits}/{HARDWARE_TOML}"),)
        return read

    def layer_scan(self, rel: str, index: int, layer: Layer, ext: str) -> LayerScan:
        """A layer's entries (directory part, then ``use`` part), sources and subdirectories.

        Cached per (directory, index): a common directory shared by many targets is
        scanned once per pass.
        """
        key = (rel, index, layer.hardware, ext)
        return self._layer_scans.get(key, self._layer_scan, rel, index, layer, ext)

    def _dir_part(self, rel: str, ext: str) -> DirPart | None:
        """A directory's children sorted into kernel files and subdirectories, once per pass."""
        return self._dir_parts.get((rel, ext), self._sort_dir, rel, ext)

    def _sort_dir(self, rel: str, ext: str) -> DirPart | None:
        part: DirPart | None = None
        kinds = self.kinds_of(rel)
        if kinds is not None:
            make = child_maker(self.path(rel))
            link: str | None = None
            files: dict[str, Path] = {}
            stems: dict[str, str] = {}
            subdirs: dict[str, Path] = {}
            for name in sorted(kinds):
                kind = kinds[name]
                if kind == "file":
                    dot = name.rfind(".")
                    if dot >= 0:
                        name_ext = name[dot + 1 :]
                        if name_ext == ext:
                            files[name] = make(name)
                            stems[name[:dot]] = name
                        elif name_ext in HEADER_EXTS:
                            files[name] = make(name)
                elif kind == "dir":
                    subdirs[name] = make(name)
                elif kind == "link" and link is None:
                    link = name
            unnamable = next(
                (n for n in (*files, *subdirs) if not n.isascii() and not is_printable(n)), None
            )
            part = (link, files, stems, subdirs, unnamable)
        return part

    def _layer_scan(self, rel: str, index: int, layer: Layer, ext: str) -> LayerScan:
        part = self._dir_part(rel, ext)
        files: dict[str, Path]
        stems: dict[str, str]
        subdirs: dict[str, Path]
        if part is None:
            files, stems, subdirs = {}, {}, {}
        else:
            link, files, stems, subdirs, unnamable = part
            if link is not None:
                child = join_rel(rel, link)
                raise SymlinkError(self.path(child), child)
            if unnamable is not None:
                child = join_rel(rel, unnamable)
                raise UnnamableFile(self.path(child), child)
        manifest = layer.manifest
        if manifest is None or not manifest.uses:
            entries = {name: Entry(name, path, index, False) for name, path in files.items()}
            return entries, stems, subdirs
        used: dict[str, Path] = {}
        stems = dict(stems)
        for use in manifest.uses:
            source, name, stem = self._use(layer, use, ext)
            present = files.get(name) or used.get(name)
            if present is not None:
                m = manifest.path
                raise UseCollides(m, self.rel(m), use, name, present, self.rel(present))
            used[name] = source
            if stem is not None:
                stems[stem] = name
        # Both parts keyed in name order: fix the order first, then fill in the entries.
        entries = cast("dict[str, Entry]", dict.fromkeys(sorted([*files, *used])))
        for name, path in files.items():
            entries[name] = Entry(name, path, index, False)
        for name, path in used.items():
            entries[name] = Entry(name, path, index, True)
        return entries, stems, subdirs

    def _use(self, layer: Layer, use: str, ext: str) -> UsedFile:
        """Steps 1-6 of SPEC 1.3 for one ``use`` string.

        Returns the file's path, its name, and its stem when it is a source (else None).
        """
        assert layer.manifest is not None
        key = (layer.hardware, use, ext)
        found = self._used_files.get(key, self._find_use, layer.hardware, use, ext)
        if isinstance(found, _Refused):
            manifest = layer.manifest.path
            if found.symlink is not None:
                raise SymlinkError(found.symlink, found.problem, manifest)
            raise UseError(manifest, self.rel(manifest), use, found.problem)
        return found

    def _find_use(
        self, hardware: str, use: str, ext: str
    ) -> tuple[Path, str, str | None] | _Refused:
        """What a ``use`` string of a manifest of ``hardware`` names; the same for every
        manifest of the tree, so the refusal is kept without the manifest's name."""
        if use.startswith(("/", "\\")) or os.path.isabs(use):
            return _Refused(f"must be relative to kernels/{hardware}")
        parts: list[str] = ["kernels", hardware]
        for comp in use.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                if parts and parts[-1] != "..":
                    parts.pop()
                else:
                    parts.append("..")
            else:
                parts.append(comp)
        if len(parts) < 2 or parts[0] != "kernels":
            return _Refused("escapes kernels/ (a use must stay inside it)")
        prel = "/".join(parts)
        path = self.path(prel)
        try:
            st = os.lstat(path)
        except OSError:
            return _Refused(f"no such file: {prel}")
        if stat.S_ISLNK(st.st_mode):
            return _Refused(prel, symlink=path)
        if not stat.S_ISREG(st.st_mode):
            return _Refused(f"no such file: {prel} is not a regular file")
        name = path.name
        if not is_kernel_file(name, ext):
            return _Refused(
                f"not a .{ext} source or a header (.{' or .'.join(HEADER_EXTS)}): {prel}"
            )
        return path, name, stem_of(name) if ext_of(name) == ext else None

    def common_part(
        self, hw: Hardware, layers: tuple[Layer, ...], rels: tuple[str, ...], first: int
    ) -> CommonPart:
        """The merged common layers ``layers[first:]`` of ``hw``, merged once per pass."""
        return self._common_parts.get(hw.name, merge_common, self, hw, layers, rels, first)

    def shadow_keys(self, directory: str, manifest: KernelManifest) -> tuple[str, ...]:
        """The ``[shadow]`` keys of ``directory``'s manifest, sorted, once per pass."""
        return self._shadow_keys.get(directory, _sorted_keys, manifest.shadow)


@dataclass(frozen=True, slots=True)
class _Refused:
    """Why a ``use`` string names no usable file: a UseError's problem, or (``symlink``
    set) the spelling of the symlink it names."""

    problem: str
    symlink: Path | None = None


def _sorted_keys(mapping: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(sorted(mapping))


def declared(
    snap: TreeSnapshot,
    layers: tuple[Layer, ...],
    winner: Entry,
    loser: Entry,
    name: str,
    covered: set[tuple[int, str]],
) -> Shadow:
    """Check that the winner's layer declares the win; return the Shadow."""
    rel = snap.rel
    layer = layers[winner.layer]
    if winner.source == loser.source:
        manifest_path = layer.dir / KERNEL_TOML
        raise SelfShadow(winner.source, rel(winner.source), name, manifest_path, rel(manifest_path))
    stem = stem_of(winner.name)
    manifest = layer.manifest
    if manifest is None or stem not in manifest.shadow:
        manifest_path = layer.dir / KERNEL_TOML
        raise UndeclaredShadow(
            winner=winner.source,
            loser=loser.source,
            manifest=manifest_path,
            stem=stem,
            role=layer.role,
            rels=(rel(winner.source), rel(loser.source), rel(manifest_path)),
            exists=manifest is not None,
        )
    covered.add((winner.layer, stem))
    return Shadow(
        role=layer.role,
        name=name,
        winner=winner.source,
        loser=loser.source,
        reason=manifest.shadow[stem],
    )


@dataclass(frozen=True, slots=True)
class CommonPart:
    """The merged common role of one hardware tree (the same for all its targets)."""

    entries: Mapping[str, Entry]
    subdirs: Mapping[str, Path]
    shadows: tuple[Shadow, ...]
    #: source stem -> the resolved common entry
    by_stem: Mapping[str, Entry]
    #: the first dead [shadow] key of a common layer (manifest, stem), if any
    dead: tuple[Path, str] | None


def merge_common(
    snap: TreeSnapshot, hw: Hardware, layers: tuple[Layer, ...], rels: tuple[str, ...], first: int
) -> CommonPart:
    """Merge the common layers ``layers[first:]`` of ``hw``: earlier layers keep a name,
    each win checked by :func:`declared`; the first dead ``[shadow]`` key is noted."""
    ext = hw.source_ext
    common: dict[str, Entry] = {}
    subdirs: dict[str, Path] = {}
    stems: dict[str, str] = {}
    shadows: list[Shadow] = []
    covered: set[tuple[int, str]] = set()
    for index in range(first, len(layers)):
        entries, layer_stems, subs = snap.layer_scan(rels[index], index, layers[index], ext)
        for name, entry in entries.items():
            present = common.get(name)
            if present is None:
                common[name] = entry
            else:
                shadows.append(declared(snap, layers, present, entry, name, covered))
        for stem, name in layer_stems.items():
            stems.setdefault(name, stem)
        for name, path in subs.items():
            subdirs.setdefault(name, path)
    dead: tuple[Path, str] | None = None
    for index in range(first, len(layers)):
        manifest = layers[index].manifest
        if manifest is None or dead is not None:
            continue
        for stem in sorted(manifest.shadow):
            if (index, stem) not in covered:
                dead = (manifest.path, stem)
                break
    return CommonPart(
        entries=MappingProxyType(dict(sorted(common.items()))),
        subdirs=MappingProxyType(dict(sorted(subdirs.items()))),
        shadows=tuple(shadows),
        by_stem=MappingProxyType({stems[n]: common[n] for n in sorted(stems)}),
        dead=dead,
    )
