"""Whether a toolchain's compiler can build an arch at all (I/O: runs the compiler).

A compiler can be installed and still not build a hardware's ``[hardware] arch``:
Debian's hipcc 5.2 runs clang 15, which does not know gfx1151 (``invalid target
ID``) and has no device libraries for gfx1100. Every module of such a target
would fail with the same error, so the build treats it like a missing compiler:
:func:`find_toolchain_for_arch` is
:func:`~metrale_orch.toolchain.probe.find_toolchain` after :func:`arch_problem`
compiled an empty kernel with the toolchain's ``arch_check_args``
(:func:`probe_for_arch`), and raises
:class:`~metrale_orch.toolchain.errors.ArchUnsupported` (a ``ToolchainMissing``)
with the compiler's own first error line. The build skips such a target with
that reason, and fails it when it is named.

The verdict is remembered across processes in ``<state_dir>/arch-checks.json``,
keyed by the toolchain's definition, the compiler's identity (its version, dry
run, the content of its binaries and the environment it reads) and the arch: a
no-op build pays nothing, a changed compiler is checked again. Beside each
verdict that let an arch build, the file keeps that arch's probed identity: while
the arch's probe shows it again, the probe without the arch is not run. Not seen:
device libraries added beside an unchanged compiler (delete the file to check again).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from metrale_orch.canonical import canonical_json
from metrale_orch.errors import MetraleError
from metrale_orch.fsutil import read_json_object, text_hash, write_own
from metrale_orch.proc import ProcessError, run_process
from metrale_orch.toolchain.argv import toolchain_environ
from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.toolchain.dryrun import PROBE_TIMEOUT
from metrale_orch.toolchain.errors import ArchUnsupported
from metrale_orch.toolchain.probe import (
    Probe,
    ProbeMemo,
    find_toolchain,
    probe_toolchain,
)

__all__ = [
    "ARCH_CHECKS",
    "arch_check_argv",
    "arch_problem",
    "find_toolchain_for_arch",
    "first_error_line",
    "probe_for_arch",
    "run_arch_check",
]

#: The verdicts' file in the build's state directory.
ARCH_CHECKS = "arch-checks.json"
_ARCH_CHECKS_MAX = 256
#: Guards the read-modify-write of the verdicts' file within this process.
_VERDICTS_LOCK = threading.Lock()
_SOURCE = "metrale_arch_check.cu"
_OUTPUT = "metrale_arch_check"
_KERNEL = 'extern "C" __global__ void metrale_arch_check() {}\n'


def arch_check_argv(toolchain: Toolchain, program: Path, arch: str) -> list[str]:
    """The arch check's argv (pure): ``arch_check_args`` with the check's file names."""
    values = {
        "source": _SOURCE,
        "output": f"{_OUTPUT}.{toolchain.extension}",
        "output_kind_flag": toolchain.output_flag,
        "arch": arch,
    }
    return [str(program), *(a.format_map(values) for a in toolchain.arch_check_args)]


def first_error_line(output: str) -> str:
    """The compiler's first line that says ``error`` (pure), else its first line, else ""."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")


def run_arch_check(
    toolchain: Toolchain, program: Path, environ: Mapping[str, str], arch: str
) -> str:
    """Compile an empty kernel for ``arch`` in a temporary directory, in the toolchain's
    environment (I/O): "" when it built, else why not (the compiler's first error line)."""
    argv = arch_check_argv(toolchain, program, arch)
    with tempfile.TemporaryDirectory(prefix="metrale-arch.") as tmp:
        (Path(tmp) / _SOURCE).write_text(_KERNEL, encoding="utf-8")
        try:
            run_process(
                argv,
                env=toolchain_environ(toolchain, environ),
                timeout=PROBE_TIMEOUT,
                cwd=Path(tmp),
            )
        except ProcessError as exc:
            return first_error_line(exc.output) or exc.reason
        output = Path(tmp) / f"{_OUTPUT}.{toolchain.extension}"
        if not (output.is_file() and output.stat().st_size):
            return f"exited 0 but wrote no {output.name}"
    return ""


def _memo_key(toolchain: Toolchain, program: Path, identity: str, arch: str) -> str:
    doc = [toolchain.to_dict(), str(program), identity, arch]
    return text_hash(canonical_json(doc))


def _read_verdicts(path: Path) -> dict[str, str]:
    return {k: v for k, v in read_json_object(path).items() if isinstance(v, str)}


