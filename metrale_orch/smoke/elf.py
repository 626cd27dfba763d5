"""Pure-Python readers for CUDA device code: cubins (CUDA ELF) and fatbins.

:func:`parse_cubin` reads a 64-bit little-endian ELF with ``e_machine ==
EM_CUDA`` (190) and returns its SM number (from ``e_flags``), the full
``-arch`` it was assembled for when ptxas recorded it, and per kernel its
registers, static shared memory and stack frame (from the ``.nv.info``
attribute records and the ``.nv.shared.<kernel>`` sections).
:func:`parse_fatbin` lists a fatbinary's embedded cubins and PTX; embedded
entries that are not compressed are parsed too.

Layout facts this relies on (measured on nvcc 13.0 output, and on the
documented older format):

- ``e_flags``: ELF ABI version >= 8 (CUDA 12.8+) keeps the SM number in bits
  8..15; older cubins keep it in bits 0..7, with 0x800 marking an ``a`` target.
- ``.note.nv.tkinfo`` holds ptxas's command-line options (``-arch sm_90a -m
  64``): the only place that tells ``sm_121f`` from ``sm_121``. ``.nv.compat``
  attribute 9 is 1 for ``a`` targets.
- Kernels are ``STT_FUNC`` symbols with ``STO_CUDA_ENTRY`` (0x10) in
  ``st_other`` and code in section ``.text.<name>``.
- ``.nv.info`` records: one byte format (1 none, 2 byte, 3 half, 4 sized),
  one byte attribute, then a u16 value or size. ``EIATTR_REGCOUNT`` (0x2f)
  and ``EIATTR_FRAME_SIZE`` (0x11) carry (symbol index, value).
- From sm_90 on, ptxas folds the 1 KiB the driver reserves per block into
  each kernel's ``.nv.shared.<name>`` size when the module references
  ``.nv.reservedSmem*``; :attr:`CubinKernel.shared_bytes` subtracts it so it
  equals what ``ptxas -v`` prints as ``smem``.

Why not pyelftools: its symbol record splits ``st_other`` into a 3-bit ``local``
field, 2 bits of padding and the visibility, so ``STO_CUDA_ENTRY`` (bit 4, the
only mark of a kernel as opposed to a device function) is dropped; the
``.nv.info`` records and the fatbin container are not ELF either, and it costs
~40 ms to import. Errors are :class:`ElfError`, a
:class:`~metrale_orch.smoke.errors.SmokeError`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from metrale_orch.smoke.errors import SmokeError
from metrale_orch.smoke.ptx import PtxError, PtxInfo, parse_ptx

__all__ = [
    "EM_CUDA",
    "FATBIN_MAGIC",
    "CubinInfo",
    "CubinKernel",
    "ElfError",
    "ElfHeader",
    "ElfSection",
    "ElfSymbol",
    "FatbinEntry",
    "FatbinInfo",
    "elf_header",
    "elf_notes",
    "elf_sections",
    "elf_symbols",
    "is_elf",
    "is_fatbin",
    "parse_cubin",
    "parse_fatbin",
]

EM_CUDA = 190
FATBIN_MAGIC = 0xBA55ED50

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_SHT_NOTE = 7
_SHT_NOBITS = 8
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F
_RESERVED_SMEM = 1024

_FATBIN_HDR = struct.Struct("<IHHQ")
_FATBIN_ENTRY = struct.Struct("<HHIQ")
_FATBIN_KIND = {1: "ptx", 2: "elf"}
_FATBIN_COMPRESSED = {0x2000: "lz4", 0x8000: "zstd"}


class ElfError(SmokeError, ValueError):
    """The bytes are not a readable CUDA ELF (or fatbin); the message says what is wrong.

    A ``ValueError`` too, as it was before the smoke errors had one base.
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class CubinKernel:
    """One kernel (entry point) of a cubin."""

    name: str
    #: Registers per thread (``EIATTR_REGCOUNT``), None when not recorded.
    registers: int | None
    #: Static shared memory per block as ``ptxas -v`` counts it (driver reserve excluded).
    shared_bytes: int
    #: Per-thread stack frame (``EIATTR_FRAME_SIZE``), None when not recorded.
    frame_bytes: int | None
    #: Size of the kernel's machine code.
    code_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CubinInfo:
    """What a cubin says about itself. ``kernels`` is sorted by name."""

    #: SM number from ``e_flags`` (90 for sm_90a, 121 for sm_121f).
    sm: int
    #: ``a``, ``f`` or "" when known (from ptxas's options or the ``a`` flag), None when unknown.
    variant: str | None
    abi_version: int
    e_flags: int
    #: ptxas's recorded options (``-arch sm_90a -m 64``), "" when absent.
    ptxas_options: str
    kernels: tuple[CubinKernel, ...]

    @property
    def arch(self) -> str:
        """``sm_<n><variant>``; the variant is left out when unknown."""
        return f"sm_{self.sm}{self.variant or ''}"

    @property
    def entry_names(self) -> tuple[str, ...]:
        """Names of every kernel, sorted."""
        return tuple(k.name for k in self.kernels)


