"""The numbers of a smoke case: dtype conversions, the drawn inputs, the comparison.

bf16 and OCP FP8 E4M3 are stored as bit patterns (uint16, uint8) and converted
here exactly (round to nearest even; FP8 saturates like CUDA's ``SATFINITE``).
:func:`make_inputs` draws a case's inputs from ``numpy.random.default_rng(seed)``
(the same seed gives the same bytes); :func:`compare_outputs` checks them against
the reference within the case's tolerances. All pure.

Needs NumPy (the optional ``metrale-orch[gpu]`` extra): nothing else of the smoke
package imports this module at import time; :mod:`metrale_orch.smoke.run` loads it
only when a case runs on a device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from metrale_orch.smoke.cases import (
    ARG_DTYPES,
    FLOAT_DTYPES,
    SCALAR_DTYPES,
    ArgSpec,
    SmokeCase,
)
from metrale_orch.smoke.errors import SmokeCaseError

__all__ = [
    "CaseInputs",
    "Comparison",
    "bf16_decode",
    "bf16_encode",
    "compare_outputs",
    "decode",
    "encode",
    "fp8e4m3_decode",
    "fp8e4m3_encode",
    "make_inputs",
]

#: A kernel parameter on the host: a storage array, or a numpy scalar.
Param = npt.NDArray[np.generic] | np.generic


def bf16_encode(values: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays a quiet NaN."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    out = np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)
    return out


def bf16_decode(bits: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """bfloat16 bit patterns (uint16) -> float32, exactly."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def _fp8_table() -> npt.NDArray[np.float32]:
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    table = sign * mag
    table[(exp == 15) & (man == 7)] = np.nan
    return table.astype(np.float32)


def fp8e4m3_decode(bits: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """OCP FP8 E4M3 (``e4m3fn``: bias 7, no infinities, S.1111.111 is NaN) bytes -> float32."""
    b = np.asarray(bits, dtype=np.uint8)
    return _fp8_table()[b]


def fp8e4m3_encode(values: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """float32 -> FP8 E4M3 bytes: round to nearest even, saturating to +-448 (CUDA ``SATFINITE``).

    NaN -> 0x7F (sign kept); infinities saturate like any out-of-range value.
    """
    f = np.asarray(values, dtype=np.float32)
    mags = _fp8_table()[:0x7F].astype(np.float64)  # codes 0x00..0x7E, increasing
    a = np.abs(f.astype(np.float64))
    hi = np.clip(np.searchsorted(mags, a, side="left"), 0, 0x7E)
    lo = np.clip(hi - 1, 0, 0x7E)
    d_hi = np.abs(mags[hi] - a)
    d_lo = np.abs(a - mags[lo])
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0))
    code = np.where(pick_lo, lo, hi)
    code = np.where(a >= mags[-1], 0x7E, code)
    code = np.where(np.isnan(f), 0x7F, code)
    sign = np.signbit(f).astype(np.int64) << 7
    out: npt.NDArray[np.uint8] = (code | sign).astype(np.uint8)
    return out


def encode(dtype: str, values: npt.ArrayLike) -> npt.NDArray[np.generic]:
    """float32 (or integer) values -> the storage array of smoke dtype ``dtype``.

    Integers are range-checked: an out-of-range value raises ValueError.
    """
    if dtype == "bf16":
        return bf16_encode(values)
    if dtype == "fp8e4m3":
        return fp8e4m3_encode(values)
    if dtype in ("f16", "f32"):
        with np.errstate(over="ignore"):  # overflow to inf is the conversion's defined result
            return np.asarray(values, dtype=np.float32).astype(ARG_DTYPES[dtype])
    target = np.dtype(ARG_DTYPES[dtype])
    arr = np.asarray(values)
    if arr.size:
        info = np.iinfo(target)
        if arr.min() < info.min or arr.max() > info.max:
            raise ValueError(f"values out of {dtype} range [{info.min}, {info.max}]")
    return arr.astype(target)


def decode(dtype: str, stored: npt.ArrayLike) -> npt.NDArray[np.generic]:
    """A storage array of smoke dtype ``dtype`` -> float32 (floats) or its integer array."""
    if dtype == "bf16":
        return bf16_decode(stored)
    if dtype == "fp8e4m3":
        return fp8e4m3_decode(stored)
    if dtype in ("f16", "f32"):
        return np.asarray(stored).astype(np.float32)
    return np.asarray(stored, dtype=ARG_DTYPES[dtype])


