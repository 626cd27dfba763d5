"""Likely mistakes in manifests, as warnings: a table or key within edit distance 2 of a known
one, and ``[build]`` keys that look meant for the build but that no toolchain reads.

:func:`manifest_warnings` is pure (one parsed manifest in, warning lines
out); :func:`read_manifest_warnings` parses the manifests a layout was
resolved from. Warnings never change what resolves: an unknown name is
ignored by resolution, and names far from every known one stay silent (real
trees carry tables and keys for other tools).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from metrale_orch.errors import printable
from metrale_orch.tree.errors import LayoutError
from metrale_orch.tree.names import HARDWARE_TOML, KERNEL_TOML, MODEL_TOML, toml_key
from metrale_orch.tree.snapshot import TreeSnapshot
from metrale_orch.tree.values import Layout

__all__ = [
    "BUILD_KEYS",
    "MANIFEST_KINDS",
    "TYPO_DISTANCE",
    "ManifestKind",
    "manifest_warnings",
    "read_manifest_warnings",
]

#: A manifest's kind, by its file name: HARDWARE.toml, MODEL.toml, KERNEL.toml.
ManifestKind = Literal["hardware", "model", "kernel"]

MANIFEST_KINDS: Mapping[str, ManifestKind] = MappingProxyType(
    {HARDWARE_TOML: "hardware", MODEL_TOML: "model", KERNEL_TOML: "kernel"}
)

#: ``[build]`` keys the built-in toolchains read (a project toolchain may add its own).
BUILD_KEYS: tuple[str, ...] = ("extra_metal_flags", "extra_nvcc_flags", "toolchain")

#: ``[build]`` keys a tree may write in the belief that something reads them, which nothing
#: does (unless a project toolchain's ``flags_key`` names one), and what to do instead.
_UNREAD_BUILD_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "extra_hip_flags": (
            "HIP targets read `extra_nvcc_flags` (with `--fmad=false`/`true` translated to "
            "`-ffp-contract=off`/`fast`); move these flags there"
        ),
    }
)

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
    doc: Mapping[str, object],
    kind: ManifestKind,
    *,
    build_keys: Iterable[str] = (),
) -> list[str]:
    """Likely typos in one parsed manifest, one warning line each, in file order (pure).

    A table whose name is within edit distance 2 of a table this kind of
    manifest has (``[buidl]``), or a key of a known table that close to one of
    its keys (``kernel_sauce``, ``extra_nvcc_flag``), is named with the file,
    the key and "did you mean ...". A ``[build]`` key nothing reads although a
    tree may expect it to be (``extra_hip_flags``) is named with what to do
    instead. Other unknown names are silent: real trees
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
                unread = _UNREAD_BUILD_KEYS.get(key) if name == "build" else None
                if unread is not None:
                    out.append(
                        f"{where}: [build] {toml_key(key)}: no toolchain reads this key: "
                        f"{unread} (the key is ignored)"
                    )
                    continue
                guess = _closest(key, known)
                if guess is not None:
                    out.append(
                        f"{where}: [{name}] {toml_key(key)}: unknown key, did you mean "
                        f"`{guess}`? (the key is ignored)"
                    )
            continue
        guess = _closest(name, tables)
        if guess is not None:
            what = "table" if isinstance(value, Mapping) else "key"
            out.append(
                f"{where}: [{toml_key(name)}]: unknown {what}, did you mean `[{guess}]`? "
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
