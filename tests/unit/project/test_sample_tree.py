"""The project's own kernel tree (kernels/): it resolves, and it shows every rule of SPEC 1.

The tree is the format's worked example (docs/tree-format.md walks through it) and the
integration fixture of the build and smoke tests, so these tests pin its shape: each rule of
the layout (inherits, redirects, allow-lists, `use`, each kind of shadow, subdirectories,
missing layers, another vendor) appears at least once, the tree stays healthy (no symlink,
no duplicated kernel file, no pointless shadow), and every smoke case names a module and an
`extern "C"` entry point that the targets reading it really have, with matching parameters.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from metrale_orch import defaults as defaults_mod
from metrale_orch.smoke import scan_cases
from metrale_orch.smoke.dtypes import make_inputs
from metrale_orch.tree import (
    HEADER_EXTS,
    Layout,
    ManifestError,
    Role,
    Target,
    Tier,
    discover,
    resolve_all,
    supports_quant,
    symlinks,
    walk,
)
from tests.support import REPO

KERNELS = REPO / "kernels"


@cache
def layouts() -> dict[str, Layout]:
    """Every walked target's layout, keyed ``hw/model/quant`` (asserts they all resolve)."""
    resolved = resolve_all(REPO)
    errors = {str(t): str(r) for t, r in resolved if not isinstance(r, Layout)}
    assert not errors, f"targets that do not resolve: {errors}"
    return {str(t): r for t, r in resolved if isinstance(r, Layout)}


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def kernel_files() -> Iterator[Path]:
    for path in sorted(KERNELS.rglob("*")):
        if path.is_file() and path.suffix.lstrip(".") in ("cu", "metal", *HEADER_EXTS):
            yield path


# --- resolution ---------------------------------------------------------------------------


def test_every_walked_target_resolves() -> None:
    targets = walk(REPO)
    assert len(targets) >= 20
    assert sorted(layouts()) == sorted(str(t) for t in targets)
    hardware = {t.hardware for t in targets}
    assert hardware == {"gb10", "hopper", "b200", "b300", "metal", "strix-hip"}
    assert len({t.model for t in targets}) >= 4


def test_hardware_manifests() -> None:
    """[hardware] name/arch/compute_capability/sm_count agree; [defaults] parse."""
    manifests = sorted(KERNELS.glob("*/HARDWARE.toml"))
    assert manifests, f"no */HARDWARE.toml under {KERNELS}"
    for hw_toml in manifests:
        hw = hw_toml.parent.name
        table = toml(hw_toml)["hardware"]
        assert table["name"] == hw
        assert isinstance(table["sm_count"], int) and table["sm_count"] > 0
        if table.get("vendor", "nvidia") == "nvidia":
            # sm_90a -> "9.0", sm_121f -> "12.1": the digits of the arch, minor last.
            digits = re.fullmatch(r"sm_(\d+)[af]?", table["arch"])
            assert digits is not None, table["arch"]
            major, minor = digits.group(1)[:-1], digits.group(1)[-1]
            assert table["compute_capability"] == f"{major}.{minor}"
        declared = defaults_mod.read_defaults(KERNELS, hw)
        assert declared.sm_count == table["sm_count"]


def test_defaults_tables() -> None:
    # As in every real tree, each [defaults] table spells out all the levers.
    for hw in ("gb10", "hopper", "b200"):
        table = toml(KERNELS / hw / "HARDWARE.toml")["defaults"]
        assert list(table) == [row.name for row in defaults_mod.LEVERS], hw
    gb10 = defaults_mod.read_defaults(KERNELS, "gb10")
    assert gb10 == dataclasses.replace(
        defaults_mod.baseline("gb10"),
        w8a8_prefill_max_m_widening=64,
        w8a8_prefill_max_m_narrowing=384,
    )
    hopper = defaults_mod.read_defaults(KERNELS, "hopper")
    baseline = defaults_mod.baseline("hopper")
    levers = set(toml(KERNELS / "hopper/HARDWARE.toml")["defaults"])
    # Hopper spells out every lever: its table names every field that differs per lever.
    lever_fields = {
        name for name in type(baseline).__dataclass_fields__ if name not in ("hw", "sm_count")
    }
    assert levers == lever_fields
    assert hopper.lm_head_batchm_max == 16
    assert hopper.attn_decode_splitk == "auto"
    assert hopper.fp8_act_quant_hopper is True
    assert "defaults" not in toml(KERNELS / "b300/HARDWARE.toml")
    b300 = defaults_mod.read_defaults(KERNELS, "b300")
    assert b300 == dataclasses.replace(defaults_mod.baseline("b300"), sm_count=148)