@dataclass(frozen=True, slots=True, kw_only=True)
class FatbinEntry:
    """One embedded image of a fatbinary."""

    kind: str  # "elf", "ptx" or "unknown(<n>)"
    sm: int
    #: (major, minor) of the image format (the PTX ISA version for PTX).
    version: tuple[int, int]
    #: "" when stored plainly, else "lz4", "zstd" or "compressed(0x...)".
    compression: str
    offset: int
    size: int
    #: Parsed image, when it is stored uncompressed and parses.
    elf: CubinInfo | None = None
    ptx: PtxInfo | None = None

    def describe(self) -> str:
        """One line: ``elf sm_90 (5968 bytes)``, ``ptx sm_121 9.0 (zstd, 568 bytes)``."""
        what = self.elf.arch if self.elf else self.ptx.target if self.ptx else f"sm_{self.sm}"
        extra = f" {self.version[0]}.{self.version[1]}" if self.kind == "ptx" else ""
        comp = f"{self.compression}, " if self.compression else ""
        return f"{self.kind} {what}{extra} ({comp}{self.size} bytes)"


@dataclass(frozen=True, slots=True, kw_only=True)
class FatbinInfo:
    """The images of a fatbinary, in file order."""

    entries: tuple[FatbinEntry, ...]

    @property
    def entry_names(self) -> tuple[str, ...]:
        """Kernel names seen in every readable image, sorted and deduplicated."""
        names: set[str] = set()
        for e in self.entries:
            if e.elf is not None:
                names.update(e.elf.entry_names)
            if e.ptx is not None:
                names.update(e.ptx.entry_names)
        return tuple(sorted(names))


def is_elf(data: bytes) -> bool:
    """True when ``data`` starts with the ELF magic."""
    return data[:4] == b"\x7fELF"


def is_fatbin(data: bytes) -> bool:
    """True when ``data`` starts with the fatbinary magic."""
    return len(data) >= 4 and struct.unpack_from("<I", data)[0] == FATBIN_MAGIC


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else len(table)].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class ElfSection:
    """One section header, as much of it as the readers need."""

    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int


def elf_sections(data: bytes, header: ElfHeader) -> list[ElfSection]:
    """The section headers, each with its name; :class:`ElfError` for a truncated table."""
    shoff, shnum, shentsize, shstrndx = (
        header.shoff,
        header.shnum,
        header.shentsize,
        header.shstrndx,
    )
    if shentsize != _SHDR.size:
        raise ElfError(f"unexpected section header size {shentsize}")
    if shoff + shnum * shentsize > len(data):
        raise ElfError("section headers run past the end of the file (truncated?)")
    raw = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    if not 0 <= shstrndx < shnum:
        raise ElfError("no section name table")
    _, _, _, _, str_off, str_size, _, _, _, _ = raw[shstrndx]
    names = data[str_off : str_off + str_size]
    out = []
    for name, typ, _flags, _addr, off, size, link, info, _align, _ent in raw:
        if typ != _SHT_NOBITS and off + size > len(data):
            raise ElfError(f"section {_cstr(names, name)!r} runs past the end of the file")
        out.append(ElfSection(_cstr(names, name), typ, off, size, link, info))
    return out


