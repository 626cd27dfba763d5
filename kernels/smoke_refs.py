"""NumPy references for the smoke cases of the sample kernel tree (SMOKE.toml `reference`).

Each reference takes `args` (every in/inout buffer decoded to float32, integer dtypes as
integer arrays, every scalar as a Python number, keyed by the SMOKE.toml arg names) and
returns the expected value of every out/inout buffer, as float32 (or integer) arrays.

References model the kernels' rounding where it matters: results stored as bf16 or FP8 are
rounded here the same way (round to nearest even; FP8 saturating), so tolerances stay tight.
tests/test_smoke_refs.py checks every reference against a naive pure-Python loop.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]
Args = dict[str, "NDArray[np.generic] | int | float"]
Result = dict[str, "NDArray[np.generic]"]

E4M3_MAX = 448.0


# --- rounding and decoding helpers -------------------------------------------------------


def bf16_round(x: NDArray[np.generic]) -> F32:
    """Round float32 values to the nearest bf16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    one, sixteen = np.uint64(1), np.uint64(16)
    bits = (bits + np.uint64(0x7FFF) + ((bits >> sixteen) & one)) & np.uint64(0xFFFF0000)
    out = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out).astype(np.float32)


def fp8e4m3_round(x: NDArray[np.generic]) -> F32:
    """Round float32 values to FP8 E4M3 (ties to even, saturating at +-448), as float32."""
    v = np.asarray(x, dtype=np.float32).astype(np.float64)
    mag = np.abs(v)
    _, exp = np.frexp(np.where(mag > 0, mag, 1.0))  # mag = m * 2**exp, 0.5 <= m < 1
    # Spacing of E4M3 values: 2**(e - 3) for normals (e = exp - 1 >= -6), 2**-9 below.
    quantum = np.exp2(np.maximum(exp - 1, -6) - 3)
    rounded = np.round(mag / quantum) * quantum  # np.round: ties to even
    out = np.sign(v) * np.minimum(rounded, E4M3_MAX)
    return np.where(np.isnan(v), np.nan, out).astype(np.float32)


def e2m1_decode(nibbles: NDArray[np.generic]) -> F32:
    """Decode FP4 E2M1 codes (0..15) to float32."""
    n = np.asarray(nibbles).astype(np.int64)
    magnitude = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)[n & 7]
    return np.asarray(np.where(n & 8, -magnitude, magnitude), dtype=np.float32)


def e8m0_decode(codes: NDArray[np.generic]) -> F32:
    """Decode E8M0 scale codes (0..255) to float32; 255 is NaN."""
    c = np.asarray(codes).astype(np.int64)
    return np.where(c == 255, np.nan, np.ldexp(1.0, c - 127)).astype(np.float32)


def unpack_fp4(packed: NDArray[np.generic]) -> F32:
    """[..., K / 2] bytes -> [..., K] decoded E2M1 values (even index in the low nibble)."""
    p = np.asarray(packed).astype(np.int64)
    pairs = np.stack([e2m1_decode(p & 0xF), e2m1_decode(p >> 4)], axis=-1)
    return pairs.reshape(*p.shape[:-1], p.shape[-1] * 2)


def _arr(args: Args, name: str) -> F32:
    """An in/inout buffer as float32."""
    return np.asarray(args[name], dtype=np.float32)


def _ints(args: Args, name: str) -> NDArray[np.int64]:
    """An integer buffer as int64."""
    return np.asarray(args[name]).astype(np.int64)


def _num(args: Args, name: str) -> float:
    """A scalar argument."""
    value = args[name]
    if isinstance(value, np.ndarray):
        raise TypeError(f"smoke arg {name!r} must be a scalar, got an array")
    return float(value)


# --- references ---------------------------------------------------------------------------


def _rmsnorm(x: F32, w: F32, eps: float, offset: float) -> F32:
    x64 = x.astype(np.float64)
    inv = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return bf16_round((x64 * inv * (offset + w.astype(np.float64))).astype(np.float32))


def rmsnorm(args: Args) -> Result:
    """common/rmsnorm.cu: out = x / rms(x) * w."""
    return {"out": _rmsnorm(_arr(args, "x"), _arr(args, "w"), _num(args, "eps"), 0.0)}


def rmsnorm_gemma(args: Args) -> Result:
    """gemma3-4b/bf16/rmsnorm.cu: out = x / rms(x) * (1 + w)."""
    return {"out": _rmsnorm(_arr(args, "x"), _arr(args, "w"), _num(args, "eps"), 1.0)}


def qk_norm(args: Args) -> Result:
    """qwen3-8b/bf16/qk_norm.cu: per-head RMSNorm, in place."""
    return {"x": _rmsnorm(_arr(args, "x"), _arr(args, "w"), _num(args, "eps"), 0.0)}


def _split_gate_up(args: Args) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    gate_up = _arr(args, "gate_up").astype(np.float64)
    d = int(_num(args, "d"))
    return gate_up[:, :d], gate_up[:, d:]


def silu_mul(args: Args) -> Result:
    """common/silu_mul.cu: out = silu(gate) * up."""
    g, u = _split_gate_up(args)
    return {"out": bf16_round((g / (1.0 + np.exp(-g)) * u).astype(np.float32))}


