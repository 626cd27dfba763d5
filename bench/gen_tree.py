"""Synthetic kernel-tree generator for benchmarks.

Writes a project root (``kernels/`` + a one-line ``dodo.py``) shaped like a
production tree: base hardware trees, overlay trees that inherit them,
models with quant leaves, `use` of shared files, and declared shadows of
both kinds (own over parent, leaf over common). Every target resolves.

    python bench/gen_tree.py OUT [--hardware 4] [--overlays 4] [--models 25]
        [--quants 5] [--files 14] [--use-density 0.2] [--shadow-density 0.2] [--seed 0]

The default is 8 hardware trees x 25 models x 5 quants = 1000 targets, each
reading about 40 inputs.

    python bench/gen_tree.py OUT --profile real [--scale 1.0]

writes instead a tree shaped like the real Metrale tree (see :func:`generate_real`):
gb10 (sm_121f) with the overlays hopper and b200, the standalone b300 `use`-ing gb10
kernels, strix (SCALE) and strix-hip (hipcc) `use`-ing gb10 and strix kernels, a
HIP tree without models, Metal; 60 targets, 224-255 modules per NVIDIA target.
``--scale`` (0-1] shrinks the kernel files per directory. The default profile's
output does not depend on this code: earlier benchmark numbers stay comparable.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

ARCHES = ("sm_90a", "sm_100a", "sm_103a", "sm_121f", "sm_80", "sm_89", "sm_120a", "sm_86")


def _kernel(name: str, tag: str) -> str:
    ident = "".join(c if c.isalnum() else "_" for c in f"{name}_{tag}")
    return (
        f'#include "hdr0.cuh"\n'
        f'extern "C" __global__ void k_{ident}(float* out) {{\n'
        f"    out[threadIdx.x] = {len(ident)}.0f;\n}}\n"
    )


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def generate(
    out: Path,
    *,
    hardware: int = 4,
    overlays: int = 4,
    models: int = 25,
    quants: int = 5,
    files: int = 14,
    use_density: float = 0.2,
    shadow_density: float = 0.2,
    seed: int = 0,
) -> int:
    """Write the tree under ``out``; returns the number of targets it has."""
    rng = random.Random(seed)
    kernels = out / "kernels"
    _write(out / "dodo.py", "from metrale_orch.dodo import *  # noqa: F403\n")
    shared = [f"u{j}.cu" for j in range(max(4, files))]
    for name in shared:
        _write(kernels / "_shared" / name, _kernel(name, "shared"))
        _write(kernels / "_shared" / ("v" + name[1:]), _kernel("v" + name[1:], "shared"))
    _write(kernels / "_shared" / "hdr0.cuh", "#pragma once\n")

    n_common = max(2, files - 2)
    common_names = [f"c{j}.cu" for j in range(n_common)]
    bases = [f"base{i}" for i in range(hardware)]
    for i, hw in enumerate(bases):
        _write(
            kernels / hw / "HARDWARE.toml",
            f'[hardware]\nvendor = "nvidia"\narch = "{ARCHES[i % len(ARCHES)]}"\n',
        )
        common = kernels / hw / "common"
        for name in common_names:
            _write(common / name, _kernel(name, hw))
        _write(common / "hdr0.cuh", f"#pragma once\n// {hw}\n")
        _write(common / "hdr1.cuh", f"#pragma once\n// {hw} 1\n")
        _write(common / "vendor" / "v.h", f"// vendored {hw}\n")
        for m in range(models):
            _model(
                rng,
                kernels / hw / f"model{m}",
                hw,
                quants,
                files,
                common_names,
                shared,
                use_density,
                shadow_density,
                parent=None,
            )

    for i in range(overlays):
        hw = f"ovl{i}"
        parent = bases[i % len(bases)] if bases else None
        if parent is None:
            break
        _write(
            kernels / hw / "HARDWARE.toml",
            f'[hardware]\nvendor = "nvidia"\narch = "{ARCHES[(i + 3) % len(ARCHES)]}"\n'
            f'inherits = "{parent}"\n',
        )
        common = kernels / hw / "common"
        replaced = [n for n in common_names if rng.random() < shadow_density] or common_names[:1]
        for name in replaced:
            _write(common / name, _kernel(name, hw))
        for j in range(max(1, files - len(replaced))):
            _write(common / f"o{j}.cu", _kernel(f"o{j}", hw))
        shadow = "".join(f'c{n[1:-3]} = "tuned for {hw}"\n' for n in replaced)
        _write(common / "KERNEL.toml", f"[shadow]\n{shadow}")
        for m in range(models):
            _model(
                rng,
                kernels / hw / f"model{m}",
                hw,
                quants,
                files,
                common_names,
                shared,
                use_density,
                shadow_density,
                parent=parent,
            )
    return (hardware + (overlays if bases else 0)) * models * quants


def _model(
    rng: random.Random,
    model_dir: Path,
    hw: str,
    quants: int,
    files: int,
    common_names: list[str],
    shared: list[str],
    use_density: float,
    shadow_density: float,
    parent: str | None,
) -> None:
    _write(model_dir / "MODEL.toml", "[model]\n")
    if parent is not None:
        # Overlays own only some quants; the rest come from the parent's leaves.
        own = [q for q in range(quants) if rng.random() < 0.5]
    else:
        own = list(range(quants))
    for q in own:
        leaf = model_dir / f"q{q}"
        names = [f"l{j}.cu" for j in range(max(1, files - 2))]
        shadows: dict[str, str] = {}
        if parent is None:
            # Leaf over common: a leaf source named like a common one.
            for name in common_names:
                if rng.random() < shadow_density / 2:
                    names.append(name)
                    shadows[name[:-3]] = "model-specific variant"
        else:
            # Own over parent: the overlay replaces some of the parent's leaf files.
            for j in range(max(1, files - 2)):
                if rng.random() < shadow_density:
                    shadows[f"l{j}"] = f"retuned for {hw}"
            names = [f"l{j}.cu" for j in range(max(1, files - 2)) if f"l{j}" in shadows]
            names.append(f"x{q}.cu")
        for name in names:
            _write(leaf / name, _kernel(name, f"{hw}_{model_dir.name}_q{q}"))
        header = "leaf.cuh" if parent is None else "overlay.cuh"
        _write(leaf / header, f"#pragma once\n// {hw} {model_dir.name} {q}\n")
        # Base leaves use u*.cu and overlay leaves v*.cu, so an overlay never uses a file
        # its parent leaf already brings in (that would be a self-shadow).
        prefix = "u" if parent is None else "v"
        uses = sorted({prefix + s[1:] for s in shared if rng.random() < use_density})
        lines = []
        if uses:
            lines.append(f"[sources]\nuse = {_toml_list(['../_shared/' + u for u in uses])}\n")
        if shadows:
            lines.append("[shadow]\n" + "".join(f'{k} = "{v}"\n' for k, v in shadows.items()))
        if lines:
            _write(leaf / "KERNEL.toml", "\n".join(lines))


# ------------------------------------------------------------------------- the real profile
#
# Shaped like the upstream Metrale tree (reconstructed 2026-11-30; NOTES.md "The real
# tree"): 8 hardware trees of mixed vendors, 60 targets, 224-255 modules per NVIDIA
# target, 91-96 per strix target, 43 per Metal target, `use`-heavy b300/strix commons,
# overlays inheriting gb10, cross-model includes, all 17 levers in every [defaults]
# table, and the files other tools keep in the tree (which the format must ignore).
# ``scale`` shrinks the kernel files per directory (the smoke test uses a small one);
# the hardware trees, models, quants, manifests and special files stay.

#: The 17 serving levers of SPEC 2.1 with their baselines, in table order.
REAL_LEVERS: tuple[tuple[str, object], ...] = (
    ("lm_head_batchm_max", 8),
    ("ssm_batched_recurrent", False),
    ("gdn_prefill_tc", False),
    ("ssm_ba_gates_hopper", False),
    ("fp8_act_quant_hopper", False),
    ("decode_split_silu", True),
    ("attn_decode_splitk", "legacy"),
    ("ffn_m16_tc", False),
    ("attn_m16_tc", False),
    ("lm_head_m16_tc", False),
    ("attn_ncol_gemv", False),
    ("ffn_gateup_fused", False),
    ("w8a8_prefill_max_m_widening", 4294967295),
    ("w8a8_prefill_max_m_narrowing", 4294967295),
    ("ffn_w4a16_tc_rows_max_m", 0),
    ("ffn_w4a16_bf16_tile", False),
    ("w8a8_gemv_entries", ("mb1_ku8", "mb2", "mb4", "mb8", "mb16")),
)

#: Per hardware: the levers its [defaults] declares differently from the baseline.
_REAL_DEFAULTS: dict[str, dict[str, object]] = {
    "gb10": {
        "attn_decode_splitk": "auto",
        "ffn_m16_tc": True,
        "attn_m16_tc": True,
        "attn_ncol_gemv": True,
        "ffn_gateup_fused": True,
        "w8a8_prefill_max_m_widening": 64,
        "w8a8_prefill_max_m_narrowing": 16,
        "ffn_w4a16_tc_rows_max_m": 32,
        "ffn_w4a16_bf16_tile": True,
        "w8a8_gemv_entries": ("mb1_ku8", "mb2_ku2_o2", "mb4_ku2_o2", "mb8", "mb16"),
    },
    "hopper": {
        "lm_head_batchm_max": 16,
        "ssm_ba_gates_hopper": True,
        "fp8_act_quant_hopper": True,
        "attn_decode_splitk": "4",
        "lm_head_m16_tc": True,
        "w8a8_prefill_max_m_widening": 128,
        "ffn_w4a16_tc_rows_max_m": 64,
    },
    "b200": {
        "lm_head_batchm_max": 12,
        "ssm_batched_recurrent": True,
        "gdn_prefill_tc": True,
        "attn_decode_splitk": "auto",
        "ffn_m16_tc": True,
        "w8a8_gemv_entries": ("mb1_ku2_o4", "mb2", "mb4", "mb8_ku2_o2", "mb16_ku1_o2"),
    },
    "b300": {
        "ssm_batched_recurrent": True,
        "gdn_prefill_tc": True,
        "decode_split_silu": False,
        "attn_decode_splitk": "8",
        "ffn_w4a16_bf16_tile": True,
    },
    "strix": {"decode_split_silu": False, "w8a8_prefill_max_m_narrowing": 8},
    "gfx1201": {"attn_decode_splitk": "off"},
}

#: gb10's common kernels are FAMILIES x VARIANTS (224); overlays and b300/strix pick
#: subsets of them by index (see the pools in :func:`generate_real`).
_FAMILIES = (
    "attn_decode", "attn_prefill", "attn_ncol", "rmsnorm", "layernorm", "rope", "ffn_gateup",
    "ffn_down", "w4a16_gemv", "w4a16_gemm", "w8a8_gemv", "w8a8_gemm", "fp8_gemm", "moe_route",
    "moe_gather", "kquant_dequant", "ssm_scan", "gdn_chunk", "lm_head", "sampling_topk",
    "embed", "fp8_act_quant", "silu_mul", "softmax", "kv_append", "argmax", "conv1d",
    "mtp_draft",
)  # fmt: skip
_VARIANTS = ("m1", "m16", "tc", "splitk", "bf16", "nvfp4", "fp8", "h128")
_STRIX_FAMILIES = ("wmma_gemm", "rdna_attn", "lds_transpose", "dpp_reduce", "gfx11_dequant")
_STRIX_VARIANTS = ("m1", "m16", "q4k", "q8", "bf16", "f16", "w32")
_LEAF_FAMILIES = (
    "fused_qkv", "gate_route", "expert_ffn", "dflash_draft", "mtp_head", "kv_quant",
    "attn_sink", "swa_decode", "yarn_rope", "qk_norm", "router_topk", "shared_expert",
)  # fmt: skip
#: Headers of every CUDA-like common directory; the first four are included by common.cuh.
_HEADERS = ("common.cuh", "ptx.cuh", "reduce.cuh", "tq_signs.cuh")
_FAMILY_HEADERS = ("mma.cuh", "quant.cuh", "fp4.cuh", "fp8.cuh", "tile.cuh", "moe.cuh")

#: (model, quant, leaf-only sources of gb10, of b300): the 12 leaves of each NVIDIA tree.
_NV_LEAVES = (
    ("qwen3.6-27b", "nvfp4", 9, 5),
    ("qwen3.6-27b", "fp8", 3, 2),
    ("qwen3.6-27b", "bf16", 1, 0),
    ("deepseek-v4-flash", "nvfp4", 7, 9),
    ("deepseek-v4-flash", "fp8", 2, 1),
    ("gemma-4-31b", "nvfp4", 5, 4),
    ("gemma-4-31b", "fp8", 0, 1),
    ("gpt-oss-120b", "mxfp4", 8, 6),
    ("gpt-oss-120b", "nvfp4", 4, 2),
    ("qwen3-next-80b", "nvfp4", 6, 3),
    ("qwen3-next-80b", "fp8", 2, 1),
    ("qwen3-next-80b", "w4a16", 3, 2),
)
#: (model, quant, leaf-only sources): the strix (and strix-hip) leaves.
_STRIX_LEAVES = (
    ("qwen3.6-27b", "q4k", 3),
    ("qwen3.6-27b", "q8", 1),
    ("gemma-4-31b", "q4k", 6),
    ("gpt-oss-120b", "mxfp4", 2),
    ("qwen3-next-80b", "q4k", 4),
)
_METAL_LEAVES = (("qwen3.6-27b", "q4k"), ("gemma-4-31b", "q4k"))

#: The cross-model includes (SPEC 3.3.1): (leaf file under kernels/, quoted include).
_Q4K_VENDOR = "../../../gb10/qwen3.6-27b/nvfp4/q4k_vendor"
REAL_CROSS_INCLUDES = (
    ("gb10/deepseek-v4-flash/nvfp4/kquant_moe.cu", f"{_Q4K_VENDOR}/mma.cuh"),
    ("gb10/gemma-4-31b/nvfp4/q4k_gemm.cu", f"{_Q4K_VENDOR}/dequant.cuh"),
    ("b300/deepseek-v4-flash/nvfp4/kquant_moe.cu", f"{_Q4K_VENDOR}/mma.cuh"),
)
_SPECIAL_LEAF_FILES = {
    ("deepseek-v4-flash", "nvfp4"): "kquant_moe",
    ("gemma-4-31b", "nvfp4"): "q4k_gemm",
}

_NV_FLAGS_COMMON = ("--fmad=false", "-DTQ_PLUS_SIGNS")
_NO_BLOCKSCALE = "-DMETRALE_NO_WARP_BLOCKSCALE_MMA"


@dataclass(frozen=True, slots=True, kw_only=True)
class RealTree:
    """What :func:`generate_real` wrote: the targets with the module stems each must
    resolve to (kept by the generator, independently of the resolver), and file counts."""

    targets: dict[str, frozenset[str]]
    #: hardware name -> vendor, for every hardware tree (gfx1201 has no targets).
    vendors: dict[str, str]
    #: file extension (text after the last dot) -> number of files under kernels/.
    files: dict[str, int]
    #: (kernel file, its quoted include) for each include that reaches another model.
    cross_includes: tuple[tuple[str, str], ...] = REAL_CROSS_INCLUDES

    @property
    def total_files(self) -> int:
        return sum(self.files.values())


def _scaled(n: int, scale: float, least: int = 1) -> int:
    if scale >= 1 or n == 0:
        return n
    return max(least, round(n * scale))


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML spelling for {value!r}")


class _RealWriter:
    """Writes files under ``out`` and counts them by extension."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.kernels = out / "kernels"
        self.files: dict[str, int] = {}

    def put(self, rel: str, text: str) -> None:
        """Write ``kernels/<rel>``."""
        _write(self.kernels / rel, text)
        ext = rel.rsplit(".", 1)[-1] if "." in rel.rsplit("/", 1)[-1] else ""
        self.files[ext] = self.files.get(ext, 0) + 1

    def cu(self, rel: str, kernels: list[str], includes: list[str], value: int) -> None:
        """A CUDA source defining ``kernels`` (the first with the full body, the others
        small tails); unique bytes: its own path is its first line."""
        lines = [f"// {rel}", *(f'#include "{inc}"' for inc in includes), ""]
        first, *tails = kernels
        lines += [
            f'extern "C" __global__ void {first}(float* __restrict__ out, '
            "const float* __restrict__ in, int n) {",
            "    const int i = blockIdx.x * blockDim.x + threadIdx.x;",
            "    if (i >= n) {",
            "        return;",
            "    }",
            f"    out[i] = metrale_warp_sum(metrale_fma(in[i], TQ_SIGN * {value}.0f, HDIM_F));",
            "}",
        ]
        for tail in tails:
            lines += [
                "",
                f'extern "C" __global__ void {tail}(float* __restrict__ out, int n) {{',
                "    const int i = blockIdx.x * blockDim.x + threadIdx.x;",
                "    if (i < n) {",
                f"        out[i] = {value}.5f;",
                "    }",
                "}",
            ]
        self.put(rel, "\n".join(lines) + "\n")

    def headers(self, common: str, *, vendored: bool) -> None:
        """The common headers every CUDA-like common source includes (``common``: the
        common directory relative to kernels/); ``vendored``: mma.cuh includes a
        ``vendor/`` subdirectory, as NVIDIA trees do."""
        tag = common.split("/")[0]
        self.put(
            f"{common}/common.cuh",
            f"#pragma once\n// {common}/common.cuh\n#include <stdint.h>\n"
            "#ifndef HDIM\n#define HDIM 64\n#endif\n#define HDIM_F ((float)HDIM)\n"
            '#include "ptx.cuh"\n#include "reduce.cuh"\n#include "tq_signs.cuh"\n',
        )
        self.put(
            f"{common}/ptx.cuh",
            f"#pragma once\n// {common}/ptx.cuh\n"
            "__device__ __forceinline__ float metrale_fma(float a, float b, float c) {\n"
            "    float r;\n"
            '    asm volatile("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));\n'
            "    return r;\n}\n",
        )
        self.put(
            f"{common}/reduce.cuh",
            f"#pragma once\n// {common}/reduce.cuh\n"
            "__device__ __forceinline__ float metrale_warp_sum(float v) {\n"
            "    unsigned int active = __activemask();\n"
            "    for (int o = 16; o > 0; o >>= 1) {\n"
            "        v += __shfl_xor_sync(0xffffffff, v, o);\n"
            "    }\n"
            "    return (active & 1u) ? v : -v;\n}\n",
        )
        self.put(
            f"{common}/tq_signs.cuh",
            f"#pragma once\n// {common}/tq_signs.cuh\n#ifdef TQ_PLUS_SIGNS\n"
            "#define TQ_SIGN 1.0f\n#else\n#define TQ_SIGN -1.0f\n#endif\n",
        )
        mma = f"#pragma once\n// {common}/mma.cuh\n"
        if vendored:
            mma += '#include "vendor/cutlass_mini.cuh"\n'
            self.put(
                f"{common}/vendor/cutlass_mini.cuh",
                f"#pragma once\n// {common}/vendor/cutlass_mini.cuh (vendored for {tag})\n"
                "#define CUTLASS_MINI_VERSION 3\n",
            )
        mma += (
            "#ifndef METRALE_NO_WARP_BLOCKSCALE_MMA\n#define METRALE_BLOCKSCALE_MMA 1\n"
            "#else\n#define METRALE_BLOCKSCALE_MMA 0\n#endif\n"
        )
        self.put(f"{common}/mma.cuh", mma)
        for i, name in enumerate(_FAMILY_HEADERS[1:], start=1):
            macro = name.split(".")[0].upper()
            self.put(
                f"{common}/{name}",
                f"#pragma once\n// {common}/{name}\n#define METRALE_{macro}_TILE {8 * i}\n",
            )

    def kernel_toml(self, rel_dir: str, **tables: str) -> None:
        """``<rel_dir>/KERNEL.toml`` from table bodies (empty ones left out)."""
        parts = [f"[{name}]\n{body}" for name, body in tables.items() if body]
        self.put(f"{rel_dir}/KERNEL.toml", "\n".join(parts))


