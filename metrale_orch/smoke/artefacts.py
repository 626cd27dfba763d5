"""The static check of an artefact: what its bytes are, and whether they match the manifest.

:func:`inspect_artefact` identifies a PTX file, a cubin, a fatbin or an AMDGPU code
object (HIP's ``.co``) by content (not by name) with the readers of
:mod:`~metrale_orch.smoke.ptx`, :mod:`~metrale_orch.smoke.elf` and
:mod:`~metrale_orch.smoke.amdgpu`; :func:`static_problems` compares what it read with
the manifest's arch and the entries the smoke cases name; :func:`xxh3_matches`
checks the manifest's content hash. Pure, no GPU; only :class:`SmokeError` leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metrale_orch.fsutil import bytes_digest, bytes_hash
from metrale_orch.smoke.amdgpu import (
    CodeObjectInfo,
    is_code_object,
    parse_code_object,
    processor_of,
)
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
    code_object: CodeObjectInfo | None = None

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
        if self.code_object is not None:
            lines.extend(f"image: {i.describe()}" for i in self.code_object.images)
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
        if is_code_object(data):
            code = parse_code_object(data)
            return ArtefactInfo(
                kind="hsaco",
                arches=tuple(i.target_id for i in code.images),
                entries=code.entry_names,
                entries_complete=True,
                code_object=code,
            )
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
    if info.code_object is not None:
        problems = _code_object_problems(info.code_object, arch)
    else:
        try:
            problems = _cuda_problems(info, arch)
        except ValueError as exc:  # the manifest's arch is no CUDA arch
            return (str(exc),)
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


def _code_object_problems(code: CodeObjectInfo, arch: str) -> list[str]:
    """Why an AMDGPU code object does not match ``arch`` (``gfx90a``, or a target id with
    features, ``gfx90a:xnack-``): no image for it, or an image whose bundle id, metadata
    note and ``e_flags`` disagree. Pure."""
    problems: list[str] = []
    want = processor_of(arch)
    images = [i for i in code.images if i.processor == want]
    if not images:
        got = ", ".join(i.target_id for i in code.images)
        problems.append(f"code object is for {got}, manifest arch is {arch!r}")
    elif ":" in arch and not any(i.target_id == arch for i in images):
        got = ", ".join(i.target_id for i in images)
        problems.append(f"code object is for {got}, manifest arch is {arch!r}")
    for image in code.images:
        for what, named in (("bundle id", image.bundle_id), ("metadata", image.metadata_target)):
            if named and processor_of(named) != image.processor:
                problems.append(
                    f"image {image.processor}: its {what} names {named!r}, its ELF flags "
                    f"{image.processor!r}"
                )
    return problems


def _cuda_problems(info: ArtefactInfo, arch: str) -> list[str]:
    """Why PTX, a cubin or a fatbin does not match ``arch``. Pure; raises ValueError when
    ``arch`` is no CUDA arch."""
    problems: list[str] = []
    want = parse_arch(arch)
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
    return problems


def xxh3_matches(data: bytes, want: str) -> bool:
    """True when ``data`` hashes to ``want``: 16 hex digits for xxh3-64, else xxh3-128."""
    want = want.lower()
    if len(want) == 16:
        return bool(bytes_digest(data) == want)
    return bool(bytes_hash(data) == want)
