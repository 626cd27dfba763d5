"""The NumPy references of kernels/smoke_refs.py against naive pure-Python loops.

Every smoke case of the sample tree compares a GPU kernel with one of these references, so
each reference is checked here, on tiny inputs, against an independent element-by-element
loop written straight from the kernel's contract (plain floats, `math`, no NumPy in the
loops). The rounding helpers are checked against brute force over every representable value.
"""

from __future__ import annotations

import importlib.util
import math
import struct
import tomllib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.support import REPO

KERNELS = REPO / "kernels"

Args = dict[str, Any]


def _load_refs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_sample_smoke_refs", KERNELS / "smoke_refs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


refs = _load_refs()


# --- naive scalar helpers ---------------------------------------------------------------------


def f32(x: float) -> float:
    """Round a Python float to float32."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def _from_bits(b: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", b))[0])


def bf16(x: float) -> float:
    """Nearest bf16 of a float32 value by comparing the two candidates; ties to even."""
    x = f32(x)
    lo_bits = _bits(x) & 0xFFFF0000  # truncation: toward zero
    lo, hi = _from_bits(lo_bits), _from_bits(lo_bits + 0x10000)  # hi: next away from zero
    d_lo, d_hi = abs(x - lo), abs(hi - x)
    if d_lo != d_hi:
        return lo if d_lo < d_hi else hi
    return lo if (lo_bits >> 16) % 2 == 0 else hi


def e4m3_value(code: int) -> float:
    """Decode one FP8 E4M3 code from its bit fields (NaN for 0x7F/0xFF)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 7
    if exponent == 15 and mantissa == 7:
        return math.nan
    if exponent == 0:
        return sign * mantissa / 8 * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def e4m3(x: float) -> float:
    """Nearest E4M3 value by brute force over the codes, ties to the even code, saturating."""
    magnitude = min(abs(x), 448.0)
    best_code = min(range(0x7F), key=lambda c: (abs(e4m3_value(c) - magnitude), c % 2))
    return math.copysign(e4m3_value(best_code), x) if best_code else 0.0


def e2m1(nibble: int) -> float:
    """Decode one FP4 E2M1 code from its bit fields."""
    exponent, mantissa = (nibble >> 1) & 3, nibble & 1
    magnitude = mantissa * 0.5 if exponent == 0 else (1 + mantissa * 0.5) * 2.0 ** (exponent - 1)
    return -magnitude if nibble & 8 else magnitude


def bf16_array(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> Any:
    """Inputs as the smoke runner hands them over: bf16-representable float32 values."""
    raw = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
    return np.array([bf16(float(v)) for v in raw.ravel()], dtype=np.float32).reshape(shape)


def e4m3_array(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> Any:
    raw = rng.standard_normal(shape) * scale
    return np.array([e4m3(float(v)) for v in raw.ravel()], dtype=np.float32).reshape(shape)


def close(got: Any, want: Any, *, rtol: float = 8e-3, atol: float = 1e-6) -> None:
    """bf16 outputs may differ by one bf16 step where float64 sums differ in the last bit."""
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


# --- helpers of smoke_refs.py ---------------------------------------------------------------


def test_bf16_round_matches_nearest_even() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(200).astype(np.float32) * np.float32(100),
            # exact ties: a bf16 value plus half a step, with odd and even last bits
            np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(2.0 + 2.0**-7), 0.0, -0.0], np.float32),
        ]
    )
    got = refs.bf16_round(values)
    assert got.dtype == np.float32
    assert [float(v) for v in got] == [bf16(float(v)) for v in values]


def test_fp8e4m3_round_matches_brute_force() -> None:
    rng = np.random.default_rng(1)
    finite = [e4m3_value(c) for c in range(256) if not math.isnan(e4m3_value(c))]
    values = np.concatenate(
        [
            rng.standard_normal(300).astype(np.float32) * np.float32(40),
            np.array(finite, dtype=np.float32),
            # midpoints between neighbours (ties), tiny values and saturation
            np.array([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, 17.0, 15.5, 470.0, -1000.0]),
        ]
    ).astype(np.float32)
    got = refs.fp8e4m3_round(values)
    assert [float(v) for v in got] == [e4m3(float(v)) for v in values]


