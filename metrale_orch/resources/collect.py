"""Collecting the register report of a build directory: the I/O of the resource report.

:func:`collect_resources` walks the tree's targets (those a pattern selects), reads each
built target's ``manifest.json`` and the artefacts it lists, and asks the right source for
each artefact's kernels: ``ptxas -v`` (:func:`run_ptxas`, the ``ptxas`` beside the
toolchain's ``nvcc``) for PTX, the cubin's own records for cubins and the cubins inside a
fatbin. A target whose toolchain produces something else (HIP code objects, Metal
libraries, SCALE objects) gets one ``no-report`` line, a target without a manifest one
``not-built`` line; a target whose manifest or artefacts cannot be read one ``error`` line,
so one broken target never hides the others.

ptxas's answers are cached in ``<build_dir>/.state/resources.json``, keyed by the
artefact's content hash, its arch, the identity of the toolchain that built it and the
``ptxas`` binary (path, size, mtime): a second run over an unchanged build runs no ptxas.
The cache is best effort: an unreadable one is ignored, a failed write is logged.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.errors import MetraleError
from metrale_orch.fsutil import bytes_hash
from metrale_orch.manifest import Manifest, ManifestError, odd_artefact, read_manifest
from metrale_orch.paths import MANIFEST_NAME, STATE_DIR, rel_posix, target_dir
from metrale_orch.proc import run_process
from metrale_orch.resources.answers import Answers
from metrale_orch.resources.errors import (
    BadManifest,
    NoTargetMatches,
    PtxasMissing,
    UnreadableArtefact,
)
from metrale_orch.resources.report import (
    KernelResources,
    ModuleResources,
    ResourceReport,
    TargetResources,
    kernels_from_cubin,
    parse_ptxas_report,
)
from metrale_orch.smoke.elf import is_elf, is_fatbin, parse_cubin, parse_fatbin
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains, select_toolchain
from metrale_orch.toolchain.locate import locate_toolchain
from metrale_orch.tree import Target, TreeSnapshot, walk

__all__ = [
    "CACHE_NAME",
    "Collected",
    "collect_resources",
    "locate_ptxas",
    "ptxas_stamp",
    "read_target_manifest",
    "run_ptxas",
    "select_targets",
]


#: The ptxas answer cache, in ``<build_dir>/.state/``.
CACHE_NAME = "resources.json"
_CACHE_SCHEMA = 1
#: Output kinds whose artefacts have a register report.
_REPORTED_OUTPUTS = ("ptx", "cubin", "fatbin")
#: Seconds one ptxas run may take.
PTXAS_TIMEOUT = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Collected:
    """A report and what producing it cost (not part of the report: it varies run to run)."""

    report: ResourceReport
    #: ptxas processes started.
    ptxas_runs: int
    #: PTX artefacts answered from the cache.
    cache_hits: int


def select_targets(targets: list[Target], pattern: str | None) -> list[Target]:
    """The targets ``pattern`` (an fnmatch wildcard over ``hw/model/quant``, optionally
    ``build:``-prefixed as in doit) selects, in order (pure). Raises
    :class:`NoTargetMatches` when it selects none."""
    if pattern is None:
        return targets
    pat = pattern.removeprefix("build:").strip("/")
    chosen = [t for t in targets if fnmatch.fnmatchcase(str(t), pat)]
    if not chosen:
        raise NoTargetMatches(pattern)
    return chosen


def run_ptxas(ptxas: Path, ptx: Path, arch: str, environ: Mapping[str, str]) -> str:
    """Assemble ``ptx`` for ``arch`` with ``ptxas -v`` (output discarded) and return its
    report (stdout and stderr). Raises :class:`~metrale_orch.proc.ProcessError`."""
    done = run_process(
        [str(ptxas), "-v", f"-arch={arch}", str(ptx), "-o", os.devnull],
        env=environ,
        timeout=PTXAS_TIMEOUT,
    )
    return done.stdout + done.stderr


def locate_ptxas(toolchain: Toolchain, environ: Mapping[str, str], arch: str) -> Path:
    """The ``ptxas`` beside the toolchain's compiler (the one that matches the PTX it
    writes). Raises ``ToolchainMissing`` as :func:`locate_toolchain`, :class:`PtxasMissing`
    when the compiler has no ptxas beside it."""
    program = locate_toolchain(toolchain, environ, arch=arch)
    ptxas = program.with_name("ptxas" + program.suffix)
    if not ptxas.is_file():
        raise PtxasMissing(str(ptxas), str(program))
    return ptxas


def ptxas_stamp(ptxas: Path) -> str:
    """``ptxas``'s stamp for the keys of cached answers: real path, size, mtime (I/O)."""
    st = ptxas.stat()
    return f"{os.path.realpath(ptxas)}:{st.st_size}:{st.st_mtime_ns}"


