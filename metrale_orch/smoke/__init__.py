"""Smoke tests of a hardware's artefacts (SPEC 3.5): static checks always, numbers on a device.

For every target of one hardware, :func:`run_smoke` reads the target's
``manifest.json`` (SPEC 4.1) and its smoke cases (``SMOKE.toml`` beside the
kernels, format in the team's SMOKE_FORMAT), then:

- **statically** checks every artefact, with no GPU: the manifest's xxh3 of
  the file matches; PTX ``.target`` equals the manifest arch; a cubin is a
  CUDA ELF for that SM (and variant, where ptxas recorded it); a fatbin holds
  an image for it; every ``extern "C"`` entry a smoke case names is present.
  Entries, registers and shared memory are reported;
- **numerically**, when CuPy finds a device whose compute capability can run
  the artefact's arch, loads the module with ``cupy.RawModule``, launches each
  case on inputs drawn from ``numpy.random.default_rng(seed)``, and compares
  with the NumPy reference of ``kernels/smoke_refs.py`` within the case's
  tolerance, reporting the max abs error. Otherwise the numeric part is
  skipped with the exact reason.

The result is a :class:`SmokeReport`; :meth:`SmokeReport.to_junit_xml` renders
``build/smoke-<hw>.xml``. CuPy and NumPy are imported inside functions only
(both are optional: ``metrale-orch[gpu]``); the static part needs neither.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import re
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol
from xml.etree import ElementTree as ET

from metrale_orch.errors import MetraleError
from metrale_orch.smoke.elf import (
    CubinInfo,
    ElfError,
    FatbinInfo,
    is_elf,
    is_fatbin,
    parse_cubin,
    parse_fatbin,
)
from metrale_orch.smoke.ptx import PtxError, PtxInfo, parse_ptx

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from metrale_orch.config import Config
    from metrale_orch.tree import Layout, LayoutError, Target

__all__ = [
    "ARG_DTYPES",
    "ArgSpec",
    "ArtefactInfo",
    "CaseResult",
    "DeviceInfo",
    "DeviceStatus",
    "SmokeCase",
    "SmokeCaseError",
    "SmokeError",
    "SmokeReport",
    "arch_runnable",
    "bf16_decode",
    "bf16_encode",
    "compare_outputs",
    "decode",
    "encode",
    "fp8e4m3_decode",
    "fp8e4m3_encode",
    "inspect_artefact",
    "load_references",
    "make_inputs",
    "merge_cases",
    "parse_arch",
    "parse_smoke_doc",
    "probe_device",
    "run_smoke",
    "run_smoke_action",
    "scan_cases",
    "smoke_tasks",
    "static_problems",
    "write_junit",
]

log = logging.getLogger(__name__)

SMOKE_TOML = "SMOKE.toml"
REFS_FILE = "smoke_refs.py"

#: Buffer dtypes of the smoke format -> numpy storage dtype name.
ARG_DTYPES: Mapping[str, str] = MappingProxyType(
    {
        "bf16": "uint16",
        "f16": "float16",
        "f32": "float32",
        "i32": "int32",
        "u32": "uint32",
        "i8": "int8",
        "u8": "uint8",
        "fp8e4m3": "uint8",
    }
)
_FLOAT_DTYPES = frozenset({"bf16", "f16", "f32", "fp8e4m3"})
_SCALAR_DTYPES: Mapping[str, str] = MappingProxyType(
    {"i32": "int32", "u32": "uint32", "f32": "float32"}
)
_KINDS = ("in", "out", "inout", "scalar")
_INITS = ("normal", "uniform", "randint", "zeros", "arange")


# --------------------------------------------------------------------------- errors


class SmokeError(MetraleError):
    """Base of the smoke area's errors."""


class SmokeCaseError(SmokeError):
    """A ``SMOKE.toml`` case is malformed; names the file, the case and the key."""

    def __init__(self, path: str, case: str, key: str, problem: str) -> None:
        self.path = path
        self.case = case
        self.key = key
        self.problem = problem
        where = f"{path}: case {case!r}" if case else path
        super().__init__(f"{where}: {key}: {problem} (see the smoke case format)")


# --------------------------------------------------------------------------- arches


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class ArchSpec:
    """``sm_<sm><variant>``: ``sm`` = 10 * major + minor, ``variant`` in "", "a", "f"."""

    sm: int
    variant: str

    @property
    def cc(self) -> tuple[int, int]:
        """The compute capability it was built for, (major, minor)."""
        return divmod(self.sm, 10)

    def __str__(self) -> str:
        return f"sm_{self.sm}{self.variant}"


_ARCH_RE = re.compile(r"^(?:sm|compute)_(\d{2,3})([af]?)$")


def parse_arch(text: str) -> ArchSpec:
    """Parse ``sm_90a`` / ``compute_121f`` / ``sm_80``. Raises ValueError for anything else."""
    m = _ARCH_RE.match(text.strip())
    if not m:
        raise ValueError(f"not a CUDA arch: {text!r} (expected sm_<NN>[a|f])")
    return ArchSpec(sm=int(m.group(1)), variant=m.group(2))


def arch_runnable(arch: str, kind: str, cc: tuple[int, int]) -> str | None:
    """None when a device of compute capability ``cc`` can run ``arch`` code of ``kind``.

    Otherwise the reason. ``kind`` is ``ptx``, ``cubin`` or ``fatbin``. Rules:
    ``a`` variants run only on exactly their cc; ``f`` (family) variants on the
    same major with a minor at least theirs; a plain cubin likewise (binary
    compatibility within a major); plain PTX on any cc at least its own (the
    driver JIT-compiles forward). A fatbin is judged as PTX when it may carry
    PTX, which is the most permissive of its images.
    """
    spec = parse_arch(arch)
    major, minor = spec.cc
    dev = f"{cc[0]}.{cc[1]}"
    if spec.variant == "a":
        if cc != (major, minor):
            return (
                f"{arch} ({kind}) runs only on compute capability {major}.{minor}, device is {dev}"
            )
        return None
    if spec.variant == "f" or kind == "cubin":
        what = "family" if spec.variant == "f" else "binary"
        if cc[0] != major or cc[1] < minor:
            return (
                f"{arch} ({kind}) runs only on compute capability {major}.x with x >= {minor}"
                f" ({what} compatibility), device is {dev}"
            )
        return None
    if cc < (major, minor):
        return f"{arch} ({kind}) needs compute capability >= {major}.{minor}, device is {dev}"
    return None