def test_e2m1_e8m0_and_unpack() -> None:
    assert [float(v) for v in refs.e2m1_decode(np.arange(16))] == [e2m1(n) for n in range(16)]
    codes = np.array([0, 1, 120, 127, 128, 254])
    assert [float(v) for v in refs.e8m0_decode(codes)] == [2.0 ** (int(c) - 127) for c in codes]
    assert math.isnan(float(refs.e8m0_decode(np.array([255]))[0]))
    packed = np.array([[0x21, 0xF8], [0x7A, 0x00]])
    want = [[e2m1(b >> s & 0xF) for b in row for s in (0, 4)] for row in packed.tolist()]
    assert refs.unpack_fp4(packed).tolist() == want


# --- naive versions of the kernels ----------------------------------------------------------


def naive_rmsnorm(x: Any, w: Any, eps: float, offset: float) -> list[list[float]]:
    out = []
    for row in x.tolist():
        ms = sum(v * v for v in row) / len(row)
        inv = 1.0 / math.sqrt(ms + eps)
        out.append(
            [bf16(f32(v * inv * (offset + wi))) for v, wi in zip(row, w.tolist(), strict=True)]
        )
    return out


def naive_gate_up(gate_up: Any, d: int, act: Callable[[float], float]) -> list[list[float]]:
    return [[bf16(f32(act(row[i]) * row[d + i])) for i in range(d)] for row in gate_up.tolist()]


def silu(g: float) -> float:
    return g / (1.0 + math.exp(-g))


def gelu_tanh(g: float) -> float:
    return 0.5 * g * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))


def naive_rope(x: Any, positions: list[int], theta: float) -> list[Any]:
    tokens, heads, head_dim = x.shape
    half = head_dim // 2
    out: list[Any] = x.tolist()
    for t in range(tokens):
        for h in range(heads):
            for i in range(half):
                freq = f32(f32(theta) ** f32(-2.0 * i / head_dim))
                angle = f32(positions[t] * freq)
                c, s = math.cos(angle), math.sin(angle)
                x1, x2 = x[t, h, i], x[t, h, i + half]
                out[t][h][i] = bf16(f32(x1 * c - x2 * s))
                out[t][h][i + half] = bf16(f32(x2 * c + x1 * s))
    return out


def naive_gemv(w: list[list[float]], x: list[float], scale: float = 1.0) -> list[float]:
    return [bf16(f32(sum(wi * xi for wi, xi in zip(row, x, strict=True)) * scale)) for row in w]