# --- each rule of SPEC section 1 appears ------------------------------------------------------


def test_inherits_four_layers() -> None:
    """hopper inherits gb10: own leaf, parent leaf, own common, parent common, all present."""
    lay = layouts()["hopper/qwen3-8b/bf16"]
    assert lay.hardware.inherits == "gb10"
    assert [(layer.role, layer.tier, rel(layer.dir)) for layer in lay.layers] == [
        (Role.LEAF, Tier.OWN, "kernels/hopper/qwen3-8b/bf16"),
        (Role.LEAF, Tier.PARENT, "kernels/gb10/qwen3-8b/bf16"),
        (Role.COMMON, Tier.OWN, "kernels/hopper/common"),
        (Role.COMMON, Tier.PARENT, "kernels/gb10/common"),
    ]
    assert all(layer.dir.is_dir() for layer in lay.layers)


def test_no_inherits_two_layers_and_missing_layers() -> None:
    assert len(layouts()["b300/qwen3-8b/bf16"].layers) == 2
    assert layouts()["gb10/qwen3-8b/bf16"].hardware.inherits is None
    # b200 has no directory of its own but its model dirs: both own layers are missing.
    lay = layouts()["b200/qwen3-8b/bf16"]
    present = [(layer.tier, layer.role) for layer in lay.layers if layer.dir.is_dir()]
    assert present == [(Tier.PARENT, Role.LEAF), (Tier.PARENT, Role.COMMON)]
    assert not (KERNELS / "b200/common").exists()


def test_walk_unites_parent_quants() -> None:
    """hopper/qwen3-8b has bf16/ and fp8/ of its own, and gets gb10's nvfp4/ too."""
    quants = {t.quant for t in walk(REPO) if (t.hardware, t.model) == ("hopper", "qwen3-8b")}
    assert quants == {"bf16", "fp8", "nvfp4"}
    assert not (KERNELS / "hopper/qwen3-8b/nvfp4").exists()
    assert not (KERNELS / "gb10/qwen3-8b/fp8").exists()


def test_redirect() -> None:
    lay = layouts()["gb10/qwen3-4b/bf16"]
    assert lay.source_model == "qwen3-8b"
    assert rel(lay.model_dir) == "kernels/gb10/qwen3-4b"
    assert rel(lay.layers[0].dir) == "kernels/gb10/qwen3-8b/bf16"
    assert not any(p.is_dir() for p in (KERNELS / "gb10/qwen3-4b").iterdir())


def test_parent_leaf_follows_the_parents_redirect() -> None:
    """b200/qwen3-4b does not redirect; gb10/qwen3-4b does, so the parent leaf is qwen3-8b's."""
    assert "kernel_source" not in toml(KERNELS / "b200/qwen3-4b/MODEL.toml")["model"]
    lay = layouts()["b200/qwen3-4b/bf16"]
    assert lay.source_model == "qwen3-4b"
    assert rel(lay.layers[1].dir) == "kernels/gb10/qwen3-8b/bf16"
    assert "qk_norm.cu" in lay.leaf


def test_allow_list() -> None:
    gemma = KERNELS / "gb10/gemma3-4b"
    assert toml(gemma / "MODEL.toml")["model"]["supported_quants"] == ["bf16"]
    assert supports_quant(gemma, "bf16")
    assert not supports_quant(gemma, "nvfp4")
    with pytest.raises(ManifestError, match="nvfp4"):
        discover(REPO, Target.parse("gb10/gemma3-4b/nvfp4"))
    # Without an allow-list, a quant with no directory anywhere resolves to common/ alone.
    fallback = discover(REPO, Target.parse("gb10/llama3-8b/fp8"))
    assert dict(fallback.leaf) == {}
    assert "rmsnorm.cu" in fallback.common