# --------------------------------------------------------------------------- device


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    """The CUDA device the numeric smoke runs on."""

    index: int
    name: str
    cc: tuple[int, int]

    def describe(self) -> str:
        """``NVIDIA H200 (cc 9.0)``."""
        return f"{self.name} (cc {self.cc[0]}.{self.cc[1]})"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceStatus:
    """Outcome of the device probe.

    ``device`` set: numbers can run. ``device`` None and ``error`` empty: no
    device (``reason`` says exactly why: skip). ``error`` set: a device is
    present but failed (every numeric case fails with it).
    """

    device: DeviceInfo | None = None
    reason: str = ""
    error: str = ""


#: A device probe: returns the status; never raises. Tests inject their own.
DeviceProbe = Callable[[], DeviceStatus]


def probe_device(index: int = 0) -> DeviceStatus:
    """Ask CuPy for CUDA device ``index`` (CUDA_VISIBLE_DEVICES applies).

    No CuPy (ImportError), no driver (``RuntimeError`` "failed to load
    libcuda", or a driver version of 0) and no device
    (``CUDARuntimeError``, or a count of 0) give a status with the reason;
    a CUDA error while reading a present device's properties gives ``error``.
    """
    try:
        import cupy  # noqa: F401
        from cupy.cuda import driver, runtime
    except ImportError as exc:
        return DeviceStatus(
            reason=f"CuPy is not installed ({exc}); install 'metrale-orch[gpu]' for the numbers"
        )
    try:
        if runtime.driverGetVersion() == 0:
            try:
                driver.ctxGetCurrent()
            except RuntimeError as exc:
                return DeviceStatus(reason=f"no CUDA driver: {exc}")
            return DeviceStatus(reason="no CUDA driver: cudaDriverGetVersion reports 0")
        count = runtime.getDeviceCount()
    except runtime.CUDARuntimeError as exc:
        return DeviceStatus(reason=f"no CUDA device: {exc}")
    except RuntimeError as exc:  # CuPy: "failed to load libcuda.so.1"
        return DeviceStatus(reason=f"no CUDA driver: {exc}")
    if count <= index:
        return DeviceStatus(reason=f"no CUDA device: the driver reports {count} device(s)")
    try:
        props = runtime.getDeviceProperties(index)
    except (runtime.CUDARuntimeError, driver.CUDADriverError) as exc:
        return DeviceStatus(error=f"CUDA device {index} is present but failed: {exc}")
    name = props.get("name", b"")
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    return DeviceStatus(
        device=DeviceInfo(
            index=index, name=str(name), cc=(int(props["major"]), int(props["minor"]))
        )
    )


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgSpec:
    """One kernel parameter of a smoke case."""

    name: str
    kind: str  # in | out | inout | scalar
    dtype: str
    shape: tuple[int, ...] = ()
    init: str | None = None
    scale: float = 1.0
    low: float | None = None
    high: float | None = None
    value: int | float | None = None

    @property
    def size(self) -> int:
        """Number of elements of the buffer (1 for a scalar)."""
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class SmokeCase:
    """One launch of one kernel entry with its inputs and reference."""

    name: str
    module: str
    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    reference: str
    seed: int
    atol: float
    rtol: float
    min_cc: tuple[int, int] | None
    args: tuple[ArgSpec, ...]
    #: Root-relative POSIX path of the SMOKE.toml that declared it.
    source: str


def _dim3(value: Any, path: str, case: str, key: str) -> tuple[int, int, int]:
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise SmokeCaseError(path, case, key, f"must be 1 to 3 positive integers, got {value!r}")
    dims = [*value, 1, 1][:3]
    return (dims[0], dims[1], dims[2])


