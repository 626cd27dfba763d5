"""Layout resolution: which files a ``(hardware, model, quant)`` target is made from.

This module owns SPEC section 1 and nothing else: it reads ``kernels/`` (the
manifests and directory listings) and returns frozen values; it never writes,
compiles or prints. Invariants of a :class:`Layout` that :func:`discover`
returns:

- every win of one layer over another is in ``shadows`` with its declared
  reason, and every ``[shadow]`` key of every layer names a win;
- no entry's file is a symlink; every entry is a kernel file of the tree;
- resolution depends only on the tree's contents, never on listing order.

Beside resolution, for the build and ``check`` (never changing what resolves):
names that are not UTF-8 are refused (:class:`UnnamableFile`), manifests that
are directories are found (:func:`misshapen_manifests`; resolution passes over
them as SPEC 1.6 says), and likely typos in manifests become warnings
(:func:`manifest_warnings`, pure; :func:`read_manifest_warnings` for a layout).

One resolution pass (``walk`` + ``discover`` of every target, see
:func:`resolve_all`) shares a :class:`TreeSnapshot`, so each directory is
listed and each manifest parsed once; independent calls get fresh snapshots.
Paths inside the values are under ``root`` as given; messages and
:func:`dump` use root-relative POSIX paths.
"""

from __future__ import annotations

import enum
import os
import stat
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar, cast

from metrale_orch.errors import MetraleError, is_printable, printable

__all__ = [
    "HEADER_EXTS",
    "DeadShadow",
    "Entry",
    "Hardware",
    "InheritsError",
    "KernelManifest",
    "Layer",
    "Layout",
    "LayoutError",
    "ManifestError",
    "NoKernelDirectory",
    "RedirectError",
    "RetiredKey",
    "Role",
    "SelfShadow",
    "Shadow",
    "SymlinkError",
    "Target",
    "Tier",
    "TreeSnapshot",
    "UndeclaredShadow",
    "UnknownHardware",
    "UnknownModel",
    "UnknownVendor",
    "UnnamableFile",
    "UseCollides",
    "UseError",
    "discover",
    "dump",
    "hardware",
    "kernel_manifest",
    "kernel_source_dir",
    "layer_manifest_problem",
    "manifest_warnings",
    "misshapen_manifests",
    "read_manifest_warnings",
    "resolve_all",
    "source_ext",
    "stem_of",
    "supports_quant",
    "symlinks",
    "unnamable_message",
    "walk",
]

HEADER_EXTS: tuple[str, ...] = ("cuh", "h")

_VENDOR_EXT: Mapping[str, str] = MappingProxyType(
    {
        "nvidia": "cu",
        "cuda": "cu",
        "amd": "cu",
        "rocm": "cu",
        "scale": "cu",
        "hip": "cu",
        "apple": "metal",
        "metal": "metal",
    }
)

HARDWARE_TOML = "HARDWARE.toml"
MODEL_TOML = "MODEL.toml"
KERNEL_TOML = "KERNEL.toml"
COMMON = "common"


# --------------------------------------------------------------------------- names


def source_ext(vendor: str) -> str | None:
    """Kernel-source extension for a ``[hardware] vendor``, or None for an unknown vendor."""
    return _VENDOR_EXT.get(vendor)


def stem_of(name: str) -> str:
    """Text before the last dot (``a.b.cu`` -> ``a.b``); a name without a dot is its own stem."""
    dot = name.rfind(".")
    return name if dot < 0 else name[:dot]


def _ext_of(name: str) -> str | None:
    dot = name.rfind(".")
    return None if dot < 0 else name[dot + 1 :]


def _is_kernel_file(name: str, src_ext: str) -> bool:
    ext = _ext_of(name)
    return ext is not None and (ext == src_ext or ext in HEADER_EXTS)


# --------------------------------------------------------------------------- values


@enum.unique
class Role(enum.Enum):
    """A layer's role; ordered as declared (leaf before common)."""

    LEAF = "leaf"
    COMMON = "common"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Role):
            return NotImplemented
        return _ROLE_ORDER[self] < _ROLE_ORDER[other]


_ROLE_ORDER = {Role.LEAF: 0, Role.COMMON: 1}


@enum.unique
class Tier(enum.Enum):
    """Whether a layer belongs to the target's own tree or the tree it inherits."""

    OWN = "own"
    PARENT = "parent"


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Target:
    """One compiled unit: ``(hardware, model, quant)``; ``str()`` is ``hw/model/quant``."""

    hardware: str
    model: str
    quant: str

    def __str__(self) -> str:
        return f"{self.hardware}/{self.model}/{self.quant}"

    @classmethod
    def parse(cls, text: str) -> Target:
        """Parse ``hw/model/quant``; raises ValueError for any other shape."""
        parts = text.strip().strip("/").split("/")
        if len(parts) != 3 or not all(parts) or any(p in (".", "..") for p in parts):
            raise ValueError(f"not a target: {text!r} (expected hw/model/quant)")
        return cls(hardware=parts[0], model=parts[1], quant=parts[2])


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """``kernels/<hw>/HARDWARE.toml``, the part resolution reads."""

    name: str
    vendor: str
    arch: str | None
    inherits: str | None
    source_ext: str
    #: The manifest file.
    path: Path
    #: The whole parsed manifest (for the build's keys); read-only by convention.
    doc: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelManifest:
    """The resolution-relevant part of one ``KERNEL.toml``."""

    path: Path
    uses: tuple[str, ...]
    #: stem -> reason (untrimmed), in file order.
    shadow: Mapping[str, str]
    doc: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One of a target's directories, whether or not it exists."""

    role: Role
    tier: Tier
    #: The layer's tree name (the target's hardware, or its parent).
    hardware: str
    dir: Path
    manifest: KernelManifest | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One file a target compiles or stages beside what it compiles."""

    name: str
    source: Path
    #: Index into ``Layout.layers`` of the layer that contributed it.
    layer: int
    #: True when ``[sources] use`` brought it in.
    used: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Shadow:
    """A declared, verified win of ``winner`` over ``loser``."""

    role: Role
    name: str
    winner: Path
    loser: Path
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """A resolved target."""

    target: Target
    hardware: Hardware
    layers: tuple[Layer, ...]
    leaf: Mapping[str, Entry]
    common: Mapping[str, Entry]
    leaf_subdirs: Mapping[str, Path]
    common_subdirs: Mapping[str, Path]
    shadows: tuple[Shadow, ...]
    source_model: str
    model_dir: Path
    #: MODEL.toml files the resolution read (own model, redirect source, parent's).
    model_manifests: tuple[Path, ...] = ()
    #: HARDWARE.toml files the resolution read (own, parent).
    hardware_manifests: tuple[Path, ...] = ()

    def configs(self) -> tuple[Path, ...]:
        """Existing KERNEL.toml paths, least specific first: parent common .. own leaf."""
        return tuple(
            layer.manifest.path for layer in reversed(self.layers) if layer.manifest is not None
        )

    def modules(self) -> tuple[tuple[str, Entry], ...]:
        """(stem, entry) for every source, common then leaf, leaf replacing common, by stem."""
        ext = self.hardware.source_ext
        mods: dict[str, Entry] = {}
        for role_map in (self.common, self.leaf):
            for name, entry in role_map.items():
                if _ext_of(name) == ext:
                    mods[stem_of(name)] = entry
        return tuple(sorted(mods.items()))

    def sources(self) -> tuple[Path, ...]:
        """The modules' source paths, sorted."""
        return tuple(sorted(entry.source for _, entry in self.modules()))

    def role_of(self, entry: Entry) -> Role:
        """The role of the layer an entry came from."""
        return self.layers[entry.layer].role

    def inputs(self) -> tuple[Path, ...]:
        """Every entry's source, every file under every role subdirectory, and ``configs()``."""
        files: set[Path] = set()
        for role_map in (self.leaf, self.common):
            files.update(entry.source for entry in role_map.values())
        for subdirs in (self.leaf_subdirs, self.common_subdirs):
            for sub in subdirs.values():
                files.update(_files_under(sub))
        files.update(self.configs())
        return tuple(sorted(files))


