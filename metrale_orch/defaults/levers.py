"""The lever table (SPEC 2.1) and the values a lever may hold.

:data:`LEVERS` is the one declarative table: a row names the lever, its type,
baseline, variables and resolution rule, and where it prints in the summary
line. Parsing, resolution, the summary line, the JSON views, the baked header
and the generated docs all walk it; a tree's own rows (``kernels/LEVERS.toml``)
are :class:`Lever` values too. Pure; imports nothing of the package but the
defaults' errors and grammar.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from metrale_orch.defaults.errors import DefaultsValueError, seen, toml_repr
from metrale_orch.defaults.grammar import U32_MAX, WHITESPACE, SplitkPolicy

__all__ = [
    "BASELINE_BATCHM_MAX",
    "BASELINE_SM_COUNT",
    "LEVERS",
    "RULE_KIND",
    "BadValue",
    "EntryValue",
    "JsonValue",
    "Kind",
    "Lever",
    "LeverValue",
    "Rule",
    "builtin_index",
    "builtin_summary",
    "check_lever_value",
    "check_sm_count",
    "check_value",
    "group_by_label",
    "json_value",
]

#: The head band a target without a ``[defaults]`` table gets.
BASELINE_BATCHM_MAX = 8
#: The SM count a target without ``[hardware] sm_count`` gets.
BASELINE_SM_COUNT = 48


class Kind(enum.Enum):
    """A lever's value type (the ``type`` of a ``kernels/LEVERS.toml`` entry)."""

    U32 = "u32"
    BOOL = "bool"
    #: A string stored verbatim (``attn_decode_splitk``: a split-K policy).
    STRING = "string"
    #: One name per band, each from the band's accepted names.
    POINTS = "points"


class Rule(enum.Enum):
    """How a lever's variables override its declaration (SPEC 2.2); the ``rule`` of an entry."""

    TOGGLE = "toggle"
    HEAD_BAND = "head-band"
    ROW_CAP = "row-cap"
    SPLITK = "split-K"
    POINTS = "points"


#: The one value type each rule works on.
RULE_KIND: Mapping[Rule, Kind] = {
    Rule.TOGGLE: Kind.BOOL,
    Rule.HEAD_BAND: Kind.U32,
    Rule.ROW_CAP: Kind.U32,
    Rule.SPLITK: Kind.STRING,
    Rule.POINTS: Kind.POINTS,
}

