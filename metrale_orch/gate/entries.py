"""The kernel entries an artefact exports, the arches it was built for and the PTX ISA
versions it carries, read from its bytes (pure but for :func:`exported_entries`).

An *exported* entry is a kernel a loader can look up by name: a PTX ``.visible .entry``
(not a ``static`` kernel's plain ``.entry``), a cubin's ``STO_CUDA_ENTRY`` function with
a global or weak symbol, the union of both over a fatbin's readable images, and an AMDGPU
code object's kernels (``<name>`` with its ``<name>.kd`` descriptor). The bytes are read
by the smoke area's readers (:func:`~metrale_orch.smoke.artefacts.inspect_artefact`);
this module only looks at what they found from the loader's side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.gate.errors import UnreadableArtefact
from metrale_orch.smoke.amdgpu import processor_of
from metrale_orch.smoke.arch import ArtefactKind, parse_arch
from metrale_orch.smoke.artefacts import ArtefactInfo, inspect_artefact
from metrale_orch.smoke.elf import ElfError, elf_header, elf_sections, elf_symbols
from metrale_orch.smoke.errors import SmokeError

__all__ = ["ArtefactView", "arch_problem", "exported_entries", "mangled_as", "read_artefact"]

_STB_LOCAL = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ArtefactView:
    """What a loader sees of one artefact."""

    kind: ArtefactKind
    #: The arches it was built for, as read (a fatbin's per image: ``sm_90a (elf)``).
    arches: tuple[str, ...]
    #: Entries a loader can look up by name, sorted.
    exports: tuple[str, ...]
    #: The PTX ISA versions of its PTX (the module's ``.version``; a fatbin's PTX images).
    ptx_versions: tuple[str, ...]
    #: False when some image could not be read (a fatbin's compressed images).
    complete: bool
    info: ArtefactInfo = field(compare=False, repr=False)


def read_artefact(data: bytes, shown: str) -> ArtefactView:
    """Read an artefact's bytes (pure). Raises :class:`UnreadableArtefact` naming
    ``shown`` when they are neither PTX, a cubin, a fatbin nor an AMDGPU code object."""
    try:
        info = inspect_artefact(data)
        exports, versions = _exports(info, data)
    except (SmokeError, ElfError) as exc:
        raise UnreadableArtefact(shown, str(exc)) from None
    return ArtefactView(
        kind=info.kind,
        arches=info.arches,
        exports=tuple(sorted(exports)),
        ptx_versions=tuple(sorted(set(versions))),
        complete=info.entries_complete,
        info=info,
    )


def exported_entries(path: Path) -> tuple[str, ...]:
    """The entries the artefact at ``path`` exports, sorted (I/O: reads the file).
    Raises :class:`UnreadableArtefact` for a file that cannot be read or is no artefact."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnreadableArtefact(str(path), f"cannot be read ({exc.strerror or exc})") from None
    return read_artefact(data, str(path)).exports


def _exports(info: ArtefactInfo, data: bytes) -> tuple[set[str], list[str]]:
    """(exported entries, PTX ISA versions) of what :func:`inspect_artefact` read."""
    if info.ptx is not None:
        return set(info.ptx.visible_entries), [info.ptx.version]
    if info.cubin is not None:
        return _bound(data, info.cubin.entry_names), []
    if info.code_object is not None:
        return set(info.code_object.entry_names), []
    exports: set[str] = set()
    versions: list[str] = []
    for image in info.fatbin.entries if info.fatbin is not None else ():
        if image.kind == "ptx":
            versions.append(f"{image.version[0]}.{image.version[1]}")
        if image.elf is not None:
            blob = data[image.offset : image.offset + image.size]
            exports |= _bound(blob, image.elf.entry_names)
        if image.ptx is not None:
            exports.update(image.ptx.visible_entries)
    return exports, versions


def _bound(elf: bytes, kernels: tuple[str, ...]) -> set[str]:
    """The ``kernels`` of a cubin whose symbol a loader can find: not ``STB_LOCAL``."""
    sections = elf_sections(elf, elf_header(elf))
    bound = {s.name for s in elf_symbols(elf, sections) if s.info >> 4 != _STB_LOCAL and s.shndx}
    return set(kernels) & bound


def arch_problem(view: ArtefactView, arch: str) -> str | None:
    """Why the artefact does not run code for the hardware's ``arch``, or None (pure):
    PTX whose ``.target`` is another arch, a cubin for another SM or variant, a fatbin
    with no image for it, a code object with no image for that processor (or target id,
    when ``arch`` names features: ``gfx90a:xnack-``)."""
    info = view.info
    built = ", ".join(view.arches) or "no arch"
    if info.code_object is not None:
        want = processor_of(arch)
        if any(
            i.processor == want and (":" not in arch or i.target_id == arch)
            for i in info.code_object.images
        ):
            return None
        return f"built for {built}, the hardware's arch is {arch}"
    try:
        spec = parse_arch(arch)
    except ValueError:
        return f"the hardware's arch {arch!r} is no CUDA arch, the artefact is {view.kind}"
    if any(sm == spec.sm and variant in (None, spec.variant) for sm, variant in _cuda_arches(info)):
        return None
    return f"built for {built}, the hardware's arch is {arch}"


def _cuda_arches(info: ArtefactInfo) -> list[tuple[int, str | None]]:
    """(SM, variant or None when unknown) of each CUDA image of the artefact."""
    found: list[tuple[int, str | None]] = []
    targets = [info.ptx.target] if info.ptx is not None else []
    if info.cubin is not None:
        found.append((info.cubin.sm, info.cubin.variant))
    for image in info.fatbin.entries if info.fatbin is not None else ():
        if image.elf is not None:
            found.append((image.elf.sm, image.elf.variant))
        elif image.ptx is not None:
            targets.append(image.ptx.target)
        else:
            found.append((image.sm, None))
    for target in targets:
        try:
            spec = parse_arch(target)
        except ValueError:
            continue
        found.append((spec.sm, spec.variant))
    return found


def mangled_as(name: str, exports: tuple[str, ...]) -> str | None:
    """The export that is ``name`` under a C++ (Itanium) mangled name, ``_Z<len><name>…``,
    or None (pure): the kernel was compiled without ``extern "C"``."""
    prefix = f"_Z{len(name)}{name}"
    return next((e for e in exports if e.startswith(prefix)), None)