def _flags_body(key: str, flags: tuple[str, ...] | list[str]) -> str:
    return f"{key} = {_toml_value(tuple(flags))}\n" if flags else ""


def _defaults_body(hw: str) -> str:
    own = _REAL_DEFAULTS.get(hw, {})
    return "".join(f"{name} = {_toml_value(own.get(name, base))}\n" for name, base in REAL_LEVERS)


def _hardware_toml(
    hw: str,
    vendor: str,
    arch: str,
    sm_count: int,
    *,
    inherits: str = "",
    flags: tuple[str, ...] = (),
    defaults: bool = True,
    display_name: str = "",
    memory: tuple[int, int] = (128, 273),
) -> str:
    lines = ["[hardware]"]
    if display_name:
        lines.append(f'name = "{display_name}"')
    lines += [f'vendor = "{vendor}"', f'arch = "{arch}"']
    if inherits:
        lines.append(f'inherits = "{inherits}"')
    lines += [f"sm_count = {sm_count}", f"memory_gib = {memory[0]}"]
    lines += [f"bandwidth_gbps = {memory[1]}", ""]
    if flags:
        key = "extra_metal_flags" if vendor in ("apple", "metal") else "extra_nvcc_flags"
        lines += ["[build]", _flags_body(key, flags)]
    if defaults:
        lines += ["[defaults]", _defaults_body(hw)]
    lines += [
        "[tensor_core_policy]",
        f'mma = "{"wmma.gfx11" if vendor in ("amd", "hip") else "mma.sync.m16n8k16"}"',
        f"block_scale = {'false' if _NO_BLOCKSCALE in flags else 'true'}",
        "",
    ]
    return "\n".join(lines)


