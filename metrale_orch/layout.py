"""Layout resolution: which files a ``(hardware, model, quant)`` target is made from.

This module owns SPEC section 1 and nothing else: it reads ``kernels/`` (the
manifests and directory listings) and returns frozen values; it never writes,
compiles or prints. Invariants of a :class:`Layout` that :func:`discover`
returns:

- every win of one layer over another is in ``shadows`` with its declared
  reason, and every ``[shadow]`` key of every layer names a win;
- no entry's file is a symlink; every entry is a kernel file of the tree;
- resolution depends only on the tree's contents, never on listing order.

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar, cast

from metrale_orch.errors import MetraleError

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
    "UseCollides",
    "UseError",
    "discover",
    "dump",
    "hardware",
    "kernel_manifest",
    "kernel_source_dir",
    "resolve_all",
    "source_ext",
    "stem_of",
    "supports_quant",
    "symlinks",
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


def _toml_key(stem: str) -> str:
    bare = stem and all((c.isalnum() and c.isascii()) or c in "-_" for c in stem)
    return stem if bare else '"' + stem.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --------------------------------------------------------------------------- snapshot

_Kind = str  # "link" | "dir" | "file" | "other"
_K = TypeVar("_K")
_V = TypeVar("_V")
#: A layer's scan: ((name, entry, stem if a source else None), ...), ((subdir, path), ...)
_Scan = tuple[tuple[tuple[str, "Entry", str | None], ...], tuple[tuple[str, Path], ...]]
_Layers = tuple[tuple[Layer, ...], bool, tuple[Path, ...]]


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
        self._paths: dict[str, Path] = {"": self.root, "kernels": self.kernels}
        self._lists: dict[str, tuple[tuple[str, _Kind], ...] | None] = {}
        self._kinds: dict[str, dict[str, _Kind] | None] = {}
        self._tomls: dict[str, dict[str, Any] | LayoutError | None] = {}
        self._hw: dict[str, Hardware | LayoutError] = {}
        self._hw_raw: dict[str, Hardware | LayoutError] = {}
        self._km: dict[str, KernelManifest | LayoutError | None] = {}
        self._ksd: dict[str, str | LayoutError] = {}
        self._scans: dict[tuple[str, int, str, str], _Scan | LayoutError] = {}
        self._commons: dict[str, _CommonPart | LayoutError] = {}
        self._models: dict[tuple[str, str], tuple[str, str, tuple[Path, ...]] | LayoutError] = {}
        self._layers: dict[tuple[str, str, str], _Layers | LayoutError] = {}
        self._uses: dict[tuple[str, str, str], Path] = {}

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

    # -- file system, memoised

    def listing(self, directory: Path | str) -> tuple[tuple[str, _Kind], ...] | None:
        """Sorted (name, kind) children of a directory, or None when it is not one."""
        rel = self.rel(directory)
        if rel in self._lists:
            return self._lists[rel]
        children: list[tuple[str, _Kind]] = []
        try:
            with os.scandir(os.path.join(self._root_s, rel) if rel else self._root_s) as it:
                for de in it:
                    if de.is_symlink():
                        kind = "link"
                    elif de.is_dir(follow_symlinks=False):
                        kind = "dir"
                    elif de.is_file(follow_symlinks=False):
                        kind = "file"
                    else:
                        kind = "other"
                    children.append((de.name, kind))
        except (FileNotFoundError, NotADirectoryError):
            result = None
        else:
            result = tuple(sorted(children))
        self._lists[rel] = result
        return result

    def kind(self, rel: str) -> _Kind | None:
        """The kind of a path as its parent's listing says (None: absent)."""
        head, _, tail = rel.rpartition("/")
        kinds = self._kinds.get(head, _MISSING)
        if kinds is _MISSING:
            listing = self.listing(head)
            kinds = self._kinds[head] = None if listing is None else dict(listing)
        return None if kinds is None else kinds.get(tail)

    def is_dir(self, path: Path | str) -> bool:
        return self.listing(path) is not None

    def is_file(self, rel: str) -> bool:
        """A regular file, or a symlink to one (as the file system would read it)."""
        kind = self.kind(rel)
        return kind == "file" or (kind == "link" and os.path.isfile(self.path(rel)))

    def toml(self, path: Path | str) -> dict[str, Any] | None:
        """The parsed TOML file, None when it is not a file; raises ManifestError when bad."""
        rel = self.rel(path)
        cached = self._tomls.get(rel, _MISSING)
        if cached is _MISSING:
            cached = None
            if self.is_file(rel):
                try:
                    with open(os.path.join(self._root_s, rel), "rb") as fh:
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
        return _cached(self._km, rel, lambda: self._load_kernel_manifest(rel))

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
            extra = sorted(k for k in sources if k != "use")
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
                key = f"[shadow] {_toml_key(stem)}"
                if not isinstance(reason, str):
                    raise ManifestError(
                        path, rel, key, f"the reason must be a string, {_got(reason)}"
                    )
                if not reason.strip():
                    raise ManifestError(
                        path, rel, key, "the reason is blank; say why the file replaces another"
                    )
                shadow[stem] = reason
        return KernelManifest(
            path=path, uses=uses, shadow=MappingProxyType(shadow), doc=MappingProxyType(doc)
        )

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
        rel, table = self.model_table(model_dir)
        if table is None or "supported_quants" not in table:
            return True
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
        return quant in quants

    def parent_source_dir(self, parent: str, name: str) -> str:
        """The parent tree's source-model directory for the own source model ``name``."""
        pmodel = f"kernels/{parent}/{name}"
        if self.toml(_join(pmodel, MODEL_TOML)) is not None:
            return self.kernel_source_dir(pmodel)
        return pmodel

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
        """(layers, whether any layer directory exists, parent MODEL.toml files read).

        Loads the layer manifests in SPEC order: own leaf, parent leaf (following the
        parent tree's redirect), own common, parent common.
        """
        key = (hw.name, source_dir, quant)
        return _cached(self._layers, key, lambda: self._load_layers(hw, source_dir, quant))

    def _load_layers(self, hw: Hardware, source_dir: str, quant: str) -> _Layers:
        own_leaf = _join(source_dir, quant)
        own_leaf_m = self.kernel_manifest(own_leaf)
        own_common = f"kernels/{hw.name}/{COMMON}"
        read: list[Path] = []
        specs: list[tuple[Role, Tier, str, str, KernelManifest | None]]
        if hw.inherits is None:
            specs = [
                (Role.LEAF, Tier.OWN, hw.name, own_leaf, own_leaf_m),
                (Role.COMMON, Tier.OWN, hw.name, own_common, self.kernel_manifest(own_common)),
            ]
        else:
            parent = hw.inherits
            name = source_dir.rpartition("/")[2]
            psource = self.parent_source_dir(parent, name)
            pmodel = f"kernels/{parent}/{name}"
            if psource != pmodel or self.is_file(_join(pmodel, MODEL_TOML)):
                read += [self.path(_join(d, MODEL_TOML)) for d in {pmodel, psource}]
            parent_leaf = _join(psource, quant)
            parent_leaf_m = self.kernel_manifest(parent_leaf)
            own_common_m = self.kernel_manifest(own_common)
            parent_common = f"kernels/{parent}/{COMMON}"
            specs = [
                (Role.LEAF, Tier.OWN, hw.name, own_leaf, own_leaf_m),
                (Role.LEAF, Tier.PARENT, parent, parent_leaf, parent_leaf_m),
                (Role.COMMON, Tier.OWN, hw.name, own_common, own_common_m),
                (
                    Role.COMMON,
                    Tier.PARENT,
                    parent,
                    parent_common,
                    self.kernel_manifest(parent_common),
                ),
            ]
        layers = tuple(
            Layer(role=r, tier=t, hardware=h, dir=self.path(d), manifest=m)
            for r, t, h, d, m in specs
        )
        exists = any(self.is_dir(d) for _, _, _, d, _ in specs)
        return layers, exists, tuple(sorted(set(read)))

    def layer_scan(self, index: int, layer: Layer, ext: str) -> _Scan:
        """A layer's entries (directory part, then ``use`` part) and subdirectories, by name.

        Cached per (directory, index): a common directory shared by many targets is
        scanned once per pass.
        """
        rel = self.rel(layer.dir)
        key = (rel, index, layer.hardware, ext)
        return _cached(self._scans, key, lambda: self._layer_scan(rel, index, layer, ext))

    def _layer_scan(self, rel: str, index: int, layer: Layer, ext: str) -> _Scan:
        entries: dict[str, Entry] = {}
        subdirs: dict[str, Path] = {}
        listing = self.listing(rel)
        if listing is not None:
            for name, kind in listing:
                if kind == "link":
                    child = _join(rel, name)
                    raise SymlinkError(self.path(child), child)
                if kind == "dir":
                    subdirs[name] = self.path(_join(rel, name))
                elif kind == "file" and _is_kernel_file(name, ext):
                    entries[name] = Entry(
                        name=name, source=self.path(_join(rel, name)), layer=index, used=False
                    )
        if layer.manifest is not None:
            for use in layer.manifest.uses:
                source = self._use(layer, use, ext)
                name = source.name
                if name in entries:
                    m = layer.manifest.path
                    raise UseCollides(
                        m,
                        self.rel(m),
                        use,
                        name,
                        entries[name].source,
                        self.rel(entries[name].source),
                    )
                entries[name] = Entry(name=name, source=source, layer=index, used=True)
        return (
            tuple(
                (name, e, stem_of(name) if _ext_of(name) == ext else None)
                for name, e in sorted(entries.items())
            ),
            tuple(sorted(subdirs.items())),
        )

    def _use(self, layer: Layer, use: str, ext: str) -> Path:
        """Steps 1-6 of SPEC 1.3 for one ``use`` string; returns the file's path."""
        assert layer.manifest is not None
        cache_key = (layer.hardware, use, ext)
        cached = self._uses.get(cache_key)
        if cached is not None:
            return cached
        manifest = layer.manifest.path
        mrel = self.rel(manifest)
        if use.startswith(("/", "\\")) or os.path.isabs(use):
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
            raise UseError(manifest, mrel, use, "escapes kernels/ (a use must stay inside it)")
        prel = "/".join(parts)
        path = self.path(prel)
        try:
            st = os.lstat(path)
        except OSError:
            raise UseError(manifest, mrel, use, f"no such file: {prel}") from None
        if stat.S_ISLNK(st.st_mode):
            raise SymlinkError(path, prel, manifest)
        if not stat.S_ISREG(st.st_mode):
            raise UseError(manifest, mrel, use, f"no such file: {prel} is not a regular file")
        if not _is_kernel_file(path.name, ext):
            raise UseError(
                manifest,
                mrel,
                use,
                f"not a .{ext} source or a header (.{' or .'.join(HEADER_EXTS)}): {prel}",
            )
        self._uses[cache_key] = path
        return path

    def common_part(self, hw: Hardware, layers: tuple[Layer, ...], first: int) -> _CommonPart:
        """The merged common layers ``layers[first:]`` of ``hw``, merged once per pass."""
        return _cached(self._commons, hw.name, lambda: _merge_common(self, hw, layers, first))


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
        model_dir, source_dir, model_manifests = snap.model_dirs(target.hardware, target.model)
    except UnknownModel as exc:  # cached per model; name this target in the message
        raise UnknownModel(target, exc.model_dir, snap.rel(exc.model_dir)) from None
    for mdir in (model_dir,) if source_dir == model_dir else (model_dir, source_dir):
        if not snap.supports_quant(mdir, target.quant):
            rel = _join(mdir, MODEL_TOML)
            raise ManifestError(
                snap.path(rel),
                rel,
                "[model] supported_quants",
                f"quant {target.quant!r} is not supported (target {target}); there is no "
                "common-only fallback for an unlisted quant: add it to the list to build it",
            )
    layers, exists, parent_manifests = snap.target_layers(hw, source_dir, target.quant)
    if not exists:
        raise NoKernelDirectory(
            target,
            tuple(layer.dir for layer in layers),
            tuple(snap.rel(layer.dir) for layer in layers),
        )

    ext = hw.source_ext
    n_leaf = 2 if hw.inherits is not None else 1
    leaf: dict[str, Entry] = {}
    leaf_subdirs: dict[str, Path] = {}
    leaf_stems: dict[str, str] = {}
    shadows: list[Shadow] = []
    covered: set[tuple[int, str]] = set()
    for index in range(n_leaf):
        entries, subdirs = snap.layer_scan(index, layers[index], ext)
        for name, entry, stem in entries:
            present = leaf.get(name)
            if present is None:
                leaf[name] = entry
                if stem is not None:
                    leaf_stems[name] = stem
            else:
                # own over parent, by file name: the earlier layer keeps the name.
                shadows.append(_declared(snap, layers, present, entry, name, covered))
        for name, path in subdirs:
            leaf_subdirs.setdefault(name, path)

    # The common layers are the same for every target of this hardware: merged once.
    common = snap.common_part(hw, layers, n_leaf)

    # leaf over common, by stem, sources only.
    for name in sorted(leaf_stems):
        loser = common.by_stem.get(leaf_stems[name])
        if loser is not None:
            shadows.append(_declared(snap, layers, leaf[name], loser, name, covered))

    for index in range(n_leaf):
        manifest = layers[index].manifest
        if manifest is None:
            continue
        for stem in sorted(manifest.shadow):
            if (index, stem) not in covered:
                raise DeadShadow(manifest.path, snap.rel(manifest.path), stem, target)
    if common.dead is not None:
        path, stem = common.dead
        raise DeadShadow(path, snap.rel(path), stem, target)

    shadows.extend(common.shadows)
    shadows.sort(key=lambda s: (_ROLE_ORDER[s.role], s.name, s.loser))
    hw_manifests: tuple[Path, ...] = (hw.path,)
    if hw.inherits is not None:
        hw_manifests += (snap.path(f"kernels/{hw.inherits}/{HARDWARE_TOML}"),)
    return Layout(
        target=target,
        hardware=hw,
        layers=layers,
        leaf=MappingProxyType(dict(sorted(leaf.items()))),
        common=common.entries,
        leaf_subdirs=MappingProxyType(dict(sorted(leaf_subdirs.items()))),
        common_subdirs=common.subdirs,
        shadows=tuple(shadows),
        source_model=source_dir.rpartition("/")[2],
        model_dir=snap.path(model_dir),
        model_manifests=tuple(sorted({*model_manifests, *parent_manifests})),
        hardware_manifests=hw_manifests,
    )


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
    return Shadow(
        role=layer.role,
        name=name,
        winner=winner.source,
        loser=loser.source,
        reason=manifest.shadow[stem],
    )


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
    snap: TreeSnapshot, hw: Hardware, layers: tuple[Layer, ...], first: int
) -> _CommonPart:
    ext = hw.source_ext
    common: dict[str, Entry] = {}
    subdirs: dict[str, Path] = {}
    stems: dict[str, str] = {}
    shadows: list[Shadow] = []
    covered: set[tuple[int, str]] = set()
    for index in range(first, len(layers)):
        entries, subs = snap.layer_scan(index, layers[index], ext)
        for name, entry, stem in entries:
            present = common.get(name)
            if present is None:
                common[name] = entry
                if stem is not None:
                    stems[name] = stem
            else:
                shadows.append(_declared(snap, layers, present, entry, name, covered))
        for name, path in subs:
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
    targets: list[Target] = []
    for hw_name, _kind in snap.listing("kernels") or ():
        if not snap.is_file(f"kernels/{hw_name}/{HARDWARE_TOML}"):
            continue
        hw = snap.hardware(hw_name)
        hw_dir = f"kernels/{hw_name}"
        for model, _mkind in snap.listing(hw_dir) or ():
            model_dir = f"{hw_dir}/{model}"
            if not snap.is_file(_join(model_dir, MODEL_TOML)):
                continue
            source_dir = snap.kernel_source_dir(model_dir)
            quants = set(_subdir_names(snap, source_dir))
            if hw.inherits is not None:
                psource = snap.parent_source_dir(hw.inherits, source_dir.rpartition("/")[2])
                quants.update(_subdir_names(snap, psource))
            targets.extend(Target(hardware=hw_name, model=model, quant=q) for q in quants)
    return sorted(targets)


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