def _num(value: Any, path: str, case: str, key: str, *, nonneg: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SmokeCaseError(path, case, key, f"must be a number, got {value!r}")
    if nonneg and value < 0:
        raise SmokeCaseError(path, case, key, f"must be >= 0, got {value!r}")
    return float(value)


def _int(value: Any, path: str, case: str, key: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SmokeCaseError(path, case, key, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _str(value: Any, path: str, case: str, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SmokeCaseError(path, case, key, f"must be a non-empty string, got {value!r}")
    return value


_CASE_KEYS = frozenset(
    {
        "name",
        "module",
        "entry",
        "grid",
        "block",
        "shared_bytes",
        "reference",
        "seed",
        "atol",
        "rtol",
        "min_cc",
        "args",
    }
)
_ARG_KEYS = frozenset({"name", "kind", "dtype", "shape", "init", "scale", "low", "high", "value"})


def _parse_arg(raw: Any, path: str, case: str, i: int) -> ArgSpec:
    key = f"args[{i}]"
    if not isinstance(raw, dict):
        raise SmokeCaseError(path, case, key, "must be a table")
    unknown = sorted(set(raw) - _ARG_KEYS)
    if unknown:
        raise SmokeCaseError(path, case, f"{key}.{unknown[0]}", "unknown key")
    name = _str(raw.get("name"), path, case, f"{key}.name")
    kind = raw.get("kind")
    if kind not in _KINDS:
        raise SmokeCaseError(path, case, f"{key}.kind", f"must be one of {_KINDS}, got {kind!r}")
    dtype = str(raw.get("dtype"))
    if kind == "scalar":
        if dtype not in _SCALAR_DTYPES:
            raise SmokeCaseError(
                path, case, f"{key}.dtype", f"a scalar must be i32, u32 or f32, got {dtype!r}"
            )
        value = raw.get("value")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SmokeCaseError(path, case, f"{key}.value", "a scalar needs a numeric value")
        if dtype != "f32" and not isinstance(value, int):
            raise SmokeCaseError(path, case, f"{key}.value", f"{dtype} needs an integer")
        if dtype == "i32" and not -(2**31) <= value < 2**31:
            raise SmokeCaseError(path, case, f"{key}.value", "out of i32 range")
        if dtype == "u32" and not 0 <= value < 2**32:
            raise SmokeCaseError(path, case, f"{key}.value", "out of u32 range")
        return ArgSpec(name=name, kind=kind, dtype=dtype, value=value)
    if dtype not in ARG_DTYPES:
        raise SmokeCaseError(
            path, case, f"{key}.dtype", f"must be one of {sorted(ARG_DTYPES)}, got {dtype!r}"
        )
    shape = raw.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape)
    ):
        raise SmokeCaseError(
            path, case, f"{key}.shape", f"must be positive integers, got {shape!r}"
        )
    init = raw.get("init")
    if kind == "out":
        if init is not None:
            raise SmokeCaseError(path, case, f"{key}.init", "an out buffer is zero-filled")
    elif init not in _INITS:
        raise SmokeCaseError(path, case, f"{key}.init", f"must be one of {_INITS}, got {init!r}")
    if init in ("normal", "uniform") and dtype not in _FLOAT_DTYPES:
        raise SmokeCaseError(path, case, f"{key}.init", f"{init} needs a float dtype, not {dtype}")
    low = high = None
    if init in ("uniform", "randint"):
        for bound in ("low", "high"):
            if bound not in raw:
                raise SmokeCaseError(path, case, f"{key}.{bound}", f"{init} needs {bound}")
        low = _num(raw["low"], path, case, f"{key}.low")
        high = _num(raw["high"], path, case, f"{key}.high")
        if not low < high:
            raise SmokeCaseError(path, case, f"{key}.high", "must be greater than low")
        if init == "randint" and not (low.is_integer() and high.is_integer()):
            raise SmokeCaseError(path, case, f"{key}.low", "randint bounds must be integers")
    scale = _num(raw.get("scale", 1.0), path, case, f"{key}.scale")
    return ArgSpec(
        name=name,
        kind=kind,
        dtype=dtype,
        shape=tuple(shape),
        init=init,
        scale=scale,
        low=low,
        high=high,
    )


def parse_smoke_doc(doc: Mapping[str, Any], path: str) -> tuple[SmokeCase, ...]:
    """The cases of one parsed ``SMOKE.toml`` (``path``: root-relative, for messages).

    Raises :class:`SmokeCaseError` for a malformed case.
    """
    unknown_top = sorted(set(doc) - {"case"})
    if unknown_top:
        raise SmokeCaseError(path, "", unknown_top[0], "unknown table (only [[case]] is read)")
    raw_cases = doc.get("case", [])
    if not isinstance(raw_cases, list):
        raise SmokeCaseError(path, "", "case", "must be an array of tables ([[case]])")
    cases: list[SmokeCase] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_cases):
        if not isinstance(raw, dict):
            raise SmokeCaseError(path, "", f"case[{i}]", "must be a table")
        name = _str(raw.get("name"), path, f"#{i}", "name")
        if name in seen:
            raise SmokeCaseError(path, name, "name", "declared twice in this file")
        seen.add(name)
        unknown = sorted(set(raw) - _CASE_KEYS)
        if unknown:
            raise SmokeCaseError(path, name, unknown[0], "unknown key")
        raw_args = raw.get("args")
        if not isinstance(raw_args, list):
            raise SmokeCaseError(path, name, "args", "must be an array of tables")
        args = tuple(_parse_arg(a, path, name, j) for j, a in enumerate(raw_args))
        names = [a.name for a in args]
        if len(set(names)) != len(names):
            raise SmokeCaseError(path, name, "args", "argument names must be unique")
        min_cc = None
        if "min_cc" in raw:
            text = raw["min_cc"]
            m = re.fullmatch(r"(\d+)\.(\d)", text) if isinstance(text, str) else None
            if m is None:
                raise SmokeCaseError(path, name, "min_cc", f'must be like "9.0", got {text!r}')
            min_cc = (int(m.group(1)), int(m.group(2)))
        cases.append(
            SmokeCase(
                name=name,
                module=_str(raw.get("module"), path, name, "module"),
                entry=_str(raw.get("entry"), path, name, "entry"),
                grid=_dim3(raw.get("grid"), path, name, "grid"),
                block=_dim3(raw.get("block"), path, name, "block"),
                shared_bytes=_int(raw.get("shared_bytes", 0), path, name, "shared_bytes"),
                reference=_str(raw.get("reference"), path, name, "reference"),
                seed=_int(raw.get("seed", 0), path, name, "seed"),
                atol=_num(raw.get("atol", 0.0), path, name, "atol", nonneg=True),
                rtol=_num(raw.get("rtol", 0.0), path, name, "rtol", nonneg=True),
                min_cc=min_cc,
                args=args,
                source=path,
            )
        )
    return tuple(cases)


def merge_cases(
    files: Sequence[tuple[str, Mapping[str, Any]]], stems: Sequence[str] | None = None
) -> tuple[SmokeCase, ...]:
    """Merge parsed SMOKE.toml files given least specific first; a later same-name case wins.

    ``files``: (root-relative path, parsed doc). Only cases whose module is in
    ``stems`` are kept (all when None). Sorted by (module, name).
    """
    merged: dict[str, SmokeCase] = {}
    for path, doc in files:
        for case in parse_smoke_doc(doc, path):
            merged[case.name] = case
    keep = None if stems is None else set(stems)
    return tuple(
        sorted(
            (c for c in merged.values() if keep is None or c.module in keep),
            key=lambda c: (c.module, c.name),
        )
    )


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def scan_cases(root: Path, layout: Layout) -> tuple[SmokeCase, ...]:
    """Read the SMOKE.toml of each existing layer directory of ``layout`` and merge them.

    Layer order is the ``configs()`` order (parent common, own common, parent
    leaf, own leaf). Raises :class:`SmokeCaseError` for an unreadable file or a
    malformed case.
    """
    files: list[tuple[str, Mapping[str, Any]]] = []
    for layer in reversed(layout.layers):
        path = layer.dir / SMOKE_TOML
        if not path.is_file():
            continue
        rel = _rel(path, root)
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SmokeCaseError(rel, "", "(file)", f"cannot be read: {exc}") from None
        files.append((rel, doc))
    return merge_cases(files, [stem for stem, _ in layout.modules()])


# --------------------------------------------------------------------------- conversions


def _np() -> Any:
    import numpy

    return numpy


def bf16_encode(values: npt.ArrayLike) -> np.ndarray[Any, Any]:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays a quiet NaN."""
    np = _np()
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    out = np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)
    return out  # type: ignore[no-any-return]


def bf16_decode(bits: npt.ArrayLike) -> np.ndarray[Any, Any]:
    """bfloat16 bit patterns (uint16) -> float32, exactly."""
    np = _np()
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)  # type: ignore[no-any-return]


def _fp8_table() -> np.ndarray[Any, Any]:
    np = _np()
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    table = sign * mag
    table[(exp == 15) & (man == 7)] = np.nan
    return table.astype(np.float32)  # type: ignore[no-any-return]


def fp8e4m3_decode(bits: npt.ArrayLike) -> np.ndarray[Any, Any]:
    """OCP FP8 E4M3 (``e4m3fn``: bias 7, no infinities, S.1111.111 is NaN) bytes -> float32."""
    np = _np()
    b = np.asarray(bits, dtype=np.uint8)
    return _fp8_table()[b]  # type: ignore[no-any-return]


def fp8e4m3_encode(values: npt.ArrayLike) -> np.ndarray[Any, Any]:
    """float32 -> FP8 E4M3 bytes: round to nearest even, saturating to +-448 (CUDA ``SATFINITE``).

    NaN -> 0x7F (sign kept); infinities saturate like any out-of-range value.
    """
    np = _np()
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
    return (code | sign).astype(np.uint8)  # type: ignore[no-any-return]


def encode(dtype: str, values: npt.ArrayLike) -> np.ndarray[Any, Any]:
    """float32 (or integer) values -> the storage array of smoke dtype ``dtype``.

    Integers are range-checked: an out-of-range value raises ValueError.
    """
    np = _np()
    if dtype == "bf16":
        return bf16_encode(values)
    if dtype == "fp8e4m3":
        return fp8e4m3_encode(values)
    if dtype in ("f16", "f32"):
        with np.errstate(over="ignore"):  # overflow to inf is the conversion's defined result
            return np.asarray(values, dtype=np.float32).astype(ARG_DTYPES[dtype])  # type: ignore[no-any-return]
    target = np.dtype(ARG_DTYPES[dtype])
    arr = np.asarray(values)
    if arr.size:
        info = np.iinfo(target)
        if arr.min() < info.min or arr.max() > info.max:
            raise ValueError(f"values out of {dtype} range [{info.min}, {info.max}]")
    return arr.astype(target)  # type: ignore[no-any-return]


def decode(dtype: str, stored: npt.ArrayLike) -> np.ndarray[Any, Any]:
    """A storage array of smoke dtype ``dtype`` -> float32 (floats) or its integer array."""
    np = _np()
    if dtype == "bf16":
        return bf16_decode(stored)
    if dtype == "fp8e4m3":
        return fp8e4m3_decode(stored)
    if dtype in ("f16", "f32"):
        return np.asarray(stored).astype(np.float32)  # type: ignore[no-any-return]
    return np.asarray(stored, dtype=ARG_DTYPES[dtype])  # type: ignore[no-any-return]


def _draw(rng: Any, arg: ArgSpec) -> np.ndarray[Any, Any]:
    np = _np()
    shape = arg.shape
    is_float = arg.dtype in _FLOAT_DTYPES
    if arg.init == "normal":
        return rng.standard_normal(size=shape, dtype=np.float32) * np.float32(arg.scale)  # type: ignore[no-any-return]
    if arg.init == "uniform":
        assert arg.low is not None and arg.high is not None
        low, span = np.float32(arg.low), np.float32(arg.high - arg.low)
        return low + span * rng.random(size=shape, dtype=np.float32)  # type: ignore[no-any-return]
    if arg.init == "randint":
        assert arg.low is not None and arg.high is not None
        ints = rng.integers(int(arg.low), int(arg.high), size=shape, dtype=np.int64)
        return ints.astype(np.float32) if is_float else ints  # type: ignore[no-any-return]
    if arg.init == "arange":
        ints = np.arange(arg.size, dtype=np.int64).reshape(shape)
        return ints.astype(np.float32) if is_float else ints  # type: ignore[no-any-return]
    return np.zeros(shape, dtype=np.float32 if is_float else np.int64)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseInputs:
    """The host side of one launch.

    ``params``: kernel parameters in order (storage arrays, numpy scalars).
    ``reference_args``: what the reference gets (decoded arrays, Python numbers).
    """

    params: tuple[Any, ...]
    reference_args: Mapping[str, Any]


def make_inputs(case: SmokeCase) -> CaseInputs:
    """Draw the case's inputs with ``numpy.random.default_rng(case.seed)``, args in order.

    Floats are drawn in float32 and rounded to the storage dtype; the
    reference sees the rounded values decoded to float32. Out buffers are
    zero-filled and draw nothing. Raises :class:`SmokeCaseError` for an integer
    init that does not fit its dtype.
    """
    np = _np()
    rng = np.random.default_rng(case.seed)
    params: list[Any] = []
    ref: dict[str, Any] = {}
    for arg in case.args:
        if arg.kind == "scalar":
            assert arg.value is not None
            scalar = np.dtype(_SCALAR_DTYPES[arg.dtype]).type(arg.value)
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


def compare_outputs(case: SmokeCase, got: Mapping[str, Any], want: Mapping[str, Any]) -> Comparison:
    """Check ``|got - want| <= atol + rtol * |want|`` for every out/inout buffer.

    ``got``: storage arrays from the device; ``want``: the reference's result.
    NaN matches NaN; equal infinities match. Pure.
    """
    np = _np()
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


# --------------------------------------------------------------------------- references


def load_references(path: Path) -> Mapping[str, Callable[..., Any]]:
    """Import ``kernels/smoke_refs.py`` by file path (not via sys.path) and return its callables.

    Raises :class:`SmokeError` when it is missing or fails to import.
    """
    if not path.is_file():
        raise SmokeError(f"{path}: no such file; smoke cases name references defined there")
    spec = importlib.util.spec_from_file_location("_metrale_smoke_refs", path)
    if spec is None or spec.loader is None:
        raise SmokeError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # user code: any failure is reported, not raised through
        raise SmokeError(f"{path}: import failed: {type(exc).__name__}: {exc}") from None
    return MappingProxyType(
        {k: v for k, v in vars(module).items() if callable(v) and not k.startswith("_")}
    )


# --------------------------------------------------------------------------- static checks


@dataclass(frozen=True, slots=True, kw_only=True)
class ArtefactInfo:
    """What an artefact is, read from its bytes."""

    kind: str  # ptx | cubin | fatbin
    #: Arch(es) it targets as read: ``sm_90a``; a fatbin lists its images' arches.
    arches: tuple[str, ...]
    #: Entry names found (for a fatbin: those of its readable images).
    entries: tuple[str, ...]
    #: True when every image could be read (False: a fatbin with compressed images).
    entries_complete: bool
    ptx: PtxInfo | None = None
    cubin: CubinInfo | None = None
    fatbin: FatbinInfo | None = None

    def describe(self) -> str:
        """A multi-line human summary: kind, arch, entries, registers/shared memory."""
        lines = [f"kind: {self.kind}", f"arch: {', '.join(self.arches) or '?'}"]
        if self.ptx is not None:
            lines.append(f"ptx version: {self.ptx.version}")
            lines.append(f"visible entries: {', '.join(self.ptx.visible_entries) or '(none)'}")
        if self.cubin is not None:
            lines.extend(_kernel_lines(self.cubin))
        if self.fatbin is not None:
            for e in self.fatbin.entries:
                lines.append(f"image: {e.describe()}")
                if e.elf is not None:
                    lines.extend("  " + ln for ln in _kernel_lines(e.elf))
                if e.ptx is not None:
                    lines.append(f"  visible entries: {', '.join(e.ptx.visible_entries)}")
        return "\n".join(lines)


def _kernel_lines(info: CubinInfo) -> list[str]:
    out = []
    for k in info.kernels:
        regs = "?" if k.registers is None else str(k.registers)
        frame = "" if not k.frame_bytes else f", {k.frame_bytes} bytes stack"
        out.append(f"kernel {k.name}: {regs} registers, {k.shared_bytes} bytes smem{frame}")
    return out or ["kernels: (none)"]


def inspect_artefact(data: bytes) -> ArtefactInfo:
    """Identify and read an artefact (by content, not name). Raises :class:`SmokeError`."""
    try:
        if is_elf(data):
            cubin = parse_cubin(data)
            return ArtefactInfo(
                kind="cubin",
                arches=(cubin.arch,),
                entries=cubin.entry_names,
                entries_complete=True,
                cubin=cubin,
            )
        if is_fatbin(data):
            fat = parse_fatbin(data)
            arches = []
            for e in fat.entries:
                a = e.elf.arch if e.elf else e.ptx.target if e.ptx else f"sm_{e.sm}"
                arches.append(f"{a} ({e.kind})")
            complete = all(e.elf is not None or e.ptx is not None for e in fat.entries)
            return ArtefactInfo(
                kind="fatbin",
                arches=tuple(arches),
                entries=fat.entry_names,
                entries_complete=complete,
                fatbin=fat,
            )
        text = data.decode("utf-8")
        ptx = parse_ptx(text)
    except (ElfError, PtxError) as exc:
        raise SmokeError(f"unreadable artefact: {exc}") from None
    except UnicodeDecodeError:
        raise SmokeError("unreadable artefact: neither ELF, fatbin nor PTX text") from None
    return ArtefactInfo(
        kind="ptx", arches=(ptx.target,), entries=ptx.entry_names, entries_complete=True, ptx=ptx
    )


def static_problems(info: ArtefactInfo, arch: str, expected: Sequence[str]) -> tuple[str, ...]:
    """Why the artefact does not match the declared ``arch`` and ``expected`` entries. Pure."""
    problems: list[str] = []
    try:
        want = parse_arch(arch)
    except ValueError as exc:
        return (str(exc),)
    if info.ptx is not None:
        try:
            got = parse_arch(info.ptx.target)
        except ValueError:
            got = None
        if got != want:
            problems.append(f".target is {info.ptx.target!r}, manifest arch is {arch!r}")
    if info.cubin is not None:
        c = info.cubin
        if c.sm != want.sm or (c.variant is not None and c.variant != want.variant):
            problems.append(f"cubin is for {c.arch}, manifest arch is {arch!r}")
    if info.fatbin is not None:
        if not any(e.sm == want.sm for e in info.fatbin.entries):
            problems.append(f"fatbin has no image for {arch!r} (images: {', '.join(info.arches)})")
        for e in info.fatbin.entries:
            elf = e.elf
            if elf is not None and elf.sm == want.sm and elf.variant not in (None, want.variant):
                problems.append(f"fatbin image {elf.arch} does not match {arch!r}")
    if info.entries_complete:
        present = set(info.entries)
        for name in sorted(set(expected)):
            if name not in present:
                problems.append(
                    f"expected entry {name!r} is missing"
                    f" (entries: {', '.join(info.entries) or 'none'});"
                    ' declare it extern "C" __global__ in the module'
                )
    return tuple(problems)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """One JUnit testcase: (target, module, case); ``case`` is "static" for the static check."""

    target: str
    module: str
    case: str
    outcome: str  # passed | failed | skipped
    message: str = ""
    #: Longer text (static summary, failure detail).
    detail: str = ""
    max_abs_error: float | None = None
    seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SmokeReport:
    """All results of one ``smoke:<hw>`` run, sorted by (target, module, static first, case)."""

    hw: str
    device: DeviceStatus
    results: tuple[CaseResult, ...]

    def count(self, outcome: str) -> int:
        """Number of results with this outcome."""
        return sum(1 for r in self.results if r.outcome == outcome)

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return self.count("failed") == 0

    def summary_line(self) -> str:
        """``smoke:hopper: 12 passed, 0 failed, 8 skipped (numbers: no CUDA device: ...)``."""
        where = (
            f"on {self.device.device.describe()}"
            if self.device.device
            else f"numbers skipped: {self.device.reason}"
            if not self.device.error
            else f"device error: {self.device.error}"
        )
        return (
            f"smoke:{self.hw}: {self.count('passed')} passed, {self.count('failed')} failed,"
            f" {self.count('skipped')} skipped ({where})"
        )

    def failures(self) -> tuple[CaseResult, ...]:
        """The failed results, in order."""
        return tuple(r for r in self.results if r.outcome == "failed")

    def to_junit_xml(self) -> str:
        """The JUnit XML document: one testsuite per target, one testcase per result."""
        suites = ET.Element("testsuites", name=f"smoke:{self.hw}")
        by_target: dict[str, list[CaseResult]] = {}
        for r in self.results:
            by_target.setdefault(r.target, []).append(r)
        totals = {"tests": 0, "failures": 0, "skipped": 0}
        total_time = 0.0
        for target in sorted(by_target):
            rs = by_target[target]
            secs = sum(r.seconds for r in rs)
            total_time += secs
            suite = ET.SubElement(
                suites,
                "testsuite",
                name=target,
                tests=str(len(rs)),
                failures=str(sum(r.outcome == "failed" for r in rs)),
                errors="0",
                skipped=str(sum(r.outcome == "skipped" for r in rs)),
                time=f"{secs:.3f}",
            )
            props = ET.SubElement(suite, "properties")
            dev = self.device
            ET.SubElement(
                props,
                "property",
                name="device",
                value=dev.device.describe() if dev.device else "none",
            )
            if not dev.device:
                ET.SubElement(
                    props, "property", name="device_reason", value=dev.reason or dev.error
                )
            for r in rs:
                tc = ET.SubElement(
                    suite,
                    "testcase",
                    classname=r.target,
                    name=f"{r.module}::{r.case}",
                    time=f"{r.seconds:.3f}",
                )
                if r.outcome == "failed":
                    fail = ET.SubElement(tc, "failure", message=r.message, type="SmokeFailure")
                    fail.text = r.detail or r.message
                elif r.outcome == "skipped":
                    ET.SubElement(tc, "skipped", message=r.message)
                out = r.detail if r.outcome != "failed" else ""
                if r.max_abs_error is not None:
                    out = (out + "\n" if out else "") + f"max abs error: {r.max_abs_error:.6g}"
                if out:
                    ET.SubElement(tc, "system-out").text = out
            totals["tests"] += len(rs)
            totals["failures"] += sum(r.outcome == "failed" for r in rs)
            totals["skipped"] += sum(r.outcome == "skipped" for r in rs)
        for k, v in totals.items():
            suites.set(k, str(v))
        suites.set("errors", "0")
        suites.set("time", f"{total_time:.3f}")
        ET.indent(suites)
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, "unicode") + "\n"


def write_junit(report: SmokeReport, path: Path) -> Path:
    """Write the report's JUnit XML atomically (temp file + rename); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(report.to_junit_xml(), encoding="utf-8")
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------- launching


class Launcher(Protocol):
    """Runs one case on the device: returns the out/inout storage arrays by name."""

    def __call__(
        self, artefact: Path, case: SmokeCase, params: Sequence[Any]
    ) -> Mapping[str, Any]: ...


@dataclass(slots=True)
class CupyLauncher:
    """Loads each artefact once with ``cupy.RawModule(path=...)`` and launches cases on it."""

    modules: dict[Path, Any] = field(default_factory=dict)

    def __call__(self, artefact: Path, case: SmokeCase, params: Sequence[Any]) -> Mapping[str, Any]:
        import cupy

        module = self.modules.get(artefact)
        if module is None:
            module = cupy.RawModule(path=str(artefact))
            self.modules[artefact] = module
        function = module.get_function(case.entry)
        if case.shared_bytes > 48 * 1024:
            function.max_dynamic_shared_size_bytes = case.shared_bytes
        device_args: list[Any] = []
        buffers: dict[str, Any] = {}
        for arg, value in zip(case.args, params, strict=True):
            if arg.kind == "scalar":
                device_args.append(value)
            else:
                buf = cupy.asarray(value)
                buffers[arg.name] = buf
                device_args.append(buf)
        function(case.grid, case.block, tuple(device_args), shared_mem=case.shared_bytes)
        cupy.cuda.Device().synchronize()
        return {
            arg.name: cupy.asnumpy(buffers[arg.name])
            for arg in case.args
            if arg.kind in ("out", "inout")
        }


# --------------------------------------------------------------------------- running


@dataclass(frozen=True, slots=True, kw_only=True)
class _ModulePlan:
    name: str
    stem: str
    artefact: Path
    xxh3: str
    cases: tuple[SmokeCase, ...]


def _xxh3_matches(data: bytes, want: str) -> bool:
    import xxhash

    want = want.lower()
    if len(want) == 16:
        return bool(xxhash.xxh3_64_hexdigest(data) == want)
    return bool(xxhash.xxh3_128_hexdigest(data) == want)


def _artefact_path(root: Path, manifest_dir: Path, artefact: str) -> Path:
    near = manifest_dir / artefact
    if near.is_file() or "/" not in artefact:
        return near
    return root / artefact


class _Run:
    """One smoke run's mutable state: results, the lazily loaded references."""

    def __init__(
        self, root: Path, status: DeviceStatus, launcher: Launcher, refs_path: Path
    ) -> None:
        self.root = root
        self.status = status
        self.launcher = launcher
        self.refs_path = refs_path
        self._refs: Mapping[str, Callable[..., Any]] | SmokeError | None = None
        self.results: list[CaseResult] = []

    def refs(self) -> Mapping[str, Callable[..., Any]]:
        if self._refs is None:
            try:
                self._refs = load_references(self.refs_path)
            except SmokeError as exc:
                self._refs = exc
        if isinstance(self._refs, SmokeError):
            raise self._refs
        return self._refs

    def add(self, **kw: Any) -> None:
        self.results.append(CaseResult(**kw))

    def target(self, build_dir: Path, layout: Layout) -> None:
        target = str(layout.target)
        out_dir = build_dir / layout.target.hardware / layout.target.model / layout.target.quant
        manifest_path = out_dir / "manifest.json"
        rel_manifest = _rel(manifest_path, self.root)
        try:
            cases = scan_cases(self.root, layout)
        except SmokeCaseError as exc:
            self.add(
                target=target, module="(cases)", case="parse", outcome="failed", message=str(exc)
            )
            cases = ()
        if not manifest_path.is_file():
            self.add(
                target=target,
                module="(manifest)",
                case="build",
                outcome="skipped",
                message=f"{rel_manifest} is missing: the target was not built"
                " (toolchain not installed, or run `doit build` first)",
            )
            return
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            if manifest.get("schema") != 1:
                raise ValueError(f"schema {manifest.get('schema')!r}, expected 1")
            arch = str(manifest["arch"])
            modules = manifest["modules"]
            if not isinstance(modules, list):
                raise ValueError("modules is not a list")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self.add(
                target=target,
                module="(manifest)",
                case="read",
                outcome="failed",
                message=f"{rel_manifest}: unreadable manifest ({exc}); rebuild the target",
            )
            return
        declared = layout.hardware.arch
        if declared and declared != arch:
            self.add(
                target=target,
                module="(manifest)",
                case="arch",
                outcome="failed",
                message=f"{rel_manifest} says arch {arch!r} but"
                f" {_rel(layout.hardware.path, self.root)} declares {declared!r}; rebuild",
            )
        by_stem: dict[str, dict[str, Any]] = {}
        for m in modules:
            if isinstance(m, dict) and isinstance(m.get("stem"), str):
                by_stem[m["stem"]] = m
        stems = [stem for stem, _ in layout.modules()]
        for stem in sorted(set(stems) | set(by_stem)):
            mod_cases = tuple(c for c in cases if c.module == stem)
            entry = by_stem.get(stem)
            if entry is None:
                self.add(
                    target=target,
                    module=stem,
                    case="static",
                    outcome="failed",
                    message=f"module {stem!r} is not in {rel_manifest}; rebuild the target",
                )
                for c in mod_cases:
                    self.add(
                        target=target,
                        module=stem,
                        case=c.name,
                        outcome="skipped",
                        message="no artefact for the module",
                    )
                continue
            plan = _ModulePlan(
                name=str(entry.get("name", stem)),
                stem=stem,
                artefact=_artefact_path(self.root, out_dir, str(entry.get("artefact", ""))),
                xxh3=str(entry.get("xxh3", "")),
                cases=mod_cases,
            )
            self.module(target, arch, plan)

    def module(self, target: str, arch: str, plan: _ModulePlan) -> None:
        start = time.perf_counter()
        label = plan.name
        rel = _rel(plan.artefact, self.root)
        expected = sorted({c.entry for c in plan.cases})
        info: ArtefactInfo | None = None
        problems: list[str] = []
        try:
            data = plan.artefact.read_bytes()
        except OSError as exc:
            problems.append(f"{rel}: cannot be read ({exc.strerror or exc}); rebuild the target")
        else:
            if not plan.xxh3:
                problems.append("manifest.json has no xxh3 for the module")
            elif not _xxh3_matches(data, plan.xxh3):
                problems.append(f"{rel}: content does not match the manifest's xxh3; rebuild")
            try:
                info = inspect_artefact(data)
            except SmokeError as exc:
                problems.append(f"{rel}: {exc}")
            else:
                problems.extend(static_problems(info, arch, expected))
        detail = f"artefact: {rel}\nexpected entries: {', '.join(expected) or '(none)'}"
        if info is not None:
            detail += "\n" + info.describe()
            if not info.entries_complete:
                detail += "\nentries not fully checked: compressed fatbin images"
        self.add(
            target=target,
            module=label,
            case="static",
            outcome="failed" if problems else "passed",
            message="; ".join(problems) if problems else f"{info.kind if info else '?'} {arch} ok",
            detail=detail,
            seconds=time.perf_counter() - start,
        )
        for case in plan.cases:
            self.case(target, label, arch, plan.artefact, info, case, static_ok=not problems)

    def case(
        self,
        target: str,
        label: str,
        arch: str,
        artefact: Path,
        info: ArtefactInfo | None,
        case: SmokeCase,
        *,
        static_ok: bool,
    ) -> None:
        status = self.status
        skip = ""
        if status.error:
            self.add(
                target=target, module=label, case=case.name, outcome="failed", message=status.error
            )
            return
        if status.device is None:
            skip = f"numeric smoke skipped: {status.reason}"
        elif not static_ok or info is None:
            skip = "numeric smoke skipped: the static check failed"
        else:
            cc = status.device.cc
            why = arch_runnable(arch, info.kind, cc)
            if why is not None:
                skip = f"numeric smoke skipped: {status.device.name}: {why}"
            elif case.min_cc is not None and cc < case.min_cc:
                skip = (
                    f"numeric smoke skipped: case needs compute capability >="
                    f" {case.min_cc[0]}.{case.min_cc[1]}, device is {cc[0]}.{cc[1]}"
                )
        if skip:
            self.add(target=target, module=label, case=case.name, outcome="skipped", message=skip)
            return
        start = time.perf_counter()
        try:
            refs = self.refs()
            ref = refs.get(case.reference)
            if ref is None:
                raise SmokeError(
                    f"{case.source}: case {case.name!r}: reference {case.reference!r} is not"
                    f" defined in {_rel(self.refs_path, self.root)}"
                )
            inputs = make_inputs(case)
            got = self.launcher(artefact, case, inputs.params)
            try:
                want = ref(dict(inputs.reference_args))
            except Exception as exc:  # user code
                raise SmokeError(
                    f"reference {case.reference!r} raised {type(exc).__name__}: {exc}"
                ) from None
            if not isinstance(want, Mapping):
                raise SmokeError(f"reference {case.reference!r} did not return a dict")
            cmp = compare_outputs(case, got, want)
        except SmokeError as exc:
            self.add(
                target=target,
                module=label,
                case=case.name,
                outcome="failed",
                message=str(exc),
                seconds=time.perf_counter() - start,
            )
            return
        except Exception as exc:  # CuPy/CUDA errors on a present device are failures
            self.add(
                target=target,
                module=label,
                case=case.name,
                outcome="failed",
                message=f"launch of {case.entry} failed: {type(exc).__name__}: {exc}",
                seconds=time.perf_counter() - start,
            )
            return
        self.add(
            target=target,
            module=label,
            case=case.name,
            outcome="passed" if cmp.ok else "failed",
            message=cmp.message if not cmp.ok else f"max abs error {cmp.max_abs_error:.4g}",
            max_abs_error=cmp.max_abs_error,
            seconds=time.perf_counter() - start,
        )


def _sort_key(r: CaseResult) -> tuple[str, str, int, str]:
    return (r.target, r.module, 0 if r.case == "static" else 1, r.case)


def run_smoke(
    root: Path | str,
    hw: str,
    *,
    build_dir: Path | str | None = None,
    targets: Sequence[str] | None = None,
    layouts: Sequence[tuple[Target, Layout | LayoutError]] | None = None,
    probe: DeviceProbe | None = None,
    launcher: Launcher | None = None,
) -> SmokeReport:
    """Smoke-test every built target of hardware ``hw``; returns the report (writes nothing).

    Targets: ``layouts`` when given (already resolved), else ``targets``
    (``hw/model/quant`` strings) resolved here, else every walked target of
    ``hw``. ``build_dir`` defaults to ``<root>/build``. ``probe`` defaults to
    :func:`probe_device`, ``launcher`` to a :class:`CupyLauncher`. A tree
    error of a target becomes a failed result; only a broken tree walk raises
    (``LayoutError``).
    """
    from metrale_orch import tree as lay

    root = Path(root)
    out = Path(build_dir) if build_dir is not None else root / "build"
    if layouts is None:
        snap = lay.TreeSnapshot(root)
        names = (
            [lay.Target.parse(t) for t in targets]
            if targets is not None
            else [t for t in lay.walk(root, snap) if t.hardware == hw]
        )
        resolved: list[tuple[Target, Layout | LayoutError]] = []
        for t in names:
            try:
                resolved.append((t, lay.discover(root, t, snap)))
            except lay.LayoutError as exc:
                resolved.append((t, exc))
        layouts = resolved
    status = (probe or probe_device)()
    run = _Run(root, status, launcher or CupyLauncher(), root / "kernels" / REFS_FILE)
    for target, result in sorted(layouts, key=lambda p: p[0]):
        if target.hardware != hw:
            continue
        if isinstance(result, lay.LayoutError):
            run.add(
                target=str(target),
                module="(layout)",
                case="resolve",
                outcome="failed",
                message=str(result),
            )
            continue
        run.target(out, result)
    results = sorted(run.results, key=_sort_key)
    return SmokeReport(hw=hw, device=status, results=tuple(results))


# --------------------------------------------------------------------------- doit


def run_smoke_action(
    root: str, hw: str, targets: list[str], build_dir: str
) -> dict[str, Any] | Any:
    """doit python-action of ``smoke:<hw>``: run, write ``<build_dir>/smoke-<hw>.xml``.

    Returns a dict of values (``summary``: the console line, ``report``: the
    XML path, counts) on success, ``doit.exceptions.TaskFailed`` (message: the
    summary and each failure) when a check failed.
    """
    report = run_smoke(root, hw, build_dir=build_dir, targets=targets)
    xml = write_junit(report, Path(build_dir) / f"smoke-{hw}.xml")
    summary = report.summary_line()
    log.info("%s (report: %s)", summary, xml)
    if report.ok:
        return {
            "summary": summary,
            "report": _rel(xml, Path(root)),
            "passed": report.count("passed"),
            "skipped": report.count("skipped"),
            "failed": 0,
        }
    from doit.exceptions import TaskFailed

    lines = [summary] + [
        f"  FAIL {r.target} {r.module}::{r.case}: {r.message}" for r in report.failures()
    ]
    return TaskFailed("\n".join(lines))


def smoke_tasks(
    root: Path,
    config: Config,
    layouts_by_hw: Mapping[str, Sequence[tuple[Target, Layout | LayoutError]]],
) -> Iterator[dict[str, Any]]:
    """Sub-task dicts of ``smoke``: one ``smoke:<hw>`` per hardware, after its builds. Pure.

    Yield them from the ``task_smoke`` generator; each depends on every
    ``build:<target>`` of its hardware and always runs (it is a test).
    """
    for hw in sorted(layouts_by_hw):
        targets = sorted(str(t) for t, _ in layouts_by_hw[hw])
        yield {
            "name": hw,
            "doc": f"smoke-test {hw}'s artefacts (static checks; numbers on a CUDA device)",
            "actions": [(run_smoke_action, [str(root), hw, targets, str(config.build_dir)])],
            "task_dep": [f"build:{t}" for t in targets],
            "uptodate": [False],
            "verbosity": 2,
        }
