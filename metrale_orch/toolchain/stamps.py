"""What the task cache compares of each toolchain: its stamp (I/O: locates and probes).

:func:`toolchain_stamp` is what :func:`~metrale_orch.toolchain.probe.find_toolchain`
finds, as JSON-ready data; :func:`toolchain_stamps` every toolchain's at once. A stamp
holds every probe the targets' plans are made from, so an equal stamp means equal
plans: the probe without an arch, each arch's compiler of a toolchain under ``{root}``,
and each arch's probe of a toolchain whose dry run names the arch or that has an arch
check, with the check's verdict (an arch its compiler cannot build is skipped, and
never probed, as generation does).
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from metrale_orch.errors import MetraleError
from metrale_orch.toolchain.archcheck import probe_for_arch
from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.toolchain.errors import ArchUnsupported
from metrale_orch.toolchain.locate import executable, find_program, find_root
from metrale_orch.toolchain.probe import ProbeMemo, probe_toolchain

__all__ = ["Stamp", "probed_per_arch", "stamped_per_arch", "toolchain_stamp", "toolchain_stamps"]

#: :func:`toolchain_stamp`'s JSON-ready value: ``["missing"]``, ``["error", text]``,
#: ``["found", program, identity]`` (with ``[[arch, identity], ...]`` after it for a
#: toolchain probed per arch) or ``["found", root, [[arch, identity], ...]]``.
Stamp = list[str | list[list[str]]]


def stamped_per_arch(toolchain: Toolchain) -> bool:
    """Whether ``toolchain``'s stamp holds a row per arch its targets build for (and the
    task cache keeps those arches as a hint): one under ``{root}``, whose every arch has a
    compiler of its own, or one :func:`probed_per_arch`."""
    return "{root}" in toolchain.program or probed_per_arch(toolchain)


def probed_per_arch(toolchain: Toolchain) -> bool:
    """Whether ``toolchain`` is stamped per arch: one program serves every arch (not one
    under ``{root}`` per arch, which is stamped per arch anyway) and either its arch
    check decides per arch whether its targets build, or its probe differs per arch (its
    dry run or program names the ``{arch}``: metal's ``-std=``, hip's ``--offload-arch=``)."""
    if "{root}" in toolchain.program:
        return False
    if toolchain.arch_check_args:  # its targets are skipped or built by each arch's verdict
        return True
    return any("{arch}" in a for a in (toolchain.program, *toolchain.dryrun_args))


def toolchain_stamp(
    toolchain: Toolchain,
    environ: Mapping[str, str],
    *,
    state_dir: Path | None = None,
    site_dirs: Iterable[Path] | None = None,
    memo: ProbeMemo | None = None,
    arches: Iterable[str] = (),
) -> Stamp:
    """What :func:`~metrale_orch.toolchain.probe.find_toolchain` finds, JSON-ready (for the
    task cache): ``["missing"]``, ``["found", program, identity]`` (probed: once per
    ``memo``), or ``["error", text]``.

    A toolchain picked per arch (a program under ``{root}``) is stamped by its root
    and every arch's compiler there, each probed by its own path:
    ``["found", root, [[arch, identity], ...]]`` (``[arch, "unsupported", why]`` where the
    toolchain's arch check refuses the arch). A toolchain whose probe differs per
    arch (:func:`probed_per_arch`) is stamped for each of ``arches`` (those its targets
    build for, ``""`` for those without an arch): ``["found", program, "", [[arch,
    identity], ...]]``, with ``[arch, "unsupported", why]`` for an arch its arch check
    refuses (see :func:`_per_arch`). Its targets' plans carry those identities, so a change only
    an arch's dry run shows (a wrapper reading a file for that arch, one arch's device
    libraries) changes the stamp too.
    """
    try:
        if "{root}" in toolchain.program:
            return _root_stamp(toolchain, environ, state_dir, memo, arches)
        program = find_program(toolchain, environ, site_dirs=site_dirs)
        if program is None:
            return ["missing"]
        wanted = sorted(set(arches)) if probed_per_arch(toolchain) else []
        if not wanted:
            plain = probe_toolchain(toolchain, program, environ, state_dir=state_dir, memo=memo)
            return ["found", str(program), plain.identity]
        per_arch = _per_arch(toolchain, program, environ, state_dir, memo, wanted)
    except MetraleError as exc:
        return ["error", str(exc)]
    return ["found", str(program), "", per_arch]


def _per_arch(
    toolchain: Toolchain,
    program: Path,
    environ: Mapping[str, str],
    state_dir: Path | None,
    memo: ProbeMemo | None,
    arches: list[str],
) -> list[list[str]]:
    """``[arch, identity]`` of each of ``arches`` (``""``: the targets without an arch),
    probed at once, as generation finds the toolchain for it
    (:func:`~metrale_orch.toolchain.archcheck.probe_for_arch`); ``[arch, "unsupported",
    why]`` for an arch the arch check refuses: generation skips its targets without
    probing the arch (a dry run for an arch the compiler does not know fails)."""

    def row(arch: str) -> list[str]:
        try:
            probe = probe_for_arch(
                toolchain, program, environ, arch=arch, state_dir=state_dir, memo=memo
            )
        except ArchUnsupported as exc:
            return [arch, "unsupported", exc.reason]
        except MetraleError as exc:  # this arch's row, not the whole stamp
            return [arch, "error", str(exc)]
        return [arch, probe.identity]

    if len(arches) == 1:
        return [row(arches[0])]
    with ThreadPoolExecutor(len(arches), thread_name_prefix="metrale-arch") as pool:
        return list(pool.map(row, arches))


def toolchain_stamps(
    toolchains: Mapping[str, Toolchain],
    environ: Mapping[str, str],
    *,
    state_dir: Path | None = None,
    memo: ProbeMemo | None = None,
    arches: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, Stamp]:
    """:func:`toolchain_stamp` of every toolchain, by name, probed at the same time: a
    probe is a few short compiler runs, so running them one after another made every
    no-op build wait for the sum (issue 21). ``arches``: name -> the arches its targets
    build for (see :func:`toolchain_stamp`)."""
    names = sorted(toolchains)
    arches = arches or {}

    def stamp(name: str) -> Stamp:
        return toolchain_stamp(
            toolchains[name], environ, state_dir=state_dir, memo=memo, arches=arches.get(name, ())
        )

    if len(names) < 2:
        return {n: stamp(n) for n in names}
    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="metrale-probe") as pool:
        futures = {n: pool.submit(stamp, n) for n in names}
        return {n: futures[n].result() for n in names}


def _root_stamp(
    toolchain: Toolchain,
    environ: Mapping[str, str],
    state_dir: Path | None,
    memo: ProbeMemo | None,
    arches: Iterable[str] = (),
) -> Stamp:
    """``["found", root, rows]``: a row per arch, ``[arch, identity]`` (or the arch
    check's ``"unsupported"``, or ``"error"``), for each of ``arches`` (those the targets
    build for; ``[arch, "absent"]`` where the root has no compiler for one: its targets
    are skipped), or for every arch the root has a compiler for when ``arches`` is empty
    (not known yet). A compiler no target uses is not run."""
    root = find_root(toolchain, environ)
    if root is None:
        return ["missing"]
    pattern = re.escape(toolchain.program).replace(re.escape("{root}"), re.escape(str(root)))
    pattern = pattern.replace(re.escape("{arch}"), "(?P<arch>[^/]+)")
    matcher = re.compile(pattern)
    found = glob.glob(toolchain.program.format(root=glob.escape(str(root)), arch="*"))
    programs: list[tuple[str, str]] = []  # (arch, path), in path order
    for path in sorted(found):
        m = matcher.fullmatch(path)
        if m is not None and executable(Path(path)):
            programs.append((m["arch"], path))

    def probe(program: tuple[str, str]) -> list[str]:
        arch, path = program
        try:  # as generation finds it: after the arch check, where the toolchain has one
            found = probe_for_arch(
                toolchain, Path(path), environ, arch=arch, state_dir=state_dir, memo=memo
            )
        except ArchUnsupported as exc:
            return [arch, "unsupported", exc.reason]
        except MetraleError as exc:  # a broken compiler of one arch hides no other arch
            return [arch, "error", str(exc)]
        return [arch, found.identity]

    wanted = sorted(set(arches))
    if wanted:
        path_of = dict(programs)
        programs = [(a, path_of[a]) for a in wanted if a in path_of]
    # Each arch's compiler as generation finds it, by its own path (a driver finds its
    # resources from the path it was called by, so two arches' links to one file are two
    # compilers); probed at once, like the toolchains.
    workers = max(1, len(programs))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="metrale-arch") as pool:
        rows = {row[0]: row for row in pool.map(probe, programs)}
    if not wanted:
        return ["found", str(root), list(rows.values())]
    return ["found", str(root), [rows.get(a, [a, "absent"]) for a in wanted]]