# One pass makes tens of thousands of these frozen values, and a frozen dataclass's
# __init__ sets each field through object.__setattr__ (about four times the cost of
# the rest of making one). So the hot paths build each value as a "shell": a plain
# class with the very same slots, filled by ordinary attribute stores, whose class is
# then switched to the value class. The result is an ordinary instance of the value
# class (same type, fields, equality, hash and repr; none of them has __post_init__).
# CPython refuses the switch (TypeError) unless both layouts are identical, so a field
# added to a value class without its shell fails loudly, never silently.


class _EntryShell:
    __slots__ = ("layer", "name", "source", "used")


class _LayerShell:
    __slots__ = ("dir", "hardware", "manifest", "role", "tier")


class _ShadowShell:
    __slots__ = ("loser", "name", "reason", "role", "winner")


class _ManifestShell:
    __slots__ = ("doc", "path", "shadow", "uses")


class _TargetShell:
    __slots__ = ("hardware", "model", "quant")


class _LayoutShell:
    __slots__ = (
        "common",
        "common_subdirs",
        "hardware",
        "hardware_manifests",
        "layers",
        "leaf",
        "leaf_subdirs",
        "model_dir",
        "model_manifests",
        "shadows",
        "source_model",
        "target",
    )


def _make_entry(name: str, source: Path, layer: int, used: bool) -> Entry:
    """``Entry(name=name, source=source, layer=layer, used=used)``, fast."""
    value: Any = _EntryShell()
    value.name = name
    value.source = source
    value.layer = layer
    value.used = used
    value.__class__ = Entry
    return cast("Entry", value)


def _make_layer(
    role: Role, tier: Tier, hardware: str, directory: Path, manifest: KernelManifest | None
) -> Layer:
    """``Layer(role=..., tier=..., hardware=..., dir=..., manifest=...)``, fast."""
    value: Any = _LayerShell()
    value.role = role
    value.tier = tier
    value.hardware = hardware
    value.dir = directory
    value.manifest = manifest
    value.__class__ = Layer
    return cast("Layer", value)


def _make_shadow(role: Role, name: str, winner: Path, loser: Path, reason: str) -> Shadow:
    """``Shadow(role=..., name=..., winner=..., loser=..., reason=...)``, fast."""
    value: Any = _ShadowShell()
    value.role = role
    value.name = name
    value.winner = winner
    value.loser = loser
    value.reason = reason
    value.__class__ = Shadow
    return cast("Shadow", value)


def _make_manifest(
    path: Path, uses: tuple[str, ...], shadow: Mapping[str, str], doc: Mapping[str, Any]
) -> KernelManifest:
    """``KernelManifest(path=..., uses=..., shadow=..., doc=...)``, fast."""
    value: Any = _ManifestShell()
    value.path = path
    value.uses = uses
    value.shadow = shadow
    value.doc = doc
    value.__class__ = KernelManifest
    return cast("KernelManifest", value)


def _make_target(hardware: str, model: str, quant: str) -> Target:
    """``Target(hardware=..., model=..., quant=...)``, fast."""
    value: Any = _TargetShell()
    value.hardware = hardware
    value.model = model
    value.quant = quant
    value.__class__ = Target
    return cast("Target", value)


def _make_layout(
    target: Target,
    hardware: Hardware,
    layers: tuple[Layer, ...],
    leaf: Mapping[str, Entry],
    common: Mapping[str, Entry],
    leaf_subdirs: Mapping[str, Path],
    common_subdirs: Mapping[str, Path],
    shadows: tuple[Shadow, ...],
    source_model: str,
    model_dir: Path,
    model_manifests: tuple[Path, ...],
    hardware_manifests: tuple[Path, ...],
) -> Layout:
    """``Layout(...)`` with every field given, fast."""
    value: Any = _LayoutShell()
    value.target = target
    value.hardware = hardware
    value.layers = layers
    value.leaf = leaf
    value.common = common
    value.leaf_subdirs = leaf_subdirs
    value.common_subdirs = common_subdirs
    value.shadows = shadows
    value.source_model = source_model
    value.model_dir = model_dir
    value.model_manifests = model_manifests
    value.hardware_manifests = hardware_manifests
    value.__class__ = Layout
    return cast("Layout", value)


def _files_under(top: Path) -> Iterator[Path]:
    for dirpath, _dirnames, filenames in os.walk(top):
        base = Path(dirpath)
        for name in filenames:
            path = base / name
            if not path.is_symlink():
                yield path


# --------------------------------------------------------------------------- errors


class LayoutError(MetraleError):
    """Base of every layout resolution error; ``str()`` names the file(s) involved."""


class UnknownHardware(LayoutError):
    """``kernels/<hw>/HARDWARE.toml`` does not exist."""

    def __init__(self, hardware: str, path: Path, rel: str) -> None:
        self.hardware = hardware
        self.path = path
        super().__init__(
            f"{rel}: no such file: `{hardware}` is not a hardware tree "
            f"(a hardware tree is a directory kernels/<hw>/ holding {HARDWARE_TOML})"
        )


class ManifestError(LayoutError):
    """A manifest cannot be read, or a key has the wrong shape."""

    def __init__(self, path: Path, rel: str, key: str | None, problem: str) -> None:
        self.path = path
        self.key = key
        self.problem = problem
        where = f"{rel}: {key}" if key else rel
        super().__init__(f"{where}: {problem}")


class UnknownVendor(LayoutError):
    """``[hardware] vendor`` names no known vendor."""

    def __init__(self, path: Path, rel: str, vendor: str) -> None:
        self.path = path
        self.vendor = vendor
        known = ", ".join(sorted(_VENDOR_EXT))
        super().__init__(
            f"{rel}: [hardware] vendor = {vendor!r} is not a known vendor (known: {known})"
        )


