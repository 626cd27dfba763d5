"""Smoke tests (SPEC 3.5): conversions, cases, static checks on real nvcc output, reports.

The numeric path runs for real only on a CUDA device (``gpu`` tests); here it
is exercised with an injected device probe and a NumPy launcher.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from metrale_orch import smoke
from metrale_orch.config import load_config
from metrale_orch.proc import run_process
from metrale_orch.smoke import (
    DeviceInfo,
    DeviceStatus,
    SmokeCase,
    SmokeCaseError,
    arch_runnable,
    merge_cases,
    parse_smoke_doc,
    probe_device,
    run_smoke,
    scan_cases,
)
from metrale_orch.smoke import dtypes as smoke_dtypes
from metrale_orch.smoke.dtypes import (
    bf16_decode,
    bf16_encode,
    fp8e4m3_decode,
    fp8e4m3_encode,
    make_inputs,
)
from metrale_orch.tasks.smoke import run_smoke_action, smoke_tasks
from metrale_orch.tree import Target, discover
from tests.support import REPO
from tests.support.project import DODO, doit, project_env

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

# ------------------------------------------------------------------ arches


@pytest.mark.parametrize(
    ("arch", "kind", "cc", "runs"),
    [
        ("sm_90a", "ptx", (9, 0), True),
        ("sm_90a", "cubin", (9, 0), True),
        ("sm_90a", "ptx", (10, 0), False),  # a: exactly its cc, even as PTX
        ("sm_90a", "cubin", (12, 1), False),
        ("sm_100f", "cubin", (10, 3), True),  # f: the family, minor >= its own
        ("sm_100f", "ptx", (10, 0), True),
        ("sm_100f", "cubin", (12, 0), False),
        ("sm_121f", "cubin", (12, 1), True),
        ("sm_121f", "ptx", (12, 0), False),
        ("sm_80", "ptx", (12, 1), True),  # plain PTX: JIT forward
        ("sm_80", "ptx", (7, 5), False),
        ("sm_80", "cubin", (8, 6), True),  # plain cubin: same major
        ("sm_80", "cubin", (9, 0), False),
        ("sm_86", "cubin", (8, 0), False),
    ],
)
def test_arch_runnable(arch: str, kind: str, cc: tuple[int, int], runs: bool) -> None:
    why = arch_runnable(arch, kind, cc)
    assert (why is None) is runs
    if why is not None:
        assert arch in why and f"{cc[0]}.{cc[1]}" in why


def test_parse_arch_rejects_junk() -> None:
    with pytest.raises(ValueError, match="not a CUDA arch"):
        smoke.parse_arch("gfx1100")


# ------------------------------------------------------------------ conversions


def _f32(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def test_bf16_round_to_nearest_even_ties() -> None:
    one = 0x3F800000
    # exactly halfway between bf16 0x3F80 and 0x3F81 -> even (0x3F80)
    assert bf16_encode([_f32(one | 0x8000)])[0] == 0x3F80
    # halfway between 0x3F81 and 0x3F82 -> even (0x3F82)
    assert bf16_encode([_f32(0x3F818000)])[0] == 0x3F82
    # just above halfway rounds up, just below rounds down
    assert bf16_encode([_f32(0x3F808001)])[0] == 0x3F81
    assert bf16_encode([_f32(0x3F807FFF)])[0] == 0x3F80
    # negative ties mirror
    assert bf16_encode([-_f32(0x3F818000)])[0] == 0xBF82
    # the largest float32 rounds to infinity, like a hardware conversion
    assert bf16_encode([np.finfo(np.float32).max])[0] == 0x7F80


def test_bf16_nan_and_inf() -> None:
    enc = bf16_encode(np.array([np.nan, -np.nan, np.inf, -np.inf, _f32(0x7F800001)], np.float32))
    dec = bf16_decode(enc)
    assert np.isnan(dec[0]) and np.isnan(dec[1]) and np.isnan(dec[4])
    assert enc[4] & 0x7F != 0  # a signalling-NaN payload that would truncate to inf stays NaN
    assert dec[2] == np.inf and dec[3] == -np.inf


def test_bf16_decode_encode_round_trips_every_code() -> None:
    codes = np.arange(1 << 16, dtype=np.uint16)
    values = bf16_decode(codes)
    finite = ~np.isnan(values)
    assert np.array_equal(bf16_encode(values)[finite], codes[finite])


@given(st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_bf16_encode_is_nearest_ties_even(bits: int) -> None:
    x = np.array([bits], dtype=np.uint32).view(np.float32)
    if not np.isfinite(x[0]):
        return
    code = int(bf16_encode(x)[0])
    low = bits >> 16  # truncation toward zero; the other candidate is the next code out
    cands = [low, low + 1]
    dist = [
        abs(float(bf16_decode(np.array([c], dtype=np.uint16))[0]) - float(x[0]))
        if (c & 0x7F80) != 0x7F80 or c & 0x7F == 0
        else math.inf
        for c in cands
    ]
    assert code in cands
    other = cands[1 - cands.index(code)]
    mine = dist[cands.index(code)]
    theirs = dist[cands.index(other)]
    assert mine <= theirs or math.isinf(theirs)
    if mine == theirs:
        assert code % 2 == 0


def test_fp8e4m3_decode_known_points() -> None:
    dec = fp8e4m3_decode(np.array([0x00, 0x01, 0x08, 0x38, 0x7E, 0x7F, 0xFE, 0x80], np.uint8))
    assert dec[0] == 0.0 and dec[1] == 2.0**-9 and dec[2] == 2.0**-6
    assert dec[3] == 1.0 and dec[4] == 448.0 and np.isnan(dec[5]) and dec[6] == -448.0
    assert dec[7] == 0.0 and np.signbit(dec[7])


def test_fp8e4m3_encode() -> None:
    codes = np.arange(256, dtype=np.uint8)
    values = fp8e4m3_decode(codes)
    finite = ~np.isnan(values)
    assert np.array_equal(fp8e4m3_encode(values)[finite], codes[finite])
    # ties to even: 1.0 (0x38) and 1.125 (0x39): 1.0625 -> 0x38; 1.1875 -> 0x3A
    assert list(fp8e4m3_encode(np.array([1.0625, 1.1875, -1.0625], np.float32))) == [
        0x38,
        0x3A,
        0xB8,
    ]
    # saturating (SATFINITE), NaN kept
    sat = fp8e4m3_encode(np.array([1000.0, -np.inf, 464.0, np.nan], np.float32))
    assert list(sat[:3]) == [0x7E, 0xFE, 0x7E]
    assert sat[3] & 0x7F == 0x7F


def test_f16_and_int_encoding() -> None:
    x = np.array([1.0 + 2.0**-11, 65520.0], np.float32)  # a tie, an overflow
    assert smoke_dtypes.encode("f16", x).dtype == np.float16
    assert smoke_dtypes.decode("f16", smoke_dtypes.encode("f16", x))[0] == 1.0
    assert np.isinf(smoke_dtypes.decode("f16", smoke_dtypes.encode("f16", x))[1])
    assert smoke_dtypes.encode("i8", np.array([-128, 127])).dtype == np.int8
    with pytest.raises(ValueError, match="out of u8 range"):
        smoke_dtypes.encode("u8", np.array([256]))


# ------------------------------------------------------------------ cases and inputs

CASE_DOC: dict[str, Any] = {
    "case": [
        {
            "name": "c1",
            "module": "scale",
            "entry": "scale_add",
            "grid": [2],
            "block": [64, 1, 1],
            "reference": "scale_add",
            "seed": 7,
            "atol": 1e-2,
            "rtol": 1e-2,
            "args": [
                {"name": "out", "kind": "out", "dtype": "bf16", "shape": [128]},
                {"name": "x", "kind": "in", "dtype": "bf16", "shape": [128], "init": "normal"},
                {"name": "a", "kind": "scalar", "dtype": "f32", "value": 0.5},
                {"name": "n", "kind": "scalar", "dtype": "i32", "value": 128},
            ],
        }
    ]
}


def _case(doc: Mapping[str, Any] = CASE_DOC) -> SmokeCase:
    return parse_smoke_doc(doc, "kernels/x/SMOKE.toml")[0]


def test_parse_case_defaults() -> None:
    c = _case()
    assert c.grid == (2, 1, 1) and c.block == (64, 1, 1) and c.shared_bytes == 0
    assert [a.kind for a in c.args] == ["out", "in", "scalar", "scalar"]
    assert c.min_cc is None and c.source == "kernels/x/SMOKE.toml"


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda c: c.update(grid=[0]), "grid"),
        (lambda c: c["args"][1].update(dtype="bf8"), "args[1].dtype"),
        (lambda c: c["args"][1].update(init="gaussian"), "args[1].init"),
        (lambda c: c["args"][2].update(dtype="f16"), "args[2].dtype"),
        (lambda c: c.update(colour="red"), "colour"),
        (lambda c: c.update(min_cc=9), "min_cc"),
        (lambda c: c["args"][1].update(init="uniform"), "args[1].low"),
    ],
)
def test_parse_case_errors_name_file_case_key(edit: Any, key: str) -> None:
    doc = json.loads(json.dumps(CASE_DOC))
    edit(doc["case"][0])
    with pytest.raises(SmokeCaseError) as info:
        parse_smoke_doc(doc, "kernels/x/SMOKE.toml")
    assert info.value.key == key
    assert "kernels/x/SMOKE.toml" in str(info.value) and "'c1'" in str(info.value)


def test_inputs_are_deterministic_and_rounded() -> None:
    c = _case()
    a, b = make_inputs(c), make_inputs(c)
    assert all(
        np.array_equal(np.asarray(p), np.asarray(q))
        for p, q in zip(a.params, b.params, strict=True)
    )
    out, x, scale, n = a.params
    assert out.dtype == np.uint16 and not out.any()
    assert x.dtype == np.uint16
    assert isinstance(scale, np.float32) and isinstance(n, np.int32)
    # the reference sees the rounded values, decoded, never the unrounded draws
    ref_x = a.reference_args["x"]
    assert ref_x.dtype == np.float32 and np.array_equal(ref_x, bf16_decode(x))
    draws = np.random.default_rng(7).standard_normal(size=(128,), dtype=np.float32)
    assert np.array_equal(x, bf16_encode(draws))
    assert a.reference_args["a"] == 0.5 and a.reference_args["n"] == 128
    assert "out" not in a.reference_args
    other = json.loads(json.dumps(CASE_DOC))
    other["case"][0]["seed"] = 8
    assert not np.array_equal(make_inputs(_case(other)).params[1], x)


def test_inputs_draw_in_declaration_order_and_inits() -> None:
    doc = json.loads(json.dumps(CASE_DOC))
    doc["case"][0]["args"] = [
        {"name": "z", "kind": "in", "dtype": "f32", "shape": [3], "init": "zeros"},
        {"name": "u", "kind": "in", "dtype": "f16", "shape": [4], "init": "uniform",
         "low": -1, "high": 1},
        {"name": "k", "kind": "inout", "dtype": "i32", "shape": [5], "init": "randint",
         "low": 0, "high": 10},
        {"name": "r", "kind": "in", "dtype": "u8", "shape": [2, 3], "init": "arange"},
        {"name": "q", "kind": "in", "dtype": "fp8e4m3", "shape": [6], "init": "normal",
         "scale": 2.0},
    ]  # fmt: skip
    inputs = make_inputs(_case(doc))
    z, u, k, r, q = inputs.params
    rng = np.random.default_rng(7)
    want_u = np.float32(-1) + np.float32(2) * rng.random(size=(4,), dtype=np.float32)
    want_k = rng.integers(0, 10, size=(5,), dtype=np.int64)
    want_q = rng.standard_normal(size=(6,), dtype=np.float32) * np.float32(2.0)
    assert not z.any() and z.dtype == np.float32
    assert np.array_equal(u, want_u.astype(np.float16))
    assert np.array_equal(k, want_k.astype(np.int32)) and k.dtype == np.int32
    assert np.array_equal(r, np.arange(6).reshape(2, 3)) and r.dtype == np.uint8
    assert np.array_equal(q, fp8e4m3_encode(want_q))
    assert inputs.reference_args["k"].dtype == np.int32


def _cases_doc(*cases: dict[str, Any]) -> dict[str, Any]:
    return {"case": [dict(CASE_DOC["case"][0], **c) for c in cases]}


def test_merge_cases_later_wins_and_filters_modules() -> None:
    common = ("common/SMOKE.toml", _cases_doc({"name": "c1"}, {"name": "c2", "module": "gone"}))
    leaf = ("leaf/SMOKE.toml", _cases_doc({"name": "c1", "atol": 0.5}, {"name": "c3"}))
    merged = merge_cases([common, leaf], stems=["scale"])
    assert [(c.name, c.source) for c in merged] == [
        ("c1", "leaf/SMOKE.toml"),
        ("c3", "leaf/SMOKE.toml"),
    ]
    assert merged[0].atol == 0.5
    assert [c.name for c in merge_cases([common, leaf])] == ["c2", "c1", "c3"]


# ------------------------------------------------------------------ a small tree

KERNEL_CU = r"""
extern "C" __global__ void scale_add(unsigned short* out, const unsigned short* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __uint_as_float(((unsigned)x[i]) << 16) * a + 1.0f;
        unsigned u = __float_as_uint(v);
        out[i] = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}