def gelu_tanh_mul(args: Args) -> Result:
    """gemma3-4b/bf16/gelu_tanh_mul.cu: out = gelu_tanh(gate) * up."""
    g, u = _split_gate_up(args)
    gelu = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3)))
    return {"out": bf16_round((gelu * u).astype(np.float32))}


def residual_add(args: Args) -> Result:
    """common/residual_add.cu: hidden += residual (fp32 add, bf16 store)."""
    return {"hidden": bf16_round(_arr(args, "hidden") + _arr(args, "residual"))}


def rope_neox(args: Args) -> Result:
    """common/rope.cu: NeoX rotate-half RoPE on x [tokens, heads, head_dim], in place."""
    x = _arr(args, "x").astype(np.float64)
    head_dim = x.shape[-1]
    half = head_dim // 2
    i = np.arange(half, dtype=np.float32)
    freq = np.power(np.float32(_num(args, "theta")), np.float32(-2.0) * i / np.float32(head_dim))
    angle = _ints(args, "positions").astype(np.float32)[:, None] * freq[None, :]  # [tokens, half]
    cos = np.cos(angle.astype(np.float64))[:, None, :]
    sin = np.sin(angle.astype(np.float64))[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    out = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return {"x": bf16_round(out.astype(np.float32))}


def _gemv(w: NDArray[np.generic], x: NDArray[np.generic], scale: float = 1.0) -> F32:
    y = w.astype(np.float64) @ x.astype(np.float64) * scale
    return bf16_round(y.astype(np.float32))


def gemv_bf16(args: Args) -> Result:
    """common/gemv_bf16.cu (and the Hopper and B300 versions): y = W @ x."""
    return {"y": _gemv(_arr(args, "w"), _arr(args, "x"))}


def gemv_nvfp4(args: Args) -> Result:
    """common/gemv_nvfp4.cu: y = global_scale * (e2m1(W) * e4m3 scale per 16) @ x."""
    w = unpack_fp4(_ints(args, "w_packed"))
    scales = np.repeat(_arr(args, "scales"), 16, axis=-1)
    return {"y": _gemv(w * scales, _arr(args, "x"), _num(args, "global_scale"))}


def gemv_mxfp4(args: Args) -> Result:
    """llama3-8b/mxfp4/gemv_mxfp4.cu: y = (e2m1(W) * 2^(e8m0 - 127) per 32) @ x."""
    w = unpack_fp4(_ints(args, "w_packed"))
    scales = np.repeat(e8m0_decode(_ints(args, "scales")), 32, axis=-1)
    return {"y": _gemv(w * scales, _arr(args, "x"))}


def gemv_w8a8(args: Args) -> Result:
    """hopper qwen3-8b/fp8/gemv_w8a8.cu: y = (W @ xq) * w_scales * x_scale[0]."""
    acc = _arr(args, "w").astype(np.float64) @ _arr(args, "xq").astype(np.float64)
    y = acc * _arr(args, "w_scales").astype(np.float64) * float(_arr(args, "x_scale")[0])
    return {"y": bf16_round(y.astype(np.float32))}


def fp8_act_quant(args: Args) -> Result:
    """hopper common/fp8_act_quant.cu: per-row amax scaling to E4M3 (float32 math)."""
    x = _arr(args, "x")
    amax = np.maximum(np.max(np.abs(x), axis=-1), np.float32(1e-12)).astype(np.float32)
    inv_scale = (np.float32(E4M3_MAX) / amax).astype(np.float32)
    q = fp8e4m3_round((x * inv_scale[:, None]).astype(np.float32))
    return {"q": q, "scales": (amax / np.float32(E4M3_MAX)).astype(np.float32)}


def moe_topk_softmax(args: Args) -> Result:
    """qwen3-30b-a3b/bf16/moe_topk.cu: softmax, top k by logit (lower index on ties)."""
    logits = _arr(args, "logits").astype(np.float64)
    k = int(_num(args, "k"))
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    # Stable sort of the negated logits: descending value, ascending index on ties.
    ids = np.argsort(-_arr(args, "logits"), axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if int(_num(args, "renormalize")):
        weights /= weights.sum(axis=-1, keepdims=True)
    return {"weights": weights.astype(np.float32), "ids": ids.astype(np.int32)}


def paged_attn_decode(args: Args) -> Result:
    """common/paged_attn_decode.cu: one-token decode attention over a paged KV cache."""
    q = _arr(args, "q").astype(np.float64)  # [seqs, heads, head_dim]
    k_cache = _arr(args, "k_cache").astype(np.float64)  # [pages, page_size, kv_heads, dim]
    v_cache = _arr(args, "v_cache").astype(np.float64)
    tables = _ints(args, "block_tables")
    seq_lens = _ints(args, "seq_lens")
    seqs, heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    scale = _num(args, "scale")
    out = np.zeros((seqs, heads, head_dim), dtype=np.float64)
    for s in range(seqs):
        t = np.arange(seq_lens[s])
        pages = tables[s, t // page_size]
        keys = k_cache[pages, t % page_size]  # [seq_len, kv_heads, dim]
        values = v_cache[pages, t % page_size]
        for h in range(heads):
            kv_h = h // (heads // kv_heads)
            scores = keys[:, kv_h] @ q[s, h] * scale
            p = np.exp(scores - scores.max())
            out[s, h] = (p / p.sum()) @ values[:, kv_h]
    return {"out": bf16_round(out.astype(np.float32))}
