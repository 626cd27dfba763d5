"""CUDA arch names (``sm_90a``, ``compute_121f``) and which device can run code built for one.

Pure: :func:`parse_arch` reads a name, :func:`arch_runnable` says why a device of a
given compute capability cannot run an artefact (None when it can).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["ArchSpec", "ArtefactKind", "arch_runnable", "parse_arch"]

#: What an artefact is, read from its bytes (``hsaco``: an AMDGPU code object, HIP's ``.co``).
ArtefactKind = Literal["ptx", "cubin", "fatbin", "hsaco"]


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class ArchSpec:
    """``sm_<sm><variant>``: ``sm`` = 10 * major + minor, ``variant`` in "", "a", "f"."""

    sm: int
    variant: str

    @property
    def cc(self) -> tuple[int, int]:
        """The compute capability it was built for, (major, minor)."""
        return divmod(self.sm, 10)

    def __str__(self) -> str:
        return f"sm_{self.sm}{self.variant}"


_ARCH_RE = re.compile(r"^(?:sm|compute)_(\d{2,3})([af]?)$")


def parse_arch(text: str) -> ArchSpec:
    """Parse ``sm_90a`` / ``compute_121f`` / ``sm_80``. Raises ValueError for anything else."""
    m = _ARCH_RE.match(text.strip())
    if not m:
        raise ValueError(f"not a CUDA arch: {text!r} (expected sm_<NN>[a|f])")
    return ArchSpec(sm=int(m.group(1)), variant=m.group(2))


def arch_runnable(arch: str, kind: ArtefactKind, cc: tuple[int, int]) -> str | None:
    """None when a device of compute capability ``cc`` can run ``arch`` code of ``kind``.

    Otherwise the reason. ``kind`` is ``ptx``, ``cubin`` or ``fatbin``. Rules:
    ``a`` variants run only on exactly their cc; ``f`` (family) variants on the
    same major with a minor at least theirs; a plain cubin likewise (binary
    compatibility within a major); plain PTX on any cc at least its own (the
    driver JIT-compiles forward). A fatbin is judged as PTX when it may carry
    PTX, which is the most permissive of its images.
    """
    spec = parse_arch(arch)
    major, minor = spec.cc
    dev = f"{cc[0]}.{cc[1]}"
    if spec.variant == "a":
        if cc != (major, minor):
            return (
                f"{arch} ({kind}) runs only on compute capability {major}.{minor}, device is {dev}"
            )
        return None
    if spec.variant == "f" or kind == "cubin":
        what = "family" if spec.variant == "f" else "binary"
        if cc[0] != major or cc[1] < minor:
            return (
                f"{arch} ({kind}) runs only on compute capability {major}.x with x >= {minor}"
                f" ({what} compatibility), device is {dev}"
            )
        return None
    if cc < (major, minor):
        return f"{arch} ({kind}) needs compute capability >= {major}.{minor}, device is {dev}"
    return None