class InheritsError(LayoutError):
    """``[hardware] inherits`` names a tree that cannot be a parent."""

    def __init__(
        self,
        path: Path,
        rel: str,
        hardware: str,
        parent: str,
        problem: str,
        cause: LayoutError | None = None,
    ) -> None:
        self.path = path
        self.hardware = hardware
        self.parent = parent
        self.problem = problem
        self.cause = cause
        super().__init__(f"{rel}: [hardware] inherits = {parent!r}: {problem}")


class RedirectError(LayoutError):
    """``[model] kernel_source`` does not name a model that owns its own sources."""

    def __init__(self, path: Path, rel: str, model_dir: Path, referent: Path, problem: str) -> None:
        self.path = path
        self.model_dir = model_dir
        self.referent = referent
        self.problem = problem
        super().__init__(f"{rel}: [model] kernel_source: {problem}")


class UnknownModel(LayoutError):
    """``kernels/<hw>/<model>`` does not exist."""

    def __init__(self, target: Target, model_dir: Path, rel: str) -> None:
        self.target = target
        self.model_dir = model_dir
        super().__init__(
            f"{rel}: no such directory: `{target.model}` is not a model of "
            f"kernels/{target.hardware} (target {target})"
        )


class NoKernelDirectory(LayoutError):
    """None of a target's layer directories exists."""

    def __init__(self, target: Target, dirs: tuple[Path, ...], rels: tuple[str, ...]) -> None:
        self.target = target
        self.dirs = dirs
        super().__init__(
            f"target {target} has no kernel directory: none of {', '.join(rels)} exists"
        )


class SymlinkError(LayoutError):
    """A layer child or a used file is a symlink; trees hold real files only."""

    def __init__(self, path: Path, rel: str, manifest: Path | None = None) -> None:
        self.path = path
        self.manifest = manifest
        super().__init__(
            f"{rel}: is a symlink; kernel trees hold real files only "
            "(share a file with [sources] use instead)"
        )


class UseError(LayoutError):
    """A ``[sources] use`` string does not name a kernel file of the tree."""

    def __init__(self, manifest: Path, rel: str, use: str, problem: str) -> None:
        self.manifest = manifest
        self.use = use
        self.problem = problem
        super().__init__(f"{rel}: [sources] use {use!r}: {problem}")


class UseCollides(LayoutError):
    """A used file's name is already an entry of the same layer."""

    def __init__(
        self, manifest: Path, rel: str, use: str, name: str, existing: Path, existing_rel: str
    ) -> None:
        self.manifest = manifest
        self.use = use
        self.name = name
        self.existing = existing
        super().__init__(
            f"{rel}: [sources] use {use!r}: this layer already has an entry named "
            f"{name!r} ({existing_rel}); remove one of them"
        )


class UndeclaredShadow(LayoutError):
    """A win that the winner's layer does not declare in ``[shadow]``."""

    def __init__(
        self,
        *,
        winner: Path,
        loser: Path,
        manifest: Path,
        stem: str,
        role: Role,
        rels: tuple[str, str, str],
        exists: bool,
    ) -> None:
        self.winner = winner
        self.loser = loser
        self.manifest = manifest
        self.stem = stem
        self.role = role
        w, lo, m = rels
        todo = "add" if exists else "create it with"
        super().__init__(
            f"{w} shadows {lo} but {m} does not declare it: {todo} "
            f'`[shadow] {_toml_key(stem)} = "<reason>"` in {m}'
        )


class DeadShadow(LayoutError):
    """A ``[shadow]`` key that covers no win."""

    def __init__(self, manifest: Path, rel: str, stem: str, target: Target) -> None:
        self.manifest = manifest
        self.stem = stem
        self.target = target
        super().__init__(
            f"{rel}: [shadow] {_toml_key(stem)} declares a shadow, but no file of stem "
            f"{stem!r} in this layer shadows another (target {target}); remove the key"
        )


class SelfShadow(LayoutError):
    """A win of a file over itself (typically a ``use`` of a file the common role reaches)."""

    def __init__(self, path: Path, rel: str, name: str, manifest: Path, manifest_rel: str) -> None:
        self.path = path
        self.name = name
        self.manifest = manifest
        super().__init__(
            f"{rel} shadows itself as {name!r} (declared through {manifest_rel}): "
            "the file is already reached; remove the [sources] use of it"
        )


class RetiredKey(LayoutError):
    """``[kernels] overrides`` in HARDWARE.toml: replacements go to ``[shadow]`` now."""

    def __init__(self, path: Path, rel: str, key: str) -> None:
        self.path = path
        self.key = key
        super().__init__(
            f"{rel}: {key} is retired: declare each replacement in [shadow] of the "
            "winner's KERNEL.toml instead, then remove the key"
        )


class UnnamableFile(LayoutError):
    """A file or directory name under ``kernels/`` is not valid UTF-8.

    Python keeps such a name's bytes as lone surrogates; doit's database, the
    cache keys and every message hold names as UTF-8, so the tree must be fixed.
    """

    def __init__(self, path: Path, rel: str) -> None:
        self.path = path
        super().__init__(unnamable_message(rel))


def unnamable_message(rel: str) -> str:
    """The one-line message for a path whose name is not valid UTF-8 (pure)."""
    return (
        f"{printable(rel)}: the name is not valid UTF-8; rename it (kernel trees, "
        "doit's database and the cache keys hold file names as UTF-8)"
    )


def _toml_key(stem: str) -> str:
    bare = stem and all((c.isalnum() and c.isascii()) or c in "-_" for c in stem)
    return stem if bare else '"' + stem.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --------------------------------------------------------------------------- snapshot

_Kind = str  # "link" | "dir" | "file" | "other"
_K = TypeVar("_K")
_V = TypeVar("_V")
#: A directory's part of a layer, per source extension: (first symlink child or None,
#: kernel files (name -> Path, in name order), sources (stem -> name), subdirectories
#: (name -> Path, in name order), the first entry or subdirectory whose name is not
#: valid UTF-8 or None). A source's name is its stem plus the one source extension, so
#: stem and name determine each other.
_DirPart = tuple[str | None, dict[str, Path], dict[str, str], dict[str, Path], str | None]
#: A layer's scan: entries (name -> Entry, in name order), sources (stem -> name),
#: subdirectories (name -> Path, in name order); shared read-only by its targets.
_Scan = tuple[dict[str, "Entry"], dict[str, str], dict[str, Path]]
#: (layers, whether any layer directory exists, layer directory spellings)
_Layers = tuple[tuple[Layer, ...], bool, tuple[str, ...]]


def _child(parent: Path, name: str) -> Path:
    """``parent / name`` for a single component, without pathlib's re-parsing when possible."""
    make = getattr(parent, "_make_child_relpath", None)
    return make(name) if make is not None else parent / name


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


