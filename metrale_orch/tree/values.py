"""The values resolution returns: targets, manifests read, layers, entries, layouts.

Frozen dataclasses, except the two made by the ten thousand per pass
(:class:`Entry`, :class:`Layout`): ``slots`` dataclasses that nothing assigns
to after construction (immutable by convention) and that hash, compare,
print and pickle exactly as their frozen siblings do. Their mappings are
read-only views (``MappingProxyType``). Pure: no I/O except
:meth:`Layout.inputs`, which lists the role subdirectories.
"""

from __future__ import annotations

import enum
import operator
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: A path's parts: the sort key of Path order.
_PARTS = operator.attrgetter("parts")

__all__ = [
    "NAME_MAX",
    "ROLE_ORDER",
    "Entry",
    "Hardware",
    "KernelManifest",
    "Layer",
    "Layout",
    "Role",
    "Shadow",
    "Target",
    "Tier",
    "files_under",
]


@enum.unique
class Role(enum.Enum):
    """A layer's role; ordered as declared (leaf before common)."""

    LEAF = "leaf"
    COMMON = "common"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Role):
            return NotImplemented
        return ROLE_ORDER[self] < ROLE_ORDER[other]


#: Sort rank of a role: leaf first.
ROLE_ORDER: Mapping[Role, int] = {Role.LEAF: 0, Role.COMMON: 1}


@enum.unique
class Tier(enum.Enum):
    """Whether a layer belongs to the target's own tree or the tree it inherits."""

    OWN = "own"
    PARENT = "parent"


#: The longest directory name, in bytes, the file systems a tree lives on hold (Linux's
#: and macOS's NAME_MAX).
NAME_MAX = 255


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
        """Parse ``hw/model/quant``; raises ValueError for any other shape, and for a part
        longer than a directory name may be (no file system holds it: asking for it
        fails with ENAMETOOLONG)."""
        parts = text.strip().strip("/").split("/")
        if len(parts) != 3 or not all(parts) or any(p in (".", "..") for p in parts):
            raise ValueError(f"not a target: {text!r} (expected hw/model/quant)")
        longest = max(len(p.encode("utf-8", "surrogateescape")) for p in parts)
        if longest > NAME_MAX:
            raise ValueError(
                f"not a target: {text!r}: a directory name is at most {NAME_MAX} bytes, "
                f"one here is {longest}"
            )
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
    doc: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelManifest:
    """The resolution-relevant part of one ``KERNEL.toml``."""

    path: Path
    uses: tuple[str, ...]
    #: stem -> reason (untrimmed), in file order.
    shadow: Mapping[str, str]
    doc: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)


# Not frozen, for the reason Entry is not (one or two per target).
@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class Layer:
    """One of a target's directories, whether or not it exists."""

    role: Role
    tier: Tier
    #: The layer's tree name (the target's hardware, or its parent).
    hardware: str
    dir: Path
    manifest: KernelManifest | None


# The hot value (a pass makes tens of thousands): not frozen, since a frozen dataclass's
# __init__ stores each field through object.__setattr__, and not keyword-only, since the
# resolver builds it positionally (half the cost of a keyword call). Immutable by
# convention; equality, hash, repr and pickling are a frozen value's.
@dataclass(slots=True, unsafe_hash=True)
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
                stem, dot, tail = name.rpartition(".")  # stem_of and ext_of, inline: hot
                if dot and tail == ext:
                    mods[stem] = entry
        return tuple(sorted(mods.items()))

    def sources(self) -> tuple[Path, ...]:
        """The modules' source paths, sorted."""
        return tuple(sorted(entry.source for _, entry in self.modules()))

    def role_of(self, entry: Entry) -> Role:
        """The role of the layer an entry came from."""
        return self.layers[entry.layer].role

    def inputs(self) -> tuple[Path, ...]:
        """Every entry's source, every file under every role subdirectory, and ``configs()``."""
        # Path order is the order of the paths' parts: comparing the (cached) parts tuples
        # gives the same order without a Python-level Path.__lt__ per comparison.
        return tuple(sorted(self.input_set(), key=_PARTS))

    def input_set(self) -> frozenset[Path]:
        """:meth:`inputs`, unordered (for callers that order them their own way)."""
        files: set[Path] = set()
        for role_map in (self.leaf, self.common):
            files.update(entry.source for entry in role_map.values())
        for subdirs in (self.leaf_subdirs, self.common_subdirs):
            for sub in subdirs.values():
                files.update(files_under(sub))
        files.update(self.configs())
        return frozenset(files)


# One pass makes tens of thousands of these frozen values, and a frozen dataclass's
# __init__ sets each field through object.__setattr__ (about four times the cost of
# the rest of making one). So the hot paths build each value as a "shell": a plain
# class with the very same slots, filled by ordinary attribute stores, whose class is
# then switched to the value class. The result is an ordinary instance of the value


def files_under(top: Path) -> Iterator[Path]:
    """Every file under ``top`` that is not a symlink (I/O)."""
    for dirpath, _dirnames, filenames in os.walk(top):
        base = Path(dirpath)
        for name in filenames:
            path = base / name
            if not path.is_symlink():
                yield path
