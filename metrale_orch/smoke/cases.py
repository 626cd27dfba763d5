"""Smoke cases: the ``[[case]]`` tables of ``SMOKE.toml`` files, parsed, merged and scanned.

:func:`parse_smoke_doc` and :func:`merge_cases` are pure (parsed TOML in, frozen
:class:`SmokeCase` values out); :func:`scan_cases` reads the files of a target's
layers. A malformed case raises :class:`SmokeCaseError` naming the file, the case
and the key. Imports nothing of the package above the tree (whose :class:`Layout` it reads).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from metrale_orch.fsutil import parse_toml
from metrale_orch.paths import root_relative
from metrale_orch.smoke.errors import SmokeCaseError

if TYPE_CHECKING:
    from metrale_orch.tree import Layout

__all__ = [
    "ARG_DTYPES",
    "FLOAT_DTYPES",
    "SCALAR_DTYPES",
    "SMOKE_TOML",
    "ArgKind",
    "ArgSpec",
    "SmokeCase",
    "merge_cases",
    "parse_smoke_doc",
    "scan_cases",
]

SMOKE_TOML = "SMOKE.toml"

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
FLOAT_DTYPES = frozenset({"bf16", "f16", "f32", "fp8e4m3"})
SCALAR_DTYPES: Mapping[str, str] = MappingProxyType(
    {"i32": "int32", "u32": "uint32", "f32": "float32"}
)
#: How a kernel parameter is passed: a buffer read, written or both, or a scalar.
ArgKind = Literal["in", "out", "inout", "scalar"]
_KINDS: tuple[ArgKind, ...] = ("in", "out", "inout", "scalar")
_INITS = ("normal", "uniform", "randint", "zeros", "arange")


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgSpec:
    """One kernel parameter of a smoke case."""

    name: str
    kind: ArgKind
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


def _dim3(value: object, path: str, case: str, key: str) -> tuple[int, int, int]:
    dims = [v for v in value if isinstance(v, int) and v >= 1] if isinstance(value, list) else []
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= 3
        or len(dims) != len(value)
        or any(isinstance(v, bool) for v in value)
    ):
        raise SmokeCaseError(path, case, key, f"must be 1 to 3 positive integers, got {value!r}")
    dims = [*dims, 1, 1][:3]
    return (dims[0], dims[1], dims[2])


def _num(value: object, path: str, case: str, key: str, *, nonneg: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SmokeCaseError(path, case, key, f"must be a number, got {value!r}")
    if nonneg and value < 0:
        raise SmokeCaseError(path, case, key, f"must be >= 0, got {value!r}")
    return float(value)


def _int(value: object, path: str, case: str, key: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SmokeCaseError(path, case, key, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _str(value: object, path: str, case: str, key: str) -> str:
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


def _parse_arg(raw: object, path: str, case: str, i: int) -> ArgSpec:
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
        if dtype not in SCALAR_DTYPES:
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
    if init in ("normal", "uniform") and dtype not in FLOAT_DTYPES:
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


def parse_smoke_doc(doc: Mapping[str, object], path: str) -> tuple[SmokeCase, ...]:
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
    files: Sequence[tuple[str, Mapping[str, object]]], stems: Sequence[str] | None = None
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


def scan_cases(root: Path, layout: Layout) -> tuple[SmokeCase, ...]:
    """Read the SMOKE.toml of each existing layer directory of ``layout`` and merge them.

    Layer order is the ``configs()`` order (parent common, own common, parent
    leaf, own leaf). Raises :class:`SmokeCaseError` for an unreadable file or a
    malformed case.
    """
    files: list[tuple[str, Mapping[str, object]]] = []
    for layer in reversed(layout.layers):
        path = layer.dir / SMOKE_TOML
        if not path.is_file():
            continue
        rel = root_relative(path, root)
        try:
            doc = parse_toml(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SmokeCaseError(rel, "", "(file)", f"cannot be read: {exc}") from None
        files.append((rel, doc))
    return merge_cases(files, [stem for stem, _ in layout.modules()])