class TreeSnapshot:
    """Listings and parsed manifests of one tree, memoised for one resolution pass.

    Internally every file is keyed by its root-relative POSIX spelling (the
    spelling messages use too); ``Path`` objects are made once per file, for
    the values handed out. Results and errors are cached alike, so a pass
    scans each directory and parses each manifest once. Make a new snapshot
    for each independent pass.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.kernels = self.root / "kernels"
        self._root_s = os.fspath(self.root)
        # os.path.join(root, rel) without its generality (rel is one str, rarely absolute).
        self._prefix = self._root_s if self._root_s.endswith("/") else self._root_s + "/"
        self._paths: dict[str, Path] = {"": self.root, "kernels": self.kernels}
        self._lists: dict[str, tuple[tuple[str, _Kind], ...] | None] = {}
        self._kinds: dict[str, dict[str, _Kind] | None] = {}
        self._dir_parts: dict[tuple[str, str], _DirPart | None] = {}
        self._allowed: dict[str, frozenset[str] | LayoutError | None] = {}
        self._parents: dict[tuple[str, str], tuple[str, tuple[Path, ...]] | LayoutError] = {}
        self._common_layers: dict[str, tuple[Layer, ...]] = {}
        self._read: dict[tuple[str, str], tuple[Path, ...]] = {}
        self._hw_read: dict[str, tuple[Path, ...]] = {}
        self._tomls: dict[str, dict[str, Any] | LayoutError | None] = {}
        self._hw: dict[str, Hardware | LayoutError] = {}
        self._hw_raw: dict[str, Hardware | LayoutError] = {}
        self._km: dict[str, KernelManifest | LayoutError | None] = {}
        self._ksd: dict[str, str | LayoutError] = {}
        self._scans: dict[tuple[str, int, str, str], _Scan | LayoutError] = {}
        self._commons: dict[str, _CommonPart | LayoutError] = {}
        self._models: dict[tuple[str, str], tuple[str, str, tuple[Path, ...]] | LayoutError] = {}
        self._layers: dict[tuple[str, str, str], _Layers | LayoutError] = {}
        self._shadow_keys: dict[str, tuple[str, ...]] = {}
        self._uses: dict[tuple[str, str, str], tuple[Path, str, str | None]] = {}

    # -- paths

    def path(self, rel: str) -> Path:
        """The Path of a root-relative POSIX spelling, made once per pass."""
        path = self._paths.get(rel)
        if path is None:
            head, _, tail = rel.rpartition("/")
            path = self._paths[rel] = _child(self.path(head), tail)
        return path

    def rel(self, path: Path | str) -> str:
        """Root-relative POSIX spelling of a path under the root (a str is taken as one)."""
        if isinstance(path, str):
            return path
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return path.as_posix()

    def _fs(self, rel: str) -> str:
        """``os.path.join(root, rel)`` for a non-empty spelling."""
        return rel if rel[0] == "/" else self._prefix + rel

    # -- file system, memoised

    def listing(self, directory: Path | str) -> tuple[tuple[str, _Kind], ...] | None:
        """Sorted (name, kind) children of a directory, or None when it is not one."""
        rel = self.rel(directory)
        result = self._lists.get(rel, _MISSING)
        if result is _MISSING:
            kinds = self._kinds_of(rel)
            result = self._lists[rel] = None if kinds is None else tuple(sorted(kinds.items()))
        return cast("tuple[tuple[str, _Kind], ...] | None", result)

    def _kinds_of(self, rel: str) -> dict[str, _Kind] | None:
        """name -> kind of a directory's children (listing order), or None: not a directory."""
        kinds = self._kinds.get(rel, _MISSING)
        if kinds is _MISSING:
            kinds = self._kinds[rel] = self._scandir(rel)
        return cast("dict[str, _Kind] | None", kinds)

    def _scandir(self, rel: str) -> dict[str, _Kind] | None:
        kinds: dict[str, _Kind] = {}
        try:
            with os.scandir(self._fs(rel) if rel else self._root_s) as it:
                for de in it:
                    # Without following links, a symlink is neither a file nor a directory.
                    if de.is_file(follow_symlinks=False):
                        kinds[de.name] = "file"
                    elif de.is_dir(follow_symlinks=False):
                        kinds[de.name] = "dir"
                    elif de.is_symlink():
                        kinds[de.name] = "link"
                    else:
                        kinds[de.name] = "other"
        except (FileNotFoundError, NotADirectoryError):
            return None
        return kinds

    def kind(self, rel: str) -> _Kind | None:
        """The kind of a path as its parent's listing says (None: absent)."""
        head, _, tail = rel.rpartition("/")
        kinds = self._kinds_of(head)
        return None if kinds is None else kinds.get(tail)

    def is_dir(self, path: Path | str) -> bool:
        return self._kinds_of(self.rel(path)) is not None

    def is_file(self, rel: str) -> bool:
        """A regular file, or a symlink to one (as the file system would read it)."""
        kind = self.kind(rel)
        return kind == "file" or (kind == "link" and os.path.isfile(self.path(rel)))

    def not_a_file(self, rel: str) -> bool:
        """Something is there that is not a regular file (a directory, a FIFO, a link to one)."""
        kind = self.kind(rel)
        if kind == "link":
            path = self.path(rel)
            return os.path.exists(path) and not os.path.isfile(path)
        return kind in ("dir", "other")

    def toml(self, path: Path | str) -> dict[str, Any] | None:
        """The parsed TOML file, None when it is not a file; raises ManifestError when bad."""
        rel = self.rel(path)
        cached = self._tomls.get(rel, _MISSING)
        if cached is _MISSING:
            cached = None
            if self.is_file(rel):
                try:
                    with open(self._fs(rel), "rb") as fh:
                        cached = tomllib.loads(fh.read().decode("utf-8"))
                except FileNotFoundError:
                    cached = None
                except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                    cached = ManifestError(
                        self.path(rel), rel, None, f"cannot be read as TOML: {exc}"
                    )
            self._tomls[rel] = cached
        if isinstance(cached, LayoutError):
            raise cached
        return cast("dict[str, Any] | None", cached)

    # -- manifests

    def hardware_raw(self, hw: str) -> Hardware:
        """HARDWARE.toml with its own checks, without the ``inherits`` checks."""
        return _cached(self._hw_raw, hw, lambda: self._load_hardware(hw))

    def hardware(self, hw: str) -> Hardware:
        """HARDWARE.toml with ``inherits`` checked."""
        return _cached(self._hw, hw, lambda: self._check_inherits(self.hardware_raw(hw)))

    def _load_hardware(self, hw: str) -> Hardware:
        rel = f"kernels/{hw}/{HARDWARE_TOML}"
        path = self.path(rel)
        doc = self.toml(rel)
        if doc is None:
            raise UnknownHardware(hw, path, rel)
        kernels_table = doc.get("kernels")
        if isinstance(kernels_table, dict) and "overrides" in kernels_table:
            raise RetiredKey(path, rel, "[kernels] overrides")
        table = doc.get("hardware")
        if not isinstance(table, dict):
            table = {}
        vendor = table.get("vendor", "nvidia")
        if not isinstance(vendor, str):
            raise ManifestError(path, rel, "[hardware] vendor", _not_string(vendor))
        ext = source_ext(vendor)
        if ext is None:
            raise UnknownVendor(path, rel, vendor)
        arch = table.get("arch")
        if arch is not None and not isinstance(arch, str):
            raise ManifestError(path, rel, "[hardware] arch", _not_string(arch))
        inherits = table.get("inherits")
        if inherits is not None and not isinstance(inherits, str):
            raise ManifestError(path, rel, "[hardware] inherits", _not_string(inherits))
        return Hardware(
            name=hw,
            vendor=vendor,
            arch=arch,
            inherits=inherits,
            source_ext=ext,
            path=path,
            doc=MappingProxyType(doc),
        )

    def _check_inherits(self, hw: Hardware) -> Hardware:
        parent = hw.inherits
        if parent is None:
            return hw
        rel = self.rel(hw.path)
        if parent == hw.name:
            raise InheritsError(
                hw.path, rel, hw.name, parent, "a tree cannot inherit itself; remove the key"
            )
        try:
            phw = self.hardware_raw(parent)
        except LayoutError as exc:
            raise InheritsError(
                hw.path, rel, hw.name, parent, f"the parent tree fails to load: {exc}", exc
            ) from exc
        if phw.inherits is not None:
            raise InheritsError(
                hw.path,
                rel,
                hw.name,
                parent,
                f"the parent inherits {phw.inherits!r} in turn; inheritance chains are "
                "refused (inherit a tree that inherits nothing)",
            )
        if phw.source_ext != hw.source_ext:
            raise InheritsError(
                hw.path,
                rel,
                hw.name,
                parent,
                f"the parent compiles .{phw.source_ext} sources but {hw.name!r} compiles "
                f".{hw.source_ext}; a tree can only inherit one of the same source extension",
            )
        return hw

    def kernel_manifest(self, directory: Path | str) -> KernelManifest | None:
        """``<directory>/KERNEL.toml`` parsed and validated, or None when absent."""
        rel = self.rel(directory)
        manifest = self._km.get(rel, _MISSING)
        if manifest is _MISSING:
            try:
                manifest = self._km[rel] = self._load_kernel_manifest(rel)
            except LayoutError as exc:
                self._km[rel] = exc
                raise
        elif isinstance(manifest, LayoutError):
            raise manifest
        return cast("KernelManifest | None", manifest)

    def _load_kernel_manifest(self, directory: str) -> KernelManifest | None:
        rel = _join(directory, KERNEL_TOML)
        doc = self.toml(rel)
        if doc is None:
            return None
        path = self.path(rel)
        uses: tuple[str, ...] = ()
        if "sources" in doc:
            sources = doc["sources"]
            if not isinstance(sources, dict):
                raise ManifestError(path, rel, "[sources]", "must be a table")
            extra = sorted(k for k in sources if k != "use") if sources.keys() - {"use"} else ()
            if extra:
                raise ManifestError(
                    path, rel, f"[sources] {extra[0]}", "unknown key ([sources] holds only `use`)"
                )
            if "use" in sources:
                use = sources["use"]
                if not isinstance(use, list):
                    raise ManifestError(path, rel, "[sources] use", "must be an array of strings")
                for i, item in enumerate(use):
                    if not isinstance(item, str):
                        raise ManifestError(
                            path, rel, f"[sources] use[{i}]", f"must be a string, {_got(item)}"
                        )
                uses = tuple(use)
        shadow: dict[str, str] = {}
        if "shadow" in doc:
            table = doc["shadow"]
            if not isinstance(table, dict):
                raise ManifestError(path, rel, "[shadow]", 'must be a table of stem = "reason"')
            for stem, reason in table.items():
                if not isinstance(reason, str):
                    raise ManifestError(
                        path,
                        rel,
                        f"[shadow] {_toml_key(stem)}",
                        f"the reason must be a string, {_got(reason)}",
                    )
                if not reason.strip():
                    raise ManifestError(
                        path,
                        rel,
                        f"[shadow] {_toml_key(stem)}",
                        "the reason is blank; say why the file replaces another",
                    )
            shadow = dict(table)
        return _make_manifest(path, uses, MappingProxyType(shadow), MappingProxyType(doc))

    def model_table(self, model_dir: Path | str) -> tuple[str, dict[str, Any] | None]:
        """(MODEL.toml spelling, its ``[model]`` table, or None when the file is absent)."""
        rel = _join(self.rel(model_dir), MODEL_TOML)
        doc = self.toml(rel)
        if doc is None:
            return rel, None
        table = doc.get("model")
        return rel, table if isinstance(table, dict) else {}

    def kernel_source_dir(self, model_dir: Path | str) -> str:
        """The source model directory's spelling (``[model] kernel_source`` followed, one hop)."""
        rel = self.rel(model_dir)
        return _cached(self._ksd, rel, lambda: self._load_kernel_source_dir(rel))

    def _load_kernel_source_dir(self, model_dir: str) -> str:
        rel, table = self.model_table(model_dir)
        if table is None or "kernel_source" not in table:
            return model_dir
        path = self.path(rel)
        value = table["kernel_source"]
        if not isinstance(value, str):
            raise ManifestError(path, rel, "[model] kernel_source", _not_string(value))
        if not value.strip():
            raise ManifestError(
                path, rel, "[model] kernel_source", "is blank; name a sibling model directory"
            )
        # The referent is <hw dir>/<value>, not normalised (pathlib drops "." alone).
        referent_path = self.path(model_dir.rpartition("/")[0]) / value
        referent = self.rel(referent_path)
        if not self.is_dir(referent):
            raise RedirectError(
                path, rel, self.path(model_dir), referent_path, f"{referent} is not a directory"
            )
        ref_rel, ref_table = self.model_table(referent)
        if ref_table is None:
            raise RedirectError(
                path,
                rel,
                self.path(model_dir),
                referent_path,
                f"{referent} is not a model (it has no {MODEL_TOML})",
            )
        if "kernel_source" in ref_table:
            raise RedirectError(
                path,
                rel,
                self.path(model_dir),
                referent_path,
                f"{ref_rel} redirects too; a redirect takes one hop only "
                "(point at the model that owns the sources)",
            )
        return referent

    def supports_quant(self, model_dir: Path | str, quant: str) -> bool:
        """Whether ``[model] supported_quants`` admits ``quant`` (absent list: every quant)."""
        rel = self.rel(model_dir)
        allowed = self._allowed.get(rel, _MISSING)
        if allowed is _MISSING:
            try:
                allowed = self._allowed[rel] = self._load_allowed(rel)
            except LayoutError as exc:
                self._allowed[rel] = exc
                raise
        if isinstance(allowed, LayoutError):
            raise allowed
        return allowed is None or quant in allowed

    def _load_allowed(self, model_dir: str) -> frozenset[str] | None:
        rel, table = self.model_table(model_dir)
        if table is None or "supported_quants" not in table:
            return None
        path = self.path(rel)
        key = "[model] supported_quants"
        quants = table["supported_quants"]
        if not isinstance(quants, list) or not quants:
            raise ManifestError(
                path, rel, key, "must be a non-empty array of quant names (or be left out)"
            )
        for i, q in enumerate(quants):
            if not isinstance(q, str) or not q.strip():
                raise ManifestError(
                    path, rel, f"{key}[{i}]", f"must be a non-blank string, {_got(q)}"
                )
        return frozenset(quants)

    def parent_source_dir(self, parent: str, name: str) -> str:
        """The parent tree's source-model directory for the own source model ``name``."""
        pmodel = f"kernels/{parent}/{name}"
        if self.toml(_join(pmodel, MODEL_TOML)) is not None:
            return self.kernel_source_dir(pmodel)
        return pmodel

    def _parent_leaf_source(self, parent: str, name: str) -> tuple[str, tuple[Path, ...]]:
        """(parent source-model dir, the parent MODEL.toml files that took), once per pass."""
        return _cached(
            self._parents, (parent, name), lambda: self._load_parent_leaf_source(parent, name)
        )

    def _load_parent_leaf_source(self, parent: str, name: str) -> tuple[str, tuple[Path, ...]]:
        psource = self.parent_source_dir(parent, name)
        pmodel = f"kernels/{parent}/{name}"
        read: tuple[Path, ...] = ()
        if psource != pmodel or self.is_file(_join(pmodel, MODEL_TOML)):
            read = tuple(sorted({self.path(_join(d, MODEL_TOML)) for d in (pmodel, psource)}))
        return psource, read

    # -- per-target pieces, each computed once per pass

    def model_dirs(self, hw: str, model: str) -> tuple[str, str, tuple[Path, ...]]:
        """(model dir, source model dir, MODEL.toml files read); raises UnknownModel etc."""
        return _cached(self._models, (hw, model), lambda: self._load_model_dirs(hw, model))

    def _load_model_dirs(self, hw: str, model: str) -> tuple[str, str, tuple[Path, ...]]:
        model_dir = f"kernels/{hw}/{model}"
        if not self.is_dir(model_dir):
            target = Target(hardware=hw, model=model, quant="*")
            raise UnknownModel(target, self.path(model_dir), model_dir)
        source_dir = self.kernel_source_dir(model_dir)
        read = {_join(d, MODEL_TOML) for d in (model_dir, source_dir)}
        return model_dir, source_dir, tuple(self.path(r) for r in sorted(read) if self.is_file(r))

    def target_layers(self, hw: Hardware, source_dir: str, quant: str) -> _Layers:
        """(layers, whether any layer directory exists, the layer directories' spellings).

        Loads the layer manifests in SPEC order: own leaf, parent leaf (following the
        parent tree's redirect), own common, parent common.
        """
        key = (hw.name, source_dir, quant)
        layers = self._layers.get(key)
        if layers is None:
            return _cached(self._layers, key, lambda: self._load_layers(hw, source_dir, quant))
        if isinstance(layers, LayoutError):
            raise layers
        return layers

    def _load_layers(self, hw: Hardware, source_dir: str, quant: str) -> _Layers:
        own_leaf = _join(source_dir, quant)
        own_leaf_m = self.kernel_manifest(own_leaf)
        own_common = f"kernels/{hw.name}/{COMMON}"
        leaf = _make_layer(Role.LEAF, Tier.OWN, hw.name, self.path(own_leaf), own_leaf_m)
        layers: tuple[Layer, ...]
        rels: tuple[str, ...]
        if hw.inherits is None:
            own_common_m = self.kernel_manifest(own_common)
            rels = (own_leaf, own_common)
            layers = (leaf, *self._common_layers_of(hw, rels[1:], (own_common_m,)))
        else:
            parent = hw.inherits
            psource, _read = self._parent_leaf_source(parent, source_dir.rpartition("/")[2])
            parent_leaf = _join(psource, quant)
            parent_leaf_m = self.kernel_manifest(parent_leaf)
            own_common_m = self.kernel_manifest(own_common)
            parent_common = f"kernels/{parent}/{COMMON}"
            parent_common_m = self.kernel_manifest(parent_common)
            rels = (own_leaf, parent_leaf, own_common, parent_common)
            pleaf = _make_layer(
                Role.LEAF, Tier.PARENT, parent, self.path(parent_leaf), parent_leaf_m
            )
            layers = (
                leaf,
                pleaf,
                *self._common_layers_of(hw, rels[2:], (own_common_m, parent_common_m)),
            )
        kinds_of = self._kinds_of
        exists = any(kinds_of(d) is not None for d in rels)
        return layers, exists, rels

    def _common_layers_of(
        self, hw: Hardware, rels: tuple[str, ...], manifests: tuple[KernelManifest | None, ...]
    ) -> tuple[Layer, ...]:
        """The common layers of ``hw`` (the same for all its targets): made once per pass."""
        layers = self._common_layers.get(hw.name)
        if layers is None:
            tiers = ((Tier.OWN, hw.name), (Tier.PARENT, hw.inherits or ""))
            layers = self._common_layers[hw.name] = tuple(
                Layer(
                    role=Role.COMMON,
                    tier=tiers[i][0],
                    hardware=tiers[i][1],
                    dir=self.path(rels[i]),
                    manifest=manifests[i],
                )
                for i in range(len(rels))
            )
        return layers

    def model_manifests(self, hw: Hardware, model: str, source_dir: str) -> tuple[Path, ...]:
        """MODEL.toml files a resolved target of ``hw/model`` read, sorted; once per pass."""
        key = (hw.name, model)
        read = self._read.get(key)
        if read is None:
            files = set(self.model_dirs(hw.name, model)[2])
            if hw.inherits is not None:
                name = source_dir.rpartition("/")[2]
                files.update(self._parent_leaf_source(hw.inherits, name)[1])
            read = self._read[key] = tuple(sorted(files))
        return read

    def hardware_manifests(self, hw: Hardware) -> tuple[Path, ...]:
        """HARDWARE.toml files a target of ``hw`` read (own, parent); once per pass."""
        read = self._hw_read.get(hw.name)
        if read is None:
            read = (hw.path,)
            if hw.inherits is not None:
                read += (self.path(f"kernels/{hw.inherits}/{HARDWARE_TOML}"),)
            self._hw_read[hw.name] = read
        return read

    def layer_scan(self, rel: str, index: int, layer: Layer, ext: str) -> _Scan:
        """A layer's entries (directory part, then ``use`` part), sources and subdirectories.

        Cached per (directory, index): a common directory shared by many targets is
        scanned once per pass.
        """
        key = (rel, index, layer.hardware, ext)
        scan = self._scans.get(key)
        if scan is None:
            try:
                scan = self._scans[key] = self._layer_scan(rel, index, layer, ext)
            except LayoutError as exc:
                self._scans[key] = exc
                raise
        elif isinstance(scan, LayoutError):
            raise scan
        return scan

    def _dir_part(self, rel: str, ext: str) -> _DirPart | None:
        """A directory's children sorted into kernel files and subdirectories, once per pass."""
        key = (rel, ext)
        cached = self._dir_parts.get(key, _MISSING)
        if cached is not _MISSING:
            return cast("_DirPart | None", cached)
        part: _DirPart | None = None
        kinds = self._kinds_of(rel)
        if kinds is not None:
            base = self.path(rel)
            make: Callable[[str], Path] = getattr(base, "_make_child_relpath", base.joinpath)
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
        self._dir_parts[key] = part
        return part

    def _layer_scan(self, rel: str, index: int, layer: Layer, ext: str) -> _Scan:
        part = self._dir_part(rel, ext)
        files: dict[str, Path]
        stems: dict[str, str]
        subdirs: dict[str, Path]
        if part is None:
            files, stems, subdirs = {}, {}, {}
        else:
            link, files, stems, subdirs, unnamable = part
            if link is not None:
                child = _join(rel, link)
                raise SymlinkError(self.path(child), child)
            if unnamable is not None:
                child = _join(rel, unnamable)
                raise UnnamableFile(self.path(child), child)
        manifest = layer.manifest
        if manifest is None or not manifest.uses:
            entries = {name: _make_entry(name, path, index, False) for name, path in files.items()}
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
            entries[name] = _make_entry(name, path, index, False)
        for name, path in used.items():
            entries[name] = _make_entry(name, path, index, True)
        return entries, stems, subdirs

    def _use(self, layer: Layer, use: str, ext: str) -> tuple[Path, str, str | None]:
        """Steps 1-6 of SPEC 1.3 for one ``use`` string.

        Returns the file's path, its name, and its stem when it is a source (else None).
        """
        assert layer.manifest is not None
        cache_key = (layer.hardware, use, ext)
        cached = self._uses.get(cache_key)
        if cached is not None:
            return cached
        manifest = layer.manifest.path
        if use.startswith(("/", "\\")) or os.path.isabs(use):
            mrel = self.rel(manifest)
            raise UseError(manifest, mrel, use, f"must be relative to kernels/{layer.hardware}")
        parts: list[str] = ["kernels", layer.hardware]
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
            mrel = self.rel(manifest)
            raise UseError(manifest, mrel, use, "escapes kernels/ (a use must stay inside it)")
        prel = "/".join(parts)
        path = self.path(prel)
        try:
            st = os.lstat(path)
        except OSError:
            raise UseError(manifest, self.rel(manifest), use, f"no such file: {prel}") from None
        if stat.S_ISLNK(st.st_mode):
            raise SymlinkError(path, prel, manifest)
        if not stat.S_ISREG(st.st_mode):
            raise UseError(
                manifest, self.rel(manifest), use, f"no such file: {prel} is not a regular file"
            )
        name = path.name
        if not _is_kernel_file(name, ext):
            raise UseError(
                manifest,
                self.rel(manifest),
                use,
                f"not a .{ext} source or a header (.{' or .'.join(HEADER_EXTS)}): {prel}",
            )
        found = self._uses[cache_key] = (
            path,
            name,
            stem_of(name) if _ext_of(name) == ext else None,
        )
        return found

    def common_part(
        self, hw: Hardware, layers: tuple[Layer, ...], rels: tuple[str, ...], first: int
    ) -> _CommonPart:
        """The merged common layers ``layers[first:]`` of ``hw``, merged once per pass."""
        part = self._commons.get(hw.name)
        if part is None:
            return _cached(
                self._commons, hw.name, lambda: _merge_common(self, hw, layers, rels, first)
            )
        if isinstance(part, LayoutError):
            raise part
        return part

    def shadow_keys(self, directory: str, manifest: KernelManifest) -> tuple[str, ...]:
        """The ``[shadow]`` keys of ``directory``'s manifest, sorted, once per pass."""
        keys = self._shadow_keys.get(directory)
        if keys is None:
            keys = self._shadow_keys[directory] = tuple(sorted(manifest.shadow))
        return keys