def collect_resources(
    root: Path, build_dir: Path, pattern: str | None, environ: Mapping[str, str]
) -> Collected:
    """The register report of ``build_dir`` for the targets ``pattern`` selects (all when
    None), sorted by target.

    Raises ``LayoutError`` when the tree does not resolve, :class:`NoTargetMatches` when
    the pattern selects nothing; a problem of one target is that target's ``error`` line.
    A run over every target (no pattern) also drops cache entries it did not use.
    """
    root = Path(os.path.abspath(root))
    build_dir = Path(os.path.abspath(build_dir))
    snap = TreeSnapshot(root)
    targets = select_targets(walk(root, snap), pattern)
    cache = Answers.load(build_dir / STATE_DIR / CACHE_NAME, _CACHE_SCHEMA, "the resource cache")
    run = _Run(root=root, environ=environ, cache=cache)
    toolchains = load_toolchains(root)
    out = []
    for target in targets:
        try:
            hardware = snap.hardware(target.hardware)
            toolchain = select_toolchain(hardware, toolchains)
            if toolchain.output not in _REPORTED_OUTPUTS:
                out.append(
                    TargetResources(
                        target=str(target),
                        status="no-report",
                        arch=hardware.arch or "",
                        detail=(
                            f"no register report for toolchain {toolchain.name!r} "
                            f"(vendor {hardware.vendor}, {toolchain.output} artefacts): "
                            "only PTX and cubin artefacts have one"
                        ),
                    )
                )
                continue
            out.append(_collect_target(run, target, toolchain, build_dir))
        except MetraleError as exc:  # the package's own: this target's line, then the next
            detail = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
            out.append(TargetResources(target=str(target), status="error", detail=detail))
    run.cache.save(prune=pattern is None)
    report = ResourceReport(build_dir=rel_posix(build_dir, root), targets=tuple(out))
    return Collected(report=report, ptxas_runs=run.ptxas_runs, cache_hits=run.cache_hits)


# ---------------------------------------------------------------------------- internals


def _kept_kernels(run: _Run, key: str) -> tuple[KernelResources, ...] | None:
    """The kernels the cache keeps for ``key``, or None (none kept, or not readable);
    read once per run (identical artefacts of many targets share a key)."""
    if key in run.kept:
        run.cache.get(key)  # counts as used
        return run.kept[key]
    found = run.cache.get(key)
    if not isinstance(found, list):
        return None
    try:
        kernels = tuple(KernelResources.from_dict(k) for k in found)
    except (ValueError, AttributeError):
        return None
    run.kept[key] = kernels
    return kernels


@dataclass(slots=True)
class _Run:
    root: Path
    environ: Mapping[str, str]
    cache: Answers
    ptxas_runs: int = 0
    cache_hits: int = 0
    #: (toolchain, arch) -> (ptxas, its stamp for cache keys).
    ptxas: dict[tuple[str, str], tuple[Path, str]] = field(default_factory=dict)
    #: cache key -> the kernels read from the cache for it in this run.
    kept: dict[str, tuple[KernelResources, ...]] = field(default_factory=dict)

    def find_ptxas(self, toolchain: Toolchain, arch: str) -> tuple[Path, str]:
        memo = (toolchain.name, arch)
        if memo not in self.ptxas:
            ptxas = locate_ptxas(toolchain, self.environ, arch)
            self.ptxas[memo] = (ptxas, ptxas_stamp(ptxas))
        return self.ptxas[memo]


def read_target_manifest(path: Path, shown: str) -> Manifest:
    """The target's manifest (:func:`~metrale_orch.manifest.read_manifest`); raises
    :class:`BadManifest` naming ``shown``."""
    try:
        manifest = read_manifest(path)
    except OSError as exc:
        raise BadManifest(shown, f"cannot be read ({exc.strerror or exc})") from None
    except ManifestError as exc:
        raise BadManifest(shown, f"cannot be read ({exc})") from None
    odd = odd_artefact(manifest)
    if odd is not None:
        raise BadManifest(shown, f"artefact {odd!r} is not a file name")
    return manifest


def _collect_target(
    run: _Run, target: Target, toolchain: Toolchain, build_dir: Path
) -> TargetResources:
    tdir = target_dir(build_dir, target.hardware, target.model, target.quant)
    manifest = tdir / MANIFEST_NAME
    shown = rel_posix(manifest, run.root)
    if not manifest.is_file():
        return TargetResources(
            target=str(target),
            status="not-built",
            detail=f"not built (no {shown})",
        )
    doc = read_target_manifest(manifest, shown)
    arch = doc.arch
    out = []
    # An artefact is a plain file name (read_target_manifest checks): paths are joined as text.
    under, below = os.fspath(tdir), rel_posix(tdir, build_dir)
    for module in sorted(doc.modules, key=lambda m: (m.artefact, m.name)):
        path = os.path.join(under, module.artefact)
        kernels = _artefact_kernels(run, toolchain, path, arch, doc.toolchain_identity)
        out.append(
            ModuleResources(
                module=module.name, artefact=f"{below}/{module.artefact}", kernels=kernels
            )
        )
    return TargetResources(target=str(target), status="ok", arch=arch, modules=tuple(out))


def _artefact_kernels(
    run: _Run, toolchain: Toolchain, path: str, arch: str, identity: str
) -> tuple[KernelResources, ...]:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        shown = rel_posix(path, run.root)
        raise UnreadableArtefact(shown, f"cannot be read ({exc.strerror or exc})") from None
    if is_elf(data):
        return kernels_from_cubin(parse_cubin(data), arch)
    if is_fatbin(data):
        cubins = [e.elf for e in parse_fatbin(data).entries if e.elf is not None]
        if not cubins:
            raise UnreadableArtefact(
                rel_posix(path, run.root), "the fatbin holds no uncompressed cubin to read"
            )
        found = [k for info in cubins for k in kernels_from_cubin(info, info.arch)]
        return tuple(sorted(found, key=lambda k: (k.kernel, k.arch)))
    if b".entry" not in data and b".target" not in data:
        raise UnreadableArtefact(rel_posix(path, run.root), "is neither PTX, a cubin nor a fatbin")
    ptxas, stamp = run.find_ptxas(toolchain, arch)
    key = f"ptx|{arch}|{bytes_hash(data)}|{identity}|{stamp}"
    cached = _kept_kernels(run, key)
    if cached is not None:
        run.cache_hits += 1
        return cached
    run.ptxas_runs += 1
    report = run_ptxas(ptxas, Path(path), arch, run.environ)
    kernels = parse_ptxas_report(report, where=rel_posix(path, run.root))
    run.cache.put(key, [k.to_dict() for k in kernels])
    run.kept[key] = kernels
    return kernels
