"""A hardware's declaration: ``kernels/<hw>/HARDWARE.toml [defaults]`` (or a baked copy).

A declaration without tree levers is a plain :class:`TargetDefaults` (one
field per built-in lever); one with tree levers is a :class:`TreeDefaults`,
which adds them, in file order, with their values. Parsing is pure
(:func:`parse_defaults`, :func:`defaults_from_json`); :func:`read_defaults`
reads the file, and a missing or unparseable one means the baseline (logged).
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from metrale_orch.defaults.errors import DefaultsValueError, UnknownLeverError
from metrale_orch.defaults.levers import (
    BASELINE_SM_COUNT,
    LEVERS,
    Lever,
    LeverValue,
    builtin_index,
    check_lever_value,
    check_sm_count,
)
from metrale_orch.defaults.tree_levers import read_tree_levers

__all__ = [
    "TargetDefaults",
    "TreeDefaults",
    "TreeValues",
    "baseline",
    "by_row",
    "defaults_from_json",
    "parse_defaults",
    "read_defaults",
]

# Named for the package, as before the split: the shared log file shows the logger's name.
_log = logging.getLogger("metrale_orch.defaults")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
T = TypeVar("T")


TreeValues = tuple[tuple[Lever, LeverValue], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetDefaults:
    """One hardware's declaration: ``[hardware] sm_count`` and every built-in lever's value."""

    hw: str
    sm_count: int
    lm_head_batchm_max: int
    ssm_batched_recurrent: bool
    gdn_prefill_tc: bool
    ssm_ba_gates_hopper: bool
    fp8_act_quant_hopper: bool
    decode_split_silu: bool
    attn_decode_splitk: str
    ffn_m16_tc: bool
    attn_m16_tc: bool
    lm_head_m16_tc: bool
    attn_ncol_gemv: bool
    ffn_gateup_fused: bool
    w8a8_prefill_max_m_widening: int
    w8a8_prefill_max_m_narrowing: int
    ffn_w4a16_tc_rows_max_m: int
    ffn_w4a16_bf16_tile: bool
    w8a8_gemv_entries: tuple[str, ...]

    @property
    def tree(self) -> TreeValues:
        """The levers ``kernels/LEVERS.toml`` declares, with their values (a
        :class:`TreeDefaults` has some; a plain declaration none)."""
        return ()

    def items(self) -> Iterator[tuple[Lever, LeverValue]]:
        """(row, declared value) of every lever: the built-in ones, then the tree's."""
        for row in LEVERS:
            yield row, getattr(self, row.name)
        yield from self.tree

    def value(self, lever: str) -> LeverValue:
        """The declared value of the lever named ``lever``.

        Raises:
            KeyError: no such lever.
        """
        if lever in builtin_index():
            value: LeverValue = getattr(self, lever)
            return value
        for row, value in self.tree:
            if row.name == lever:
                return value
        raise KeyError(lever)


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeDefaults(TargetDefaults):
    """A declaration of a tree that declares levers of its own in ``kernels/LEVERS.toml``."""

    #: (row, declared value) per tree lever, in file order.
    tree: TreeValues


def by_row(cls: type[T]) -> Callable[..., T]:
    """``cls`` called with one keyword per row of :data:`LEVERS`: each field's type is its
    row's kind, which a test checks, not mypy (a keyword per row cannot be typed)."""
    return cls


def _hardware_path(hw: str) -> str:
    return f"kernels/{hw}/HARDWARE.toml"


def _declaration(
    hw: str, sm_count: int, values: Mapping[str, LeverValue], levers: Sequence[Lever]
) -> TargetDefaults:
    builtin = {row.name: values.get(row.name, row.baseline) for row in LEVERS}
    if not levers:
        return by_row(TargetDefaults)(hw=hw, sm_count=sm_count, **builtin)
    tree = tuple((row, values.get(row.name, row.baseline)) for row in levers)
    return by_row(TreeDefaults)(hw=hw, sm_count=sm_count, tree=tree, **builtin)


def baseline(hw: str, *, levers: Sequence[Lever] = ()) -> TargetDefaults:
    """What a target that declares no ``[defaults]`` table gets (``levers``: the
    tree's own, :attr:`DeclaredLevers.levers`)."""
    return _declaration(hw, BASELINE_SM_COUNT, {}, levers)


