"""Which CUDA driver loads which PTX: NVIDIA's PTX ISA / CUDA release table (pure).

A driver JIT-compiles PTX up to the ISA version of its own CUDA release and refuses
anything newer ("the provided PTX was compiled with an unsupported toolchain"): nvcc 13
writes ``.version 9.0``, which a CUDA 12.8 driver cannot load. :func:`isa_problem` says
why a PTX module's ``.version`` is too new for a deployment's minimum CUDA release.

The table is NVIDIA's "PTX ISA Version / CUDA Release" table, from the release notes of
the PTX ISA manual (https://docs.nvidia.com/cuda/parallel-thread-execution/
#release-notes-ptx-release-history), as NVIDIA's own cuda-python copies it
(``cuda/bindings/utils/_ptx_utils.py``, ``_ptx_to_cuda``). Note PTX ISA 8.5 serves CUDA
12.5 and 12.6, and 8.6 came with 12.7.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["CUDA_OF_ISA", "Version", "format_version", "isa_problem", "parse_version"]

#: A ``MAJOR.MINOR`` version as numbers.
Version = tuple[int, int]

#: PTX ISA version -> the first CUDA release whose driver loads it.
CUDA_OF_ISA: Mapping[Version, Version] = MappingProxyType(
    {
        (1, 0): (1, 0), (1, 1): (1, 1), (1, 2): (2, 0), (1, 3): (2, 1), (1, 4): (2, 2),
        (2, 0): (3, 0), (2, 1): (3, 1), (2, 2): (3, 2), (2, 3): (4, 0), (3, 0): (4, 1),
        (3, 1): (5, 0), (3, 2): (5, 5), (4, 0): (6, 0), (4, 1): (6, 5), (4, 2): (7, 0),
        (4, 3): (7, 5), (5, 0): (8, 0), (6, 0): (9, 0), (6, 1): (9, 1), (6, 2): (9, 2),
        (6, 3): (10, 0), (6, 4): (10, 1), (6, 5): (10, 2),
        (7, 0): (11, 0), (7, 1): (11, 1), (7, 2): (11, 2), (7, 3): (11, 3), (7, 4): (11, 4),
        (7, 5): (11, 5), (7, 6): (11, 6), (7, 7): (11, 7), (7, 8): (11, 8),
        (8, 0): (12, 0), (8, 1): (12, 1), (8, 2): (12, 2), (8, 3): (12, 3), (8, 4): (12, 4),
        (8, 5): (12, 5), (8, 6): (12, 7), (8, 7): (12, 8), (8, 8): (12, 9),
        (9, 0): (13, 0), (9, 1): (13, 1),
    }
)  # fmt: skip

_VERSION = re.compile(r"(\d{1,3})\.(\d{1,3})")


def parse_version(text: str) -> Version | None:
    """``"12.8"`` -> ``(12, 8)``; None for anything that is not ``MAJOR.MINOR`` (pure)."""
    m = _VERSION.fullmatch(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def format_version(version: Version) -> str:
    """``(12, 8)`` -> ``"12.8"``."""
    return f"{version[0]}.{version[1]}"


def isa_problem(isa: str, min_cuda: Version) -> str | None:
    """Why a driver of CUDA ``min_cuda`` cannot load PTX of ISA version ``isa`` (the
    ``.version`` text), or None when it can (pure). A version the table does not hold is
    a problem too: the gate cannot vouch for it."""
    version = parse_version(isa)
    if version is None:
        return f"PTX .version {isa!r} is not a PTX ISA version"
    cuda = CUDA_OF_ISA.get(version)
    need = format_version(min_cuda)
    if cuda is None:
        newest = max(CUDA_OF_ISA)
        if version > newest and min_cuda <= CUDA_OF_ISA[newest]:
            return (
                f"PTX ISA {isa} is newer than any CUDA {need} driver loads (PTX ISA "
                f"{format_version(newest)} came with CUDA {format_version(CUDA_OF_ISA[newest])})"
            )
        return (
            f"PTX ISA {isa} is not in the PTX ISA / CUDA release table this check knows: "
            f"cannot tell whether a CUDA {need} driver loads it"
        )
    if cuda > min_cuda:
        return (
            f"PTX ISA {isa} needs a CUDA {format_version(cuda)} driver or newer, the "
            f"deployment's minimum is CUDA {need}: build with a CUDA {need} toolkit (or older) "
            "or raise min_cuda"
        )
    return None