def _nv_info_records(blob: bytes) -> list[tuple[int, int, bytes | int]]:
    """(format, attribute, payload bytes or value) for each record of a ``.nv.info*`` section."""
    records: list[tuple[int, int, bytes | int]] = []
    i = 0
    while i + 4 <= len(blob):
        fmt, attr, half = struct.unpack_from("<BBH", blob, i)
        if fmt == 4:
            records.append((fmt, attr, blob[i + 4 : i + 4 + half]))
            i += 4 + half
        elif fmt in (1, 2, 3):
            records.append((fmt, attr, half & 0xFF if fmt == 2 else half))
            i += 4
        else:
            break  # unknown format: stop rather than misread the rest
    return records


def _ptxas_arch(options: str) -> str | None:
    words = options.split()
    for i, w in enumerate(words[:-1]):
        if w in ("-arch", "--gpu-name"):
            return words[i + 1]
    for w in words:
        if w.startswith(("-arch=", "--gpu-name=")):
            return w.split("=", 1)[1]
    return None


def elf_notes(blob: bytes) -> list[tuple[str, int, bytes]]:
    """(owner name, type, descriptor) of each record of an ``SHT_NOTE`` section."""
    out = []
    i = 0
    while i + 12 <= len(blob):
        namesz, descsz, typ = struct.unpack_from("<III", blob, i)
        i += 12
        name = blob[i : i + namesz].rstrip(b"\0").decode("utf-8", "replace")
        i += (namesz + 3) & ~3
        out.append((name, typ, blob[i : i + descsz]))
        i += (descsz + 3) & ~3
    return out


class ElfHeader(NamedTuple):
    """What a 64-bit little-endian ELF header tells: the machine, the OS ABI and its
    version, ``e_flags`` and the section table."""

    machine: int
    osabi: int
    abi: int
    flags: int
    shoff: int
    shentsize: int
    shnum: int
    shstrndx: int


class ElfSymbol(NamedTuple):
    """One symbol table entry, as much of it as kernels need."""

    name: str
    info: int
    other: int
    shndx: int
    size: int


def parse_cubin(data: bytes) -> CubinInfo:
    """Read a CUDA ELF. Raises :class:`ElfError` when it is not one (or is truncated)."""
    header = _cuda_header(data)
    sections = elf_sections(data, header)
    sm, flag_variant = _flag_arch(header.abi, header.flags)
    ptxas_options, compat_a = _toolkit_info(data, sections)
    symbols = elf_symbols(data, sections)
    regs, frames = _kernel_attributes(data, sections)
    kernels = _kernels(sections, symbols, regs, frames)
    return CubinInfo(
        sm=sm,
        variant=_variant(sm, flag_variant, ptxas_options, compat_a),
        abi_version=header.abi,
        e_flags=header.flags,
        ptxas_options=ptxas_options,
        kernels=tuple(kernels),
    )