"""

REFS = """
import numpy as np

def scale_add(args):
    return {"out": (args["x"] * np.float32(args["a"]) + np.float32(1)).astype(np.float32)}
"""

SMOKE_TOML = """
[[case]]
name = "scale_128"
module = "scale"
entry = "scale_add"
grid = [2, 1, 1]
block = [64, 1, 1]
reference = "scale_add"
seed = 3
atol = 2e-2
rtol = 2e-2
args = [
  { name = "out", kind = "out", dtype = "bf16", shape = [128] },
  { name = "x", kind = "in", dtype = "bf16", shape = [128], init = "normal" },
  { name = "a", kind = "scalar", dtype = "f32", value = 0.5 },
  { name = "n", kind = "scalar", dtype = "i32", value = 128 },
]
"""


def make_tree(root: Path, arch: str = "sm_90a", *, leaf_case: str = "") -> None:
    """kernels/hw1 (common: scale.cu + SMOKE.toml, other.cu) with model m, quant q."""
    k = root / "kernels"
    (k / "hw1" / "common").mkdir(parents=True)
    (k / "hw1" / "m" / "q").mkdir(parents=True)
    (k / "hw1" / "HARDWARE.toml").write_text(f'[hardware]\nvendor = "nvidia"\narch = "{arch}"\n')
    (k / "hw1" / "m" / "MODEL.toml").write_text("[model]\n")
    (k / "hw1" / "common" / "scale.cu").write_text(KERNEL_CU)
    (k / "hw1" / "common" / "other.cu").write_text('extern "C" __global__ void other() {}\n')
    (k / "hw1" / "common" / "SMOKE.toml").write_text(SMOKE_TOML)
    (k / "hw1" / "m" / "q" / "SMOKE.toml").write_text(leaf_case)
    (k / "smoke_refs.py").write_text(REFS)


def compile_target(
    root: Path, arch: str, kind: str = "ptx", manifest_arch: str | None = None
) -> Path:
    """Compile every module of hw1/m/q with nvcc and write manifest.json like the build does."""
    out = root / "build" / "hw1" / "m" / "q"
    out.mkdir(parents=True, exist_ok=True)
    modules = []
    for stem in ("other", "scale"):
        artefact = out / f"{stem}.{kind}"
        src = root / "kernels" / "hw1" / "common" / f"{stem}.cu"
        run_process(["nvcc", f"--{kind}", f"-arch={arch}", "-O3", str(src), "-o", str(artefact)])
        modules.append(
            {
                "name": stem,
                "stem": stem,
                "source": f"kernels/hw1/common/{stem}.cu",
                "artefact": artefact.name,
                "xxh3": xxhash.xxh3_128_hexdigest(artefact.read_bytes()),
                "key": "0" * 32,
                "outcome": "compiled",
            }
        )
    manifest = {
        "schema": 1,
        "target": "hw1/m/q",
        "arch": manifest_arch or arch,
        "toolchain": {"name": "nvcc", "identity": "test"},
        "flags": [],
        "modules": modules,
        "shadows": [],
        "defaults": {},
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def no_device() -> DeviceStatus:
    return DeviceStatus(reason="no CUDA device: test probe")


def fake_device(cc: tuple[int, int]) -> smoke.DeviceProbe:
    def probe() -> DeviceStatus:
        return DeviceStatus(device=DeviceInfo(index=0, name="Fake GPU", cc=cc))

    return probe


def numpy_launcher(bias: float = 0.0) -> smoke.Launcher:
    """Emulates scale_add on the host (plus ``bias`` to make it wrong)."""

    def launch(artefact: Path, case: SmokeCase, params: Sequence[Any]) -> Mapping[str, Any]:
        assert artefact.is_file()
        _out, x, a, _n = params
        return {"out": bf16_encode(bf16_decode(x) * a + np.float32(1 + bias))}

    return launch


def by_name(report: smoke.SmokeReport) -> dict[str, smoke.CaseResult]:
    return {f"{r.module}::{r.case}": r for r in report.results}


def test_scan_cases_layers_and_override(tmp_path: Path) -> None:
    leaf = SMOKE_TOML.replace("seed = 3", "seed = 99") + SMOKE_TOML.replace(
        '"scale_128"', '"dropped"'
    ).replace('module = "scale"', 'module = "not_a_module"')
    make_tree(tmp_path, leaf_case=leaf)
    layout = discover(tmp_path, Target.parse("hw1/m/q"))
    cases = scan_cases(tmp_path, layout)
    assert [(c.name, c.seed, c.source) for c in cases] == [
        ("scale_128", 99, "kernels/hw1/m/q/SMOKE.toml")
    ]


def test_scan_cases_bad_toml(tmp_path: Path) -> None:
    make_tree(tmp_path, leaf_case="[[case]\n")
    layout = discover(tmp_path, Target.parse("hw1/m/q"))
    with pytest.raises(SmokeCaseError, match=r"kernels/hw1/m/q/SMOKE.toml"):
        scan_cases(tmp_path, layout)


# ------------------------------------------------------------------ static checks, real nvcc


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize(("arch", "kind"), [("sm_90a", "ptx"), ("sm_121f", "cubin")])
def test_static_checks_pass_and_numbers_skip(tmp_path: Path, arch: str, kind: str) -> None:
    make_tree(tmp_path, arch)
    compile_target(tmp_path, arch, kind)
    report = run_smoke(tmp_path, "hw1", probe=no_device)
    results = by_name(report)
    assert set(results) == {"other::static", "scale::static", "scale::scale_128"}
    assert results["scale::static"].outcome == "passed", results["scale::static"].message
    assert results["other::static"].outcome == "passed"
    assert f"arch: {arch}" in results["scale::static"].detail
    assert "scale_add" in results["scale::static"].detail
    if kind == "cubin":
        assert "registers" in results["scale::static"].detail
    skipped = results["scale::scale_128"]
    assert skipped.outcome == "skipped" and "no CUDA device: test probe" in skipped.message
    assert report.ok


@pytest.mark.nvcc
@needs_nvcc
def test_static_missing_entry_fails(tmp_path: Path) -> None:
    make_tree(tmp_path)
    toml = (tmp_path / "kernels/hw1/common/SMOKE.toml").read_text()
    (tmp_path / "kernels/hw1/common/SMOKE.toml").write_text(
        toml.replace('entry = "scale_add"', 'entry = "scale_mul"')
    )
    compile_target(tmp_path, "sm_90a", "cubin")
    report = run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=numpy_launcher())
    static = by_name(report)["scale::static"]
    assert static.outcome == "failed"
    assert "'scale_mul' is missing" in static.message and "scale_add" in static.message
    numeric = by_name(report)["scale::scale_128"]
    assert numeric.outcome == "skipped" and "static check failed" in numeric.message
    assert not report.ok


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("kind", ["ptx", "cubin"])
def test_static_wrong_arch_fails(tmp_path: Path, kind: str) -> None:
    make_tree(tmp_path, "sm_90a")
    compile_target(tmp_path, "sm_121f", kind, manifest_arch="sm_90a")
    report = run_smoke(tmp_path, "hw1", probe=no_device)
    static = by_name(report)["scale::static"]
    assert static.outcome == "failed"
    assert "sm_121f" in static.message and "sm_90a" in static.message


@pytest.mark.nvcc
@needs_nvcc
def test_static_hash_mismatch_and_manifest_arch(tmp_path: Path) -> None:
    make_tree(tmp_path, "sm_90a")
    out = compile_target(tmp_path, "sm_90a")
    with (out / "scale.ptx").open("a") as fh:
        fh.write("\n// tampered\n")
    (tmp_path / "kernels/hw1/HARDWARE.toml").write_text('[hardware]\narch = "sm_100a"\n')
    results = by_name(run_smoke(tmp_path, "hw1", probe=no_device))
    assert "does not match the manifest's xxh3" in results["scale::static"].message
    assert results["other::static"].outcome == "passed"
    assert "declares 'sm_100a'" in results["(manifest)::arch"].message


def test_unbuilt_target_is_skipped(tmp_path: Path) -> None:
    make_tree(tmp_path)
    report = run_smoke(tmp_path, "hw1", probe=no_device)
    (only,) = report.results
    assert only.outcome == "skipped" and "manifest.json is missing" in only.message
    assert report.ok


# ------------------------------------------------------------------ numeric path, fake device


@pytest.mark.nvcc
@needs_nvcc
def test_numeric_pipeline_with_fake_device(tmp_path: Path) -> None:
    make_tree(tmp_path)
    compile_target(tmp_path, "sm_90a")
    good = by_name(run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=numpy_launcher()))
    case = good["scale::scale_128"]
    assert case.outcome == "passed", case.message
    assert case.max_abs_error is not None and case.max_abs_error <= 2e-2

    bad = by_name(
        run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=numpy_launcher(0.25))
    )
    failed = bad["scale::scale_128"]
    assert failed.outcome == "failed" and "elements outside" in failed.message
    assert failed.max_abs_error is not None and failed.max_abs_error >= 0.2

    other_gpu = by_name(run_smoke(tmp_path, "hw1", probe=fake_device((12, 1))))
    assert other_gpu["scale::scale_128"].outcome == "skipped"
    assert "Fake GPU" in other_gpu["scale::scale_128"].message
    assert "9.0" in other_gpu["scale::scale_128"].message


@pytest.mark.nvcc
@needs_nvcc
def test_numeric_errors_are_failures(tmp_path: Path) -> None:
    make_tree(tmp_path)
    compile_target(tmp_path, "sm_90a")

    def crash(artefact: Path, case: SmokeCase, params: Sequence[Any]) -> Mapping[str, Any]:
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

    r = by_name(run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=crash))
    assert r["scale::scale_128"].outcome == "failed"
    assert "ILLEGAL_ADDRESS" in r["scale::scale_128"].message

    def broken() -> DeviceStatus:
        return DeviceStatus(error="CUDA device 0 is present but failed: CUDA_ERROR_UNKNOWN")

    r = by_name(run_smoke(tmp_path, "hw1", probe=broken))
    assert r["scale::scale_128"].outcome == "failed"

    (tmp_path / "kernels/smoke_refs.py").write_text("def unrelated(args):\n    return {}\n")
    r = by_name(run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=numpy_launcher()))
    assert "'scale_add' is not defined in kernels/smoke_refs.py" in r["scale::scale_128"].message


# ------------------------------------------------------------------ the device probe, for real


def test_probe_without_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    status = probe_device()
    assert status.device is None and not status.error
    assert status.reason == "numeric smoke needs cupy: pip install 'metrale-orch[gpu]'"
    assert status.fix == "pip install 'metrale-orch[gpu]'"


def test_probe_on_this_machine() -> None:
    pytest.importorskip("cupy")
    status = probe_device()
    if status.device is not None:
        pytest.skip(f"a CUDA device is present here: {status.device.describe()}")
    assert not status.error
    assert status.reason.startswith(("no CUDA driver", "no CUDA device")), status.reason
    assert "libcuda" in status.reason or "device" in status.reason


@pytest.mark.nvcc
@needs_nvcc
def test_real_skip_reason_reaches_junit(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    make_tree(tmp_path)
    compile_target(tmp_path, "sm_90a")
    status = probe_device()
    if status.device is not None:
        pytest.skip("a CUDA device is present here")
    values = run_smoke_action(str(tmp_path), "hw1", ["hw1/m/q"], str(tmp_path / "build"))
    assert isinstance(values, dict) and values["failed"] == 0, values
    assert values["summary"] == (
        f"smoke hw1: 2 static passed, 1 numeric skipped ({status.reason.split(':')[0]}), 0 failed"
    )
    assert values["report"] == "build/smoke-hw1.xml"
    doc = ET.parse(tmp_path / "build" / "smoke-hw1.xml").getroot()
    assert doc.tag == "testsuites"
    assert (doc.get("tests"), doc.get("failures"), doc.get("skipped")) == ("3", "0", "1")
    (suite,) = doc.findall("testsuite")
    assert suite.get("name") == "hw1/m/q"
    cases = {tc.get("name"): tc for tc in suite.findall("testcase")}
    assert set(cases) == {"other::static", "scale::static", "scale::scale_128"}
    skipped = cases["scale::scale_128"].find("skipped")
    assert skipped is not None and status.reason in (skipped.get("message") or "")


@pytest.mark.nvcc
@needs_nvcc
def test_junit_failures_and_action_failure(tmp_path: Path) -> None:
    make_tree(tmp_path, "sm_90a")
    compile_target(tmp_path, "sm_121f", "ptx", manifest_arch="sm_90a")
    report = run_smoke(tmp_path, "hw1", probe=no_device)
    root = ET.fromstring(report.to_junit_xml())
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "2", "1")
    failures = [tc for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert sorted(str(tc.get("name")) for tc in failures) == ["other::static", "scale::static"]
    from doit.exceptions import TaskFailed

    result = run_smoke_action(str(tmp_path), "hw1", ["hw1/m/q"], str(tmp_path / "build"))
    assert isinstance(result, TaskFailed)
    assert "FAIL hw1/m/q scale::static" in str(result)
    assert (tmp_path / "build" / "smoke-hw1.xml").is_file()


def test_layout_error_is_a_failed_testcase(tmp_path: Path) -> None:
    make_tree(tmp_path)
    report = run_smoke(tmp_path, "hw1", targets=["hw1/nomodel/q"], probe=no_device)
    (only,) = report.results
    assert only.outcome == "failed" and only.module == "(layout)"


# ------------------------------------------------------------------ doit tasks


def test_smoke_tasks_are_picklable_and_depend_on_builds(tmp_path: Path) -> None:
    make_tree(tmp_path)
    config = load_config(tmp_path, environ={"HOME": str(tmp_path)})
    t = Target.parse("hw1/m/q")
    tasks = list(smoke_tasks(tmp_path, config, {"hw1": [(t, discover(tmp_path, t))]}))
    (task,) = tasks
    assert task["name"] == "hw1"
    assert task["task_dep"] == ["build:hw1/m/q"]
    func, args = task["actions"][0]
    assert func is run_smoke_action
    assert args == [str(tmp_path), "hw1", ["hw1/m/q"], str(tmp_path / "build")]
    pickle.loads(pickle.dumps(task["actions"]))


# ------------------------------------------------------------------ on a CUDA device


def _device_or_skip() -> DeviceInfo:
    status = probe_device()
    if status.device is None:
        pytest.skip(f"numeric smoke needs a CUDA device: {status.reason or status.error}")
    return status.device


def _device_arch(dev: DeviceInfo) -> str:
    major, minor = dev.cc
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


@pytest.mark.gpu
@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("kind", ["ptx", "cubin"])
def test_gpu_synthetic_kernel(tmp_path: Path, kind: str) -> None:
    dev = _device_or_skip()
    arch = _device_arch(dev)
    make_tree(tmp_path, arch)
    compile_target(tmp_path, arch, kind)
    report = run_smoke(tmp_path, "hw1")
    results = by_name(report)
    assert report.device.device is not None
    case = results["scale::scale_128"]
    assert case.outcome == "passed", case.message
    assert case.max_abs_error is not None and case.max_abs_error < 2e-2
    assert report.ok, [r.message for r in report.failures()]


@pytest.mark.gpu
@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.slow
def test_gpu_sample_tree(tmp_path: Path) -> None:
    """Build every NVIDIA target of the sample tree for this device and run all its cases."""
    dev = _device_or_skip()
    import metrale_orch.steps.target as compile_mod
    from metrale_orch.tree import hardware, resolve_all

    repo = REPO
    shutil.copytree(repo / "kernels", tmp_path / "kernels")
    if (repo / "toolchains").is_dir():
        shutil.copytree(repo / "toolchains", tmp_path / "toolchains")
    arch = _device_arch(dev)
    nvidia = []
    for hw_dir in sorted((tmp_path / "kernels").iterdir()):
        manifest = hw_dir / "HARDWARE.toml"
        if not manifest.is_file():
            continue
        info = hardware(tmp_path / "kernels", hw_dir.name)
        if info.source_ext != "cu" or info.vendor not in ("nvidia", "cuda"):
            continue
        nvidia.append(hw_dir.name)
        if info.arch and arch_runnable(info.arch, "ptx", dev.cc) is None:
            continue
        text = manifest.read_text()
        manifest.write_text(text.replace(f'arch = "{info.arch}"', f'arch = "{arch}"'))
    env = dict(os.environ, METRALE_ORCH_LOCAL_CACHE=str(tmp_path / "cache"))
    config = load_config(tmp_path, environ=env)
    ran = 0
    for target, layout in resolve_all(tmp_path):
        if target.hardware not in nvidia or not hasattr(layout, "modules"):
            continue
        compile_mod.build_target(tmp_path, target, config=config, cache=None, environ=env)
    for hw in nvidia:
        report = run_smoke(tmp_path, hw, build_dir=config.build_dir)
        smoke.write_junit(report, config.build_dir / f"smoke-{hw}.xml")
        assert report.ok, "\n".join(f"{r.target} {r.module}::{r.case}: {r.message}"
                                    for r in report.failures())  # fmt: skip
        ran += report.count("passed")
    assert ran > 0


# ------------------------------------------------------------------ the sample tree


def _sample_layouts() -> list[Any]:
    from metrale_orch.tree import Layout, resolve_all

    assert (REPO / "kernels" / smoke.REFS_FILE).is_file(), "the sample tree has smoke_refs.py"
    return [lay for _, lay in resolve_all(REPO) if isinstance(lay, Layout)]


def test_sample_cases_parse_and_references_match_shapes() -> None:
    refs = smoke.load_references(REPO / "kernels" / smoke.REFS_FILE)
    seen: dict[tuple[str, str], SmokeCase] = {}
    for layout in _sample_layouts():
        for case in scan_cases(REPO, layout):
            seen.setdefault((case.source, case.name), case)
    assert seen, "the sample tree declares smoke cases"
    for case in seen.values():
        assert case.reference in refs, f"{case.source}: {case.name}: no reference"
        inputs = make_inputs(case)
        want = refs[case.reference](dict(inputs.reference_args))
        for arg in case.args:
            if arg.kind in ("out", "inout"):
                assert np.asarray(want[arg.name]).shape == arg.shape, (case.name, arg.name)


@pytest.mark.nvcc
@pytest.mark.slow
@needs_nvcc
def test_sample_target_static_checks(tmp_path: Path) -> None:
    """Build one sample NVIDIA target with the real build step; every static check passes."""
    import metrale_orch.steps.target as compile_mod

    layouts = [
        lay
        for lay in _sample_layouts()
        if lay.hardware.source_ext == "cu" and lay.hardware.vendor in ("nvidia", "cuda")
    ]
    layout = next((lay for lay in layouts if scan_cases(REPO, lay)), None)
    assert layout is not None, "the sample tree has an NVIDIA target with smoke cases"
    env = dict(os.environ, METRALE_ORCH_BUILD_DIR=str(tmp_path / "build"))
    env["METRALE_ORCH_LOCAL_CACHE"] = str(tmp_path / "cache")
    config = load_config(REPO, environ=env)
    result = compile_mod.build_target(REPO, layout, config=config, cache=None, environ=env)
    assert not getattr(result, "failed", False)
    report = run_smoke(
        REPO, layout.target.hardware, build_dir=config.build_dir,
        layouts=[(layout.target, layout)], probe=no_device,
    )  # fmt: skip
    statics = [r for r in report.results if r.case == "static"]
    assert statics and all(r.outcome == "passed" for r in statics), report.failures()
    assert all(r.outcome == "skipped" for r in report.results if r.case != "static")


@pytest.mark.nvcc
@needs_nvcc
def test_doit_smoke_ends_with_its_summary_line(tmp_path: Path) -> None:
    """`doit smoke:<hw>` as a user runs it: a real build, then one line saying what passed
    (static checks) and what did not run (numbers without a device), and why."""
    make_tree(tmp_path)
    (tmp_path / "dodo.py").write_text(DODO)
    env = project_env(tmp_path)
    run = doit(tmp_path, ["smoke:hw1"], env)
    assert run.returncode == 0, run.text
    last = run.out.rstrip("\n").splitlines()[-1]
    status = probe_device()
    if status.device is None:
        short = status.reason.split(":", 1)[0]
        assert last == f"smoke hw1: 2 static passed, 1 numeric skipped ({short}), 0 failed"
    else:
        assert last.startswith("smoke hw1: 2 static passed, 1 numeric passed (on ")