def test_quant_dir_with_only_a_manifest_uses_siblings() -> None:
    quant_dir = KERNELS / "gb10/qwen3-8b/nvfp4"
    assert sorted(p.name for p in quant_dir.iterdir()) == ["KERNEL.toml", "SMOKE.toml"]
    lay = layouts()["gb10/qwen3-8b/nvfp4"]
    assert {name: (e.used, rel(e.source)) for name, e in lay.leaf.items()} == {
        "qk_norm.cu": (True, "kernels/gb10/qwen3-8b/bf16/qk_norm.cu")
    }
    moe = layouts()["gb10/qwen3-30b-a3b/nvfp4"]
    assert all(e.used for e in moe.leaf.values())
    assert rel(moe.leaf["moe_topk.cu"].source) == "kernels/gb10/qwen3-30b-a3b/bf16/moe_topk.cu"


def test_use_across_trees() -> None:
    """b300 (no inherits) and strix-hip bring GB10 files in with `use`."""
    b300 = layouts()["b300/qwen3-8b/bf16"]
    used_common = {n for n, e in b300.common.items() if e.used}
    own_common = {n for n, e in b300.common.items() if not e.used}
    assert {"rmsnorm.cu", "bf16_util.cuh"} <= used_common
    assert own_common == {"gemv_bf16.cu"}  # B300's own divergent source
    assert all(rel(b300.common[n].source).startswith("kernels/gb10/common/") for n in used_common)
    hip = layouts()["strix-hip/llama3-8b/bf16"]
    assert hip.hardware.vendor == "hip" and hip.hardware.source_ext == "cu"
    assert hip.leaf and all(rel(e.source).startswith("kernels/gb10/") for e in hip.leaf.values())
    hopper_fp8 = layouts()["hopper/qwen3-8b/fp8"]
    assert rel(hopper_fp8.leaf["qk_norm.cu"].source) == "kernels/gb10/qwen3-8b/bf16/qk_norm.cu"


def _shadows(target: str) -> set[tuple[Role, str, str, str]]:
    return {(s.role, s.name, rel(s.winner), rel(s.loser)) for s in layouts()[target].shadows}


def test_own_over_parent_shadows() -> None:
    """By file name, in both roles, a header among them; declared in the winner's layer."""
    h, g = "kernels/hopper/", "kernels/gb10/"
    assert _shadows("hopper/qwen3-8b/bf16") == {
        (Role.COMMON, "gemv_bf16.cu", h + "common/gemv_bf16.cu", g + "common/gemv_bf16.cu"),
        (
            Role.COMMON,
            "arch_tuning.cuh",
            h + "common/arch_tuning.cuh",
            g + "common/arch_tuning.cuh",
        ),
        (Role.LEAF, "qk_norm.cu", h + "qwen3-8b/bf16/qk_norm.cu", g + "qwen3-8b/bf16/qk_norm.cu"),
    }
    shadow = toml(KERNELS / "hopper/common/KERNEL.toml")["shadow"]
    assert set(shadow) == {"gemv_bf16", "arch_tuning"}


def test_leaf_over_common_shadow_and_wrapping_source() -> None:
    lay = layouts()["gb10/gemma3-4b/bf16"]
    leaf_rms = KERNELS / "gb10/gemma3-4b/bf16/rmsnorm.cu"
    assert _shadows("gb10/gemma3-4b/bf16") == {
        (Role.LEAF, "rmsnorm.cu", rel(leaf_rms), "kernels/gb10/common/rmsnorm.cu")
    }
    assert dict(lay.modules())["rmsnorm"].source == leaf_rms
    assert "rmsnorm.cu" in lay.common  # both stay in their role maps
    text = leaf_rms.read_text()
    assert '#include "../../common/rmsnorm.cu"' in text
    assert "#define RMSNORM_WEIGHT_OFFSET 1.0f" in text
    # The same win, by the parent leaf layer, in a Hopper target (declared in GB10's leaf).
    hopper = _shadows("hopper/gemma3-4b/bf16")
    assert (Role.LEAF, "rmsnorm.cu", rel(leaf_rms), "kernels/gb10/common/rmsnorm.cu") in hopper