def _model_toml(model: str, quants: list[str] | None) -> str:
    head = "[model]\n"
    if quants is not None:
        head += f"supported_quants = {_toml_value(tuple(quants))}\n"
    family = model.split("-")[0].replace(".", "_")
    return (
        f"{head}\n[sampling.default]\ntemperature = 0.7\ntop_p = 0.95\n\n"
        "[sampling.greedy]\ntemperature = 0.0\n\n"
        f"[behavior]\nthinking = {'true' if 'qwen' in model else 'false'}\n"
        "max_context = 262144\n\n"
        f'[[model_types]]\nname = "{family}"\narch = "{family.title()}ForCausalLM"\n\n'
        f'[[model_types]]\nname = "{family}_mtp"\narch = "{family.title()}MTP"\n\n'
        "[dflash]\ndraft_layers = 2\n\n"
        '[expected_absent]\nkernels = ["attn_sink_prefill"]\n'
    )


def _accuracy_toml(leaf: str) -> str:
    return f"# {leaf}\n[tolerance]\natol = 1e-3\nrtol = 1e-2\n"


def _bench_toml(leaf: str) -> str:
    return f"# {leaf}\n[shapes]\nbatch = [1, 8, 32]\ncontext = [4096, 32768]\n"


def _leaf_only(count: int, special: str | None) -> list[str]:
    names = [f"{_LEAF_FAMILIES[k % 12]}_v{k // 12}" for k in range(count)]
    if special and names:
        names[0] = special
    return names


