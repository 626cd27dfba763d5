"""The PTX and CUDA ELF / fatbin readers, on real nvcc output and on hand-made text.

These are the tests of this topic that run in-process; the others are in
``tests/scenarios/smoke/test_ptx_elf.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.smoke.elf import (
    ElfError,
    is_elf,
    parse_cubin,
    parse_fatbin,
)
from metrale_orch.smoke.ptx import PtxError, looks_like_ptx, parse_ptx


def test_ptx_comments_extern_and_options() -> None:
    text = """
    // .entry commented_out(
    /* .visible .entry also_not(
       */
    .version 8.7
    .target sm_100a, debug
    .address_size 64
    .extern .entry declared_elsewhere(.param .u64 p);
    .weak .entry weak_one()
    {
    }
    .visible .entry $odd$name(.param .u32 x) { }
    .entry internal_one ( ) { }
    """
    info = parse_ptx(text)
    assert info.target == "sm_100a"
    assert info.target_options == ("debug",)
    assert info.version == "8.7"
    assert [(e.name, e.linkage) for e in info.entries] == [
        ("$odd$name", "visible"),
        ("internal_one", ""),
        ("weak_one", "weak"),
    ]
    assert info.visible_entries == ("$odd$name",)


def test_ptx_without_target_is_an_error() -> None:
    with pytest.raises(PtxError, match=r"\.target"):
        parse_ptx(".version 9.0\n// .target sm_90\n")
    assert not looks_like_ptx(b"\x7fELF\x00\x00")


def test_not_a_cubin() -> None:
    with pytest.raises(ElfError, match="not an ELF"):
        parse_cubin(b".version 9.0\n.target sm_90\n")
    host = Path("/bin/sh").resolve().read_bytes()[:4096] if Path("/bin/sh").exists() else b""
    if is_elf(host):
        with pytest.raises(ElfError, match="EM_CUDA"):
            parse_cubin(host)


def test_fatbin_garbage() -> None:
    with pytest.raises(ElfError, match="fatbinary"):
        parse_fatbin(b"\x00" * 32)
    header = (0xBA55ED50).to_bytes(4, "little") + b"\x01\x00\x10\x00" + (999).to_bytes(8, "little")
    with pytest.raises(ElfError, match="truncated"):
        parse_fatbin(header + b"\x00" * 10)