LeverValue = int | bool | str | tuple[str, ...]
#: A lever value as JSON holds it (points as an array).
JsonValue = int | bool | str | list[str]
#: A value of a lever's ``kernels/LEVERS.toml`` entry as JSON holds it (points: an array of arrays).
EntryValue = JsonValue | list[list[str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Lever:
    """One row of the lever table (built in, or a ``[[lever]]`` of ``kernels/LEVERS.toml``).

    ``variables`` are the positive variables, the first present deciding;
    ``kill`` forces a toggle off by its presence alone. ``points`` holds a
    points lever's accepted names per band. Rows sharing a ``summary_name``
    print as one item ``name=<a>/<b>`` tagged by the first row's source;
    ``summary_rank`` orders the built-in rows in the summary line (tree rows
    follow in file order). ``max_label``: 4294967295 prints as ``max``.
    """

    name: str
    kind: Kind
    baseline: LeverValue
    rule: Rule
    variables: tuple[str, ...] = ()
    kill: str | None = None
    points: tuple[tuple[str, ...], ...] = ()
    summary_name: str | None = None
    summary_rank: int = 0
    max_label: bool = False
    about: str = ""

    @property
    def label(self) -> str:
        """The name this row prints under in the summary line."""
        return self.summary_name or self.name

    @property
    def macro(self) -> str:
        """The baked header's ``#define`` name."""
        return f"METRALE_{self.name.upper()}"

    def all_variables(self) -> tuple[str, ...]:
        """Every variable that can decide this lever: the positive ones, then the kill switch."""
        return self.variables if self.kill is None else (*self.variables, self.kill)

    def declaration(self) -> dict[str, EntryValue]:
        """The row as a ``kernels/LEVERS.toml`` entry declares it (JSON-ready; no ``about``)."""
        out: dict[str, EntryValue] = {
            "name": self.name,
            "type": self.kind.value,
            "baseline": json_value(self.baseline),
            "variables": list(self.variables),
            "rule": self.rule.value,
        }
        if self.kill is not None:
            out["kill"] = self.kill
        if self.points:
            out["points"] = [list(band) for band in self.points]
        if self.summary_name is not None:
            out["summary_name"] = self.summary_name
        return out


def _toggle(
    name: str,
    rank: int,
    about: str,
    *,
    baseline: bool = False,
    variables: tuple[str, ...] | None = None,
    kill: str | None = None,
) -> Lever:
    return Lever(
        name=name,
        kind=Kind.BOOL,
        baseline=baseline,
        rule=Rule.TOGGLE,
        variables=(f"METRALE_{name.upper()}",) if variables is None else variables,
        kill=kill,
        summary_rank=rank,
        about=about,
    )


def _prefill_cap(name: str, about: str) -> Lever:
    # The W8A8 prefill caps come as a pair (widening, narrowing), one summary item.
    return Lever(
        name=name,
        kind=Kind.U32,
        baseline=U32_MAX,
        rule=Rule.ROW_CAP,
        variables=(f"METRALE_{name.upper()}",),
        summary_name="w8a8_prefill_max_m",
        summary_rank=13,
        max_label=True,
        about=about,
    )


#: The lever table, in declaration order (SPEC 2.1). Adding a lever is one row here
#: plus its field in :class:`TargetDefaults` and :class:`TargetLevers` (typed
#: attributes; a test checks the three agree) and its test. A tree adds levers
#: without a release in ``kernels/LEVERS.toml``.
LEVERS: tuple[Lever, ...] = (
    Lever(
        name="lm_head_batchm_max",
        kind=Kind.U32,
        baseline=BASELINE_BATCHM_MAX,
        rule=Rule.HEAD_BAND,
        variables=("METRALE_LM_HEAD_BATCHM_MAX",),
        summary_rank=1,
        about="widest decode batch the BF16 head serves with the batched GEMV",
    ),
    _toggle("ssm_batched_recurrent", 2, "batched SSM recurrence across sequences"),
    _toggle("gdn_prefill_tc", 3, "tensor-core GDN prefill"),
    _toggle("ssm_ba_gates_hopper", 4, "Hopper BA-gates twin"),
    _toggle("fp8_act_quant_hopper", 12, "Hopper FP8 activation-quant twin"),
    _toggle(
        "decode_split_silu",
        5,
        "split SiLU on the decode path",
        baseline=True,
        variables=(),
        kill="METRALE_NO_DECODE_SPLIT_SILU",
    ),
    Lever(
        name="attn_decode_splitk",
        kind=Kind.STRING,
        baseline="legacy",
        rule=Rule.SPLITK,
        variables=("METRALE_ATTN_DECODE_SPLITK",),
        summary_rank=6,
        about="paged-decode attention split-K policy",
    ),
    _toggle(
        "ffn_m16_tc",
        7,
        "M16 tensor-core tier on the dense-FFN decode",
        variables=("METRALE_FFN_M16_TC", "METRALE_M16_TC"),
    ),
    _toggle(
        "attn_m16_tc",
        8,
        "M16 tensor-core tiers on the attention decode",
        variables=("METRALE_ATTN_M16_TC", "METRALE_M16_TC"),
    ),
    _toggle("lm_head_m16_tc", 9, "M16 tensor-core arm on the BF16 decode head"),
    _toggle(
        "attn_ncol_gemv",
        10,
        "n-column batched GEMV on the attention decode",
        kill="METRALE_NO_ATTN_DECODE_BATCH",
    ),
    _toggle("ffn_gateup_fused", 11, "fused gate+up decode GEMM"),
    _prefill_cap(
        "w8a8_prefill_max_m_widening",
        "largest M that takes the W8A8 prefill on a widening projection (n > k)",
    ),
    _prefill_cap(
        "w8a8_prefill_max_m_narrowing",
        "largest M that takes the W8A8 prefill on a narrowing projection (n <= k)",
    ),
    Lever(
        name="ffn_w4a16_tc_rows_max_m",
        kind=Kind.U32,
        baseline=0,
        rule=Rule.ROW_CAP,
        variables=("METRALE_FFN_W4A16_TC_ROWS_MAX_M",),
        summary_rank=14,
        about="largest M that takes the W4A16 tensor-core FFN rows (0: never)",
    ),
    _toggle("ffn_w4a16_bf16_tile", 15, "BF16 tile on the W4A16 FFN"),
    Lever(
        name="w8a8_gemv_entries",
        kind=Kind.POINTS,
        baseline=("mb1_ku8", "mb2", "mb4", "mb8", "mb16"),
        rule=Rule.POINTS,
        variables=("METRALE_W8A8_GEMV_ENTRIES",),
        points=(
            ("mb1_ku8", "mb1_ku2_o4"),
            ("mb2", "mb2_ku2_o2"),
            ("mb4", "mb4_ku2_o2"),
            ("mb8", "mb8_ku2_o2"),
            ("mb16", "mb16_ku1_o2"),
        ),
        summary_rank=16,
        about="W8A8 GEMV schedule point of each token-tile band",
    ),
)


@functools.cache
def builtin_index() -> Mapping[str, Lever]:
    return {row.name: row for row in LEVERS}


def group_by_label(rows: Sequence[Lever]) -> tuple[tuple[str, tuple[Lever, ...]], ...]:
    """(label, rows) of consecutive rows sharing a label."""
    items: list[tuple[str, list[Lever]]] = []
    for row in rows:
        if items and items[-1][0] == row.label:
            items[-1][1].append(row)
        else:
            items.append((row.label, [row]))
    return tuple((label, tuple(group)) for label, group in items)


@functools.cache
def builtin_summary() -> tuple[tuple[str, tuple[Lever, ...]], ...]:
    """The built-in (label, rows) in summary order; a group is tagged by its first row."""
    order = sorted(range(len(LEVERS)), key=lambda i: (LEVERS[i].summary_rank, i))
    return group_by_label([LEVERS[i] for i in order])


# --------------------------------------------------------------------------- values


class BadValue(Exception):
    """A value that does not fit its lever (internal: turned into a DefaultsError)."""

    def __init__(self, expected: str, got: str) -> None:
        self.expected = expected
        self.got = got
        super().__init__(f"must be {expected}, got {got}")


def _bands_text(bands: Sequence[Sequence[str]]) -> str:
    return "; ".join(f"band {i}: {'|'.join(names)}" for i, names in enumerate(bands))


def _points_expected(bands: Sequence[Sequence[str]]) -> str:
    return (
        f"an array of {len(bands)} strings, one point per band in band order ({_bands_text(bands)})"
    )


def _check_points(value: object, bands: Sequence[Sequence[str]]) -> tuple[str, ...]:
    expected = _points_expected(bands)
    if not isinstance(value, list | tuple):
        raise BadValue(expected, seen(value))
    if len(value) != len(bands):
        raise BadValue(expected, f"an array of {len(value)} ({toml_repr(value)})")
    out: list[str] = []
    for band, (item, names) in enumerate(zip(value, bands, strict=True)):
        if not isinstance(item, str):
            raise BadValue(expected, f"{seen(item)} in band {band}")
        name = item.strip(WHITESPACE)
        if name not in names:
            elsewhere = [i for i, other in enumerate(bands) if name in other]
            hint = f", a point of band {elsewhere[0]} (wrong order?)" if elsewhere else ""
            raise BadValue(expected, f"{toml_repr(item)} in band {band}{hint}")
        out.append(name)
    return tuple(out)


def check_value(
    kind: Kind, value: object, *, bands: Sequence[Sequence[str]] = (), low: int = 0
) -> LeverValue:
    """``value`` as a lever of ``kind`` holds it.

    Raises:
        BadValue: the wrong type, out of range, or (points) not one name per band.
    """
    if kind is Kind.BOOL:
        if type(value) is bool:
            return value
        raise BadValue("a boolean", seen(value))
    if kind is Kind.STRING:
        if isinstance(value, str):
            return value
        raise BadValue("a string", seen(value))
    if kind is Kind.POINTS:
        return _check_points(value, bands)
    if type(value) is int and low <= value <= U32_MAX:
        return value
    expected = f"an integer in {low}..={U32_MAX}"
    raise BadValue(expected, seen(value, expected))


def check_lever_value(row: Lever, value: object, *, path: str, table: str, key: str) -> LeverValue:
    try:
        return check_value(row.kind, value, bands=row.points)
    except BadValue as bad:
        expected = "a string (split-K policy)" if row.rule is Rule.SPLITK else bad.expected
        raise DefaultsValueError(
            path=path, table=table, key=key, value=value, expected=expected, got=bad.got
        ) from None


def check_sm_count(value: object, *, path: str, table: str) -> int:
    try:
        count = check_value(Kind.U32, value, low=1)
    except BadValue as bad:
        raise DefaultsValueError(
            path=path, table=table, key="sm_count", value=value, expected=bad.expected, got=bad.got
        ) from None
    assert isinstance(count, int)
    return count


def json_value(value: object) -> JsonValue:
    if isinstance(value, SplitkPolicy):
        return value.label
    if isinstance(value, tuple):
        return list(value)
    assert isinstance(value, int | str)
    return value