def test_role_subdirectory() -> None:
    lay = layouts()["gb10/llama3-8b/mxfp4"]
    assert {k: rel(v) for k, v in lay.common_subdirs.items()} == {
        "vendor": "kernels/gb10/common/vendor"
    }
    inputs = {rel(p) for p in lay.inputs()}
    assert "kernels/gb10/common/vendor/ocp_mx/mx_types.cuh" in inputs
    assert "kernels/gb10/common/vendor/ocp_mx/README.md" in inputs
    assert "vendor" in layouts()["hopper/qwen3-8b/fp8"].common_subdirs  # parent's, inherited


def test_metal_tree() -> None:
    lay = layouts()["metal/llama3-8b/bf16"]
    assert lay.hardware.vendor == "apple" and lay.hardware.arch == "metal3.1"
    assert {stem: e.name for stem, e in lay.modules()} == {
        "rmsnorm": "rmsnorm.metal",
        "silu_mul": "silu_mul.metal",
    }
    assert "metal_common.h" in lay.common  # a header, never a module


def test_build_flags_and_module_renames() -> None:
    hopper_flags = toml(KERNELS / "hopper/HARDWARE.toml")["build"]["extra_nvcc_flags"]
    assert hopper_flags and all(isinstance(f, str) for f in hopper_flags)
    with_flags = [
        p for p in KERNELS.rglob("KERNEL.toml") if toml(p).get("build", {}).get("extra_nvcc_flags")
    ]
    assert len(with_flags) >= 2
    # Every [modules] rename names a module stem of every target that reads the manifest.
    renames = 0
    for lay in layouts().values():
        stems = {stem for stem, _ in lay.modules()}
        for config in lay.configs():
            for stem in toml(config).get("modules", {}):
                renames += 1
                assert stem in stems, f"{rel(config)}: [modules] {stem} is no module"
    assert renames


# --- the tree stays healthy -------------------------------------------------------------------


def test_no_symlinks() -> None:
    assert symlinks(REPO) == []


def test_no_duplicated_kernel_files() -> None:
    """Same name and same bytes in two directories: share the file with `use` instead."""
    seen: dict[tuple[str, bytes], list[str]] = defaultdict(list)
    for path in kernel_files():
        seen[(path.name, path.read_bytes())].append(rel(path))
    assert [paths for paths in seen.values() if len(paths) > 1] == []


def test_no_pointless_shadow() -> None:
    found = layouts()
    assert found, "the sample tree has targets"
    for target, lay in found.items():
        for s in lay.shadows:
            assert s.winner.read_bytes() != s.loser.read_bytes(), (target, s.name)


def test_entry_points_are_extern_c() -> None:
    """Every CUDA kernel is an extern "C" entry; no static device function (path-hashed)."""
    cuda = [p for p in kernel_files() if p.suffix in (".cu", ".cuh")]
    assert any(p.suffix == ".cu" for p in cuda), f"no .cu file under {KERNELS}"
    for path in cuda:
        text = path.read_text()
        kernels = re.findall(r"(extern \"C\"\s+)?__global__", text)
        assert all(k for k in kernels), f'{rel(path)}: a __global__ without extern "C"'
        assert not re.search(r"\bstatic\b[^;{]*__device__", text), rel(path)
        assert "namespace {" not in text, rel(path)
        if path.suffix == ".cu":
            assert kernels or '#include "../../common/' in text, rel(path)


# --- smoke cases ------------------------------------------------------------------------------

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_ENTRY = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)', re.S)
_POINTER_DTYPES = {
    "bf16_t": {"bf16"},
    "float": {"f32"},
    "int": {"i32"},
    "uint8_t": {"u8", "fp8e4m3"},
}
_SCALAR_DTYPES = {"int": "i32", "float": "f32", "unsigned": "u32", "uint32_t": "u32"}


