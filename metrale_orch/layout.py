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
from typing import Any, TypeVar

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


class TreeSnapshot:
    """Listings and parsed manifests of one tree, memoised for one resolution pass.

    Results and errors are cached alike, so a pass scans each directory and
    parses each manifest once. Make a new snapshot for each independent pass.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.kernels = self.root / "kernels"
        self._lists: dict[Path, tuple[tuple[str, _Kind], ...] | None] = {}
        self._tomls: dict[Path, dict[str, Any] | LayoutError | None] = {}
        self._hw: dict[str, Hardware | LayoutError] = {}
        self._hw_raw: dict[str, Hardware | LayoutError] = {}
        self._km: dict[Path, KernelManifest | LayoutError | None] = {}
        self._ksd: dict[Path, Path | LayoutError] = {}

    # -- paths

    def rel(self, path: Path) -> str:
        """Root-relative POSIX spelling of a path under the root."""
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return path.as_posix()

    # -- file system, memoised

    def listing(self, directory: Path) -> tuple[tuple[str, _Kind], ...] | None:
        """Sorted (name, kind) children of a directory, or None when it is not one."""
        if directory in self._lists:
            return self._lists[directory]
        children: list[tuple[str, _Kind]] = []
        try:
            with os.scandir(directory) as it:
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
        self._lists[directory] = result
        return result

    def is_dir(self, path: Path) -> bool:
        return self.listing(path) is not None

    def toml(self, path: Path) -> dict[str, Any] | None:
        """The parsed TOML file, None when it is not a file; raises ManifestError when bad."""
        if path not in self._tomls:
            try:
                text = path.read_bytes().decode("utf-8")
                value: dict[str, Any] | LayoutError | None = tomllib.loads(text)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                value = None
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                value = ManifestError(path, self.rel(path), None, f"cannot be read as TOML: {exc}")
            self._tomls[path] = value
        cached = self._tomls[path]
        if isinstance(cached, LayoutError):
            raise cached
        return cached

    # -- manifests

    def hardware_raw(self, hw: str) -> Hardware:
        """HARDWARE.toml with its own checks, without the ``inherits`` checks."""
        return _cached(self._hw_raw, hw, lambda: self._load_hardware(hw))

    def hardware(self, hw: str) -> Hardware:
        """HARDWARE.toml with ``inherits`` checked."""
        return _cached(self._hw, hw, lambda: self._check_inherits(self.hardware_raw(hw)))

    def _load_hardware(self, hw: str) -> Hardware:
        path = self.kernels / hw / HARDWARE_TOML
        rel = self.rel(path)
        doc = self.toml(path)
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

    def kernel_manifest(self, directory: Path) -> KernelManifest | None:
        """``<directory>/KERNEL.toml`` parsed and validated, or None when absent."""
        return _cached(self._km, directory, lambda: self._load_kernel_manifest(directory))

    def _load_kernel_manifest(self, directory: Path) -> KernelManifest | None:
        path = directory / KERNEL_TOML
        doc = self.toml(path)
        if doc is None:
            return None
        rel = self.rel(path)
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

    def model_table(self, model_dir: Path) -> tuple[Path, dict[str, Any] | None]:
        """(MODEL.toml path, its ``[model]`` table or None when the file is absent)."""
        path = model_dir / MODEL_TOML
        doc = self.toml(path)
        if doc is None:
            return path, None
        table = doc.get("model")
        return path, table if isinstance(table, dict) else {}

    def kernel_source_dir(self, model_dir: Path) -> Path:
        """The source model directory (``[model] kernel_source`` followed, one hop)."""
        return _cached(self._ksd, model_dir, lambda: self._load_kernel_source_dir(model_dir))

    def _load_kernel_source_dir(self, model_dir: Path) -> Path:
        path, table = self.model_table(model_dir)
        if table is None or "kernel_source" not in table:
            return model_dir
        rel = self.rel(path)
        value = table["kernel_source"]
        if not isinstance(value, str):
            raise ManifestError(path, rel, "[model] kernel_source", _not_string(value))
        if not value.strip():
            raise ManifestError(
                path, rel, "[model] kernel_source", "is blank; name a sibling model directory"
            )
        referent = model_dir.parent / value
        if not self.is_dir(referent):
            raise RedirectError(
                path, rel, model_dir, referent, f"{self.rel(referent)} is not a directory"
            )
        ref_path, ref_table = self.model_table(referent)
        if ref_table is None:
            raise RedirectError(
                path,
                rel,
                model_dir,
                referent,
                f"{self.rel(referent)} is not a model (it has no {MODEL_TOML})",
            )
        if "kernel_source" in ref_table:
            raise RedirectError(
                path,
                rel,
                model_dir,
                referent,
                f"{self.rel(ref_path)} redirects too; a redirect takes one hop only "
                "(point at the model that owns the sources)",
            )
        return referent

    def supports_quant(self, model_dir: Path, quant: str) -> bool:
        """Whether ``[model] supported_quants`` admits ``quant`` (absent list: every quant)."""
        path, table = self.model_table(model_dir)
        if table is None or "supported_quants" not in table:
            return True
        rel = self.rel(path)
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


def _cached(cache: dict[_K, _V | LayoutError], key: _K, make: Callable[[], _V]) -> _V:
    if key not in cache:
        try:
            cache[key] = make()
        except LayoutError as exc:
            cache[key] = exc
    value = cache[key]
    if isinstance(value, LayoutError):
        raise value
    return value


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
    return _snapshot_for(directory).kernel_manifest(directory)


def kernel_source_dir(model_dir: Path | str) -> Path:
    """The source model directory of ``model_dir`` (itself without a redirect).

    Raises ManifestError, RedirectError.
    """
    model_dir = Path(model_dir)
    return _snapshot_for(model_dir).kernel_source_dir(model_dir)


def supports_quant(model_dir: Path | str, quant: str) -> bool:
    """Whether the model's ``supported_quants`` admits ``quant``. Raises ManifestError."""
    model_dir = Path(model_dir)
    return _snapshot_for(model_dir).supports_quant(model_dir, quant)


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
    return _Resolver(snap, target).run()