def naive_attention(args: Args) -> list[Any]:
    q, kc, vc = args["q"], args["k_cache"], args["v_cache"]
    seqs, heads, head_dim = q.shape
    page_size, kv_heads = kc.shape[1], kc.shape[2]
    out: list[Any] = np.zeros(q.shape).tolist()
    for s in range(seqs):
        for h in range(heads):
            kv_h = h // (heads // kv_heads)
            slots = []
            for t in range(int(args["seq_lens"][s])):
                page = int(args["block_tables"][s, t // page_size])
                slots.append((page, t % page_size))
            scores = [
                sum(q[s, h, d] * kc[p, o, kv_h, d] for d in range(head_dim)) * args["scale"]
                for p, o in slots
            ]
            top = max(scores)
            weights = [math.exp(sc - top) for sc in scores]
            total = sum(weights)
            for d in range(head_dim):
                acc = sum(wt * vc[p, o, kv_h, d] for wt, (p, o) in zip(weights, slots, strict=True))
                out[s][h][d] = bf16(f32(acc / total))
    return out


def naive_topk(logits: Any, k: int, renormalize: bool) -> tuple[list[Any], list[Any]]:
    all_weights, all_ids = [], []
    for row in logits.tolist():
        top = max(row)
        exps = [math.exp(v - top) for v in row]
        total = sum(exps)
        ids: list[int] = []
        for _ in range(k):
            best = -1
            for e, v in enumerate(row):  # strict '>' keeps the lower index on ties
                if e not in ids and (best < 0 or v > row[best]):
                    best = e
            ids.append(best)
        weights = [exps[e] / total for e in ids]
        if renormalize:
            picked = sum(weights)
            weights = [wt / picked for wt in weights]
        all_weights.append(weights)
        all_ids.append(ids)
    return all_weights, all_ids


# --- one check per reference ----------------------------------------------------------------


def check_rmsnorm(rng: np.random.Generator) -> None:
    x, w = bf16_array(rng, (3, 16)), bf16_array(rng, (16,), 0.5)
    args: Args = {"x": x, "w": w, "rows": 3, "cols": 16, "eps": 1e-6}
    close(refs.rmsnorm(args)["out"], naive_rmsnorm(x, w, 1e-6, 0.0))


def check_rmsnorm_gemma(rng: np.random.Generator) -> None:
    x, w = bf16_array(rng, (3, 16)), bf16_array(rng, (16,), 0.1)
    args: Args = {"x": x, "w": w, "rows": 3, "cols": 16, "eps": 1e-6}
    close(refs.rmsnorm_gemma(args)["out"], naive_rmsnorm(x, w, 1e-6, 1.0))


def check_qk_norm(rng: np.random.Generator) -> None:
    x, w = bf16_array(rng, (5, 8)), bf16_array(rng, (8,), 0.5)
    args: Args = {"x": x, "w": w, "rows": 5, "head_dim": 8, "eps": 1e-6}
    close(refs.qk_norm(args)["x"], naive_rmsnorm(x, w, 1e-6, 0.0))


def check_silu_mul(rng: np.random.Generator) -> None:
    gate_up = bf16_array(rng, (3, 10), 2.0)
    got = refs.silu_mul({"gate_up": gate_up, "rows": 3, "d": 5})["out"]
    close(got, naive_gate_up(gate_up, 5, silu))


def check_gelu_tanh_mul(rng: np.random.Generator) -> None:
    gate_up = bf16_array(rng, (3, 10), 2.0)
    got = refs.gelu_tanh_mul({"gate_up": gate_up, "rows": 3, "d": 5})["out"]
    close(got, naive_gate_up(gate_up, 5, gelu_tanh))


def check_residual_add(rng: np.random.Generator) -> None:
    hidden, residual = bf16_array(rng, (12,)), bf16_array(rng, (12,))
    got = refs.residual_add({"hidden": hidden, "residual": residual, "n": 12})["hidden"]
    want = [bf16(f32(a + b)) for a, b in zip(hidden.tolist(), residual.tolist(), strict=True)]
    close(got, want, rtol=0, atol=0)  # one float32 add, one rounding: exact


def check_rope_neox(rng: np.random.Generator) -> None:
    x = bf16_array(rng, (2, 3, 8))
    positions = rng.integers(0, 512, size=2)
    args: Args = {"x": x, "positions": positions, "tokens": 2, "heads": 3, "head_dim": 8}
    args["theta"] = 10000.0
    close(refs.rope_neox(args)["x"], naive_rope(x, positions.tolist(), 10000.0))


def check_gemv_bf16(rng: np.random.Generator) -> None:
    w, x = bf16_array(rng, (4, 24), 0.1), bf16_array(rng, (24,))
    got = refs.gemv_bf16({"w": w, "x": x, "n_rows": 4, "k": 24})["y"]
    close(got, naive_gemv(w.tolist(), x.tolist()))


def check_gemv_nvfp4(rng: np.random.Generator) -> None:
    n, k = 3, 32
    packed = rng.integers(0, 256, size=(n, k // 2))
    scales = np.array([[e4m3(v) for v in row] for row in rng.uniform(0.25, 2.0, (n, k // 16))])
    x = bf16_array(rng, (k,))
    args: Args = {"w_packed": packed, "scales": scales, "global_scale": 0.125, "x": x}
    args |= {"n_rows": n, "k": k}
    w = [
        [e2m1(int(row[i // 2]) >> (4 * (i % 2)) & 0xF) * srow[i // 16] for i in range(k)]
        for row, srow in zip(packed, scales.tolist(), strict=True)
    ]
    close(refs.gemv_nvfp4(args)["y"], naive_gemv(w, x.tolist(), 0.125))


def check_gemv_mxfp4(rng: np.random.Generator) -> None:
    n, k = 3, 64
    packed = rng.integers(0, 256, size=(n, k // 2))
    scales = rng.integers(120, 130, size=(n, k // 32))
    x = bf16_array(rng, (k,))
    args: Args = {"w_packed": packed, "scales": scales, "x": x, "n_rows": n, "k": k}
    w = [
        [
            e2m1(int(row[i // 2]) >> (4 * (i % 2)) & 0xF) * 2.0 ** (srow[i // 32] - 127)
            for i in range(k)
        ]
        for row, srow in zip(packed, scales.tolist(), strict=True)
    ]
    close(refs.gemv_mxfp4(args)["y"], naive_gemv(w, x.tolist()))


def check_gemv_w8a8(rng: np.random.Generator) -> None:
    n, k = 4, 16
    w, xq = e4m3_array(rng, (n, k)), e4m3_array(rng, (k,), 4.0)
    w_scales = rng.uniform(0.01, 0.1, n).astype(np.float32)
    x_scale = np.array([0.05], dtype=np.float32)
    args: Args = {"w": w, "w_scales": w_scales, "xq": xq, "x_scale": x_scale}
    args |= {"n_rows": n, "k": k}
    want = [
        bf16(
            f32(
                sum(a * b for a, b in zip(row, xq.tolist(), strict=True))
                * float(s)
                * float(x_scale[0])
            )
        )
        for row, s in zip(w.tolist(), w_scales, strict=True)
    ]
    close(refs.gemv_w8a8(args)["y"], want)


def check_fp8_act_quant(rng: np.random.Generator) -> None:
    x = bf16_array(rng, (3, 20), 3.0)
    x[2] = 0.0  # an all-zero row takes the 1e-12 floor
    got = refs.fp8_act_quant({"x": x, "rows": 3, "cols": 20})
    for r, row in enumerate(x.tolist()):
        amax = f32(max(max(abs(v) for v in row), f32(1e-12)))
        inv_scale = f32(448.0 / amax)
        assert float(got["scales"][r]) == f32(amax / 448.0)
        assert [float(v) for v in got["q"][r]] == [e4m3(f32(v * inv_scale)) for v in row]


def check_moe_topk_softmax(rng: np.random.Generator) -> None:
    logits = rng.standard_normal((4, 12)).astype(np.float32)
    logits[1, 3] = logits[1, 7]  # a tie: the lower expert index comes first
    for renormalize in (0, 1):
        args: Args = {"logits": logits, "tokens": 4, "experts": 12, "k": 3}
        args["renormalize"] = renormalize
        got = refs.moe_topk_softmax(args)
        weights, ids = naive_topk(logits, 3, bool(renormalize))
        assert got["ids"].dtype == np.int32
        assert got["ids"].tolist() == ids
        close(got["weights"], weights, rtol=1e-6)


def check_paged_attn_decode(rng: np.random.Generator) -> None:
    seqs, heads, kv_heads, head_dim, page_size, pages = 2, 4, 2, 8, 4, 5
    args: Args = {
        "q": bf16_array(rng, (seqs, heads, head_dim)),
        "k_cache": bf16_array(rng, (pages, page_size, kv_heads, head_dim)),
        "v_cache": bf16_array(rng, (pages, page_size, kv_heads, head_dim)),
        "block_tables": rng.integers(0, pages, size=(seqs, 3)),
        "seq_lens": np.array([9, 3]),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "page_size": page_size,
        "max_pages": 3,
        "scale": 0.35,
    }
    close(refs.paged_attn_decode(args)["out"], naive_attention(args))


CHECKS: dict[str, Callable[[np.random.Generator], None]] = {
    "rmsnorm": check_rmsnorm,
    "rmsnorm_gemma": check_rmsnorm_gemma,
    "qk_norm": check_qk_norm,
    "silu_mul": check_silu_mul,
    "gelu_tanh_mul": check_gelu_tanh_mul,
    "residual_add": check_residual_add,
    "rope_neox": check_rope_neox,
    "gemv_bf16": check_gemv_bf16,
    "gemv_nvfp4": check_gemv_nvfp4,
    "gemv_mxfp4": check_gemv_mxfp4,
    "gemv_w8a8": check_gemv_w8a8,
    "fp8_act_quant": check_fp8_act_quant,
    "moe_topk_softmax": check_moe_topk_softmax,
    "paged_attn_decode": check_paged_attn_decode,
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_reference_matches_naive_loop(name: str) -> None:
    for seed in range(3):
        CHECKS[name](np.random.default_rng(seed))


def _smoke_references() -> Iterator[tuple[str, str]]:
    for path in sorted(KERNELS.glob("*/**/SMOKE.toml")):
        for case in tomllib.loads(path.read_text()).get("case", []):
            yield path.relative_to(REPO).as_posix(), case["reference"]


def test_every_reference_is_checked() -> None:
    """Each reference a SMOKE.toml names, and each public one in smoke_refs.py, has a check."""
    named = {ref for _, ref in _smoke_references()}
    assert named, "the sample tree has smoke cases"
    assert named <= set(CHECKS), f"references without a naive check: {named - set(CHECKS)}"
    helpers = {"bf16_round", "fp8e4m3_round", "e2m1_decode", "e8m0_decode", "unpack_fp4"}
    public = {
        name
        for name, value in vars(refs).items()
        if callable(value) and not name.startswith("_") and value.__module__ == refs.__name__
    }
    assert public - helpers == set(CHECKS)