def elf_header(data: bytes) -> ElfHeader:
    """The header of a 64-bit little-endian ELF, any machine; :class:`ElfError` otherwise."""
    if not is_elf(data):
        raise ElfError("not an ELF file (bad magic)")
    if len(data) < _EHDR.size:
        raise ElfError("ELF header truncated")
    (
        ident,
        _etype,
        machine,
        _ver,
        _entry,
        _phoff,
        shoff,
        flags,
        _eh,
        _phe,
        _phn,
        shentsize,
        shnum,
        shstrndx,
    ) = _EHDR.unpack_from(data)
    if ident[4] != 2 or ident[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF")
    return ElfHeader(machine, ident[7], ident[8], flags, shoff, shentsize, shnum, shstrndx)


def _cuda_header(data: bytes) -> ElfHeader:
    """The header of a 64-bit little-endian CUDA ELF; :class:`ElfError` for anything else."""
    header = elf_header(data)
    if header.machine != EM_CUDA:
        raise ElfError(f"ELF machine is {header.machine}, not EM_CUDA ({EM_CUDA}): not a cubin")
    return header


def _flag_arch(abi: int, flags: int) -> tuple[int, str | None]:
    """(SM number, ``"a"`` or None) as ``e_flags`` spells them for the ELF ABI version."""
    if abi >= 8:
        return (flags >> 8) & 0xFF, None
    return flags & 0xFF, "a" if flags & 0x800 else None


def _toolkit_info(data: bytes, sections: list[ElfSection]) -> tuple[str, int | None]:
    """(ptxas's recorded options or "", ``.nv.compat`` attribute 9 or None)."""
    ptxas_options = ""
    compat_a: int | None = None
    for sec in sections:
        blob = data[sec.offset : sec.offset + sec.size]
        if sec.name == ".note.nv.tkinfo" and sec.type == _SHT_NOTE:
            for _name, _typ, desc in elf_notes(blob):
                for piece in desc.split(b"\0"):
                    text = piece.decode("utf-8", "replace").strip()
                    if text.startswith("-") and _ptxas_arch(text):
                        ptxas_options = text
        elif sec.name == ".nv.compat":
            for fmt, attr, value in _nv_info_records(blob):
                if fmt == 2 and attr == 9 and isinstance(value, int):
                    compat_a = value
    return ptxas_options, compat_a


def _variant(
    sm: int, flag_variant: str | None, ptxas_options: str, compat_a: int | None
) -> str | None:
    """The arch suffix: ptxas's recorded ``-arch`` when it names this SM, else the flags'
    ``a``, else ``a`` when ``.nv.compat`` marks one."""
    variant = flag_variant
    recorded = _ptxas_arch(ptxas_options) if ptxas_options else None
    if recorded and recorded.startswith("sm_"):
        digits = recorded[3:].rstrip("abcdefghijklmnopqrstuvwxyz")
        if digits.isdigit() and int(digits) == sm:
            variant = recorded[3 + len(digits) :]
    if variant is None and compat_a == 1:
        variant = "a"
    return variant


def elf_symbols(data: bytes, sections: list[ElfSection]) -> list[ElfSymbol]:
    """The entries of the symbol table (else of the dynamic one; none without either), in
    table order."""
    symtab = next((s for s in sections if s.type == _SHT_SYMTAB), None) or next(
        (s for s in sections if s.type == _SHT_DYNSYM), None
    )
    symbols: list[ElfSymbol] = []
    if symtab is not None and 0 <= symtab.link < len(sections):
        strtab = sections[symtab.link]
        strings = data[strtab.offset : strtab.offset + strtab.size]
        for i in range(symtab.size // _SYM.size):
            name, info, other, shndx, _value, size = _SYM.unpack_from(
                data, symtab.offset + i * _SYM.size
            )
            symbols.append(ElfSymbol(_cstr(strings, name), info, other, shndx, size))
    return symbols


def _kernel_attributes(
    data: bytes, sections: list[ElfSection]
) -> tuple[dict[int, int], dict[int, int]]:
    """(register count, stack frame size) by symbol index, from the ``.nv.info`` records."""
    regs: dict[int, int] = {}
    frames: dict[int, int] = {}
    for sec in sections:
        if sec.name != ".nv.info":
            continue
        for fmt, attr, payload in _nv_info_records(data[sec.offset : sec.offset + sec.size]):
            if fmt == 4 and isinstance(payload, bytes) and len(payload) >= 8:
                sym, value = struct.unpack_from("<II", payload)
                if attr == _EIATTR_REGCOUNT:
                    regs[sym] = value
                elif attr == _EIATTR_FRAME_SIZE:
                    frames[sym] = value
    return regs, frames


def _kernels(
    sections: list[ElfSection],
    symbols: list[ElfSymbol],
    regs: Mapping[int, int],
    frames: Mapping[int, int],
) -> list[CubinKernel]:
    """The kernels among the symbols with their resources, sorted by name."""
    reserved = any(s.name.startswith(".nv.reservedSmem") for s in symbols)
    by_name = {s.name: s for s in sections}
    kernels = []
    for index, symbol in enumerate(symbols):
        if not _is_kernel(symbol, sections):
            continue
        code = sections[symbol.shndx]
        registers = regs.get(index)
        if registers is None and code.info >> 24:
            registers = code.info >> 24
        kernels.append(
            CubinKernel(
                name=symbol.name,
                registers=registers,
                shared_bytes=_static_shared(by_name.get(f".nv.shared.{symbol.name}"), reserved),
                frame_bytes=frames.get(index),
                code_bytes=symbol.size or code.size,
            )
        )
    kernels.sort(key=lambda k: k.name)
    return kernels


def _is_kernel(symbol: ElfSymbol, sections: list[ElfSection]) -> bool:
    """An entry function (``STO_CUDA_ENTRY``) with its code in ``.text.<name>``."""
    if symbol.info & 0xF != _STT_FUNC or not symbol.other & _STO_CUDA_ENTRY:
        return False
    if not 0 < symbol.shndx < len(sections):
        return False
    return sections[symbol.shndx].name == f".text.{symbol.name}"


def _static_shared(shared_sec: ElfSection | None, reserved: bool) -> int:
    """A kernel's static shared memory as ``ptxas -v`` prints it: the size of its
    ``.nv.shared.<name>`` less the 1 KiB the driver reserves, when ptxas folded that in."""
    shared = shared_sec.size if shared_sec is not None else 0
    if reserved and shared >= _RESERVED_SMEM:
        shared -= _RESERVED_SMEM
    return shared


def parse_fatbin(data: bytes) -> FatbinInfo:
    """List the images of one or more concatenated fatbinaries.

    Uncompressed ELF and PTX images are parsed (an image that fails to parse is
    listed without its parse). Raises :class:`ElfError` when ``data`` is not a
    fatbinary or its headers are truncated.
    """
    if not is_fatbin(data):
        raise ElfError("not a fatbinary (bad magic)")
    entries = []
    pos = 0
    while pos + _FATBIN_HDR.size <= len(data) and is_fatbin(data[pos:]):
        _magic, _ver, hsize, fat_size = _FATBIN_HDR.unpack_from(data, pos)
        start, end = pos + hsize, pos + hsize + fat_size
        if end > len(data):
            raise ElfError("fatbinary truncated")
        off = start
        while off + _FATBIN_ENTRY.size <= end:
            kind_n, _ev, ehsize, psize = _FATBIN_ENTRY.unpack_from(data, off)
            if ehsize < 48 or off + ehsize + psize > end:
                raise ElfError(f"fatbinary image header at offset {off} is malformed")
            minor, major, sm = struct.unpack_from("<HHI", data, off + 24)
            eflags = struct.unpack_from("<Q", data, off + 40)[0]
            compression = ""
            for bit, name in _FATBIN_COMPRESSED.items():
                if eflags & bit:
                    compression = name
            payload = data[off + ehsize : off + ehsize + psize]
            kind = _FATBIN_KIND.get(kind_n, f"unknown({kind_n})")
            elf = ptx = None
            if not compression:
                try:
                    if kind == "elf":
                        elf = parse_cubin(payload)
                    elif kind == "ptx":
                        ptx = parse_ptx(payload.rstrip(b"\0").decode("utf-8"))
                except (ElfError, PtxError, UnicodeDecodeError):
                    pass
            entries.append(
                FatbinEntry(
                    kind=kind,
                    sm=sm,
                    version=(major, minor),
                    compression=compression,
                    offset=off + ehsize,
                    size=psize,
                    elf=elf,
                    ptx=ptx,
                )
            )
            off += ehsize + psize
        pos = end
    return FatbinInfo(entries=tuple(entries))
