"""Smoke tests (SPEC 3.5): conversions, cases, static checks on real nvcc output, reports.

The numeric path runs for real only on a CUDA device (``gpu`` tests); here it
is exercised with an injected device probe and a NumPy launcher.

The tests of this topic that start processes are in ``tests/scenarios/smoke/test_smoke.py``.
"""

from __future__ import annotations

import json
import math
import pickle
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metrale_orch import smoke
from metrale_orch.config import load_config
from metrale_orch.smoke import (
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
from tests.support.smoke import (
    SMOKE_TOML,
    _sample_layouts,
    make_tree,
    no_device,
)

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


def test_unbuilt_target_is_skipped(tmp_path: Path) -> None:
    make_tree(tmp_path)
    report = run_smoke(tmp_path, "hw1", probe=no_device)
    (only,) = report.results
    assert only.outcome == "skipped" and "manifest.json is missing" in only.message
    assert report.ok


# ------------------------------------------------------------------ the device probe, for real


def test_probe_without_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    status = probe_device()
    assert status.device is None and not status.error
    assert status.reason == "numeric smoke needs cupy: pip install 'metrale-orch[gpu]'"
    assert status.fix == "pip install 'metrale-orch[gpu]'"


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