def _draw(rng: np.random.Generator, arg: ArgSpec) -> npt.NDArray[np.generic]:
    shape = arg.shape
    is_float = arg.dtype in FLOAT_DTYPES
    if arg.init == "normal":
        return rng.standard_normal(size=shape, dtype=np.float32) * np.float32(arg.scale)
    if arg.init == "uniform":
        assert arg.low is not None and arg.high is not None
        low, span = np.float32(arg.low), np.float32(arg.high - arg.low)
        return low + span * rng.random(size=shape, dtype=np.float32)
    if arg.init == "randint":
        assert arg.low is not None and arg.high is not None
        ints = rng.integers(int(arg.low), int(arg.high), size=shape, dtype=np.int64)
        return ints.astype(np.float32) if is_float else ints
    if arg.init == "arange":
        ints = np.arange(arg.size, dtype=np.int64).reshape(shape)
        return ints.astype(np.float32) if is_float else ints
    return np.zeros(shape, dtype=np.float32 if is_float else np.int64)


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseInputs:
    """The host side of one launch.

    ``params``: kernel parameters in order (storage arrays, numpy scalars).
    ``reference_args``: what the reference gets (decoded arrays, Python numbers).
    """

    params: tuple[Param, ...]
    reference_args: Mapping[str, object]


def make_inputs(case: SmokeCase) -> CaseInputs:
    """Draw the case's inputs with ``numpy.random.default_rng(case.seed)``, args in order.

    Floats are drawn in float32 and rounded to the storage dtype; the
    reference sees the rounded values decoded to float32. Out buffers are
    zero-filled and draw nothing. Raises :class:`SmokeCaseError` for an integer
    init that does not fit its dtype.
    """
    rng = np.random.default_rng(case.seed)
    params: list[Param] = []
    ref: dict[str, object] = {}
    for arg in case.args:
        if arg.kind == "scalar":
            assert arg.value is not None
            scalar = np.dtype(SCALAR_DTYPES[arg.dtype]).type(arg.value)
            params.append(scalar)
            ref[arg.name] = scalar.item()
            continue
        if arg.kind == "out":
            params.append(np.zeros(arg.shape, dtype=ARG_DTYPES[arg.dtype]))
            continue
        try:
            stored = encode(arg.dtype, _draw(rng, arg))
        except ValueError as exc:
            raise SmokeCaseError(case.source, case.name, f"args.{arg.name}", str(exc)) from None
        params.append(stored)
        ref[arg.name] = decode(arg.dtype, stored)
    return CaseInputs(params=tuple(params), reference_args=MappingProxyType(ref))


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """Result of comparing one case's outputs with the reference."""

    ok: bool
    max_abs_error: float
    message: str


def compare_outputs(
    case: SmokeCase, got: Mapping[str, object], want: Mapping[str, object]
) -> Comparison:
    """Check ``|got - want| <= atol + rtol * |want|`` for every out/inout buffer.

    ``got``: storage arrays from the device; ``want``: the reference's result.
    NaN matches NaN; equal infinities match. Pure.
    """
    problems: list[str] = []
    worst = 0.0
    for arg in case.args:
        if arg.kind not in ("out", "inout"):
            continue
        if arg.name not in want:
            problems.append(f"{arg.name}: the reference returned no value")
            continue
        w = np.asarray(want[arg.name])
        if w.shape != arg.shape:
            problems.append(
                f"{arg.name}: the reference returned shape {w.shape}, declared {arg.shape}"
            )
            continue
        g = decode(arg.dtype, np.asarray(got[arg.name]).reshape(arg.shape))
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(g64 - w64)
            both_nan = np.isnan(g64) & np.isnan(w64)
            fine = both_nan | (g64 == w64) | (diff <= case.atol + case.rtol * np.abs(w64))
        diff = np.where(both_nan | (g64 == w64), 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)
        err = float(diff.max()) if diff.size else 0.0
        worst = max(worst, err)
        bad = int((~fine).sum())
        if bad:
            at = np.unravel_index(int(np.argmax(np.where(fine, -1.0, diff))), arg.shape)
            idx = tuple(int(i) for i in at)
            problems.append(
                f"{arg.name}: {bad} of {g.size} elements outside atol={case.atol:g} +"
                f" rtol={case.rtol:g}*|want| (max abs error {err:.4g}; at {list(idx)}"
                f" got {g64[idx]:.6g}, want {w64[idx]:.6g})"
            )
    return Comparison(ok=not problems, max_abs_error=worst, message="; ".join(problems))
