"""Pure-Python reader for AMDGPU code objects: what ``hipcc --genco`` writes.

:func:`parse_code_object` reads a clang offload bundle or a bare AMDGPU ELF and
returns, per device image, the processor it was built for (from ``e_flags``), the
target its metadata note names, the target-id features the flags record and its
kernels. :func:`is_code_object` tells one apart from other artefacts by content.

Layout facts this relies on (measured on Debian's hipcc 5.2.3 / clang 15 output;
LLVM's AMDGPUUsage and ClangOffloadBundler documents):

- ``--genco`` writes an offload bundle: the magic ``__CLANG_OFFLOAD_BUNDLE__``, a
  u64 entry count, then per entry a u64 offset, u64 size, u64 id length and the
  id: ``host-x86_64-unknown-linux`` (empty for ``--genco``) and one
  ``hipv4-amdgcn-amd-amdhsa--<target id>`` per ``--offload-arch``; each device
  entry is an AMDGPU ELF. All little-endian.
- The ELF: 64-bit little-endian, ``e_machine`` EM_AMDGPU (224), ``EI_OSABI`` 64
  (HSA) with ``EI_ABIVERSION`` = code object version - 2. ``e_flags & 0xff`` is
  the processor (``EF_AMDGPU_MACH_*``, :data:`AMDGPU_MACH`); code objects v4 and
  later keep xnack in bits 8-9 and sramecc in bits 10-11 (1 any, 2 off, 3 on).
- The ``NT_AMDGPU_METADATA`` (32) note is MessagePack; its ``amdhsa.target``
  string is the full target (``amdgcn-amd-amdhsa--gfx90a:xnack-``).
- A kernel is a function symbol ``<name>`` with its kernel descriptor, an object
  symbol ``<name>.kd``.

Errors are :class:`~metrale_orch.smoke.elf.ElfError` (a ``SmokeError``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from metrale_orch.smoke.elf import (
    ElfError,
    ElfSection,
    ElfSymbol,
    elf_header,
    elf_notes,
    elf_sections,
    elf_symbols,
    is_elf,
)

__all__ = [
    "AMDGPU_MACH",
    "BUNDLE_MAGIC",
    "EM_AMDGPU",
    "AmdgpuImage",
    "CodeObjectInfo",
    "is_code_object",
    "parse_amdgpu_elf",
    "parse_code_object",
    "processor_of",
]

EM_AMDGPU = 224
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
_ELFOSABI_AMDGPU_HSA = 64
_NT_AMDGPU_METADATA = 32
_SHT_NOTE = 7
_STT_OBJECT = 1
_STT_FUNC = 2
_U64 = struct.Struct("<Q")
_ENTRY = struct.Struct("<QQQ")

#: ``e_flags & 0xff`` -> processor, as LLVM's ``EF_AMDGPU_MACH_AMDGCN_*`` values
#: (0x040 was gfx940 until LLVM 18 retired it; 0x043 was reserved before gfx1150).
AMDGPU_MACH: Mapping[int, str] = MappingProxyType(
    {
        0x020: "gfx600", 0x021: "gfx601", 0x022: "gfx700", 0x023: "gfx701",
        0x024: "gfx702", 0x025: "gfx703", 0x026: "gfx704", 0x028: "gfx801",
        0x029: "gfx802", 0x02A: "gfx803", 0x02B: "gfx810", 0x02C: "gfx900",
        0x02D: "gfx902", 0x02E: "gfx904", 0x02F: "gfx906", 0x030: "gfx908",
        0x031: "gfx909", 0x032: "gfx90c", 0x033: "gfx1010", 0x034: "gfx1011",
        0x035: "gfx1012", 0x036: "gfx1030", 0x037: "gfx1031", 0x038: "gfx1032",
        0x039: "gfx1033", 0x03A: "gfx602", 0x03B: "gfx705", 0x03C: "gfx805",
        0x03D: "gfx1035", 0x03E: "gfx1034", 0x03F: "gfx90a", 0x040: "gfx940",
        0x041: "gfx1100", 0x042: "gfx1013", 0x043: "gfx1150", 0x044: "gfx1103",
        0x045: "gfx1036", 0x046: "gfx1101", 0x047: "gfx1102", 0x048: "gfx1200",
        0x04A: "gfx1151", 0x04C: "gfx942", 0x04E: "gfx1201", 0x04F: "gfx950",
        0x051: "gfx9-generic", 0x052: "gfx10-1-generic", 0x053: "gfx10-3-generic",
        0x054: "gfx11-generic", 0x055: "gfx1152", 0x058: "gfx1153",
        0x059: "gfx12-generic", 0x05F: "gfx9-4-generic",
    }
)  # fmt: skip

#: Target-id feature states of code object v4+ ``e_flags`` (1 = any: not recorded).
_FEATURE_STATES = {2: "-", 3: "+"}


@dataclass(frozen=True, slots=True, kw_only=True)
class AmdgpuImage:
    """One AMDGPU ELF of a code object."""

    #: The bundle entry's id (``hipv4-amdgcn-amd-amdhsa--gfx90a``), "" for a bare ELF.
    bundle_id: str
    #: The processor ``e_flags`` names (``gfx90a``), ``unknown(0x..)`` for a value not in
    #: :data:`AMDGPU_MACH`.
    processor: str
    #: Target-id features ``e_flags`` records as on or off (``sramecc+``, ``xnack-``).
    features: tuple[str, ...]
    #: ``amdhsa.target`` of the metadata note (``amdgcn-amd-amdhsa--gfx90a``), "" if none.
    metadata_target: str
    #: The code object version (``EI_ABIVERSION`` + 2 under the HSA OS ABI), 0 if unknown.
    code_object_version: int
    e_flags: int
    #: Kernel names (a ``<name>`` function with a ``<name>.kd`` descriptor), sorted.
    kernels: tuple[str, ...]

    @property
    def target_id(self) -> str:
        """``gfx90a`` or ``gfx90a:sramecc+:xnack-``, as clang spells a target id."""
        return ":".join((self.processor, *self.features))

    def describe(self) -> str:
        """One line: ``gfx90a (code object v4, bundle hipv4-…--gfx90a): k1, k2``."""
        where = [f"code object v{self.code_object_version}"] if self.code_object_version else []
        if self.bundle_id:
            where.append(f"bundle {self.bundle_id}")
        names = ", ".join(self.kernels) or "(no kernels)"
        return f"{self.target_id} ({', '.join(where)}): {names}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeObjectInfo:
    """The device images of a code object, in file order."""

    images: tuple[AmdgpuImage, ...]
    #: True for an offload bundle, False for a bare ELF.
    bundled: bool

    @property
    def processors(self) -> tuple[str, ...]:
        """The processor of each image, in file order."""
        return tuple(i.processor for i in self.images)

    @property
    def entry_names(self) -> tuple[str, ...]:
        """Kernel names of every image, sorted and deduplicated."""
        return tuple(sorted({k for i in self.images for k in i.kernels}))


def is_code_object(data: bytes) -> bool:
    """True for an offload bundle, or an ELF whose machine is EM_AMDGPU."""
    if data.startswith(BUNDLE_MAGIC):
        return True
    return is_elf(data) and len(data) >= 20 and struct.unpack_from("<H", data, 18)[0] == EM_AMDGPU


def processor_of(target: str) -> str:
    """The processor of a target or target id (pure): ``gfx90a`` for ``gfx90a:xnack-``,
    for ``amdgcn-amd-amdhsa--gfx90a`` and for ``hipv4-amdgcn-amd-amdhsa--gfx90a``."""
    tail = target.rsplit("--", 1)[-1] if "--" in target else target
    return tail.split(":", 1)[0]


def parse_code_object(data: bytes) -> CodeObjectInfo:
    """Read an offload bundle's AMDGPU images, or a bare AMDGPU ELF. Raises
    :class:`ElfError` for anything else, a truncated bundle, or a bundle without an
    AMDGPU image."""
    if not data.startswith(BUNDLE_MAGIC):
        return CodeObjectInfo(images=(parse_amdgpu_elf(data),), bundled=False)
    images = []
    for bundle_id, blob in _bundle_entries(data):
        if "-amdgcn-" not in bundle_id:
            continue  # the host entry (empty for --genco)
        try:
            images.append(parse_amdgpu_elf(blob, bundle_id=bundle_id))
        except ElfError as exc:
            raise ElfError(f"bundle entry {bundle_id!r}: {exc}") from None
    if not images:
        ids = ", ".join(i for i, _ in _bundle_entries(data)) or "none"
        raise ElfError(f"the offload bundle holds no AMDGPU image (entries: {ids})")
    return CodeObjectInfo(images=tuple(images), bundled=True)


def _bundle_entries(data: bytes) -> list[tuple[str, bytes]]:
    """(id, bytes) of each entry of a clang offload bundle, in file order."""
    pos = len(BUNDLE_MAGIC)
    if pos + _U64.size > len(data):
        raise ElfError("offload bundle truncated (no entry count)")
    (count,) = _U64.unpack_from(data, pos)
    pos += _U64.size
    entries = []
    for n in range(count):
        if pos + _ENTRY.size > len(data):
            raise ElfError(f"offload bundle truncated in the header of entry {n}")
        offset, size, id_len = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        if pos + id_len > len(data) or offset + size > len(data):
            raise ElfError(f"offload bundle entry {n} runs past the end of the file")
        bundle_id = data[pos : pos + id_len].decode("utf-8", "replace")
        pos += id_len
        entries.append((bundle_id, data[offset : offset + size]))
    return entries


def parse_amdgpu_elf(data: bytes, *, bundle_id: str = "") -> AmdgpuImage:
    """Read one AMDGPU ELF. Raises :class:`ElfError` when it is not one (or is truncated)."""
    header = elf_header(data)
    if header.machine != EM_AMDGPU:
        raise ElfError(f"ELF machine is {header.machine}, not EM_AMDGPU ({EM_AMDGPU})")
    sections = elf_sections(data, header)
    mach = header.flags & 0xFF
    hsa = header.osabi == _ELFOSABI_AMDGPU_HSA
    version = header.abi + 2 if hsa else 0
    return AmdgpuImage(
        bundle_id=bundle_id,
        processor=AMDGPU_MACH.get(mach, f"unknown(0x{mach:03x})"),
        features=_features(header.flags) if version >= 4 else (),
        metadata_target=_metadata_target(data, sections),
        code_object_version=version,
        e_flags=header.flags,
        kernels=_kernels(elf_symbols(data, sections)),
    )


def _features(flags: int) -> tuple[str, ...]:
    """The target-id features a v4+ ``e_flags`` records as on or off, sorted by name."""
    found = []
    for name, shift in (("sramecc", 10), ("xnack", 8)):
        state = _FEATURE_STATES.get((flags >> shift) & 0x3)
        if state is not None:
            found.append(name + state)
    return tuple(found)


def _metadata_target(data: bytes, sections: list[ElfSection]) -> str:
    """``amdhsa.target`` of the ``NT_AMDGPU_METADATA`` note, or ""."""
    key = b"\xad" + b"amdhsa.target"  # a MessagePack fixstr of 13 bytes
    for sec in sections:
        if sec.type != _SHT_NOTE:
            continue
        for name, typ, desc in elf_notes(data[sec.offset : sec.offset + sec.size]):
            if name != "AMDGPU" or typ != _NT_AMDGPU_METADATA:
                continue
            at = desc.find(key)
            if at >= 0:
                return _msgpack_str(desc, at + len(key))
    return ""


def _msgpack_str(blob: bytes, pos: int) -> str:
    """The MessagePack string at ``pos`` (fixstr, str8 or str16), or "" for anything else."""
    if pos >= len(blob):
        return ""
    tag = blob[pos]
    if 0xA0 <= tag <= 0xBF:
        start, size = pos + 1, tag & 0x1F
    elif tag == 0xD9 and pos + 1 < len(blob):
        start, size = pos + 2, blob[pos + 1]
    elif tag == 0xDA and pos + 2 < len(blob):
        start, size = pos + 3, struct.unpack_from(">H", blob, pos + 1)[0]
    else:
        return ""
    return blob[start : start + size].decode("utf-8", "replace")


def _kernels(symbols: list[ElfSymbol]) -> tuple[str, ...]:
    """Defined functions that have a ``<name>.kd`` kernel descriptor, sorted."""
    descriptors = {
        s.name[: -len(".kd")]
        for s in symbols
        if s.name.endswith(".kd") and s.info & 0xF == _STT_OBJECT and s.shndx
    }
    return tuple(
        sorted({s.name for s in symbols if s.info & 0xF == _STT_FUNC and s.shndx} & descriptors)
    )
