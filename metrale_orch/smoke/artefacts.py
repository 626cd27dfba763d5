"""The static check of an artefact: what its bytes are, and whether they match the manifest.

:func:`inspect_artefact` identifies a PTX file, a cubin or a fatbin by content
(not by name) with the readers of :mod:`~metrale_orch.smoke.ptx` and
:mod:`~metrale_orch.smoke.elf`; :func:`static_problems` compares what it read with
the manifest's arch and the entries the smoke cases name; :func:`xxh3_matches`
checks the manifest's content hash. Pure, no GPU; only :class:`SmokeError` leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from metrale_orch.smoke.arch import ArtefactKind, parse_arch
from metrale_orch.smoke.elf import (
    CubinInfo,
    ElfError,
    FatbinInfo,
    is_elf,
    is_fatbin,
    parse_cubin,
    parse_fatbin,
)
from metrale_orch.smoke.errors import SmokeError
from metrale_orch.smoke.ptx import PtxError, PtxInfo, parse_ptx

__all__ = ["ArtefactInfo", "inspect_artefact", "static_problems", "xxh3_matches"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ArtefactInfo:
    """What an artefact is, read from its bytes."""

    kind: ArtefactKind
    #: Arch(es) it targets as read: ``sm_90a``; a fatbin lists its images' arches.
    arches: tuple[str, ...]
    #: Entry names found (for a fatbin: those of its readable images).
    entries: tuple[str, ...]
    #: True when every image could be read (False: a fatbin with compressed images).
    entries_complete: bool
    ptx: PtxInfo | None = None
    cubin: CubinInfo | None = None
    fatbin: FatbinInfo | None = None

    def describe(self) -> str:
        """A multi-line human summary: kind, arch, entries, registers/shared memory."""
        lines = [f"kind: {self.kind}", f"arch: {', '.join(self.arches) or '?'}"]
        if self.ptx is not None:
            lines.append(f"ptx version: {self.ptx.version}")
            lines.append(f"visible entries: {', '.join(self.ptx.visible_entries) or '(none)'}")
        if self.cubin is not None:
            lines.extend(_kernel_lines(self.cubin))
        if self.fatbin is not None:
            for e in self.fatbin.entries:
                lines.append(f"image: {e.describe()}")
                if e.elf is not None:
                    lines.extend("  " + ln for ln in _kernel_lines(e.elf))
                if e.ptx is not None:
                    lines.append(f"  visible entries: {', '.join(e.ptx.visible_entries)}")
        return "\n".join(lines)


def _kernel_lines(info: CubinInfo) -> list[str]:
    out = []
    for k in info.kernels:
        regs = "?" if k.registers is None else str(k.registers)
        frame = "" if not k.frame_bytes else f", {k.frame_bytes} bytes stack"
        out.append(f"kernel {k.name}: {regs} registers, {k.shared_bytes} bytes smem{frame}")
    return out or ["kernels: (none)"]


def inspect_artefact(data: bytes) -> ArtefactInfo:
    """Identify and read an artefact (by content, not name). Raises :class:`SmokeError`."""
    try:
        if is_elf(data):
            cubin = parse_cubin(data)
            return ArtefactInfo(
                kind="cubin",
                arches=(cubin.arch,),
                entries=cubin.entry_names,
                entries_complete=True,
                cubin=cubin,
            )
        if is_fatbin(data):
            fat = parse_fatbin(data)
            arches = []
            for e in fat.entries:
                a = e.elf.arch if e.elf else e.ptx.target if e.ptx else f"sm_{e.sm}"
                arches.append(f"{a} ({e.kind})")
            complete = all(e.elf is not None or e.ptx is not None for e in fat.entries)
            return ArtefactInfo(
                kind="fatbin",
                arches=tuple(arches),
                entries=fat.entry_names,
                entries_complete=complete,
                fatbin=fat,
            )
        text = data.decode("utf-8")
        ptx = parse_ptx(text)
    except (ElfError, PtxError) as exc:
        raise SmokeError(f"unreadable artefact: {exc}") from None
    except UnicodeDecodeError:
        raise SmokeError("unreadable artefact: neither ELF, fatbin nor PTX text") from None
    return ArtefactInfo(
        kind="ptx", arches=(ptx.target,), entries=ptx.entry_names, entries_complete=True, ptx=ptx
    )


def static_problems(info: ArtefactInfo, arch: str, expected: Sequence[str]) -> tuple[str, ...]:
    """Why the artefact does not match the declared ``arch`` and ``expected`` entries. Pure."""
    problems: list[str] = []
    try:
        want = parse_arch(arch)
    except ValueError as exc:
        return (str(exc),)
    if info.ptx is not None:
        try:
            got = parse_arch(info.ptx.target)
        except ValueError:
            got = None
        if got != want:
            problems.append(f".target is {info.ptx.target!r}, manifest arch is {arch!r}")
    if info.cubin is not None:
        c = info.cubin
        if c.sm != want.sm or (c.variant is not None and c.variant != want.variant):
            problems.append(f"cubin is for {c.arch}, manifest arch is {arch!r}")
    if info.fatbin is not None:
        if not any(e.sm == want.sm for e in info.fatbin.entries):
            problems.append(f"fatbin has no image for {arch!r} (images: {', '.join(info.arches)})")
        for e in info.fatbin.entries:
            elf = e.elf
            if elf is not None and elf.sm == want.sm and elf.variant not in (None, want.variant):
                problems.append(f"fatbin image {elf.arch} does not match {arch!r}")
    if info.entries_complete:
        present = set(info.entries)
        for name in sorted(set(expected)):
            if name not in present:
                problems.append(
                    f"expected entry {name!r} is missing"
                    f" (entries: {', '.join(info.entries) or 'none'});"
                    ' declare it extern "C" __global__ in the module'
                )
    return tuple(problems)


def xxh3_matches(data: bytes, want: str) -> bool:
    """True when ``data`` hashes to ``want``: 16 hex digits for xxh3-64, else xxh3-128."""
    want = want.lower()
    if len(want) == 16:
        return bool(xxhash.xxh3_64_hexdigest(data) == want)
    return bool(xxhash.xxh3_128_hexdigest(data) == want)