class _Resolver:
    def __init__(self, snap: TreeSnapshot, target: Target) -> None:
        self.snap = snap
        self.target = target

    def run(self) -> Layout:
        snap, target = self.snap, self.target
        rel = snap.rel
        hw = snap.hardware(target.hardware)
        hw_manifests = [hw.path]
        if hw.inherits is not None:
            hw_manifests.append(snap.kernels / hw.inherits / HARDWARE_TOML)

        model_dir = snap.kernels / target.hardware / target.model
        if not snap.is_dir(model_dir):
            raise UnknownModel(target, model_dir, rel(model_dir))
        source_dir = snap.kernel_source_dir(model_dir)
        model_manifests = {model_dir / MODEL_TOML, source_dir / MODEL_TOML}

        for mdir in dict.fromkeys((model_dir, source_dir)):
            if not snap.supports_quant(mdir, target.quant):
                path = mdir / MODEL_TOML
                raise ManifestError(
                    path,
                    rel(path),
                    "[model] supported_quants",
                    f"quant {target.quant!r} is not supported (target {target}); there is no "
                    "common-only fallback for an unlisted quant: add it to the list to build it",
                )

        # Layer manifests: own leaf, parent leaf, own common, parent common.
        own_leaf = source_dir / target.quant
        own_leaf_m = snap.kernel_manifest(own_leaf)
        layer_specs: list[tuple[Role, Tier, str, Path, KernelManifest | None]] = []
        if hw.inherits is None:
            own_common = snap.kernels / hw.name / COMMON
            layer_specs = [
                (Role.LEAF, Tier.OWN, hw.name, own_leaf, own_leaf_m),
                (Role.COMMON, Tier.OWN, hw.name, own_common, snap.kernel_manifest(own_common)),
            ]
        else:
            parent = hw.inherits
            pmodel = snap.kernels / parent / source_dir.name
            if (pmodel / MODEL_TOML).is_file():
                model_manifests.add(pmodel / MODEL_TOML)
                psource = snap.kernel_source_dir(pmodel)
                model_manifests.add(psource / MODEL_TOML)
            else:
                psource = pmodel
            parent_leaf = psource / target.quant
            parent_leaf_m = snap.kernel_manifest(parent_leaf)
            own_common = snap.kernels / hw.name / COMMON
            own_common_m = snap.kernel_manifest(own_common)
            parent_common = snap.kernels / parent / COMMON
            parent_common_m = snap.kernel_manifest(parent_common)
            layer_specs = [
                (Role.LEAF, Tier.OWN, hw.name, own_leaf, own_leaf_m),
                (Role.LEAF, Tier.PARENT, parent, parent_leaf, parent_leaf_m),
                (Role.COMMON, Tier.OWN, hw.name, own_common, own_common_m),
                (Role.COMMON, Tier.PARENT, parent, parent_common, parent_common_m),
            ]
        layers = tuple(
            Layer(role=r, tier=t, hardware=h, dir=d, manifest=m) for r, t, h, d, m in layer_specs
        )
        if not any(snap.is_dir(layer.dir) for layer in layers):
            raise NoKernelDirectory(
                target,
                tuple(layer.dir for layer in layers),
                tuple(rel(layer.dir) for layer in layers),
            )

        maps: dict[Role, dict[str, Entry]] = {Role.LEAF: {}, Role.COMMON: {}}
        subdirs: dict[Role, dict[str, Path]] = {Role.LEAF: {}, Role.COMMON: {}}
        shadows: list[Shadow] = []
        covered: set[tuple[int, str]] = set()
        for index, layer in enumerate(layers):
            entries, layer_subdirs = self._scan(index, layer, hw.source_ext)
            role_map = maps[layer.role]
            for name in sorted(entries):
                entry = entries[name]
                present = role_map.get(name)
                if present is None:
                    role_map[name] = entry
                    continue
                # own over parent, by file name: the earlier layer keeps the name.
                shadows.append(self._declared(layers, present, entry, name, covered))
            for name, path in sorted(layer_subdirs.items()):
                subdirs[layer.role].setdefault(name, path)

        # leaf over common, by stem, sources only.
        ext = hw.source_ext
        common_by_stem = {stem_of(n): e for n, e in maps[Role.COMMON].items() if _ext_of(n) == ext}
        for name in sorted(maps[Role.LEAF]):
            if _ext_of(name) != ext:
                continue
            loser = common_by_stem.get(stem_of(name))
            if loser is not None:
                winner = maps[Role.LEAF][name]
                shadows.append(self._declared(layers, winner, loser, name, covered))

        for index, layer in enumerate(layers):
            if layer.manifest is None:
                continue
            for stem in sorted(layer.manifest.shadow):
                if (index, stem) not in covered:
                    raise DeadShadow(layer.manifest.path, rel(layer.manifest.path), stem, target)

        shadows.sort(key=lambda s: (_ROLE_ORDER[s.role], s.name, s.loser))
        return Layout(
            target=target,
            hardware=hw,
            layers=layers,
            leaf=MappingProxyType(dict(sorted(maps[Role.LEAF].items()))),
            common=MappingProxyType(dict(sorted(maps[Role.COMMON].items()))),
            leaf_subdirs=MappingProxyType(dict(sorted(subdirs[Role.LEAF].items()))),
            common_subdirs=MappingProxyType(dict(sorted(subdirs[Role.COMMON].items()))),
            shadows=tuple(shadows),
            source_model=source_dir.name,
            model_dir=model_dir,
            model_manifests=tuple(sorted(p for p in model_manifests if p.is_file())),
            hardware_manifests=tuple(hw_manifests),
        )

    def _declared(
        self,
        layers: tuple[Layer, ...],
        winner: Entry,
        loser: Entry,
        name: str,
        covered: set[tuple[int, str]],
    ) -> Shadow:
        """Check that the winner's layer declares the win; return the Shadow."""
        rel = self.snap.rel
        layer = layers[winner.layer]
        manifest_path = layer.dir / KERNEL_TOML
        if winner.source == loser.source:
            raise SelfShadow(
                winner.source, rel(winner.source), name, manifest_path, rel(manifest_path)
            )
        stem = stem_of(winner.name)
        manifest = layer.manifest
        if manifest is None or stem not in manifest.shadow:
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

    def _scan(self, index: int, layer: Layer, ext: str) -> tuple[dict[str, Entry], dict[str, Path]]:
        """A layer's entries (directory part, then ``use`` part) and subdirectories."""
        snap = self.snap
        entries: dict[str, Entry] = {}
        subdirs: dict[str, Path] = {}
        listing = snap.listing(layer.dir)
        if listing is not None:
            for name, kind in listing:
                path = layer.dir / name
                if kind == "link":
                    raise SymlinkError(path, snap.rel(path))
                if kind == "dir":
                    subdirs[name] = path
                elif kind == "file" and _is_kernel_file(name, ext):
                    entries[name] = Entry(name=name, source=path, layer=index, used=False)
        if layer.manifest is not None:
            for use in layer.manifest.uses:
                source = self._use(layer, use, ext)
                name = source.name
                if name in entries:
                    m = layer.manifest.path
                    raise UseCollides(
                        m,
                        snap.rel(m),
                        use,
                        name,
                        entries[name].source,
                        snap.rel(entries[name].source),
                    )
                entries[name] = Entry(name=name, source=source, layer=index, used=True)
        return entries, subdirs

    def _use(self, layer: Layer, use: str, ext: str) -> Path:
        """Steps 1-6 of SPEC 1.3 for one ``use`` string; returns the file's path."""
        snap = self.snap
        assert layer.manifest is not None
        manifest = layer.manifest.path
        mrel = snap.rel(manifest)
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
        path = snap.root.joinpath(*parts)
        prel = "/".join(parts)
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
        return path


