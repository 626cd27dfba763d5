"""The task cache's key (I/O: finds and probes toolchains): what task generation depends
on besides the watched files.

:func:`generation_base` digests what needs no compiler run (versions, root,
configuration, every toolchain's definition and the environment they read);
:func:`generation_key` adds the stamps of the toolchains the targets select, probed on
every invocation. Kept apart from the specs it keys (:mod:`metrale_orch.graph.cached`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import xxhash

import metrale_orch
from metrale_orch.config import EXECUTION_KEYS, Config
from metrale_orch.graph import taskcache
from metrale_orch.paths import STATE_DIR
from metrale_orch.steps.hip_mirror import scan_hip_compat
from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.toolchain.probe import ProbeMemo
from metrale_orch.toolchain.stamps import Stamp, toolchain_stamps

__all__ = [
    "generation_base",
    "generation_key",
    "key_of",
    "scoped_base",
    "selected_toolchains",
    "stamps_of",
    "stored_key",
]


def generation_base(
    root: Path,
    environ: Mapping[str, str],
    config: Config,
    toolchains: Mapping[str, Toolchain],
    *,
    doit: str,
) -> str:
    """Digest of what task generation depends on besides the watched files and the
    toolchains' programs (no compiler runs): versions (``doit``: the version of the
    driver the tasks are generated for, given by its adapter), root, configuration,
    every toolchain's definition, and the environment variables any of them reads."""
    names = {"PATH", "HOME", "XDG_CACHE_HOME"}
    names.update(k for k in environ if k.startswith("METRALE_"))
    for tc in toolchains.values():
        names.update(tc.home_env)
        names.update(tc.env_allowlist)
        if tc.env_prefixes:
            names.update(k for k in environ if k.startswith(tc.env_prefixes))
        if tc.host_compiler_env:
            names.add(tc.host_compiler_env)
    doc = {
        "schema": taskcache.SCHEMA,
        "python": [sys.version, sys.executable],
        "doit": doit,
        "package": metrale_orch.__version__,
        "root": os.fspath(root),
        "build_dir": os.fspath(config.build_dir),
        "config": _generation_config(config),
        "env": {name: environ.get(name) for name in sorted(names)},
        "toolchains": {name: tc.to_dict() for name, tc in sorted(toolchains.items())},
        # The HIP targets' file deps and identity list its files: a new one regenerates.
        "hip_compat": scan_hip_compat(root, config.hip_compat_dir).digest,
    }
    return _digest(doc)


def generation_key(
    root: Path,
    environ: Mapping[str, str],
    config: Config,
    toolchains: Mapping[str, Toolchain],
    probes: ProbeMemo | None = None,
    used: Iterable[str] | None = None,
    *,
    doit: str,
) -> str:
    """Digest of what task generation depends on besides the watched files (I/O: finds
    and probes toolchains): :func:`generation_base`, and the programs of the toolchains
    ``used`` (default: those the last generation under the same base selected, else
    all), with their names.

    Probed on every invocation (a wrapper can switch the real compiler without a change
    any stat would see); only the real binaries' hashes are remembered. A toolchain no
    target selects changes no task, so it is not probed: hipcc on a tree of NVIDIA
    targets costs a no-op nothing (:func:`~metrale_orch.graph.taskcache.read_uses`).
    """
    base = generation_base(root, environ, config, toolchains, doit=doit)
    state_dir = config.build_dir / STATE_DIR
    if used is None:
        used = taskcache.read_uses(state_dir, base)
    arches = taskcache.read_arches(state_dir, base)
    return key_of(base, stamps_of(config, environ, toolchains, probes, used, arches))


def stamps_of(
    config: Config,
    environ: Mapping[str, str],
    toolchains: Mapping[str, Toolchain],
    probes: ProbeMemo | None,
    used: Iterable[str] | None,
    arches: Mapping[str, Iterable[str]],
) -> dict[str, Stamp]:
    """The stamps of the toolchains ``used`` (None: all of them), those probed per arch
    also for their ``arches``, probed now."""
    state_dir = config.build_dir / STATE_DIR
    probed = selected_toolchains(toolchains, used)
    return toolchain_stamps(probed, environ, state_dir=state_dir, memo=probes, arches=arches)


def scoped_base(base: str, scope: Sequence[str] | None) -> str:
    """``base`` (:func:`generation_base`) of a run scoped to ``scope`` (the whole tree:
    ``base`` itself): a scoped entry is another entry, with hints of its own."""
    return base if scope is None else _digest({"base": base, "scope": sorted(set(scope))})


def key_of(base: str, stamps: Mapping[str, Stamp]) -> str:
    """The key of ``base`` with these toolchains' stamps."""
    return _digest({"base": base, "used": sorted(stamps), "programs": dict(stamps)})


def stored_key(
    base: str,
    stamps: Mapping[str, Stamp],
    selected: Sequence[str],
    per_arch: Mapping[str, Sequence[str]],
) -> str | None:
    """The key an entry generated after ``stamps`` were taken is stored under: that of
    the toolchains its targets ``selected``, from those same stamps; None (not stored)
    when a selected toolchain was not stamped before generation, or one probed per arch
    and found was not stamped for exactly the arches its targets build for (``per_arch``).

    Stamping it afterwards would pair what generation saw with a later look at the
    toolchain: a compiler installed, or put earlier on ``PATH``, while the targets were
    planned would give the entry the key of the new compiler and specs made for the
    old one (a skip, or another identity in every plan), and the next run would hit
    it. Not storing costs one more generation: the next run's hint names the toolchain
    (and the arches) and stamps it first."""
    if not set(selected) <= set(stamps):
        return None
    for name, arches in per_arch.items():
        stamp = stamps[name]
        if stamp[0] == "found" and _stamped_arches(stamp) != sorted(set(arches)):
            return None
    return key_of(base, {name: stamps[name] for name in selected})


def _stamped_arches(stamp: Stamp) -> list[str]:
    """The arches a found toolchain's stamp holds per-arch rows of (sorted): its fourth
    item, or the third of one under ``{root}`` (:data:`~metrale_orch.toolchain.stamps.Stamp`)."""
    if len(stamp) > 3:
        per_arch = stamp[3]
    elif len(stamp) == 3 and isinstance(stamp[2], list):
        per_arch = stamp[2]
    else:
        per_arch = []
    return sorted(str(row[0]) for row in per_arch if isinstance(row, list) and row)


def selected_toolchains(
    toolchains: Mapping[str, Toolchain], used: Iterable[str] | None
) -> dict[str, Toolchain]:
    """The toolchains named in ``used`` that are defined (all when ``used`` is None)."""
    if used is None:
        return dict(toolchains)
    return {n: toolchains[n] for n in sorted(set(used) & set(toolchains))}


def _digest(doc: object) -> str:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogateescape"))


def _generation_config(config: Config) -> dict[str, object]:
    """The configuration as the generated tasks depend on it: everything but where and how
    many compiles run (``jobs``, the remote executor: :data:`EXECUTION_KEYS`), which
    changes no task."""
    doc = {k: v for k, v in config.to_dict().items() if k not in EXECUTION_KEYS}
    sources = doc.get("sources")
    if isinstance(sources, dict):
        doc["sources"] = {k: v for k, v in sources.items() if k not in EXECUTION_KEYS}
    return doc