def _parse_levers(
    table: Mapping[str, object], *, path: str, section: str, levers: Sequence[Lever]
) -> dict[str, LeverValue]:
    index: dict[str, Lever] = dict(builtin_index())
    index.update((row.name, row) for row in levers)
    unknown = sorted(key for key in table if key not in index)
    if unknown:
        raise UnknownLeverError(path=path, table=section, keys=unknown, valid=tuple(index))
    return {
        key: check_lever_value(index[key], table[key], path=path, table=section, key=key)
        for key in sorted(table)
    }


def parse_defaults(
    hw: str, doc: Mapping[str, object], *, levers: Sequence[Lever] = ()
) -> TargetDefaults:
    """The declaration in a parsed ``kernels/<hw>/HARDWARE.toml`` mapping.

    ``[hardware] sm_count`` absent -> 48. ``[defaults]`` absent or not a table
    -> the baseline; each key present replaces exactly its field. ``levers``
    are the tree's own (:attr:`DeclaredLevers.levers`): their keys are levers
    too, and the result is a :class:`TreeDefaults` when there are any.

    Raises:
        DefaultsValueError: a value of the wrong type or out of range
            (``sm_count`` must be in 1..=4294967295, u32 levers in 0..=4294967295,
            points one name of each band, in band order).
        UnknownLeverError: ``[defaults]`` keys that name no lever (all of them).
    """
    path = _hardware_path(hw)
    sm_count = BASELINE_SM_COUNT
    hardware = doc.get("hardware")
    if isinstance(hardware, Mapping) and "sm_count" in hardware:
        sm_count = check_sm_count(hardware["sm_count"], path=path, table="hardware")
    table = doc.get("defaults")
    values = (
        _parse_levers(table, path=path, section="defaults", levers=levers)
        if isinstance(table, Mapping)
        else {}
    )
    return _declaration(hw, sm_count, values, levers)


def _integers_fit_i64(value: object) -> bool:
    # TOML 1.0 (and the reference's parser) rejects a document holding an integer
    # outside i64; tomllib accepts it, so such a file counts as unparseable here.
    if isinstance(value, Mapping):
        return all(_integers_fit_i64(v) for v in value.values())
    if isinstance(value, list):
        return all(_integers_fit_i64(v) for v in value)
    if type(value) is int:
        return _I64_MIN <= value <= _I64_MAX
    return True


def read_defaults(
    kernels_dir: Path | str, hw: str, *, levers: Sequence[Lever] | None = None
) -> TargetDefaults:
    """Read and parse ``<kernels_dir>/<hw>/HARDWARE.toml``.

    ``levers`` are the tree's own; None reads them from ``<kernels_dir>/LEVERS.toml``
    (:func:`read_tree_levers`). A missing, unreadable or unparseable
    HARDWARE.toml yields the baseline (logged).

    Raises:
        DefaultsError: as :func:`parse_defaults` and :func:`read_tree_levers`.
    """
    if levers is None:
        levers = read_tree_levers(kernels_dir).levers
    path = Path(kernels_dir) / hw / "HARDWARE.toml"
    try:
        text = path.read_bytes().decode("utf-8")
        doc = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        _log.info("%s: %s; using the baseline defaults", _hardware_path(hw), exc)
        return baseline(hw, levers=levers)
    if not _integers_fit_i64(doc):
        _log.info("%s: integer outside i64; using the baseline defaults", _hardware_path(hw))
        return baseline(hw, levers=levers)
    return parse_defaults(hw, doc, levers=levers)


def defaults_from_json(
    doc: Mapping[str, object],
    *,
    where: str = "target_defaults.json",
    levers: Sequence[Lever] = (),
) -> TargetDefaults:
    """The declaration in a baked ``target_defaults.json`` (inverse of
    :func:`render_defaults_json`; ``levers``: the tree's own). Lever keys it
    lacks take the baseline.

    Raises:
        DefaultsError: ``hw`` not a string, a bad ``sm_count`` or lever value, unknown keys.
    """
    hw = doc.get("hw", "")
    if not isinstance(hw, str):
        raise DefaultsValueError(path=where, table="", key="hw", value=hw, expected="a string")
    sm_count = check_sm_count(doc.get("sm_count", BASELINE_SM_COUNT), path=where, table="")
    table = {k: v for k, v in doc.items() if k not in ("hw", "sm_count")}
    values = _parse_levers(table, path=where, section="", levers=levers)
    return _declaration(hw, sm_count, values, levers)
