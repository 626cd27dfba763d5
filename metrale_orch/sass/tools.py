"""Finding and running the disassembler and ptxas (I/O: the file system and processes).

:func:`find_disassembler` looks for ``cuobjdump`` (first) or ``nvdisasm`` exactly as the
toolchain finder looks for the target's ``nvcc``
(:func:`~metrale_orch.toolchain.locate.find_program`: ``PATH``, ``$CUDA_HOME/bin`` and
``$CUDA_PATH/bin``, then the running Python's pip-installed CUDA wheels), and raises
:class:`~metrale_orch.sass.errors.DisassemblerMissing` naming the pip command when neither
is there. :func:`disassemble` turns one artefact into a listing: a cubin or a fatbin
directly, PTX after ``ptxas`` has assembled it for its arch in a temporary directory.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.proc import run_process
from metrale_orch.resources.collect import locate_ptxas
from metrale_orch.sass.errors import DisassemblerMissing, UndisassemblableArtefact
from metrale_orch.smoke.elf import ElfError, is_elf, is_fatbin, parse_fatbin
from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.toolchain.locate import find_program

__all__ = ["DISASSEMBLERS", "Disassembler", "disassemble", "find_disassembler"]

#: The programs, in the order they are looked for.
DISASSEMBLERS = ("cuobjdump", "nvdisasm")
#: Where the PyPI wheels put them under site-packages (CUDA 13's, then CUDA 12's).
_PIP_DIRS = ("nvidia/cu13/bin", "nvidia/cuda_cuobjdump/bin", "nvidia/cuda_nvdisasm/bin")
_HOME_ENV = ("CUDA_HOME", "CUDA_PATH")
#: Seconds one ptxas or disassembler run may take.
TIMEOUT = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Disassembler:
    """The disassembler found: which one, and where."""

    kind: Literal["cuobjdump", "nvdisasm"]
    path: Path


def _as_toolchain(toolchain: Toolchain, program: str) -> Toolchain:
    """``toolchain`` looking for ``program`` where it looks for its compiler, plus the CUDA
    homes and wheel directories the disassemblers come in."""
    return dataclasses.replace(
        toolchain,
        program=program,
        program_env=(),
        program_paths=(),
        home_env=tuple(dict.fromkeys((*toolchain.home_env, *_HOME_ENV))),
        pip_dirs=tuple(dict.fromkeys((*toolchain.pip_dirs, *_PIP_DIRS))),
    )


def find_disassembler(
    toolchain: Toolchain, environ: Mapping[str, str], *, site_dirs: Iterable[Path] | None = None
) -> Disassembler:
    """``cuobjdump``, else ``nvdisasm``, found as ``toolchain`` finds its compiler
    (``site_dirs`` replaces the running Python's site-packages, for tests). Raises
    :class:`DisassemblerMissing` when neither is found."""
    dirs = None if site_dirs is None else tuple(site_dirs)
    for kind in DISASSEMBLERS:
        found = find_program(_as_toolchain(toolchain, kind), environ, site_dirs=dirs)
        if found is not None:
            return Disassembler(kind="cuobjdump" if kind == "cuobjdump" else "nvdisasm", path=found)
    homes = ", ".join(f"${v}/bin" for v in dict.fromkeys((*toolchain.home_env, *_HOME_ENV)))
    raise DisassemblerMissing(f"PATH, {homes} or this Python's nvidia/cu13/bin")


def disassemble(
    tool: Disassembler,
    toolchain: Toolchain,
    artefact: Path,
    arch: str,
    environ: Mapping[str, str],
    *,
    shown: str,
) -> str:
    """The SASS listing of ``artefact`` (a cubin, a fatbin, or PTX assembled for ``arch``
    by the ``ptxas`` beside the toolchain's compiler). Raises
    :class:`UndisassemblableArtefact` naming ``shown``, ``PtxasMissing``, or
    :class:`~metrale_orch.proc.ProcessError` when a tool fails."""
    try:
        data = artefact.read_bytes()
    except OSError as exc:
        raise UndisassemblableArtefact(shown, f"cannot be read ({exc.strerror or exc})") from None
    with tempfile.TemporaryDirectory(prefix="metrale-sass-") as tmp:
        if is_elf(data):
            cubins = [artefact]
        elif is_fatbin(data):
            cubins = [artefact] if tool.kind == "cuobjdump" else _fatbin_cubins(data, tmp, shown)
        elif b".entry" in data or b".target" in data:
            ptxas = locate_ptxas(toolchain, environ, arch)
            cubin = Path(tmp) / "assembled.cubin"
            argv = [str(ptxas), f"-arch={arch}", str(artefact), "-o", str(cubin)]
            run_process(argv, env=environ, timeout=TIMEOUT)
            cubins = [cubin]
        else:
            raise UndisassemblableArtefact(shown, "is neither PTX, a cubin nor a fatbin")
        return "".join(_listing(tool, c, environ) for c in cubins)


def _listing(tool: Disassembler, binary: Path, environ: Mapping[str, str]) -> str:
    flags = ["-sass"] if tool.kind == "cuobjdump" else ["-c"]
    return run_process([str(tool.path), *flags, str(binary)], env=environ, timeout=TIMEOUT).stdout


def _fatbin_cubins(data: bytes, tmp: str, shown: str) -> list[Path]:
    """The fatbin's cubins written out for nvdisasm (which reads only cubins)."""
    try:
        entries = [e for e in parse_fatbin(data).entries if e.kind == "elf"]
    except ElfError as exc:
        raise UndisassemblableArtefact(shown, f"cannot be read ({exc})") from None
    if any(e.compression for e in entries):
        raise UndisassemblableArtefact(
            shown,
            "a compressed fatbin needs cuobjdump (nvdisasm reads only plain cubins); "
            "`pip install nvidia-cuda-cuobjdump`",
        )
    out = []
    for i, entry in enumerate(entries):
        path = Path(tmp) / f"entry{i}.cubin"
        path.write_bytes(data[entry.offset : entry.offset + entry.size])
        out.append(path)
    return out
