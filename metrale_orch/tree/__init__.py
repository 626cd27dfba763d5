"""The tree: which files a ``(hardware, model, quant)`` target is made from (SPEC section 1).

The package reads ``kernels/`` (manifests and directory listings) and returns
frozen values; it never writes, compiles or prints. Its modules, lowest first:

- :mod:`~metrale_orch.tree.names`: manifest names, source extensions, stems;
- :mod:`~metrale_orch.tree.values`: Target, Hardware, Layer, Entry, Layout ...;
- :mod:`~metrale_orch.tree.errors`: LayoutError and a subclass per case;
- :mod:`~metrale_orch.tree.files`: the cached file-system view and its memo;
- :mod:`~metrale_orch.tree.manifests`: the manifests read and validated;
- :mod:`~metrale_orch.tree.snapshot`: TreeSnapshot, one pass's memoised pieces;
- :mod:`~metrale_orch.tree.resolve`: walk, discover, resolve_all, the readers;
- :mod:`~metrale_orch.tree.warnings`: likely typos in manifests;
- :mod:`~metrale_orch.tree.dump`: the JSON view;
- :mod:`~metrale_orch.tree.beyond`: includes that reach beyond the layout.

One resolution pass (``walk`` + ``discover`` of every target, see
:func:`resolve_all`) shares a :class:`TreeSnapshot`, so each directory is
listed and each manifest parsed once. Paths inside the values are under
``root`` as given; messages and :func:`dump` use root-relative POSIX paths.
This module is the package's public face: import from here.
"""

from __future__ import annotations

from metrale_orch.tree.dump import Json, dump, layout_to_dict
from metrale_orch.tree.errors import (
    DeadShadow,
    InheritsError,
    LayoutError,
    ManifestError,
    NoKernelDirectory,
    RedirectError,
    RetiredKey,
    SelfShadow,
    SymlinkError,
    UndeclaredShadow,
    UnknownHardware,
    UnknownModel,
    UnknownVendor,
    UnnamableFile,
    UnsafeTargetName,
    UseCollides,
    UseError,
    unnamable_message,
    unsafe_target_name,
)
from metrale_orch.tree.names import (
    COMMON,
    HARDWARE_TOML,
    HEADER_EXTS,
    KERNEL_TOML,
    MODEL_TOML,
    source_ext,
    stem_of,
)
from metrale_orch.tree.resolve import (
    discover,
    hardware,
    kernel_manifest,
    kernel_source_dir,
    layer_manifest_problem,
    misshapen_manifests,
    redirect_manifest,
    resolve_all,
    supports_quant,
    symlinks,
    walk,
)
from metrale_orch.tree.snapshot import TreeSnapshot
from metrale_orch.tree.values import (
    Entry,
    Hardware,
    KernelManifest,
    Layer,
    Layout,
    Role,
    Shadow,
    Target,
    Tier,
)
from metrale_orch.tree.warnings import (
    BUILD_KEYS,
    MANIFEST_KINDS,
    TYPO_DISTANCE,
    ManifestKind,
    manifest_warnings,
    read_manifest_warnings,
)

__all__ = [
    "BUILD_KEYS",
    "COMMON",
    "HARDWARE_TOML",
    "HEADER_EXTS",
    "KERNEL_TOML",
    "MANIFEST_KINDS",
    "MODEL_TOML",
    "TYPO_DISTANCE",
    "DeadShadow",
    "Entry",
    "Hardware",
    "InheritsError",
    "Json",
    "KernelManifest",
    "Layer",
    "Layout",
    "LayoutError",
    "ManifestError",
    "ManifestKind",
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
    "UnsafeTargetName",
    "UseCollides",
    "UseError",
    "discover",
    "dump",
    "hardware",
    "kernel_manifest",
    "kernel_source_dir",
    "layer_manifest_problem",
    "layout_to_dict",
    "manifest_warnings",
    "misshapen_manifests",
    "read_manifest_warnings",
    "redirect_manifest",
    "resolve_all",
    "source_ext",
    "stem_of",
    "supports_quant",
    "symlinks",
    "unnamable_message",
    "unsafe_target_name",
    "walk",
]