def _cached(cache: dict[_K, _V | LayoutError], key: _K, make: Callable[[], _V]) -> _V:
    value = cache.get(key, _MISSING)
    if value is _MISSING:
        try:
            value = cache[key] = make()
        except LayoutError as exc:
            cache[key] = exc
            raise
    if isinstance(value, LayoutError):
        raise value
    return cast("_V", value)


_MISSING: Any = object()


def _got(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "float", dict: "table", list: "array"}
    return f"got {names.get(type(value), type(value).__name__)} {value!r}"


def _not_string(value: object) -> str:
    return f"must be a string, {_got(value)}"


# --------------------------------------------------------------------------- public readers


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


# --------------------------------------------------------------------------- discover


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
            rel = _join(mdir, MODEL_TOML)
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
                        shadows.append(_declared(snap, layers, present, entry, name, covered))
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
            shadows.append(_declared(snap, layers, leaf[name], loser, name, covered))

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
    return _make_layout(
        target,
        hw,
        layers,
        MappingProxyType(leaf),
        common.entries,
        MappingProxyType(leaf_subdirs),
        common.subdirs,
        tuple(shadows),
        source_dir.rpartition("/")[2],
        snap.path(model_dir),
        snap.model_manifests(hw, target.model, source_dir),
        snap.hardware_manifests(hw),
    )


