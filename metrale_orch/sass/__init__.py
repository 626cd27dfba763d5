"""The SASS diff: which kernels' machine code changed between two build directories.

:mod:`~metrale_orch.sass.listing` reads a ``cuobjdump -sass`` or ``nvdisasm`` listing
into normalised code per function (pure); :mod:`~metrale_orch.sass.diff` compares two
modules' functions (pure) and holds the values; :mod:`~metrale_orch.sass.tools` finds
the disassembler (as the toolchain finder finds nvcc) and runs it and ptxas;
:mod:`~metrale_orch.sass.compare` walks the two build directories' manifests. It reads
the tree, the toolchains, the artefact readers of :mod:`metrale_orch.smoke.elf` and the
target selection and ptxas lookup of :mod:`metrale_orch.resources`; nothing but the CLI
imports it.
"""

from __future__ import annotations

from metrale_orch.sass.compare import SASS_OUTPUTS, compare_builds
from metrale_orch.sass.diff import KernelDiff, SassDiff, TargetNote, diff_functions
from metrale_orch.sass.errors import (
    ArtefactMismatch,
    DisassemblerMissing,
    SassError,
    UndisassemblableArtefact,
)
from metrale_orch.sass.listing import FunctionCode, normalise_instruction, parse_listing
from metrale_orch.sass.tools import Disassembler, disassemble, find_disassembler

__all__ = [
    "SASS_OUTPUTS",
    "ArtefactMismatch",
    "Disassembler",
    "DisassemblerMissing",
    "FunctionCode",
    "KernelDiff",
    "SassDiff",
    "SassError",
    "TargetNote",
    "UndisassemblableArtefact",
    "compare_builds",
    "diff_functions",
    "disassemble",
    "find_disassembler",
    "normalise_instruction",
    "parse_listing",
]
