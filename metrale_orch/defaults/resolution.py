"""Resolution: every lever of a declaration against a variable lookup, and the summary line.

:func:`resolve` is pure (tests and ``metrale-orch defaults`` pass
``environ.get``); :func:`format_levers` renders the one summary line (SPEC
2.3): the built-in levers in SPEC order, then the tree's in file order. A
:class:`TreeDefaults` resolves to a :class:`TreeLevers`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from metrale_orch.defaults.declaration import TargetDefaults, by_row
from metrale_orch.defaults.grammar import (
    U32_MAX,
    Resolved,
    SplitkPolicy,
    env_resolved,
    resolve_batchm_max,
    resolve_max_m,
    resolve_points,
    resolve_policy,
    resolve_toggle,
    target_resolved,
)
from metrale_orch.defaults.levers import (
    LEVERS,
    JsonValue,
    Lever,
    LeverValue,
    Rule,
    builtin_index,
    builtin_summary,
    group_by_label,
    json_value,
)

__all__ = [
    "ResolvedValue",
    "TargetLevers",
    "TreeLevers",
    "TreeResolved",
    "format_levers",
    "resolve",
]

#: A resolved lever's value: a split-K lever resolves to a policy, points to a tuple of names.
ResolvedValue = int | bool | SplitkPolicy | tuple[str, ...]
#: The shape of :meth:`TargetLevers.to_dict`.
LeversJson = dict[str, str | int | dict[str, dict[str, JsonValue]]]


TreeResolved = tuple[tuple[Lever, Resolved[ResolvedValue]], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetLevers:
    """Every built-in lever of one declaration, resolved against a variable lookup."""

    hw: str
    sm_count: int
    lm_head_batchm_max: Resolved[int]
    ssm_batched_recurrent: Resolved[bool]
    gdn_prefill_tc: Resolved[bool]
    ssm_ba_gates_hopper: Resolved[bool]
    fp8_act_quant_hopper: Resolved[bool]
    decode_split_silu: Resolved[bool]
    attn_decode_splitk: Resolved[SplitkPolicy]
    ffn_m16_tc: Resolved[bool]
    attn_m16_tc: Resolved[bool]
    lm_head_m16_tc: Resolved[bool]
    attn_ncol_gemv: Resolved[bool]
    ffn_gateup_fused: Resolved[bool]
    w8a8_prefill_max_m_widening: Resolved[int]
    w8a8_prefill_max_m_narrowing: Resolved[int]
    ffn_w4a16_tc_rows_max_m: Resolved[int]
    ffn_w4a16_bf16_tile: Resolved[bool]
    w8a8_gemv_entries: Resolved[tuple[str, ...]]

    @property
    def tree(self) -> TreeResolved:
        """The tree's own levers, resolved (a :class:`TreeLevers` has some)."""
        return ()

    def items(self) -> Iterator[tuple[Lever, Resolved[ResolvedValue]]]:
        """(row, resolved value) of every lever: the built-in ones, then the tree's."""
        for row in LEVERS:
            yield row, getattr(self, row.name)
        yield from self.tree

    def lever(self, name: str) -> Resolved[ResolvedValue]:
        """The resolved lever named ``name``.

        Raises:
            KeyError: no such lever.
        """
        if name in builtin_index():
            value: Resolved[ResolvedValue] = getattr(self, name)
            return value
        for row, value in self.tree:
            if row.name == name:
                return value
        raise KeyError(name)

    def to_dict(self) -> LeversJson:
        """JSON view: hw, sm_count and every lever's value and source."""
        return {
            "hw": self.hw,
            "sm_count": self.sm_count,
            "levers": {
                row.name: {"value": json_value(r.value), "source": r.source.value}
                for row, r in self.items()
            },
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeLevers(TargetLevers):
    """The resolution of a :class:`TreeDefaults`: the built-in levers and the tree's own."""

    #: (row, resolved value) per tree lever, in file order.
    tree: TreeResolved


def _resolve_one(
    row: Lever, declared: LeverValue, var: Callable[[str], str | None]
) -> Resolved[ResolvedValue]:
    # The first positive variable present decides (the umbrella comes second).
    raw = None
    for name in row.variables:
        raw = var(name)
        if raw is not None:
            break
    if row.rule is Rule.TOGGLE:
        kill = row.kill is not None and var(row.kill) is not None
        return resolve_toggle(bool(declared), raw, kill)
    if row.rule is Rule.HEAD_BAND:
        assert isinstance(declared, int)
        return resolve_batchm_max(declared, raw)
    if row.rule is Rule.ROW_CAP:
        assert isinstance(declared, int)
        return resolve_max_m(declared, raw)
    if row.rule is Rule.POINTS:
        assert isinstance(declared, tuple)
        return resolve_points(declared, raw, row.points)
    policy, from_env = resolve_policy(str(declared), raw)
    return env_resolved(policy) if from_env else target_resolved(policy)


def resolve(defaults: TargetDefaults, var: Callable[[str], str | None]) -> TargetLevers:
    """Every lever of ``defaults`` resolved against ``var`` (name -> value, None when unset).

    Pure: tests and ``metrale-orch defaults`` pass ``environ.get``. A
    :class:`TreeDefaults` resolves to a :class:`TreeLevers`.
    """
    values = {row.name: _resolve_one(row, getattr(defaults, row.name), var) for row in LEVERS}
    if not defaults.tree:
        return by_row(TargetLevers)(hw=defaults.hw, sm_count=defaults.sm_count, **values)
    tree = tuple((row, _resolve_one(row, value, var)) for row, value in defaults.tree)
    return by_row(TreeLevers)(hw=defaults.hw, sm_count=defaults.sm_count, tree=tree, **values)


def _value_text(row: Lever, value: object) -> str:
    if isinstance(value, SplitkPolicy):
        return value.label
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return "/".join(value)
    return "max" if row.max_label and value == U32_MAX else str(value)


def format_levers(levers: TargetLevers) -> str:
    """The summary line (SPEC 2.3): ``target defaults (<hw>): sm_count=<n> ...``, the
    built-in levers in SPEC order, then the tree's in file order."""
    parts = [f"target defaults ({levers.hw or 'unknown'}): sm_count={levers.sm_count}"]
    items = builtin_summary() + group_by_label([row for row, _ in levers.tree])
    for label, rows in items:
        resolved_rows = [(row, levers.lever(row.name)) for row in rows]
        text = "/".join(_value_text(row, r.value) for row, r in resolved_rows)
        parts.append(f"{label}={text}{resolved_rows[0][1].source.tag}")
    return " ".join(parts)