def _shadow_order(s: Shadow) -> tuple[int, str, Path]:
    return _ROLE_ORDER[s.role], s.name, s.loser


def _declared(
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
    return _make_shadow(layer.role, name, winner.source, loser.source, manifest.shadow[stem])


@dataclass(frozen=True, slots=True)
class _CommonPart:
    """The merged common role of one hardware tree (the same for all its targets)."""

    entries: Mapping[str, Entry]
    subdirs: Mapping[str, Path]
    shadows: tuple[Shadow, ...]
    #: source stem -> the resolved common entry
    by_stem: Mapping[str, Entry]
    #: the first dead [shadow] key of a common layer (manifest, stem), if any
    dead: tuple[Path, str] | None


def _merge_common(
    snap: TreeSnapshot, hw: Hardware, layers: tuple[Layer, ...], rels: tuple[str, ...], first: int
) -> _CommonPart:
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
                shadows.append(_declared(snap, layers, present, entry, name, covered))
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
    return _CommonPart(
        entries=MappingProxyType(dict(sorted(common.items()))),
        subdirs=MappingProxyType(dict(sorted(subdirs.items()))),
        shadows=tuple(shadows),
        by_stem=MappingProxyType({stems[n]: common[n] for n in sorted(stems)}),
        dead=dead,
    )


# --------------------------------------------------------------------------- walk


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
            if mkind in ("file", "other") or not snap.is_file(_join(model_dir, MODEL_TOML)):
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
                targets.append(_make_target(hw_name, model, quant))
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


def _subdir_names(snap: TreeSnapshot, directory: str) -> Iterator[str]:
    for name, kind in snap.listing(directory) or ():
        if kind == "dir" or (kind == "link" and os.path.isdir(snap.path(_join(directory, name)))):
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


# --------------------------------------------------------------------------- warnings

#: A manifest's kind, by its file name: HARDWARE.toml, MODEL.toml, KERNEL.toml.
ManifestKind = Literal["hardware", "model", "kernel"]

MANIFEST_KINDS: Mapping[str, ManifestKind] = MappingProxyType(
    {HARDWARE_TOML: "hardware", MODEL_TOML: "model", KERNEL_TOML: "kernel"}
)

#: ``[build]`` keys the built-in toolchains read (a project toolchain may add its own).
BUILD_KEYS: tuple[str, ...] = ("extra_metal_flags", "extra_nvcc_flags", "toolchain")

#: kind -> table -> its known keys, or None where any key may appear ([modules],
#: [shadow], [shadow_exempt] are keyed by stems and modules) or an unknown key is an
#: error already ([sources]; [defaults], whose levers a tree can extend).
_KNOWN: Mapping[ManifestKind, Mapping[str, tuple[str, ...] | None]] = MappingProxyType(
    {
        "hardware": {
            "hardware": ("arch", "inherits", "sm_count", "vendor"),
            "build": BUILD_KEYS,
            "defaults": None,
        },
        "model": {"model": ("kernel_source", "supported_quants")},
        "kernel": {
            "build": BUILD_KEYS,
            "modules": None,
            "shadow": None,
            "shadow_exempt": None,
            "sources": None,
        },
    }
)

#: A name this close to a known one (and not equal) is taken for a typo of it.
TYPO_DISTANCE = 2


def _edit_distance(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance (Damerau-Levenshtein with adjacent
    transpositions) of ``a`` and ``b``, or ``limit + 1`` once it must exceed ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[-1]


def _closest(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` is a typo of (within :data:`TYPO_DISTANCE`, not equal), or None."""
    best: tuple[int, str] | None = None
    for cand in known:
        # Two edits turn a four-letter name into almost anything: one edit at most there.
        limit = TYPO_DISTANCE if len(cand) > 4 else 1
        d = _edit_distance(name, cand, limit)
        if 0 < d <= limit and (best is None or (d, cand) < best):
            best = (d, cand)
    return None if best is None else best[1]


def manifest_warnings(
    path_rel: str,
    doc: Mapping[str, Any],
    kind: ManifestKind,
    *,
    build_keys: Iterable[str] = (),
) -> list[str]:
    """Likely typos in one parsed manifest, one warning line each, in file order (pure).

    A table whose name is within edit distance 2 of a table this kind of
    manifest has (``[buidl]``), or a key of a known table that close to one of
    its keys (``kernel_sauce``, ``extra_nvcc_flag``), is named with the file,
    the key and "did you mean ...". Other unknown names are silent: real trees
    carry tables and keys for other tools. ``build_keys``: more ``[build]``
    keys to know (a project toolchain's ``flags_key``).
    """
    tables = _KNOWN[kind]
    where = printable(path_rel)
    extra = tuple(build_keys)
    out: list[str] = []
    for name, value in doc.items():
        if name in tables:
            known = tables[name]
            if known is None or not isinstance(value, Mapping):
                continue
            if name == "build" and extra:
                known = (*known, *extra)
            for key in value:
                if key in known:
                    continue
                guess = _closest(key, known)
                if guess is not None:
                    out.append(
                        f"{where}: [{name}] {_toml_key(key)}: unknown key, did you mean "
                        f"`{guess}`? (the key is ignored)"
                    )
            continue
        guess = _closest(name, tables)
        if guess is not None:
            what = "table" if isinstance(value, Mapping) else "key"
            out.append(
                f"{where}: [{_toml_key(name)}]: unknown {what}, did you mean `[{guess}]`? "
                "(it is ignored)"
            )
    return out


def read_manifest_warnings(
    root: Path | str, layout: Layout, *, build_keys: Iterable[str] = ()
) -> list[str]:
    """:func:`manifest_warnings` of every manifest ``layout`` was resolved from (I/O: parses
    them): its HARDWARE.toml files, MODEL.toml files and ``configs()``; sorted, unique."""
    snap = TreeSnapshot(root)
    extra = tuple(build_keys)
    found: set[str] = set()
    for path in (*layout.hardware_manifests, *layout.model_manifests, *layout.configs()):
        kind = MANIFEST_KINDS.get(path.name)
        if kind is None:
            continue
        rel = snap.rel(path)
        try:
            doc = snap.toml(path)
        except LayoutError:  # resolution read it, so it parsed then; now it is gone
            continue
        if doc is not None:
            found.update(manifest_warnings(rel, doc, kind, build_keys=extra))
    return sorted(found)


# --------------------------------------------------------------------------- dump


def layout_to_dict(layout: Layout, root: Path | str) -> dict[str, Any]:
    """The SPEC 1.7 JSON view of one layout, every path relative to ``root``."""
    root = Path(root)

    def r(path: Path) -> str:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            return path.as_posix()

    def entries(m: Mapping[str, Entry]) -> dict[str, Any]:
        return {n: [r(e.source), e.layer, e.used] for n, e in sorted(m.items())}

    view = {
        "source_model": layout.source_model,
        "layers": [[lay.role.value, lay.tier.value, r(lay.dir)] for lay in layout.layers],
        "leaf": entries(layout.leaf),
        "common": entries(layout.common),
        "leaf_subdirs": {n: r(p) for n, p in sorted(layout.leaf_subdirs.items())},
        "common_subdirs": {n: r(p) for n, p in sorted(layout.common_subdirs.items())},
        "configs": [r(p) for p in layout.configs()],
        "modules": {stem: r(e.source) for stem, e in layout.modules()},
        "shadows": [
            [s.role.value, s.name, r(s.winner), r(s.loser), s.reason] for s in layout.shadows
        ],
    }
    return dict(sorted(view.items()))


def dump(root: Path | str) -> dict[str, Any]:
    """Every walked target keyed ``hw/model/quant``: its layout view or ``{"error": message}``."""
    out: dict[str, Any] = {}
    for target, result in resolve_all(root):
        if isinstance(result, LayoutError):
            out[str(target)] = {"error": str(result)}
        else:
            out[str(target)] = layout_to_dict(result, root)
    return dict(sorted(out.items()))