def _closure_text(source: Path) -> str:
    """The source and its quoted-include closure (resolved from each file's directory)."""
    seen: dict[Path, str] = {}
    todo = [source]
    while todo:
        path = todo.pop().resolve()
        if path in seen or not path.is_file():
            continue
        seen[path] = path.read_text()
        todo.extend(path.parent / inc for inc in _INCLUDE.findall(seen[path]))
    return "\n".join(seen.values())


@cache
def _entries(source: Path) -> dict[str, list[str]]:
    """extern "C" entry name -> its parameter declarations."""
    return {
        name: [p.strip() for p in params.split(",")]
        for name, params in _ENTRY.findall(_closure_text(source))
    }


def _references() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("_tree_smoke_refs", KERNELS / "smoke_refs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def _check_params(where: str, params: list[str], args: tuple[Any, ...]) -> None:
    assert len(params) == len(args), f"{where}: {len(args)} args for {len(params)} params"
    for param, arg in zip(params, args, strict=True):
        words = param.replace("*", " * ").split()
        name, base = words[-1], [w for w in words[:-1] if w not in ("const", "__restrict__", "*")]
        assert name == arg.name, f"{where}: arg {arg.name!r} is parameter {name!r}"
        if "*" in words:
            assert arg.kind != "scalar", f"{where}: {name} is a pointer"
            assert arg.dtype in _POINTER_DTYPES[base[-1]], f"{where}: {name} is {param}"
            assert (arg.kind == "in") == ("const" in words), f"{where}: {name} kind vs const"
        else:
            assert arg.kind == "scalar", f"{where}: {name} is passed by value"
            assert arg.dtype == _SCALAR_DTYPES[base[-1]], f"{where}: {name} is {param}"


def test_smoke_cases_match_modules_entries_and_references() -> None:
    """Each case of each target: module, extern "C" entry, parameters, reference outputs."""
    refs = _references()
    checked = 0
    for target, lay in layouts().items():
        if lay.hardware.source_ext != "cu":
            continue
        modules = dict(lay.modules())
        for case in scan_cases(REPO, lay):
            where = f"{target}: {case.source} case {case.name}"
            entries = _entries(modules[case.module].source)
            assert case.entry in entries, f'{where}: no extern "C" {case.entry}'
            _check_params(where, entries[case.entry], case.args)
            inputs = make_inputs(case)
            want = refs[case.reference](dict(inputs.reference_args))
            outputs = {a.name: a.shape for a in case.args if a.kind in ("out", "inout")}
            assert {k: tuple(v.shape) for k, v in want.items()} == outputs, where
            checked += 1
    assert checked > 50


def _layer_dirs() -> dict[Path, list[Layout]]:
    reach: dict[Path, list[Layout]] = defaultdict(list)
    for lay in layouts().values():
        for layer in lay.layers:
            reach[layer.dir.resolve()].append(lay)
    return reach


def test_every_smoke_file_case_applies_to_every_target_reading_it() -> None:
    """No case is silently dropped: its module is a module of each target that reads it."""
    reach = _layer_dirs()
    files = sorted(KERNELS.glob("*/**/SMOKE.toml"))
    assert len(files) >= 8
    for path in files:
        readers = reach.get(path.parent.resolve(), [])
        assert readers, f"{rel(path)} is in no target's layer directory"
        for case in toml(path)["case"]:
            for lay in readers:
                stems = {stem for stem, _ in lay.modules()}
                assert case["module"] in stems, f"{rel(path)} {case['name']}: {lay.target}"


def test_wrapping_leaf_overrides_the_common_case() -> None:
    cases = {c.name: c for c in scan_cases(REPO, layouts()["hopper/gemma3-4b/bf16"])}
    assert cases["rmsnorm_4x1024"].reference == "rmsnorm_gemma"
    assert "fp8_act_quant_4x512" in cases  # Hopper's own common case
    common = {c.name: c for c in scan_cases(REPO, layouts()["gb10/qwen3-8b/bf16"])}
    assert common["rmsnorm_4x1024"].reference == "rmsnorm"
