"""The PTX and CUDA ELF / fatbin readers, on real nvcc output and on hand-made text.

The tests of this topic that run in-process are in ``tests/unit/smoke/test_ptx_elf.py``.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

import pytest

from metrale_orch.proc import run_process
from metrale_orch.smoke import SmokeError
from metrale_orch.smoke.elf import (
    EM_CUDA,
    ElfError,
    is_elf,
    is_fatbin,
    parse_cubin,
    parse_fatbin,
)
from metrale_orch.smoke.ptx import looks_like_ptx, parse_ptx

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

KERNELS = r"""
__device__ __noinline__ float helper(float v) { return v * 2.0f + 1.0f; }

extern "C" __global__ void scale_add(float* x, float a, int n) {
    __shared__ float tile[128];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x % 128] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) x[i] = helper(tile[(threadIdx.x + 1) % 128]) * a;
}

extern "C" __global__ void copy_dyn(const float* src, float* dst) {
    extern __shared__ float buf[];
    buf[threadIdx.x] = src[threadIdx.x];
    __syncthreads();
    dst[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

template <int N> __global__ void templated(int* p) { p[threadIdx.x] = N; }
template __global__ void templated<3>(int*);
"""

ARCHES = ("sm_90a", "sm_121f")


@dataclass(frozen=True)
class Built:
    ptx: dict[str, bytes]
    cubin: dict[str, bytes]
    #: arch -> ptxas -v text
    ptxas: dict[str, str]
    fatbin_plain: bytes
    fatbin_zstd: bytes


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    d = tmp_path_factory.mktemp("ptx_elf")
    src = d / "k.cu"
    src.write_text(KERNELS)
    ptx, cubin, ptxas = {}, {}, {}
    for arch in ARCHES:
        run_process(
            ["nvcc", "--ptx", f"-arch={arch}", "-O3", str(src), "-o", str(d / f"{arch}.ptx")]
        )
        ptx[arch] = (d / f"{arch}.ptx").read_bytes()
        done = run_process(
            ["nvcc", "--cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v", str(src), "-o",
             str(d / f"{arch}.cubin")]
        )  # fmt: skip
        cubin[arch] = (d / f"{arch}.cubin").read_bytes()
        ptxas[arch] = done.stdout + done.stderr
    gencode = ["-gencode", "arch=compute_90a,code=sm_90a", "-gencode",
               "arch=compute_121f,code=compute_121f"]  # fmt: skip
    for name, extra in (("plain", ["--no-compress"]), ("zstd", [])):
        out = d / f"{name}.fatbin"
        run_process(["nvcc", "--fatbin", *gencode, *extra, "-O3", str(src), "-o", str(out)])
    return Built(
        ptx=ptx,
        cubin=cubin,
        ptxas=ptxas,
        fatbin_plain=(d / "plain.fatbin").read_bytes(),
        fatbin_zstd=(d / "zstd.fatbin").read_bytes(),
    )


def _ptxas_facts(text: str) -> dict[str, tuple[int, int]]:
    """kernel -> (registers, smem bytes) as ptxas -v prints them."""
    facts: dict[str, tuple[int, int]] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            smem = re.search(r"(\d+) bytes smem", line)
            facts[current] = (int(m.group(1)), int(smem.group(1)) if smem else 0)
    return facts


# ------------------------------------------------------------------ PTX


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHES)
def test_ptx_of_nvcc(built: Built, arch: str) -> None:
    info = parse_ptx(built.ptx[arch].decode())
    assert info.target == arch
    assert info.address_size == 64
    assert re.fullmatch(r"\d+\.\d+", info.version)
    # extern "C" kernels by their own name; the template instance mangled; no device function.
    assert {"scale_add", "copy_dyn"} <= set(info.visible_entries)
    assert any(n.startswith("_Z") and "templated" in n for n in info.entry_names)
    assert not any("helper" in n for n in info.entry_names)
    assert looks_like_ptx(built.ptx[arch])


# ------------------------------------------------------------------ cubin


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHES)
def test_cubin_of_nvcc(built: Built, arch: str) -> None:
    data = built.cubin[arch]
    assert is_elf(data)
    assert int.from_bytes(data[18:20], "little") == EM_CUDA
    info = parse_cubin(data)
    assert info.arch == arch
    assert info.sm == int(arch[3:-1])
    assert "scale_add" in info.entry_names and "copy_dyn" in info.entry_names
    assert not any("helper" in n for n in info.entry_names)  # a device function is no kernel
    # Registers and static shared memory agree with what ptxas itself reported.
    facts = _ptxas_facts(built.ptxas[arch])
    assert set(facts) == set(info.entry_names)
    for k in info.kernels:
        assert (k.registers, k.shared_bytes) == facts[k.name], k.name
        assert k.code_bytes > 0


@pytest.mark.nvcc
@needs_nvcc
def test_cubin_variant_comes_from_ptxas_options(built: Built) -> None:
    info = parse_cubin(built.cubin["sm_121f"])
    assert "-arch sm_121f" in info.ptxas_options
    assert info.variant == "f"
    assert parse_cubin(built.cubin["sm_90a"]).variant == "a"


@pytest.mark.nvcc
@needs_nvcc
def test_cubin_truncations_fail_cleanly(built: Built) -> None:
    data = built.cubin["sm_90a"]
    whole = parse_cubin(data)
    # The reader needs the header, the section headers and the sections' data; what lies
    # beyond them (the program headers) it does not read.
    shoff = int.from_bytes(data[0x28:0x30], "little")
    shnum = int.from_bytes(data[0x3C:0x3E], "little")
    needed = shoff + shnum * 64
    errors = 0
    for cut in range(0, len(data), max(1, len(data) // 97)):
        if cut >= needed:
            assert parse_cubin(data[:cut]) == whole, cut
            continue
        with pytest.raises(ElfError) as caught:
            parse_cubin(data[:cut])
        errors += 1
        assert isinstance(caught.value, SmokeError), cut
        if cut < 4:
            assert str(caught.value) == "not an ELF file (bad magic)", cut
        elif cut < 64:
            assert str(caught.value) == "ELF header truncated", cut
        else:
            assert re.fullmatch(
                r"section headers run past the end of the file \(truncated\?\)"
                r"|section '[^']*' runs past the end of the file",
                str(caught.value),
            ), (cut, str(caught.value))
    assert errors > 50


# ------------------------------------------------------------------ fatbin


@pytest.mark.nvcc
@needs_nvcc
def test_fatbin_uncompressed_lists_and_parses_images(built: Built) -> None:
    assert is_fatbin(built.fatbin_plain)
    fat = parse_fatbin(built.fatbin_plain)
    kinds = sorted((e.kind, e.sm) for e in fat.entries)
    assert kinds == [("elf", 90), ("ptx", 121)]
    elf = next(e for e in fat.entries if e.kind == "elf")
    ptx = next(e for e in fat.entries if e.kind == "ptx")
    assert elf.elf is not None and elf.elf.arch == "sm_90a"
    assert ptx.ptx is not None and ptx.ptx.target == "sm_121f"
    assert {"scale_add", "copy_dyn"} <= set(fat.entry_names)
    assert "ptx sm_121f" in ptx.describe()


@pytest.mark.nvcc
@needs_nvcc
def test_fatbin_compressed_images_are_listed(built: Built) -> None:
    fat = parse_fatbin(built.fatbin_zstd)
    assert sorted(e.sm for e in fat.entries) == [90, 121]
    compressed = [e for e in fat.entries if e.compression]
    assert compressed, "nvcc 13 compresses fatbin PTX by default"
    for e in compressed:
        assert e.elf is None and e.ptx is None
        assert e.compression in e.describe()