def arch_problem(
    toolchain: Toolchain,
    program: Path,
    environ: Mapping[str, str],
    *,
    arch: str,
    identity: str,
    state_dir: Path | None = None,
) -> str:
    """Why ``program`` (whose probed identity is ``identity``) cannot build ``arch``, or ""
    (I/O). Remembered in ``<state_dir>/arch-checks.json``; "" at once for a toolchain
    without ``arch_check_args`` or a hardware without an arch."""
    if not toolchain.arch_check_args or not arch:
        return ""
    key = _memo_key(toolchain, program, identity, arch)
    path = None if state_dir is None else Path(state_dir) / ARCH_CHECKS
    known = {} if path is None else _read_verdicts(path)
    if key in known:
        return known[key]
    problem = run_arch_check(toolchain, program, environ, arch)
    if path is not None:
        _keep_verdict(path, key, problem)
    return problem


def _keep_verdict(path: Path, key: str, problem: str) -> None:
    """Add one verdict to the file. Generation finds its toolchains on threads, whose
    checks run at once: only the read-modify-write of the file is one at a time, so no
    thread's verdict is lost to another's write."""
    with _VERDICTS_LOCK:
        known = _read_verdicts(path)
        kept = dict(sorted(known.items())[: _ARCH_CHECKS_MAX - 1])
        kept[key] = problem
        kept = dict(sorted(kept.items()))
        # Only a speed-up: a read-only build dir checks again in the next process.
        with contextlib.suppress(OSError):
            write_own(path, json.dumps(kept, indent=1).encode())


def _built_key(toolchain: Toolchain, program: Path, arch: str) -> str:
    """The verdicts file's key of the arch probe last found to build ``arch``."""
    doc = [toolchain.to_dict(), str(program), arch, "built, with the arch's own probe"]
    return text_hash(canonical_json(doc))


def probe_for_arch(
    toolchain: Toolchain,
    program: Path,
    environ: Mapping[str, str],
    *,
    arch: str,
    state_dir: Path | None = None,
    memo: ProbeMemo | None = None,
) -> Probe:
    """``program``'s probe for ``arch``, once its compiler is known to build ``arch`` (I/O):
    for a toolchain with ``arch_check_args``, :func:`arch_problem` keyed by the probe
    without the arch (a dry run for an arch the compiler does not know fails), then the
    arch's own probe; else that probe alone. Probed once per ``memo``.

    A compiler found to build ``arch`` leaves that arch's identity in the verdicts file.
    While the arch's probe shows that same identity, the verdict stands without the
    probe without the arch: a no-op build runs one dry run per arch, not two. The arch's
    probe names at least what the other one does that bears on the arch (the same
    programs, version and environment, and the arch's own device libraries and flags),
    so it changes whenever the verdict's key would. Raises :class:`ArchUnsupported` for
    an arch it cannot build, and what the probes raise.
    """
    if not (toolchain.arch_check_args and arch):
        return probe_toolchain(
            toolchain, program, environ, state_dir=state_dir, arch=arch, memo=memo
        )
    path = None if state_dir is None else Path(state_dir) / ARCH_CHECKS
    key = _built_key(toolchain, program, arch)
    built = None if path is None else _read_verdicts(path).get(key)
    if built is not None:
        # A failure here is the arch's (one the compiler no longer knows): the full
        # check below says why, in the compiler's words.
        with contextlib.suppress(MetraleError):
            probe = probe_toolchain(
                toolchain, program, environ, state_dir=state_dir, arch=arch, memo=memo
            )
            if probe.identity == built:
                return probe
    identity = probe_toolchain(toolchain, program, environ, state_dir=state_dir, memo=memo).identity
    problem = arch_problem(
        toolchain, program, environ, arch=arch, identity=identity, state_dir=state_dir
    )
    if problem:
        raise ArchUnsupported(
            toolchain.name, program.name, toolchain.install_hint, arch=arch, reason=problem
        )
    probe = probe_toolchain(toolchain, program, environ, state_dir=state_dir, arch=arch, memo=memo)
    if path is not None and probe.identity != built:
        _keep_verdict(path, key, probe.identity)
    return probe


#: :func:`~metrale_orch.toolchain.probe.find_toolchain`, probed by :func:`probe_for_arch`:
#: once the compiler is known to build ``arch`` (for a toolchain with ``arch_check_args``).
#: Raises :class:`ArchUnsupported` for an arch it cannot build, and what ``find_toolchain``
#: raises.
find_toolchain_for_arch = partial(find_toolchain, probe=probe_for_arch)