def generate_real(out: Path, *, scale: float = 1.0) -> RealTree:
    """Write a tree shaped like the real Metrale tree under ``out`` (``kernels/`` and
    the one-line ``dodo.py``); returns what it wrote. ``0 < scale <= 1`` shrinks the
    kernel files per directory."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    w = _RealWriter(out)
    _write(out / "dodo.py", "from metrale_orch.dodo import *  # noqa: F403\n")
    targets: dict[str, frozenset[str]] = {}

    n_fam = _scaled(len(_FAMILIES), scale, 4)
    n_var = _scaled(len(_VARIANTS), scale, 4)
    common = [f"{f}_{v}" for f in _FAMILIES[:n_fam] for v in _VARIANTS[:n_var]]
    family_of = {f"{f}_{v}": i for i, f in enumerate(_FAMILIES[:n_fam]) for v in _VARIANTS[:n_var]}
    # Pools by index, pairwise disjoint: leaf shadows, overlay replacements, renames.
    shadow_pool = [c for i, c in enumerate(common) if i % 5 == 2]
    replace_pool = [c for i, c in enumerate(common) if i % 5 == 4]
    renamed = {common[3]: common[3] + "_kernel", common[5]: common[5] + "_kernel"}
    has_tail = {c for i, c in enumerate(common) if i % 7 == 0}
    b300_used = [c for i, c in enumerate(common) if i % 9 in (0, 2, 4, 6)]
    strix_used = [c for i, c in enumerate(common) if i % 4 == 1]

    def nv_source(rel: str, stem: str, value: int, *, tail: bool) -> None:
        header = _FAMILY_HEADERS[family_of.get(stem, value) % len(_FAMILY_HEADERS)]
        w.cu(rel, [stem, *([stem + "_tail"] if tail else [])], ["common.cuh", header], value)

    def common_extras(rel_dir: str, stems: list[str]) -> None:
        w.put(
            f"{rel_dir}/FUSIONS.toml",
            f'# {rel_dir}\n[[fusion]]\nname = "norm_rope"\nkernels = {_toml_value(stems[:2])}\n',
        )
        w.put(
            f"{rel_dir}/KERNEL_FAMILIES.toml",
            f"# {rel_dir}\n"
            + "".join(
                f"[families.{f}]\nvariants = {_toml_value(_VARIANTS[:n_var])}\n"
                for f in _FAMILIES[:3]
            ),
        )

    def shadow_tables(stems: list[str], reason: str, dropped: dict[str, str]) -> dict[str, str]:
        return {
            "shadow": "".join(f'{s} = "{reason}"\n' for s in stems),
            "shadow_exempt": "".join(
                f'{renamed.get(s, s)} = ["{k}"]\n' for s, k in sorted(dropped.items())
            ),
        }

    def nv_leaves(
        hw: str, leaf_only_of: list[int], shadow_offset: int
    ) -> dict[tuple[str, str], tuple[list[str], list[str]]]:
        """The leaves of gb10 or b300: leaf-only sources, 1-2 leaf-over-common shadows,
        a header, KERNEL.toml, ACCURACY.toml, BENCH.toml; returns each leaf's
        (leaf-only stems, shadowing stems)."""
        stems_of: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        for j, ((model, quant, *_), count) in enumerate(zip(_NV_LEAVES, leaf_only_of, strict=True)):
            leaf = f"{hw}/{model}/{quant}"
            only = _leaf_only(_scaled(count, scale), _SPECIAL_LEAF_FILES.get((model, quant)))
            shadows = [shadow_pool[(2 * j + shadow_offset) % len(shadow_pool)]]
            if j % 2 == 0 and hw == "gb10":
                shadows.append(shadow_pool[(2 * j + 1 + shadow_offset) % len(shadow_pool)])
            for k, stem in enumerate(only):
                includes = ["../../common/common.cuh", "model.cuh"]
                cross = [inc for f, inc in REAL_CROSS_INCLUDES if f == f"{leaf}/{stem}.cu"]
                if (model, quant) == ("qwen3.6-27b", "nvfp4") and hw == "gb10" and k == 0:
                    includes.append("q4k_vendor/dequant.cuh")
                w.cu(f"{leaf}/{stem}.cu", [stem], includes + cross, 300 + k)
            for k, stem in enumerate(shadows):
                w.cu(f"{leaf}/{stem}.cu", [stem], ["../../common/common.cuh", "model.cuh"], 400 + k)
            w.put(
                f"{leaf}/model.cuh",
                f"#pragma once\n// {leaf}/model.cuh\n#define MODEL_SCALE {j}.0f\n",
            )
            flags = ["--fmad=false", *(["-DHDIM=128"] if j % 3 != 2 else [])]
            dropped = {s: s + "_tail" for s in shadows if s in has_tail}
            w.kernel_toml(
                leaf,
                build=_flags_body("extra_nvcc_flags", flags),
                **shadow_tables(shadows, f"{model} {quant} tile shape", dropped),
            )
            w.put(f"{leaf}/ACCURACY.toml", _accuracy_toml(leaf))
            w.put(f"{leaf}/BENCH.toml", _bench_toml(leaf))
            stems_of[(model, quant)] = (only, shadows)
        return stems_of

    def models(hw: str, allow_list: bool) -> None:
        quants: dict[str, list[str]] = {}
        for model, quant, *_ in _NV_LEAVES:
            quants.setdefault(model, []).append(quant)
        for model, qs in quants.items():
            w.put(f"{hw}/{model}/MODEL.toml", _model_toml(model, qs if allow_list else None))

    # gb10: the base NVIDIA tree.
    w.put("gb10/HARDWARE.toml", _hardware_toml("gb10", "nvidia", "sm_121f", 48))
    w.headers("gb10/common", vendored=True)
    for i, stem in enumerate(common):
        nv_source(f"gb10/common/{stem}.cu", stem, i, tail=stem in has_tail)
    w.kernel_toml(
        "gb10/common",
        build=_flags_body("extra_nvcc_flags", _NV_FLAGS_COMMON),
        modules="".join(f'{s} = "{n}"\n' for s, n in renamed.items()),
    )
    common_extras("gb10/common", common)
    gb10_leaves = nv_leaves("gb10", [leaf[2] for leaf in _NV_LEAVES], 0)
    q4k = "gb10/qwen3.6-27b/nvfp4/q4k_vendor"
    w.put(f"{q4k}/tables.cuh", f"#pragma once\n// {q4k}/tables.cuh\n#define Q4K_TABLE_N 16\n")
    w.put(
        f"{q4k}/mma.cuh",
        f'#pragma once\n// {q4k}/mma.cuh\n#include "tables.cuh"\n'
        "#define Q4K_MMA_K (Q4K_TABLE_N * 2)\n",
    )
    w.put(
        f"{q4k}/dequant.cuh",
        f'#pragma once\n// {q4k}/dequant.cuh\n#include "tables.cuh"\n'
        "#define Q4K_DEQUANT_SHIFT (Q4K_TABLE_N / 4)\n",
    )
    models("gb10", allow_list=True)
    for (model, quant), (only, shadows) in gb10_leaves.items():
        targets[f"gb10/{model}/{quant}"] = frozenset([*common, *only, *shadows])

    # hopper and b200: overlays inheriting gb10; their commons replace some gb10 kernels
    # by file name and add arch-specific ones; some leaves replace a parent leaf file.
    n_hopper, n_b200 = _scaled(10, scale), _scaled(8, scale)
    # (hw, arch, SMs, (GiB, GB/s), new kernels' prefix and count, replaced kernels, and
    # which gb10 leaves get an own leaf replacing one file: index % every == offset).
    overlays = (
        ("hopper", "sm_90a", 132, (80, 3350), "wgmma", 14, replace_pool[:n_hopper], 3, 0),
        ("b200", "sm_100a", 148, (180, 8000), "tcgen05", 21, replace_pool[-n_b200:], 4, 1),
    )
    for hw, arch, sms, memory, prefix, n_new, replaced, every, offset in overlays:
        hardware = _hardware_toml(
            hw, "nvidia", arch, sms, inherits="gb10", flags=(_NO_BLOCKSCALE,), memory=memory
        )
        w.put(f"{hw}/HARDWARE.toml", hardware)
        new = [f"{prefix}_gemm_{k}" for k in range(_scaled(n_new, scale))]
        for k, stem in enumerate(replaced):
            nv_source(f"{hw}/common/{stem}.cu", stem, 500 + k, tail=stem in has_tail)
        for k, stem in enumerate(new):
            nv_source(f"{hw}/common/{stem}.cu", stem, 600 + k, tail=False)
        w.kernel_toml(
            f"{hw}/common",
            build=_flags_body("extra_nvcc_flags", ("--fmad=false",)),
            shadow="".join(f'{s} = "retuned for {arch}"\n' for s in replaced),
        )
        common_extras(f"{hw}/common", new or replaced)
        models(hw, allow_list=False)
        for j, ((model, quant), (only, shadows)) in enumerate(gb10_leaves.items()):
            mine = [s for s in only if s not in _SPECIAL_LEAF_FILES.values()]
            if j % every == offset and mine:
                leaf = f"{hw}/{model}/{quant}"
                includes = ["../../common/common.cuh", "model.cuh"]
                w.cu(f"{leaf}/{mine[-1]}.cu", [mine[-1]], includes, 700 + j)
                w.kernel_toml(leaf, shadow=f'{mine[-1]} = "retuned for {arch}"\n')
                w.put(f"{leaf}/ACCURACY.toml", _accuracy_toml(leaf))
            targets[f"{hw}/{model}/{quant}"] = frozenset([*common, *new, *only, *shadows])

    # b300: stands alone; its common has its own version of most gb10 kernels and
    # `use`s about 100 others from gb10.
    w.put(
        "b300/HARDWARE.toml",
        _hardware_toml(
            "b300", "nvidia", "sm_103a", 148, flags=(_NO_BLOCKSCALE,), memory=(288, 8000)
        ),
    )
    w.headers("b300/common", vendored=True)
    used = set(b300_used)
    b300_own = [c for c in common if c not in used]
    b300_new = [f"tcgen05_b300_{k}" for k in range(_scaled(6, scale))]
    for i, stem in enumerate(b300_own):
        nv_source(f"b300/common/{stem}.cu", stem, 800 + i, tail=stem in has_tail)
    for k, stem in enumerate(b300_new):
        nv_source(f"b300/common/{stem}.cu", stem, 900 + k, tail=False)
    w.kernel_toml(
        "b300/common",
        sources=f"use = {_toml_value(tuple(f'../gb10/common/{s}.cu' for s in b300_used))}\n",
        build=_flags_body("extra_nvcc_flags", _NV_FLAGS_COMMON),
    )
    common_extras("b300/common", b300_own)
    b300_leaves = nv_leaves("b300", [leaf[3] for leaf in _NV_LEAVES], 7)
    models("b300", allow_list=True)
    for (model, quant), (only, shadows) in b300_leaves.items():
        targets[f"b300/{model}/{quant}"] = frozenset([*common, *b300_new, *only, *shadows])

    # strix (vendor amd: SCALE) and strix-hip (vendor hip, the same sources through
    # hipcc): strix's common `use`s gb10 kernels; strix-hip `use`s all of strix's.
    strix_own = [f"{f}_{v}" for f in _STRIX_FAMILIES for v in _STRIX_VARIANTS][
        : _scaled(34, scale, 2)
    ]
    w.put(
        "strix/HARDWARE.toml",
        _hardware_toml("strix", "amd", "gfx1151", 40, memory=(128, 256)),
    )
    w.headers("strix/common", vendored=False)
    for i, stem in enumerate(strix_own):
        w.cu(
            f"strix/common/{stem}.cu",
            [stem, *([stem + "_tail"] if i % 7 == 0 else [])],
            ["common.cuh", _FAMILY_HEADERS[i % len(_FAMILY_HEADERS)]],
            1000 + i,
        )
    w.kernel_toml(
        "strix/common",
        sources=f"use = {_toml_value(tuple(f'../gb10/common/{s}.cu' for s in strix_used))}\n",
        build=_flags_body("extra_nvcc_flags", _NV_FLAGS_COMMON),
    )
    common_extras("strix/common", strix_own)
    strix_headers = [*_HEADERS, *_FAMILY_HEADERS]
    w.put(
        "strix-hip/HARDWARE.toml",
        _hardware_toml(
            "strix-hip", "hip", "gfx1151", 40, defaults=False, display_name="strix",
            memory=(128, 256),
        ),
    )  # fmt: skip
    hip_uses = [
        *(f"../strix/common/{s}.cu" for s in strix_own),
        *(f"../strix/common/{h}" for h in strix_headers),
        *(f"../gb10/common/{s}.cu" for s in strix_used),
    ]
    w.kernel_toml(
        "strix-hip/common",
        sources=f"use = {_toml_value(tuple(hip_uses))}\n",
        build=_flags_body("extra_nvcc_flags", ("--fmad=false",)),
    )
    common_extras("strix-hip/common", strix_own)
    strix_models: dict[str, list[str]] = {}
    for j, (model, quant, count) in enumerate(_STRIX_LEAVES):
        strix_models.setdefault(model, []).append(quant)
        leaf = f"strix/{model}/{quant}"
        only = [f"{stem}_rdna" for stem in _leaf_only(_scaled(count, scale), None)]
        shadow = strix_own[(3 * j + 1) % len(strix_own)]
        for k, stem in enumerate([*only, shadow]):
            w.cu(f"{leaf}/{stem}.cu", [stem], ["../../common/common.cuh", "model.cuh"], 1100 + k)
        w.put(
            f"{leaf}/model.cuh", f"#pragma once\n// {leaf}/model.cuh\n#define MODEL_SCALE {j}.0f\n"
        )
        flags = ["--fmad=false", *(["-DHDIM=128"] if j % 2 == 0 else []), "-ffp-contract=off"]
        dropped = {shadow: shadow + "_tail"} if strix_own.index(shadow) % 7 == 0 else {}
        w.kernel_toml(
            leaf,
            build=_flags_body("extra_nvcc_flags", flags),
            **shadow_tables([shadow], "RDNA 3.5 wave32 variant", dropped),
        )
        w.put(f"{leaf}/ACCURACY.toml", _accuracy_toml(leaf))
        w.put(f"{leaf}/BENCH.toml", _bench_toml(leaf))
        hip_leaf = f"strix-hip/{model}/{quant}"
        uses = [f"../{leaf}/{stem}.cu" for stem in [*only, shadow]] + [f"../{leaf}/model.cuh"]
        w.kernel_toml(
            hip_leaf,
            sources=f"use = {_toml_value(tuple(uses))}\n",
            build=_flags_body("extra_nvcc_flags", flags),
            **shadow_tables([shadow], "RDNA 3.5 wave32 variant", dropped),
        )
        module_set = frozenset(strix_own) | frozenset(strix_used) | frozenset([*only, shadow])
        targets[f"strix/{model}/{quant}"] = module_set
        targets[f"strix-hip/{model}/{quant}"] = module_set
    for model, quants in strix_models.items():
        w.put(f"strix/{model}/MODEL.toml", _model_toml(model, quants))
        w.put(f"strix-hip/{model}/MODEL.toml", _model_toml(model, None))

    # gfx1201: a HIP tree with a common directory and no models (no targets).
    w.put(
        "gfx1201/HARDWARE.toml",
        _hardware_toml("gfx1201", "hip", "gfx1201", 64, memory=(16, 640)),
    )
    w.headers("gfx1201/common", vendored=False)
    for k, stem in enumerate(("wmma_gemm_probe", "dpp_reduce_probe")):
        w.cu(f"gfx1201/common/{stem}.cu", [stem], ["common.cuh", "mma.cuh"], 1200 + k)
    w.kernel_toml("gfx1201/common", build=_flags_body("extra_nvcc_flags", ("--fmad=false",)))

    # metal: Apple, its own .metal kernels, no [defaults] table.
    w.put(
        "metal/HARDWARE.toml",
        _hardware_toml("metal", "apple", "metal3.1", 40, defaults=False, memory=(128, 546)),
    )
    metal_common = [
        f"{f}_{v}" for f in _FAMILIES[:7] for v in ("f16", "bf16", "q4k", "q8", "f32", "simd")
    ][: _scaled(41, scale, 2)]
    w.put(
        "metal/common/metal_common.h",
        "#pragma once\n// metal/common/metal_common.h\n"
        "inline float metrale_scale(float x) { return x * 0.5f; }\n",
    )
    w.put(
        "metal/common/metal_quant.h",
        "#pragma once\n// metal/common/metal_quant.h\n#define Q4K_BLOCK 32\n",
    )
    for i, stem in enumerate(metal_common):
        w.put(
            f"metal/common/{stem}.metal",
            _metal_source(f"metal/common/{stem}.metal", stem, "metal_common.h", i),
        )
    w.kernel_toml("metal/common", build=_flags_body("extra_metal_flags", ("-fno-fast-math",)))
    for model, quant in _METAL_LEAVES:
        w.put(f"metal/{model}/MODEL.toml", _model_toml(model, [quant]))
        leaf = f"metal/{model}/{quant}"
        only = [f"simdgroup_{kind}" for kind in ("matmul", "reduce")]
        for k, stem in enumerate(only):
            w.put(
                f"{leaf}/{stem}.metal",
                _metal_source(f"{leaf}/{stem}.metal", stem, "../../common/metal_common.h", 50 + k),
            )
        w.put(f"{leaf}/ACCURACY.toml", _accuracy_toml(leaf))
        targets[f"metal/{model}/{quant}"] = frozenset(metal_common) | frozenset(only)

    _project_files(w, sorted(targets))
    vendors = {
        "gb10": "nvidia", "hopper": "nvidia", "b200": "nvidia", "b300": "nvidia",
        "strix": "amd", "strix-hip": "hip", "gfx1201": "hip", "metal": "apple",
    }  # fmt: skip
    return RealTree(
        targets=dict(sorted(targets.items())),
        vendors=vendors,
        files=dict(sorted(w.files.items())),
    )


def _metal_source(rel: str, stem: str, header: str, value: int) -> str:
    return (
        f'// {rel}\n#include <metal_stdlib>\n#include "{header}"\nusing namespace metal;\n\n'
        f"kernel void {stem}(device float* out [[buffer(0)]],\n"
        "                device const float* in [[buffer(1)]],\n"
        "                uint i [[thread_position_in_grid]]) {\n"
        f"    out[i] = metrale_scale(in[i]) * {value}.0f;\n}}\n"
    )


def _project_files(w: _RealWriter, targets: list[str]) -> None:
    """Files other tools keep under kernels/ (not hardware trees, not manifests)."""
    devices = "".join(
        f'[[device]]\nhardware = "{hw}"\nrunner = ["self-hosted", "{hw}"]\n\n'
        for hw in ("gb10", "hopper", "b200", "b300", "strix", "metal")
    )
    w.put("DEVICES.toml", devices)
    w.put(
        "ASM_RATCHET.toml",
        "".join(f'[ratchet."{t}"]\nmax_registers = 128\nmax_spills = 0\n\n' for t in targets[:12]),
    )
    w.put("circuits/README.md", "# Circuits\nServing graphs; not a hardware tree.\n")
    for rel, text in (
        ("decode/CIRCUIT.toml", '[circuit]\nname = "decode"\nstages = ["attn", "ffn"]\n'),
        ("decode/stages/attn.toml", '[stage]\nkernels = ["attn_decode_m1", "rope_m1"]\n'),
        ("decode/stages/ffn.toml", '[stage]\nkernels = ["ffn_gateup_m1", "ffn_down_m1"]\n'),
        ("prefill/CIRCUIT.toml", '[circuit]\nname = "prefill"\nstages = ["moe"]\n'),
        ("prefill/stages/moe.toml", '[stage]\nkernels = ["moe_route_m16", "moe_gather_m16"]\n'),
        ("spec/CIRCUIT.toml", '[circuit]\nname = "speculative"\ndraft = "mtp_draft_m1"\n'),
    ):
        w.put(f"circuits/{rel}", text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--profile", choices=("synthetic", "real"), default="synthetic")
    ap.add_argument("--scale", type=float, default=1.0, help="real profile: files per directory")
    ap.add_argument("--hardware", type=int, default=4)
    ap.add_argument("--overlays", type=int, default=4)
    ap.add_argument("--models", type=int, default=25)
    ap.add_argument("--quants", type=int, default=5)
    ap.add_argument("--files", type=int, default=14)
    ap.add_argument("--use-density", type=float, default=0.2)
    ap.add_argument("--shadow-density", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.profile == "real":
        tree = generate_real(a.out, scale=a.scale)
        toml = tree.files.get("toml", 0)
        print(
            f"{a.out}: {len(tree.targets)} targets, {tree.total_files} files under kernels/ "
            f"({toml} TOML)"
        )
        return
    n = generate(
        a.out,
        hardware=a.hardware,
        overlays=a.overlays,
        models=a.models,
        quants=a.quants,
        files=a.files,
        use_density=a.use_density,
        shadow_density=a.shadow_density,
        seed=a.seed,
    )
    print(f"{a.out}: {n} targets")


if __name__ == "__main__":
    main()