# --------------------------------------------------------------------------- walk


def walk(root: Path | str, snapshot: TreeSnapshot | None = None) -> list[Target]:
    """Every target of the tree, sorted; manifest errors abort (raise LayoutError)."""
    snap = snapshot if snapshot is not None else TreeSnapshot(root)
    targets: set[Target] = set()
    for hw_name, kind in snap.listing(snap.kernels) or ():
        if kind != "dir" and not (kind == "link" and (snap.kernels / hw_name).is_dir()):
            continue
        if not (snap.kernels / hw_name / HARDWARE_TOML).is_file():
            continue
        hw = snap.hardware(hw_name)
        hw_dir = snap.kernels / hw_name
        for model, mkind in snap.listing(hw_dir) or ():
            model_dir = hw_dir / model
            if mkind not in ("dir", "link") or not (model_dir / MODEL_TOML).is_file():
                continue
            source_dir = snap.kernel_source_dir(model_dir)
            quants = set(_subdir_names(snap, source_dir))
            if hw.inherits is not None:
                pmodel = snap.kernels / hw.inherits / source_dir.name
                psource = (
                    snap.kernel_source_dir(pmodel) if (pmodel / MODEL_TOML).is_file() else pmodel
                )
                quants.update(_subdir_names(snap, psource))
            targets.update(Target(hardware=hw_name, model=model, quant=q) for q in quants)
    return sorted(targets)


def _subdir_names(snap: TreeSnapshot, directory: Path) -> Iterator[str]:
    for name, kind in snap.listing(directory) or ():
        if kind == "dir" or (kind == "link" and (directory / name).is_dir()):
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
            out.append((target, discover(snap.root, target, snap)))
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

    return {
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


def dump(root: Path | str) -> dict[str, Any]:
    """Every walked target keyed ``hw/model/quant``: its layout view or ``{"error": message}``."""
    out: dict[str, Any] = {}
    for target, result in resolve_all(root):
        if isinstance(result, LayoutError):
            out[str(target)] = {"error": str(result)}
        else:
            out[str(target)] = layout_to_dict(result, root)
    return dict(sorted(out.items()))
