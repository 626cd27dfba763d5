"""Tests for metrale_orch.defaults (SPEC 2) and `metrale-orch defaults`.

The tests of this topic that start processes are in
``tests/scenarios/defaults/test_defaults.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_orch import defaults as D
from metrale_orch.cli import main
from metrale_orch.defaults import (
    BASELINE_BATCHM_MAX,
    DENSE_GEMV_BATCHM_MAX_M,
    LEVERS,
    AlreadyResolvedError,
    DeclaredLevers,
    DefaultsError,
    DefaultsValueError,
    Kind,
    LeverDeclarationError,
    Resolved,
    Rule,
    Source,
    SplitkPolicy,
    TargetDefaults,
    TargetLevers,
    TreeDefaults,
    TreeLevers,
    UnknownLeverError,
    baseline,
    declare,
    defaults_from_json,
    format_levers,
    parse_defaults,
    parse_tree_levers,
    read_defaults,
    read_tree_levers,
    render_defaults_header,
    render_defaults_json,
    render_docs,
    reset_resolved,
    resolve,
    resolve_batchm_max,
    resolve_max_m,
    resolve_points,
    resolve_policy,
    resolve_toggle,
    resolved,
    summary_line,
    write_docs,
)
from metrale_orch.errors import MetraleError
from metrale_orch.steps.plan import plan_target
from metrale_orch.toolchain.definitions import builtin_toolchains
from metrale_orch.tree import Target, discover
from tests.support import REPO
from tests.support.build import small_tree
from tests.support.defaults import (
    GEMV_BASELINE,
    HOPPER_TOML,
    TREE,
    TREE_DEFAULTS_TOML,
    U32_MAX,
    _defines,
    hopper,
    write_levers,
)

NO_ENV: dict[str, str] = {}

# SPEC 2.1: lever -> (type, baseline), in table order.
SPEC_BASELINES: dict[str, tuple[Kind, object]] = {
    "lm_head_batchm_max": (Kind.U32, 8),
    "ssm_batched_recurrent": (Kind.BOOL, False),
    "gdn_prefill_tc": (Kind.BOOL, False),
    "ssm_ba_gates_hopper": (Kind.BOOL, False),
    "fp8_act_quant_hopper": (Kind.BOOL, False),
    "decode_split_silu": (Kind.BOOL, True),
    "attn_decode_splitk": (Kind.STRING, "legacy"),
    "ffn_m16_tc": (Kind.BOOL, False),
    "attn_m16_tc": (Kind.BOOL, False),
    "lm_head_m16_tc": (Kind.BOOL, False),
    "attn_ncol_gemv": (Kind.BOOL, False),
    "ffn_gateup_fused": (Kind.BOOL, False),
    "w8a8_prefill_max_m_widening": (Kind.U32, U32_MAX),
    "w8a8_prefill_max_m_narrowing": (Kind.U32, U32_MAX),
    "ffn_w4a16_tc_rows_max_m": (Kind.U32, 0),
    "ffn_w4a16_bf16_tile": (Kind.BOOL, False),
    "w8a8_gemv_entries": (Kind.POINTS, ("mb1_ku8", "mb2", "mb4", "mb8", "mb16")),
}

# SPEC 2.1: the names each band of w8a8_gemv_entries accepts.
GEMV_BANDS = [
    ("mb1_ku8", "mb1_ku2_o4"),
    ("mb2", "mb2_ku2_o2"),
    ("mb4", "mb4_ku2_o2"),
    ("mb8", "mb8_ku2_o2"),
    ("mb16", "mb16_ku1_o2"),
]

# SPEC 2.2: lever -> (own variable, umbrella, kill switch).
SPEC_VARIABLES: dict[str, tuple[str | None, str | None, str | None]] = {
    "lm_head_batchm_max": ("METRALE_LM_HEAD_BATCHM_MAX", None, None),
    "ssm_batched_recurrent": ("METRALE_SSM_BATCHED_RECURRENT", None, None),
    "gdn_prefill_tc": ("METRALE_GDN_PREFILL_TC", None, None),
    "ssm_ba_gates_hopper": ("METRALE_SSM_BA_GATES_HOPPER", None, None),
    "fp8_act_quant_hopper": ("METRALE_FP8_ACT_QUANT_HOPPER", None, None),
    "decode_split_silu": (None, None, "METRALE_NO_DECODE_SPLIT_SILU"),
    "attn_decode_splitk": ("METRALE_ATTN_DECODE_SPLITK", None, None),
    "ffn_m16_tc": ("METRALE_FFN_M16_TC", "METRALE_M16_TC", None),
    "attn_m16_tc": ("METRALE_ATTN_M16_TC", "METRALE_M16_TC", None),
    "lm_head_m16_tc": ("METRALE_LM_HEAD_M16_TC", None, None),
    "attn_ncol_gemv": ("METRALE_ATTN_NCOL_GEMV", None, "METRALE_NO_ATTN_DECODE_BATCH"),
    "ffn_gateup_fused": ("METRALE_FFN_GATEUP_FUSED", None, None),
    "w8a8_prefill_max_m_widening": ("METRALE_W8A8_PREFILL_MAX_M_WIDENING", None, None),
    "w8a8_prefill_max_m_narrowing": ("METRALE_W8A8_PREFILL_MAX_M_NARROWING", None, None),
    "ffn_w4a16_tc_rows_max_m": ("METRALE_FFN_W4A16_TC_ROWS_MAX_M", None, None),
    "ffn_w4a16_bf16_tile": ("METRALE_FFN_W4A16_BF16_TILE", None, None),
    "w8a8_gemv_entries": ("METRALE_W8A8_GEMV_ENTRIES", None, None),
}


def spec_row_variables(name: str) -> tuple[tuple[str, ...], str | None]:
    """(positive variables in the order they are read, kill switch) of a SPEC lever."""
    own, umbrella, kill = SPEC_VARIABLES[name]
    return tuple(v for v in (own, umbrella) if v is not None), kill


# SPEC 2.3: the summary line's items, in order ("w8a8_prefill_max_m" is both caps).
SPEC_SUMMARY = [
    "lm_head_batchm_max",
    "ssm_batched_recurrent",
    "gdn_prefill_tc",
    "ssm_ba_gates_hopper",
    "decode_split_silu",
    "attn_decode_splitk",
    "ffn_m16_tc",
    "attn_m16_tc",
    "lm_head_m16_tc",
    "attn_ncol_gemv",
    "ffn_gateup_fused",
    "fp8_act_quant_hopper",
    "w8a8_prefill_max_m",
    "ffn_w4a16_tc_rows_max_m",
    "ffn_w4a16_bf16_tile",
    "w8a8_gemv_entries",
]

GB10_TOML = """\
[hardware]
arch = "sm_121a"

[defaults]
w8a8_prefill_max_m_widening = 64
w8a8_prefill_max_m_narrowing = 384
"""

HOPPER_LINE = (
    "target defaults (hopper): sm_count=132 lm_head_batchm_max=16 ssm_batched_recurrent=on "
    "gdn_prefill_tc=on ssm_ba_gates_hopper=on decode_split_silu=on attn_decode_splitk=auto "
    "ffn_m16_tc=off attn_m16_tc=on lm_head_m16_tc=on attn_ncol_gemv=off ffn_gateup_fused=on "
    "fp8_act_quant_hopper=on w8a8_prefill_max_m=max/max ffn_w4a16_tc_rows_max_m=0 "
    "ffn_w4a16_bf16_tile=off w8a8_gemv_entries=mb1_ku8/mb2/mb4/mb8/mb16"
)
TREE_NAMES = [
    "moe_rows_max_m",
    "moe_tc",
    "moe_splitk",
    "moe_batchm_max",
    "moe_entries",
    "moe_cap_wide",
    "moe_cap_narrow",
]
TREE_LINE_TAIL = (
    " w8a8_gemv_entries=mb1_ku8/mb2/mb4/mb8/mb16 moe_rows_max_m=128 moe_tc=on moe_splitk=4 "
    "moe_batchm_max=4 moe_entries=a2/b3 moe_cap=4294967295/7"
)


def tree_levers() -> tuple[D.Lever, ...]:
    return parse_tree_levers(tomllib.loads(TREE))


def tree_gb10() -> TargetDefaults:
    return parse_defaults("gb10", tomllib.loads(TREE_DEFAULTS_TOML), levers=tree_levers())


def doc_with(defaults: object = None, hardware: object = None) -> dict[str, object]:
    doc: dict[str, object] = {}
    if hardware is not None:
        doc["hardware"] = hardware
    if defaults is not None:
        doc["defaults"] = defaults
    return doc


def write_hw(root: Path, hw: str, text: str | bytes) -> Path:
    path = root / "kernels" / hw / "HARDWARE.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- the table


def test_the_table_holds_the_spec_levers_types_baselines_and_variables() -> None:
    assert [row.name for row in LEVERS] == list(SPEC_BASELINES)
    for row in LEVERS:
        kind, value = SPEC_BASELINES[row.name]
        assert (row.kind, row.baseline) == (kind, value), row.name
        assert type(row.baseline) is type(value), row.name
        assert (row.variables, row.kill) == spec_row_variables(row.name), row.name
    assert BASELINE_BATCHM_MAX == 8
    assert DENSE_GEMV_BATCHM_MAX_M == 16


def test_the_value_types_carry_one_field_per_row() -> None:
    names = [row.name for row in LEVERS]
    for cls in (TargetDefaults, TargetLevers):
        assert [f.name for f in dataclasses.fields(cls)] == ["hw", "sm_count", *names]
    assert not {"hw", "sm_count"} & set(names)


def test_rules_match_types_and_only_toggles_have_umbrellas_or_kill_switches() -> None:
    expected = {Kind.BOOL: {Rule.TOGGLE}, Kind.U32: {Rule.HEAD_BAND, Rule.ROW_CAP}}
    expected[Kind.STRING] = {Rule.SPLITK}
    expected[Kind.POINTS] = {Rule.POINTS}
    for row in LEVERS:
        assert row.rule in expected[row.kind], row.name
        assert bool(row.points) is (row.kind is Kind.POINTS), row.name
        if row.rule is not Rule.TOGGLE:
            assert len(row.variables) == 1 and row.kill is None, row.name
    gemv = next(row for row in LEVERS if row.name == "w8a8_gemv_entries")
    assert [list(band) for band in gemv.points] == [list(band) for band in GEMV_BANDS]
    # Only the two W8A8 prefill caps print 4294967295 as `max`.
    assert {row.name for row in LEVERS if row.max_label} == {
        "w8a8_prefill_max_m_widening",
        "w8a8_prefill_max_m_narrowing",
    }


def test_rows_printed_together_share_a_rank_and_the_line_follows_spec_order() -> None:
    by_rank: dict[int, set[str]] = {}
    for row in LEVERS:
        by_rank.setdefault(row.summary_rank, set()).add(row.label)
    assert all(len(labels) == 1 for labels in by_rank.values())
    line = format_levers(resolve(baseline("x"), NO_ENV.get))
    assert re.findall(r" (\w+)=", line)[1:] == SPEC_SUMMARY


# --------------------------------------------------------------------------- parsing


def test_baseline_is_the_spec_table_with_48_sms() -> None:
    b = baseline("gb10")
    assert (b.hw, b.sm_count) == ("gb10", 48)
    assert {row.name: b.value(row.name) for row in LEVERS} == {
        name: value for name, (_, value) in SPEC_BASELINES.items()
    }


def _other_value(kind: Kind, value: object) -> object:
    if kind is Kind.BOOL:
        return not value
    if kind is Kind.POINTS:
        return ("mb1_ku2_o4", "mb2", "mb4_ku2_o2", "mb8", "mb16_ku1_o2")
    return "auto" if kind is Kind.STRING else 7


@pytest.mark.parametrize("row", LEVERS, ids=lambda r: r.name)
def test_each_key_replaces_exactly_its_field(row: D.Lever) -> None:
    value: Any = _other_value(row.kind, row.baseline)
    toml_value = list(value) if isinstance(value, tuple) else value
    parsed = parse_defaults("hopper", doc_with({row.name: toml_value}))
    expected = dataclasses.replace(baseline("hopper"), **{row.name: value})
    assert parsed == expected


def test_a_declared_table_parses_with_sm_count() -> None:
    d = hopper()
    assert (d.hw, d.sm_count, d.lm_head_batchm_max, d.attn_decode_splitk) == (
        "hopper",
        132,
        16,
        "auto",
    )
    assert d.w8a8_prefill_max_m_widening == U32_MAX


@pytest.mark.parametrize("table", [None, 3, "x", [1, 2], [{"lm_head_batchm_max": 4}]])
def test_absent_or_non_table_defaults_is_the_baseline_but_sm_count_is_read(table: object) -> None:
    parsed = parse_defaults("h100", doc_with(table, {"sm_count": 132}))
    assert parsed == dataclasses.replace(baseline("h100"), sm_count=132)


def test_the_split_k_declaration_is_stored_verbatim() -> None:
    assert parse_defaults("h", doc_with({"attn_decode_splitk": " AuTo "})).attn_decode_splitk == (
        " AuTo "
    )


@pytest.mark.parametrize(
    ("value", "ok"),
    [(0, True), (1, True), (U32_MAX, True), (U32_MAX + 1, False), (-1, False), (2**70, False)],
)
def test_u32_lever_bounds(value: int, ok: bool) -> None:
    doc = doc_with({"lm_head_batchm_max": value})
    if ok:
        assert parse_defaults("hopper", doc).lm_head_batchm_max == value
    else:
        with pytest.raises(DefaultsValueError) as info:
            parse_defaults("hopper", doc)
        assert info.value.key == "lm_head_batchm_max"
        assert "kernels/hopper/HARDWARE.toml" in str(info.value)
        assert "[defaults] lm_head_batchm_max" in str(info.value)
        assert str(value) in str(info.value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [(1, True), (132, True), (U32_MAX, True), (0, False), (-5, False), (U32_MAX + 1, False)],
)
def test_sm_count_bounds(value: int, ok: bool) -> None:
    doc = doc_with(hardware={"sm_count": value})
    if ok:
        assert parse_defaults("b200", doc).sm_count == value
    else:
        with pytest.raises(DefaultsValueError) as info:
            parse_defaults("b200", doc)
        assert (info.value.key, info.value.table) == ("sm_count", "hardware")
        assert "kernels/b200/HARDWARE.toml: [hardware] sm_count" in str(info.value)


@pytest.mark.parametrize("hardware", [None, {}, {"arch": "sm_90a"}, 7])
def test_sm_count_absent_is_48(hardware: object) -> None:
    assert parse_defaults("x", doc_with(hardware=hardware)).sm_count == 48


@pytest.mark.parametrize(
    ("table", "key", "value", "got"),
    [
        ("defaults", "lm_head_batchm_max", True, "a boolean (true)"),
        ("defaults", "lm_head_batchm_max", 8.0, "a float (8.0)"),
        ("defaults", "lm_head_batchm_max", "8", 'a string ("8")'),
        ("defaults", "w8a8_prefill_max_m_widening", [64], "an array ([64])"),
        ("defaults", "ffn_gateup_fused", 1, "an integer (1)"),
        ("defaults", "ffn_gateup_fused", "true", 'a string ("true")'),
        ("defaults", "attn_decode_splitk", 4, "an integer (4)"),
        ("defaults", "attn_decode_splitk", False, "a boolean (false)"),
        ("hardware", "sm_count", True, "a boolean (true)"),
        ("hardware", "sm_count", 132.0, "a float (132.0)"),
        ("hardware", "sm_count", "132", 'a string ("132")'),
    ],
)
def test_wrong_types_name_the_file_and_key(table: str, key: str, value: object, got: str) -> None:
    doc = {table: {key: value}}
    with pytest.raises(DefaultsValueError) as info:
        parse_defaults("hopper", doc)
    err = info.value
    assert isinstance(err, DefaultsError) and isinstance(err, MetraleError)
    assert (err.path, err.table, err.key, err.value) == (
        "kernels/hopper/HARDWARE.toml",
        table,
        key,
        value,
    )
    assert str(err).startswith(f"kernels/hopper/HARDWARE.toml: [{table}] {key} must be ")
    assert got in str(err)


def test_an_unknown_key_names_the_key_and_lists_every_lever() -> None:
    with pytest.raises(UnknownLeverError) as info:
        parse_defaults("hopper", doc_with({"lm_head_batchm_max": 8, "ffn_gateup_fuse": True}))
    err = info.value
    assert (err.key, err.keys) == ("ffn_gateup_fuse", ("ffn_gateup_fuse",))
    assert err.valid == tuple(SPEC_BASELINES)
    text = str(err)
    assert text.startswith(
        "kernels/hopper/HARDWARE.toml: [defaults] has an unknown lever: 'ffn_gateup_fuse' "
        "(did you mean 'ffn_gateup_fused'?); known levers: lm_head_batchm_max, "
    )
    assert all(name in text for name in SPEC_BASELINES)
    assert "kernels/LEVERS.toml" in text and "rename or remove" not in text
    assert "\n" not in text


def test_every_unknown_key_is_named_in_one_error() -> None:
    table = {"b_new": 1, "lm_head_batchm_max": True, "a_new": False, "zz": "x"}
    with pytest.raises(UnknownLeverError) as info:
        parse_defaults("gb10", doc_with(table))
    err = info.value
    # All three unknown keys at once (sorted), before any value is checked.
    assert err.keys == ("a_new", "b_new", "zz") and err.key == "a_new, b_new, zz"
    text = str(err)
    assert "[defaults] has 3 unknown levers: 'a_new', 'b_new', 'zz'; known levers: " in text
    assert "a lever added upstream after this metrale-orch release is declared in " in (
        text.lower()
    )
    assert "kernels/LEVERS.toml" in text and "rename" not in text


def test_read_defaults_parses_the_file(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", HOPPER_TOML)
    assert read_defaults(tmp_path / "kernels", "hopper") == hopper()
    assert read_defaults(str(tmp_path / "kernels"), "hopper") == hopper()


@pytest.mark.parametrize(
    "content",
    [
        None,
        "[defaults\nlm_head_batchm_max = 4\n",
        b'[defaults]\nattn_decode_splitk = "\xff"\n',
        "[hardware]\nsm_count = 132\n[defaults]\nlm_head_batchm_max = 99999999999999999999\n",
    ],
    ids=["missing", "bad-toml", "bad-utf8", "beyond-i64"],
)
def test_a_missing_or_unparseable_file_is_the_baseline(
    tmp_path: Path, content: str | bytes | None
) -> None:
    if content is not None:
        write_hw(tmp_path, "gb10", content)
    assert read_defaults(tmp_path / "kernels", "gb10") == baseline("gb10")


def test_read_defaults_raises_for_a_bad_table(tmp_path: Path) -> None:
    write_hw(tmp_path, "gb10", "[defaults]\nlm_head_batchm_max = -3\n")
    with pytest.raises(DefaultsValueError, match=r"kernels/gb10/HARDWARE.toml.*-3"):
        read_defaults(tmp_path / "kernels", "gb10")


# --------------------------------------------------------------------------- the grammar

OFF_SPELLINGS = [
    "0",
    "false",
    "off",
    "no",
    "OFF",
    "No",
    "FaLsE",
    " 0 ",
    "\toff\n",
    "\u3000no\u3000",
]
# Anything else is on: empty, whitespace, junk, Unicode look-alikes, and U+001C, which
# Rust's trim keeps (Python's str.strip would drop it).
ON_SPELLINGS = [
    "",
    " ",
    "1",
    "on",
    "yes",
    "true",
    "00",
    "offf",
    "n o",
    "\uff4f\uff46\uff46",
    "\x1coff",
]


@pytest.mark.parametrize("default_on", [True, False])
def test_toggle_absent_is_the_declaration(default_on: bool) -> None:
    assert resolve_toggle(default_on, None, False) == Resolved(
        value=default_on, source=Source.TARGET
    )


@pytest.mark.parametrize("raw", OFF_SPELLINGS)
@pytest.mark.parametrize("default_on", [True, False])
def test_toggle_off_spellings(raw: str, default_on: bool) -> None:
    r = resolve_toggle(default_on, raw, False)
    assert (r.value, r.source, r.from_env) == (False, Source.ENV, True)


@pytest.mark.parametrize("raw", ON_SPELLINGS)
@pytest.mark.parametrize("default_on", [True, False])
def test_toggle_any_other_value_is_on(raw: str, default_on: bool) -> None:
    assert resolve_toggle(default_on, raw, False) == Resolved(value=True, source=Source.ENV)


@pytest.mark.parametrize("raw", [None, "1", "", "0"])
def test_a_kill_switch_outranks_declaration_and_variable(raw: str | None) -> None:
    assert resolve_toggle(True, raw, True) == Resolved(value=False, source=Source.ENV)


@pytest.mark.parametrize(
    ("raw", "value", "source"),
    [
        ("12", 12, Source.ENV),
        ("1", 1, Source.ENV),
        ("16", 16, Source.ENV),
        ("64", 16, Source.ENV),
        (str(U32_MAX), 16, Source.ENV),
        (" 3 ", 3, Source.ENV),
        ("+5", 5, Source.ENV),
        ("007", 7, Source.ENV),
        ("0", 8, Source.TARGET),
        ("", 8, Source.TARGET),
        ("  ", 8, Source.TARGET),
        ("banana", 8, Source.TARGET),
        ("-1", 8, Source.TARGET),
        ("-0", 8, Source.TARGET),
        ("+", 8, Source.TARGET),
        ("1_0", 8, Source.TARGET),
        ("1.5", 8, Source.TARGET),
        ("\u0663", 8, Source.TARGET),
        (str(U32_MAX + 1), 8, Source.TARGET),
        (None, 8, Source.TARGET),
    ],
)
def test_head_band_grammar(raw: str | None, value: int, source: Source) -> None:
    assert resolve_batchm_max(8, raw) == Resolved(value=value, source=source)


def test_head_band_declaration_is_clamped_too() -> None:
    assert resolve_batchm_max(64, None) == Resolved(value=16, source=Source.TARGET)
    assert resolve_batchm_max(64, "junk") == Resolved(value=16, source=Source.TARGET)


@pytest.mark.parametrize(
    ("raw", "value", "source"),
    [
        ("0", 0, Source.ENV),
        ("384", 384, Source.ENV),
        (" 64\n", 64, Source.ENV),
        ("+7", 7, Source.ENV),
        (str(U32_MAX), U32_MAX, Source.ENV),
        (str(U32_MAX + 1), 100, Source.TARGET),
        ("-1", 100, Source.TARGET),
        ("", 100, Source.TARGET),
        ("max", 100, Source.TARGET),
        ("0x10", 100, Source.TARGET),
        (None, 100, Source.TARGET),
    ],
)
def test_row_cap_grammar(raw: str | None, value: int, source: Source) -> None:
    assert resolve_max_m(100, raw) == Resolved(value=value, source=source)


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("legacy", SplitkPolicy.LEGACY),
        (" LEGACY ", SplitkPolicy.LEGACY),
        ("auto", SplitkPolicy.AUTO),
        ("Auto\n", SplitkPolicy.AUTO),
        ("0", SplitkPolicy.pinned(1)),
        ("off", SplitkPolicy.pinned(1)),
        ("FALSE", SplitkPolicy.pinned(1)),
        ("no", SplitkPolicy.pinned(1)),
        ("1", SplitkPolicy.pinned(1)),
        ("4", SplitkPolicy.pinned(4)),
        (" +11 ", SplitkPolicy.pinned(11)),
        ("16", SplitkPolicy.pinned(16)),
        ("17", SplitkPolicy.pinned(16)),
        (str(U32_MAX), SplitkPolicy.pinned(16)),
        (str(U32_MAX + 1), None),
        ("-3", None),
        ("", None),
        ("atuo", None),
        ("2.5", None),
        ("yes", None),
    ],
)
def test_split_k_parse(text: str, policy: SplitkPolicy | None) -> None:
    assert SplitkPolicy.parse(text) == policy


def test_split_k_labels_and_pins() -> None:
    assert SplitkPolicy.LEGACY.label == "legacy"
    assert SplitkPolicy.AUTO.label == "auto"
    assert [SplitkPolicy.pinned(n).label for n in (0, 1, 7, 16, 99)] == ["1", "1", "7", "16", "16"]
    for policy in (SplitkPolicy.LEGACY, SplitkPolicy.AUTO, SplitkPolicy.pinned(5)):
        assert SplitkPolicy.parse(policy.label) == policy


@pytest.mark.parametrize(
    ("declared", "raw", "expected"),
    [
        ("auto", None, (SplitkPolicy.AUTO, False)),
        ("auto", "atuo", (SplitkPolicy.AUTO, False)),
        ("auto", "", (SplitkPolicy.AUTO, False)),
        ("auto", "0", (SplitkPolicy.pinned(1), True)),
        ("legacy", "auto", (SplitkPolicy.AUTO, True)),
        ("bogus", None, (SplitkPolicy.LEGACY, False)),
        ("", "junk", (SplitkPolicy.LEGACY, False)),
        ("8", None, (SplitkPolicy.pinned(8), False)),
        ("8", " Legacy", (SplitkPolicy.LEGACY, True)),
    ],
)
def test_resolve_policy(
    declared: str, raw: str | None, expected: tuple[SplitkPolicy, bool]
) -> None:
    assert resolve_policy(declared, raw) == expected


# --------------------------------------------------------------------------- the three new levers

BANDS_TEXT = (
    "band 0: mb1_ku8|mb1_ku2_o4; band 1: mb2|mb2_ku2_o2; band 2: mb4|mb4_ku2_o2; "
    "band 3: mb8|mb8_ku2_o2; band 4: mb16|mb16_ku1_o2"
)


def gemv(value: object) -> TargetDefaults:
    return parse_defaults("gb10", doc_with({"w8a8_gemv_entries": value}))


@pytest.mark.parametrize("band", range(5))
def test_each_band_accepts_exactly_its_two_names(band: int) -> None:
    others = {name for i, names in enumerate(GEMV_BANDS) if i != band for name in names}
    for name in GEMV_BANDS[band]:
        value = [*GEMV_BASELINE[:band], name, *GEMV_BASELINE[band + 1 :]]
        assert gemv(value).w8a8_gemv_entries == tuple(value)
    for name in [*sorted(others), "mb3", "MB2", "mb1", "", "mb16_ku2_o2"]:
        value = [*GEMV_BASELINE[:band], name, *GEMV_BASELINE[band + 1 :]]
        with pytest.raises(DefaultsValueError):
            gemv(value)


def test_a_points_declaration_is_trimmed_and_stored_as_a_tuple() -> None:
    value = [" mb1_ku2_o4 ", "\tmb2", "mb4\n", "\u3000mb8", "mb16_ku1_o2\u00a0"]
    assert gemv(value).w8a8_gemv_entries == (
        "mb1_ku2_o4",
        "mb2",
        "mb4",
        "mb8",
        "mb16_ku1_o2",
    )


@pytest.mark.parametrize(
    ("value", "got"),
    [
        (["mb1_ku8", "mb2", "mb4", "mb8"], 'an array of 4 (["mb1_ku8", "mb2", "mb4", "mb8"])'),
        (
            ["mb1_ku8", "mb2", "mb4", "mb8", "mb16", "mb16"],
            'an array of 6 (["mb1_ku8", "mb2", "mb4", "mb8", "mb16", "mb16"])',
        ),
        (["mb2", "mb1_ku8", "mb4", "mb8", "mb16"], '"mb2" in band 0, a point of band 1 (wrong'),
        (["mb1_ku8", "mb2", "mb4", "mb16", "mb8"], '"mb16" in band 3, a point of band 4 (wrong'),
        (["mb1_ku8", "mb2", "mb5", "mb8", "mb16"], '"mb5" in band 2;'),
        (["mb1_ku8", "MB2", "mb4", "mb8", "mb16"], '"MB2" in band 1;'),
        (["mb1_ku8", "mb2", "mb4", 8, "mb16"], "an integer (8) in band 3;"),
        (["mb1_ku8", "mb2", "mb4", "mb8", True], "a boolean (true) in band 4;"),
        (["mb1_ku8", ["mb2"], "mb4", "mb8", "mb16"], 'an array (["mb2"]) in band 1;'),
        ("mb1_ku8,mb2,mb4,mb8,mb16", 'a string ("mb1_ku8,mb2,mb4,mb8,mb16");'),
        ([], "an array of 0 ([]);"),
        (5, "an integer (5);"),
        ({"a": "mb2"}, "a table ({...});"),
    ],
)
def test_a_bad_points_declaration_names_file_key_and_bands(value: object, got: str) -> None:
    with pytest.raises(DefaultsValueError) as info:
        gemv(value)
    err = info.value
    assert (err.path, err.table, err.key) == (
        "kernels/gb10/HARDWARE.toml",
        "defaults",
        "w8a8_gemv_entries",
    )
    text = str(err)
    assert text.startswith(
        "kernels/gb10/HARDWARE.toml: [defaults] w8a8_gemv_entries must be an array of 5 "
        f"strings, one point per band in band order ({BANDS_TEXT}), got "
    )
    assert got in text and "\n" not in text


@pytest.mark.parametrize(
    ("raw", "value", "source"),
    [
        ("mb1_ku8,mb2,mb4,mb8,mb16", GEMV_BASELINE, Source.ENV),
        (
            " mb1_ku2_o4 , mb2_ku2_o2,mb4_ku2_o2 ,mb8_ku2_o2,\tmb16_ku1_o2\n",
            ("mb1_ku2_o4", "mb2_ku2_o2", "mb4_ku2_o2", "mb8_ku2_o2", "mb16_ku1_o2"),
            Source.ENV,
        ),
        ("mb1_ku8,\u3000mb2,mb4,mb8,mb16", GEMV_BASELINE, Source.ENV),
        # A trailing comma makes six parts; the empty string is one part.
        ("mb1_ku2_o4,mb2,mb4,mb8,mb16,", ("x",), Source.TARGET),
        ("", ("x",), Source.TARGET),
        (" ", ("x",), Source.TARGET),
        ("mb1_ku2_o4,mb2,mb4,mb8", ("x",), Source.TARGET),
        ("mb1_ku2_o4,mb2,mb4,mb8,mb16,mb16", ("x",), Source.TARGET),
        ("mb2,mb1_ku8,mb4,mb8,mb16", ("x",), Source.TARGET),
        ("MB1_KU8,mb2,mb4,mb8,mb16", ("x",), Source.TARGET),
        ("mb1_ku8,,mb4,mb8,mb16", ("x",), Source.TARGET),
        ("mb1_ku8;mb2;mb4;mb8;mb16", ("x",), Source.TARGET),
        ("mb1_ku8/mb2/mb4/mb8/mb16", ("x",), Source.TARGET),
        (None, ("x",), Source.TARGET),
    ],
)
def test_points_override_grammar(raw: str | None, value: tuple[str, ...], source: Source) -> None:
    assert resolve_points(("x",), raw, GEMV_BANDS) == Resolved(value=value, source=source)


def test_w8a8_gemv_entries_reads_its_variable_and_keeps_the_declaration_otherwise() -> None:
    declared = gemv(["mb1_ku2_o4", "mb2", "mb4", "mb8", "mb16"])
    env = {"METRALE_W8A8_GEMV_ENTRIES": "mb1_ku8,mb2_ku2_o2,mb4,mb8,mb16,"}
    assert resolve(declared, env.get).w8a8_gemv_entries == Resolved(
        value=("mb1_ku2_o4", "mb2", "mb4", "mb8", "mb16"), source=Source.TARGET
    )
    env["METRALE_W8A8_GEMV_ENTRIES"] = "mb1_ku8,mb2_ku2_o2,mb4,mb8,mb16"
    assert resolve(declared, env.get).w8a8_gemv_entries == Resolved(
        value=("mb1_ku8", "mb2_ku2_o2", "mb4", "mb8", "mb16"), source=Source.ENV
    )


@pytest.mark.parametrize(
    ("raw", "value", "source"),
    [
        ("0", 0, Source.ENV),
        (" 12 ", 12, Source.ENV),
        (str(U32_MAX), U32_MAX, Source.ENV),
        ("", 64, Source.TARGET),
        ("max", 64, Source.TARGET),
        ("-1", 64, Source.TARGET),
        (str(U32_MAX + 1), 64, Source.TARGET),
        (None, 64, Source.TARGET),
    ],
)
def test_the_w4a16_row_cap_is_a_row_cap(raw: str | None, value: int, source: Source) -> None:
    declared = parse_defaults("gb10", doc_with({"ffn_w4a16_tc_rows_max_m": 64}))
    env = {} if raw is None else {"METRALE_FFN_W4A16_TC_ROWS_MAX_M": raw}
    assert resolve(declared, env.get).ffn_w4a16_tc_rows_max_m == Resolved(
        value=value, source=source
    )


@pytest.mark.parametrize("value", [-1, U32_MAX + 1, True, "0", 1.0])
def test_the_w4a16_row_cap_must_be_a_u32(value: object) -> None:
    with pytest.raises(DefaultsValueError, match=r"\[defaults\] ffn_w4a16_tc_rows_max_m must "):
        parse_defaults("gb10", doc_with({"ffn_w4a16_tc_rows_max_m": value}))


def test_the_w4a16_row_cap_prints_as_a_number_never_max() -> None:
    declared = parse_defaults("gb10", doc_with({"ffn_w4a16_tc_rows_max_m": U32_MAX}))
    line = format_levers(resolve(declared, NO_ENV.get))
    assert " w8a8_prefill_max_m=max/max ffn_w4a16_tc_rows_max_m=4294967295 " in line
    assert " ffn_w4a16_tc_rows_max_m=0 " in format_levers(resolve(baseline("x"), NO_ENV.get))


@pytest.mark.parametrize(
    ("env", "value", "source"),
    [
        ({}, False, Source.TARGET),
        ({"METRALE_FFN_W4A16_BF16_TILE": ""}, True, Source.ENV),
        ({"METRALE_FFN_W4A16_BF16_TILE": " Off "}, False, Source.ENV),
        ({"METRALE_FFN_W4A16_BF16_TILE": "yes"}, True, Source.ENV),
        # Not under the M16 umbrella, and no kill switch.
        ({"METRALE_M16_TC": "1"}, False, Source.TARGET),
        ({"METRALE_NO_FFN_W4A16_BF16_TILE": "1"}, False, Source.TARGET),
    ],
)
def test_ffn_w4a16_bf16_tile_is_a_plain_toggle(
    env: dict[str, str], value: bool, source: Source
) -> None:
    assert resolve(baseline("gb10"), env.get).ffn_w4a16_bf16_tile == Resolved(
        value=value, source=source
    )
    on = parse_defaults("gb10", doc_with({"ffn_w4a16_bf16_tile": True}))
    assert resolve(on, {"METRALE_M16_TC": "0"}.get).ffn_w4a16_bf16_tile.value is True


def test_the_summary_line_ends_with_the_three_new_levers() -> None:
    declared = parse_defaults(
        "b300",
        doc_with(
            {
                "ffn_w4a16_tc_rows_max_m": 32,
                "ffn_w4a16_bf16_tile": True,
                "w8a8_gemv_entries": ["mb1_ku2_o4", "mb2", "mb4", "mb8_ku2_o2", "mb16"],
            },
            {"sm_count": 148},
        ),
    )
    base = (
        "target defaults (b300): sm_count=148 lm_head_batchm_max=8 ssm_batched_recurrent=off "
        "gdn_prefill_tc=off ssm_ba_gates_hopper=off decode_split_silu=on "
        "attn_decode_splitk=legacy ffn_m16_tc=off attn_m16_tc=off lm_head_m16_tc=off "
        "attn_ncol_gemv=off ffn_gateup_fused=off fp8_act_quant_hopper=off "
        "w8a8_prefill_max_m=max/max "
    )
    assert format_levers(resolve(declared, NO_ENV.get)) == base + (
        "ffn_w4a16_tc_rows_max_m=32 ffn_w4a16_bf16_tile=on "
        "w8a8_gemv_entries=mb1_ku2_o4/mb2/mb4/mb8_ku2_o2/mb16"
    )
    env = {
        "METRALE_FFN_W4A16_TC_ROWS_MAX_M": "0",
        "METRALE_FFN_W4A16_BF16_TILE": "off",
        "METRALE_W8A8_GEMV_ENTRIES": "mb1_ku8, mb2_ku2_o2, mb4_ku2_o2, mb8, mb16_ku1_o2",
    }
    assert format_levers(resolve(declared, env.get)) == base + (
        "ffn_w4a16_tc_rows_max_m=0 (env) ffn_w4a16_bf16_tile=off (env) "
        "w8a8_gemv_entries=mb1_ku8/mb2_ku2_o2/mb4_ku2_o2/mb8/mb16_ku1_o2 (env)"
    )


def test_a_real_17_lever_table_parses() -> None:
    """Every real HARDWARE.toml with a [defaults] table declares all 17 levers."""
    text = HOPPER_TOML + (
        "w8a8_prefill_max_m_widening = 128\n"
        "w8a8_prefill_max_m_narrowing = 4294967295\n"
        "ffn_w4a16_tc_rows_max_m = 16\n"
        "ffn_w4a16_bf16_tile = true\n"
        'w8a8_gemv_entries = ["mb1_ku2_o4", "mb2_ku2_o2", "mb4_ku2_o2", "mb8_ku2_o2", '
        '"mb16_ku1_o2"]\n'
    )
    doc = tomllib.loads(text)
    assert len(doc["defaults"]) == 17
    parsed = parse_defaults("hopper", doc)
    assert (parsed.ffn_w4a16_tc_rows_max_m, parsed.ffn_w4a16_bf16_tile) == (16, True)
    assert parsed.w8a8_gemv_entries == (
        "mb1_ku2_o4",
        "mb2_ku2_o2",
        "mb4_ku2_o2",
        "mb8_ku2_o2",
        "mb16_ku1_o2",
    )


# --------------------------------------------------------------------------- whole-table resolution


def test_kill_switches_outrank_positive_variables() -> None:
    env = {
        "METRALE_ATTN_NCOL_GEMV": "1",
        "METRALE_NO_ATTN_DECODE_BATCH": "",
        "METRALE_NO_DECODE_SPLIT_SILU": "0",
    }
    on = dataclasses.replace(hopper(), attn_ncol_gemv=True)
    levers = resolve(on, env.get)
    assert levers.attn_ncol_gemv == Resolved(value=False, source=Source.ENV)
    assert levers.decode_split_silu == Resolved(value=False, source=Source.ENV)


def test_decode_split_silu_has_no_positive_variable() -> None:
    levers = resolve(hopper(), {"METRALE_DECODE_SPLIT_SILU": "0"}.get)
    assert levers.decode_split_silu == Resolved(value=True, source=Source.TARGET)


def test_the_umbrella_applies_only_when_the_own_variable_is_absent() -> None:
    gb10 = baseline("gb10")
    alone = resolve(gb10, {"METRALE_M16_TC": "1"}.get)
    assert alone.ffn_m16_tc == alone.attn_m16_tc == Resolved(value=True, source=Source.ENV)
    assert alone.lm_head_m16_tc == Resolved(value=False, source=Source.TARGET)

    both = resolve(gb10, {"METRALE_M16_TC": "1", "METRALE_FFN_M16_TC": "0"}.get)
    assert both.ffn_m16_tc == Resolved(value=False, source=Source.ENV)
    assert both.attn_m16_tc == Resolved(value=True, source=Source.ENV)

    # Present-but-empty is present: the own variable wins (empty = on).
    empty = resolve(gb10, {"METRALE_M16_TC": "0", "METRALE_ATTN_M16_TC": ""}.get)
    assert empty.attn_m16_tc == Resolved(value=True, source=Source.ENV)
    assert empty.ffn_m16_tc == Resolved(value=False, source=Source.ENV)


def test_resolve_asks_only_for_the_tables_variables() -> None:
    asked: list[str] = []

    def var(name: str) -> str | None:
        asked.append(name)
        return None

    resolve(hopper(), var)
    known = {v for row in LEVERS for v in row.all_variables()}
    assert set(asked) <= known
    assert {row.variables[0] for row in LEVERS if row.variables} <= set(asked)


def test_the_summary_line_of_a_declared_table_without_environment() -> None:
    assert format_levers(resolve(hopper(), NO_ENV.get)) == HOPPER_LINE


def test_the_summary_line_of_a_declared_table_with_environment() -> None:
    env = {
        "METRALE_LM_HEAD_BATCHM_MAX": "12",
        "METRALE_SSM_BATCHED_RECURRENT": "0",
        "METRALE_M16_TC": "1",
        "METRALE_NO_ATTN_DECODE_BATCH": "",
        "METRALE_ATTN_NCOL_GEMV": "1",
        "METRALE_ATTN_DECODE_SPLITK": "0",
        "METRALE_W8A8_PREFILL_MAX_M_NARROWING": "384",
        "METRALE_GDN_PREFILL_TC": "banana",
        "UNRELATED": "1",
    }
    assert format_levers(resolve(hopper(), env.get)) == (
        "target defaults (hopper): sm_count=132 lm_head_batchm_max=12 (env) "
        "ssm_batched_recurrent=off (env) gdn_prefill_tc=on (env) ssm_ba_gates_hopper=on "
        "decode_split_silu=on attn_decode_splitk=1 (env) ffn_m16_tc=on (env) "
        "attn_m16_tc=on (env) lm_head_m16_tc=on attn_ncol_gemv=off (env) ffn_gateup_fused=on "
        "fp8_act_quant_hopper=on w8a8_prefill_max_m=max/384 ffn_w4a16_tc_rows_max_m=0 "
        "ffn_w4a16_bf16_tile=off w8a8_gemv_entries=mb1_ku8/mb2/mb4/mb8/mb16"
    )


def test_the_w8a8_pair_prints_wide_narrow_with_the_widening_tag() -> None:
    gb10 = parse_defaults("gb10", tomllib.loads(GB10_TOML))
    line = format_levers(resolve(gb10, NO_ENV.get))
    assert line.startswith("target defaults (gb10): sm_count=48 lm_head_batchm_max=8 ")
    assert line.endswith(
        " attn_decode_splitk=legacy ffn_m16_tc=off attn_m16_tc=off "
        "lm_head_m16_tc=off attn_ncol_gemv=off ffn_gateup_fused=off "
        "fp8_act_quant_hopper=off w8a8_prefill_max_m=64/384 ffn_w4a16_tc_rows_max_m=0 "
        "ffn_w4a16_bf16_tile=off w8a8_gemv_entries=mb1_ku8/mb2/mb4/mb8/mb16"
    )
    wide = resolve(gb10, {"METRALE_W8A8_PREFILL_MAX_M_WIDENING": "0"}.get)
    assert " w8a8_prefill_max_m=0/384 (env) ffn_w4a16_tc_rows_max_m=0 " in format_levers(wide)
    narrow = resolve(gb10, {"METRALE_W8A8_PREFILL_MAX_M_NARROWING": "0"}.get)
    assert " w8a8_prefill_max_m=64/0 ffn_w4a16_tc_rows_max_m=0 " in format_levers(narrow)


def test_an_anonymous_declaration_prints_unknown() -> None:
    assert format_levers(resolve(baseline(""), NO_ENV.get)).startswith(
        "target defaults (unknown): sm_count=48 lm_head_batchm_max=8 "
    )


# Independent oracle for "the environment decided this lever" (ASCII inputs only).
def _u32(text: str) -> int | None:
    match = re.fullmatch(r"[ \t]*\+?([0-9]+)[ \t]*", text)
    return int(match[1]) if match and int(match[1]) <= U32_MAX else None


def _decided_by_env(name: str, env: Mapping[str, str]) -> bool:
    own, umbrella, kill = SPEC_VARIABLES[name]
    if kill is not None and kill in env:
        return True
    raw = env.get(own) if own else None
    if name == "lm_head_batchm_max":
        return raw is not None and (_u32(raw) or 0) > 0
    if name.startswith("w8a8_prefill") or name == "ffn_w4a16_tc_rows_max_m":
        return raw is not None and _u32(raw) is not None
    if name == "w8a8_gemv_entries":
        parts = [] if raw is None else [p.strip(" \t") for p in raw.split(",")]
        if len(parts) != 5:
            return False
        return all(p in band for p, band in zip(parts, GEMV_BANDS, strict=True))
    if name == "attn_decode_splitk":
        return raw is not None and (
            raw.strip(" \t").lower() in {"legacy", "auto", "off", "false", "no"}
            or _u32(raw) is not None
        )
    return raw is not None or (umbrella is not None and umbrella in env)


ALL_VARIABLES = sorted({v for names in SPEC_VARIABLES.values() for v in names if v} | {"OTHER"})
_POINT_WORDS = [name for band in GEMV_BANDS for name in band] + ["MB2", "mb3", "", " mb4 "]
VALUES = st.one_of(
    st.sampled_from(
        ["", "0", "1", "off", "No", "auto", "LEGACY", " 12 ", "+3", "-1", "4294967296"]
    ),
    st.text(alphabet=" \t+-0123456789abcdefilnostuyAFLNO", max_size=8),
    # Schedule points: mostly five names, each of its band or not, sometimes 4 or 6.
    st.lists(st.sampled_from(_POINT_WORDS), min_size=4, max_size=6).map(",".join),
    st.tuples(*[st.sampled_from(band) for band in GEMV_BANDS]).map(", ".join),
)


def _declarations() -> st.SearchStrategy[TargetDefaults]:
    def value(row: D.Lever) -> st.SearchStrategy[object]:
        if row.kind is Kind.BOOL:
            return st.booleans()
        if row.kind is Kind.U32:
            return st.sampled_from([0, 1, 8, 16, 64, U32_MAX])
        if row.kind is Kind.POINTS:
            return st.tuples(*[st.sampled_from(band) for band in GEMV_BANDS])
        return st.sampled_from(["legacy", "auto", "4", "bogus"])

    return st.builds(
        TargetDefaults,
        hw=st.sampled_from(["", "hopper", "gb10"]),
        sm_count=st.integers(1, U32_MAX),
        **{row.name: value(row) for row in LEVERS},
    )


@settings(max_examples=300, deadline=None)
@given(declared=_declarations(), env=st.dictionaries(st.sampled_from(ALL_VARIABLES), VALUES))
def test_env_tag_appears_exactly_for_levers_the_environment_decided(
    declared: TargetDefaults, env: dict[str, str]
) -> None:
    levers = resolve(declared, env.get)
    decided = {name for name in SPEC_BASELINES if _decided_by_env(name, env)}
    assert {name for name in SPEC_BASELINES if levers.lever(name).from_env} == decided
    line = format_levers(levers)
    tagged = set(re.findall(r" (\w+)=\S+ \(env\)", line))
    label = {name: name for name in SPEC_BASELINES} | {
        "w8a8_prefill_max_m_widening": "w8a8_prefill_max_m",
        "w8a8_prefill_max_m_narrowing": "",
    }
    assert tagged == {label[name] for name in decided} - {""}
    assert line.count("(env)") == len(tagged)
    sources = {k: v["source"] for k, v in levers.to_dict()["levers"].items()}
    assert {k for k, v in sources.items() if v == "env"} == decided
    # With no variables at all every value is the declaration's.
    assert "(env)" not in format_levers(resolve(declared, NO_ENV.get))


# --------------------------------------------------------------------------- process-wide


def test_resolved_keeps_its_first_resolution() -> None:
    first = resolved({"METRALE_LM_HEAD_BATCHM_MAX": "12"})
    assert first.hw == "" and first.lm_head_batchm_max == Resolved(value=12, source=Source.ENV)
    assert resolved({}) is first
    assert resolved() is first
    assert summary_line() == format_levers(first)
    assert summary_line().startswith("target defaults (unknown): sm_count=48 ")
    reset_resolved()
    assert resolved({}).lm_head_batchm_max.source is Source.TARGET


def test_resolved_reads_the_process_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("METRALE_FFN_GATEUP_FUSED", "1")
    assert resolved().ffn_gateup_fused == Resolved(value=True, source=Source.ENV)


def test_declare_installs_the_served_declaration() -> None:
    declare(hopper())
    assert D.declared() == hopper()
    assert summary_line() == HOPPER_LINE
    declare(hopper())  # the same declaration again is fine
    with pytest.raises(AlreadyResolvedError, match="hopper"):
        declare(baseline("gb10"))


# --------------------------------------------------------------------------- baked artefacts


def test_the_json_view_round_trips() -> None:
    d = hopper()
    doc = render_defaults_json(d)
    assert set(doc) == {"hw", "sm_count", *SPEC_BASELINES}
    assert doc["w8a8_gemv_entries"] == list(GEMV_BASELINE)  # points as an array
    text = json.dumps(doc, sort_keys=True)
    assert '"w8a8_gemv_entries": ["mb1_ku8", "mb2", "mb4", "mb8", "mb16"]' in text
    assert defaults_from_json(json.loads(text)) == d
    assert defaults_from_json({"hw": "x"}) == baseline("x")


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"hw": "x", "sm_count": 0}, "sm_count"),
        ({"hw": 3}, "hw"),
        ({"hw": "x", "ssm_batched_recurrent": 1}, "ssm_batched_recurrent"),
        ({"hw": "x", "nope": 1}, "nope"),
        ({"hw": "x", "w8a8_gemv_entries": ["mb1_ku8"]}, "w8a8_gemv_entries"),
        ({"hw": "x", "w8a8_gemv_entries": "mb1_ku8/mb2/mb4/mb8/mb16"}, "w8a8_gemv_entries"),
    ],
)
def test_a_bad_baked_json_names_the_key(doc: dict[str, object], key: str) -> None:
    with pytest.raises(DefaultsError) as info:
        defaults_from_json(doc)
    assert info.value.key == key and "target_defaults.json" in str(info.value)


def test_the_header_defines_every_lever() -> None:
    d = hopper()
    header = render_defaults_header(d)
    assert header.startswith("/* ") and header.endswith("#endif /* METRALE_TARGET_DEFAULTS_H */\n")
    defines = _defines(header)
    assert "METRALE_TARGET_DEFAULTS_H" in header.split("\n")[1]
    assert defines.pop("METRALE_TARGET_SM_COUNT") == "132"
    assert defines.pop("METRALE_TARGET_HW") == '"hopper"'
    assert defines.pop("METRALE_ATTN_DECODE_SPLITK") == '"auto"'
    assert defines.pop("METRALE_LM_HEAD_BATCHM_MAX") == "16u"
    assert defines.pop("METRALE_W8A8_PREFILL_MAX_M_WIDENING") == "4294967295u"
    assert defines.pop("METRALE_W8A8_PREFILL_MAX_M_NARROWING") == "4294967295u"
    assert defines.pop("METRALE_FFN_W4A16_TC_ROWS_MAX_M") == "0u"
    # Points: one string literal joined by "/".
    assert defines.pop("METRALE_W8A8_GEMV_ENTRIES") == '"mb1_ku8/mb2/mb4/mb8/mb16"'
    bools = {f"METRALE_{row.name.upper()}": row.name for row in LEVERS if row.kind is Kind.BOOL}
    assert defines == {m: "1" if d.value(name) else "0" for m, name in bools.items()}


# --------------------------------------------------------------------------- kernels/LEVERS.toml


def test_a_plain_declaration_has_one_field_per_builtin_lever_only() -> None:
    d = hopper()
    assert type(d) is TargetDefaults and d.tree == ()
    assert set(dataclasses.asdict(d)) == {"hw", "sm_count", *SPEC_BASELINES}
    assert type(resolve(d, NO_ENV.get)) is TargetLevers
    # A tree re-declaring only built-in levers (identically) changes nothing.
    only_builtin = """\
[[lever]]
name = "ffn_m16_tc"
type = "bool"
baseline = false
variables = ["METRALE_FFN_M16_TC", "METRALE_M16_TC"]
rule = "toggle"
about = "the docs' text may differ"

[[lever]]
name = "w8a8_prefill_max_m_narrowing"
type = "u32"
baseline = 4294967295
variables = ["METRALE_W8A8_PREFILL_MAX_M_NARROWING"]
rule = "row-cap"
summary_name = "w8a8_prefill_max_m"
"""
    levers = parse_tree_levers(tomllib.loads(only_builtin))
    assert levers == ()
    # The default summary name spelled out is the same declaration.
    spelled = {**next(r for r in LEVERS if r.name == "ffn_m16_tc").declaration()}
    assert parse_tree_levers({"lever": [spelled | {"summary_name": "ffn_m16_tc"}]}) == ()
    assert parse_defaults("hopper", tomllib.loads(HOPPER_TOML), levers=levers) == d


def test_an_array_element_is_pointed_at() -> None:
    entry = _entry(variables=["METRALE_A", "METRALE B"])
    with pytest.raises(LeverDeclarationError) as info:
        parse_tree_levers({"lever": [entry]})
    assert (info.value.key, info.value.item) == ("variables", "[1]")
    assert str(info.value).startswith(
        "kernels/LEVERS.toml: [[lever]] 'moe_x': variables[1] must be an environment variable "
        'name ([A-Za-z_][A-Za-z0-9_]*), got a string ("METRALE B")'
    )
    entry = _entry(**{**POINTS_OK, "baseline": ["a", "c"], "points": [["a"], ["c", "d e"]]})
    with pytest.raises(LeverDeclarationError) as info:
        parse_tree_levers({"lever": [entry]})
    assert (info.value.key, info.value.item) == ("points", "[1][1]")
    assert ": points[1][1] must be a point name ([A-Za-z0-9_.+-]+), got " in str(info.value)


def test_tree_levers_parse_in_file_order_without_identical_builtins() -> None:
    levers = tree_levers()
    assert [row.name for row in levers] == TREE_NAMES
    moe_tc = levers[1]
    assert (moe_tc.kind, moe_tc.rule, moe_tc.baseline) == (Kind.BOOL, Rule.TOGGLE, True)
    assert (moe_tc.variables, moe_tc.kill) == (
        ("METRALE_MOE_TC", "METRALE_M16_TC"),
        "METRALE_NO_MOE_TC",
    )
    assert moe_tc.about == "tensor-core MoE decode"
    entries = levers[4]
    assert (entries.kind, entries.baseline) == (Kind.POINTS, ("a1", "b1"))
    assert entries.points == (("a1", "a2"), ("b1", "b2", "b3"))
    assert [row.label for row in levers[5:]] == ["moe_cap", "moe_cap"]
    # The JSON view is what the entries declare (no `about`).
    assert DeclaredLevers(file=None, levers=levers).to_dict()[1] == {
        "name": "moe_tc",
        "type": "bool",
        "baseline": True,
        "variables": ["METRALE_MOE_TC", "METRALE_M16_TC"],
        "kill": "METRALE_NO_MOE_TC",
        "rule": "toggle",
    }


def test_a_builtin_lever_redeclared_identically_is_allowed() -> None:
    for row in LEVERS:
        entry = row.declaration()
        doc = {"lever": [entry]}
        assert parse_tree_levers(doc) == (), row.name


def test_tree_levers_parse_as_defaults_keys() -> None:
    d = tree_gb10()
    assert isinstance(d, TreeDefaults) and isinstance(d, TargetDefaults)
    assert [row.name for row, _ in d.tree] == TREE_NAMES
    assert d.value("moe_rows_max_m") == 128
    assert d.value("moe_entries") == ("a2", "b3")  # trimmed
    assert d.value("moe_splitk") == "4"
    assert d.value("moe_tc") is True  # the baseline
    assert d.lm_head_batchm_max == 12
    with pytest.raises(KeyError):
        d.value("nope")
    assert baseline("gb10", levers=tree_levers()).value("moe_rows_max_m") == 64
    # Each type's checks apply to a tree lever's value as to a built-in's.
    for key, value, expected in [
        ("moe_rows_max_m", -1, "must be an integer in 0..=4294967295, got -1, out of range"),
        ("moe_tc", "yes", 'must be a boolean, got a string ("yes")'),
        ("moe_splitk", 4, "must be a string (split-K policy), got an integer (4)"),
        ("moe_entries", ["b1", "a1"], '"b1" in band 0, a point of band 1 (wrong order?)'),
        ("moe_entries", ["a1"], "must be an array of 2 strings, one point per band in band "),
    ]:
        with pytest.raises(DefaultsValueError) as info:
            parse_defaults("gb10", doc_with({key: value}), levers=tree_levers())
        assert info.value.key == key
        assert str(info.value).startswith(f"kernels/gb10/HARDWARE.toml: [defaults] {key} ")
        assert expected in str(info.value)
    with pytest.raises(DefaultsValueError, match=r"band 0: a1\|a2; band 1: b1\|b2\|b3"):
        parse_defaults("gb10", doc_with({"moe_entries": "a1"}), levers=tree_levers())


def test_an_unknown_key_lists_the_tree_levers_among_the_known() -> None:
    with pytest.raises(UnknownLeverError) as info:
        parse_defaults("gb10", doc_with({"moe_rows_maxm": 1, "moe_tc": True}), levers=tree_levers())
    assert info.value.keys == ("moe_rows_maxm",)
    assert info.value.valid == (*SPEC_BASELINES, *TREE_NAMES)
    assert "(did you mean 'moe_rows_max_m'?)" in str(info.value)
    # Without the declaration the same key is unknown, and the message says where it goes.
    with pytest.raises(UnknownLeverError, match=r"declared in kernels/LEVERS\.toml"):
        parse_defaults("gb10", doc_with({"moe_tc": True}))


def test_tree_levers_resolve_by_their_rules() -> None:
    d = tree_gb10()
    env = {
        "METRALE_MOE_ROWS_MAX_M": " 0 ",
        "METRALE_M16_TC": "0",  # the toggle's second variable
        "METRALE_MOE_SPLITK": "legacy",
        "METRALE_MOE_BATCHM_MAX": "99",  # clamped to 16
        "METRALE_MOE_ENTRIES": "a1,b2",
        "METRALE_MOE_CAP_NARROW": "junk",
    }
    levers = resolve(d, env.get)
    assert isinstance(levers, TreeLevers)
    assert levers.lever("moe_rows_max_m") == Resolved(value=0, source=Source.ENV)
    assert levers.lever("moe_tc") == Resolved(value=False, source=Source.ENV)
    assert levers.lever("moe_splitk") == Resolved(value=SplitkPolicy.LEGACY, source=Source.ENV)
    assert levers.lever("moe_batchm_max") == Resolved(value=16, source=Source.ENV)
    assert levers.lever("moe_entries") == Resolved(value=("a1", "b2"), source=Source.ENV)
    assert levers.lever("moe_cap_narrow") == Resolved(value=7, source=Source.TARGET)
    assert levers.lm_head_batchm_max == Resolved(value=12, source=Source.TARGET)
    # The first variable present decides; the kill switch outranks both.
    first = resolve(d, {"METRALE_MOE_TC": "1", "METRALE_M16_TC": "0"}.get)
    assert first.lever("moe_tc") == Resolved(value=True, source=Source.ENV)
    killed = resolve(d, {"METRALE_MOE_TC": "1", "METRALE_NO_MOE_TC": ""}.get)
    assert killed.lever("moe_tc") == Resolved(value=False, source=Source.ENV)
    trailing = resolve(d, {"METRALE_MOE_ENTRIES": "a1,b2,"}.get)
    assert trailing.lever("moe_entries") == Resolved(value=("a2", "b3"), source=Source.TARGET)
    with pytest.raises(KeyError):
        levers.lever("nope")


def test_tree_levers_print_after_the_builtins_in_file_order() -> None:
    d = tree_gb10()
    line = format_levers(resolve(d, NO_ENV.get))
    assert line.startswith("target defaults (gb10): sm_count=48 lm_head_batchm_max=12 ")
    assert line.endswith(TREE_LINE_TAIL)
    env = {"METRALE_MOE_CAP_WIDE": "3", "METRALE_MOE_ENTRIES": "a1, b1", "METRALE_MOE_TC": "0"}
    assert format_levers(resolve(d, env.get)).endswith(
        " moe_rows_max_m=128 moe_tc=off (env) moe_splitk=4 moe_batchm_max=4 "
        "moe_entries=a1/b1 (env) moe_cap=3/7 (env)"
    )
    # The pair is tagged by its first lever only.
    narrow = resolve(d, {"METRALE_MOE_CAP_NARROW": "1"}.get)
    assert format_levers(narrow).endswith(" moe_cap=4294967295/1")


def test_tree_levers_are_baked_into_json_and_header() -> None:
    d = tree_gb10()
    doc = render_defaults_json(d)
    assert set(doc) == {"hw", "sm_count", *SPEC_BASELINES, *TREE_NAMES}
    assert (doc["moe_rows_max_m"], doc["moe_entries"], doc["moe_tc"]) == (128, ["a2", "b3"], True)
    back = defaults_from_json(json.loads(json.dumps(doc)), levers=tree_levers())
    assert back == d
    with pytest.raises(UnknownLeverError):
        defaults_from_json(doc)  # without the tree's levers
    defines = _defines(render_defaults_header(d))
    assert defines["METRALE_MOE_ROWS_MAX_M"] == "128u"
    assert defines["METRALE_MOE_TC"] == "1"
    assert defines["METRALE_MOE_SPLITK"] == '"4"'
    assert defines["METRALE_MOE_ENTRIES"] == '"a2/b3"'
    assert defines["METRALE_MOE_CAP_WIDE"] == "4294967295u"
    header = render_defaults_header(d)
    assert header.index("METRALE_W8A8_GEMV_ENTRIES") < header.index("METRALE_MOE_ROWS_MAX_M")
    levers = resolve(d, NO_ENV.get).to_dict()["levers"]
    assert list(levers)[-len(TREE_NAMES) :] == TREE_NAMES
    assert levers["moe_entries"] == {"value": ["a2", "b3"], "source": "target"}


def test_the_docs_list_a_trees_levers() -> None:
    text = render_docs(tree_levers())
    assert (
        "| `moe_tc` | bool | `true` | `METRALE_MOE_TC`; `METRALE_M16_TC` (read only when " in text
    )
    assert "| tensor-core MoE decode |" in text
    assert "| `moe_rows_max_m` | u32 | `64` | `METRALE_MOE_ROWS_MAX_M` | row-cap | declared " in (
        text
    )
    assert "| `moe_entries` | 1 | `b1`, `b2`, `b3` |" in text
    assert "| `METRALE_NO_MOE_TC` | `moe_tc` | forces it off when present" in text
    assert "moe_rows_max_m" not in render_docs()


def test_the_process_wide_resolution_serves_tree_levers() -> None:
    declare(tree_gb10())
    assert summary_line().endswith(TREE_LINE_TAIL)
    assert resolved().lever("moe_rows_max_m").value == 128
    with pytest.raises(AlreadyResolvedError):
        declare(baseline("gb10", levers=tree_levers()))


LEVER_OK = {
    "name": "moe_x",
    "type": "u32",
    "baseline": 1,
    "variables": ["METRALE_MOE_X"],
    "rule": "row-cap",
}


def _entry(**changes: object) -> dict[str, object]:
    entry = {**LEVER_OK, **changes}
    return {k: v for k, v in entry.items() if v is not None}


POINTS_OK = {"type": "points", "rule": "points", "baseline": ["a"], "points": [["a", "b"]]}


@pytest.mark.parametrize(
    ("entry", "lever", "key", "problem"),
    [
        ("not a table", "#1", "[[lever]]", 'must be a table, got a string ("not a table")'),
        (_entry(nmae="x"), "#1", "nmae", "is not a key of a lever (the keys: name, type, "),
        (_entry(a=1, b=2), "#1", "a, b", "are not keys of a lever"),
        (_entry(name=None), "#1", "name", "is missing (every lever has name, type, baseline"),
        (_entry(type=None), "#1", "type", "is missing"),
        (_entry(baseline=None), "#1", "baseline", "is missing"),
        (_entry(variables=None), "#1", "variables", "is missing"),
        (_entry(rule=None), "#1", "rule", "is missing"),
        (_entry(name="Moe_X"), "#1", "name", "must be a lower-case name ([a-z][a-z0-9_]*), got a"),
        (_entry(name="moe-x"), "#1", "name", "must be a lower-case name"),
        (_entry(name=3), "#1", "name", "must be a lower-case name ([a-z][a-z0-9_]*), got an "),
        (_entry(name="sm_count"), "#1", "name", "'sm_count' is reserved"),
        (_entry(name="hw"), "#1", "name", "'hw' is reserved"),
        (_entry(name="target_hw"), "#1", "name", "'target_hw' is reserved"),
        (_entry(type="int"), "'moe_x'", "type", "must be one of u32, bool, string, points, got "),
        (_entry(rule="row cap"), "'moe_x'", "rule", "must be one of toggle, head-band, row-cap, "),
        (_entry(rule="Split-K"), "'moe_x'", "rule", "must be one of"),
        (
            _entry(rule="toggle"),
            "'moe_x'",
            "rule",
            "'toggle' works on bool levers, not u32 (a "
            "u32 lever takes rule 'head-band' or 'row-cap')",
        ),
        (_entry(type="string", baseline="x"), "'moe_x'", "rule", "'row-cap' works on u32 levers"),
        (_entry(variables="METRALE_X"), "'moe_x'", "variables", "must be an array of environment"),
        (
            _entry(variables=["METRALE X"]),
            "'moe_x'",
            "variables",
            "must be an environment variable name ([A-Za-z_]",
        ),
        (
            _entry(variables=["A", 3]),
            "'moe_x'",
            "variables",
            "must be an environment variable name",
        ),
        (_entry(variables=["A", "A"]), "'moe_x'", "variables", "repeats 'A'"),
        (_entry(kill="METRALE_NO_X"), "'moe_x'", "kill", "is for toggles only"),
        (
            _entry(type="bool", rule="toggle", baseline=False, kill=["X"]),
            "'moe_x'",
            "kill",
            'must be an environment variable name, got an array (["X"])',
        ),
        (_entry(points=[["a"]]), "'moe_x'", "points", "is for points levers only (type and rule"),
        (_entry(**{**POINTS_OK, "points": None}), "'moe_x'", "points", "is missing: a points"),
        (_entry(**{**POINTS_OK, "points": []}), "'moe_x'", "points", "must be a non-empty array"),
        (_entry(**{**POINTS_OK, "points": "a"}), "'moe_x'", "points", "must be a non-empty array"),
        (_entry(**{**POINTS_OK, "points": [[]]}), "'moe_x'", "points", "is empty"),
        (_entry(**{**POINTS_OK, "points": [["a"], "b"]}), "'moe_x'", "points", "must be an "),
        (_entry(**{**POINTS_OK, "points": [["a", "a b"]]}), "'moe_x'", "points", "must be a point"),
        (_entry(**{**POINTS_OK, "points": [["a/b"]]}), "'moe_x'", "points", "must be a point"),
        (_entry(**{**POINTS_OK, "points": [["a,b"]]}), "'moe_x'", "points", "must be a point"),
        (_entry(**{**POINTS_OK, "points": [["a", "a"]]}), "'moe_x'", "points", "repeats 'a'"),
        (_entry(baseline=-1), "'moe_x'", "baseline", "must be an integer in 0..=4294967295, got "),
        (_entry(baseline=U32_MAX + 1), "'moe_x'", "baseline", "out of range"),
        (_entry(baseline="1"), "'moe_x'", "baseline", 'got a string ("1")'),
        (
            _entry(type="bool", rule="toggle", baseline=0),
            "'moe_x'",
            "baseline",
            "must be a boolean, got an integer (0)",
        ),
        (
            _entry(type="string", rule="split-K", baseline=True),
            "'moe_x'",
            "baseline",
            "must be a string, got a boolean (true)",
        ),
        (
            _entry(**{**POINTS_OK, "baseline": ["b", "a"]}),
            "'moe_x'",
            "baseline",
            "must be an array of 1 strings, one point per band in band order (band 0: a|b), got",
        ),
        (_entry(**{**POINTS_OK, "baseline": ["c"]}), "'moe_x'", "baseline", '"c" in band 0'),
        (_entry(summary_name="Moe"), "'moe_x'", "summary_name", "must be a lower-case name"),
        (_entry(summary_name="sm_count"), "'moe_x'", "summary_name", "'sm_count' is reserved"),
        (_entry(about=3), "'moe_x'", "about", "must be a string, got an integer (3)"),
    ],
)
def test_a_bad_lever_entry_names_the_file_the_lever_and_the_key(
    entry: object, lever: str, key: str, problem: str
) -> None:
    with pytest.raises(LeverDeclarationError) as info:
        parse_tree_levers({"lever": [LEVER_OK | {"name": "ok_first"}, entry]})
    err = info.value
    assert isinstance(err, DefaultsError)
    lever = "#2" if lever == "#1" else lever
    assert (err.path, err.lever, err.key) == ("kernels/LEVERS.toml", lever, key)
    text = str(err)
    assert text.startswith(f"kernels/LEVERS.toml: [[lever]] {lever}: {key}{err.item} ")
    assert problem in text, text
    assert text.endswith("; fix the entry in kernels/LEVERS.toml") and "\n" not in text


@pytest.mark.parametrize(
    ("changes", "key", "problem"),
    [
        ({"baseline": 16}, "baseline", "is 16 here but 8 in the built-in lever of that name"),
        ({"rule": "row-cap"}, "rule", 'is "row-cap" here but "head-band" in the built-in'),
        ({"variables": ["METRALE_X"]}, "variables", 'is ["METRALE_X"] here but '),
        ({"type": "bool", "baseline": True, "rule": "toggle"}, "type", 'is "bool" here but "u32"'),
        ({"summary_name": "head"}, "summary_name", 'is "head" here but absent in the built-in'),
    ],
)
def test_a_builtin_lever_redeclared_differently_is_an_error(
    changes: dict[str, object], key: str, problem: str
) -> None:
    entry = {**next(r for r in LEVERS if r.name == "lm_head_batchm_max").declaration(), **changes}
    with pytest.raises(LeverDeclarationError) as info:
        parse_tree_levers({"lever": [entry]})
    assert (info.value.lever, info.value.key) == ("'lm_head_batchm_max'", key)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("name", "key", "problem"),
    [
        ("kill", "kill", 'is absent here but "METRALE_NO_DECODE_SPLIT_SILU" in the built-in'),
        ("points", "points", 'is [["mb1_ku8", "mb1_ku2_o4", "mb1_x"], ["mb2", "mb2_ku2_o2"]'),
        ("baseline", "baseline", 'is ["mb1_ku2_o4", "mb2", "mb4", "mb8", "mb16"] here but ['),
        ("summary", "summary_name", 'is absent here but "w8a8_prefill_max_m" in the built-in'),
        ("umbrella", "variables", 'is ["METRALE_FFN_M16_TC"] here but ["METRALE_FFN_M16_TC", '),
    ],
)
def test_every_key_of_a_builtin_redeclaration_is_compared(
    name: str, key: str, problem: str
) -> None:
    builtin = {row.name: row.declaration() for row in LEVERS}
    entry = {
        "kill": {**builtin["decode_split_silu"], "kill": None},
        "points": {
            **builtin["w8a8_gemv_entries"],
            "points": [
                ["mb1_ku8", "mb1_ku2_o4", "mb1_x"],
                *builtin["w8a8_gemv_entries"]["points"][1:],
            ],
        },
        "baseline": {
            **builtin["w8a8_gemv_entries"],
            "baseline": ["mb1_ku2_o4", "mb2", "mb4", "mb8", "mb16"],
        },
        "summary": {**builtin["w8a8_prefill_max_m_narrowing"], "summary_name": None},
        "umbrella": {**builtin["ffn_m16_tc"], "variables": ["METRALE_FFN_M16_TC"]},
    }[name]
    entry = {k: v for k, v in entry.items() if v is not None}
    with pytest.raises(LeverDeclarationError) as info:
        parse_tree_levers({"lever": [entry]})
    assert info.value.key == key
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("entries", "lever", "key", "problem"),
    [
        ([LEVER_OK, LEVER_OK], "'moe_x'", "name", "is declared twice (entries #1 and #2)"),
        (
            [_entry(summary_name="w8a8_prefill_max_m")],
            "'moe_x'",
            "summary_name",
            "'w8a8_prefill_max_m' already prints in the summary line for a built-in lever",
        ),
        (
            [_entry(summary_name="ffn_gateup_fused")],
            "'moe_x'",
            "summary_name",
            "already prints in the summary line for a built-in lever",
        ),
        (
            [_entry(name="w8a8_prefill_max_m")],
            "'w8a8_prefill_max_m'",
            "name",
            "already prints in the summary line for a built-in lever",
        ),
        (
            [
                _entry(name="a_one", summary_name="pair"),
                _entry(name="b_mid"),
                _entry(name="c_two", summary_name="pair"),
            ],
            "'c_two'",
            "summary_name",
            "'pair' already prints in the summary line for 'a_one'; levers sharing a summary "
            "name are declared one after another",
        ),
        (
            [
                _entry(name="a_one"),
                _entry(name="b_mid"),
                _entry(name="c_two", summary_name="a_one"),
            ],
            "'c_two'",
            "summary_name",
            "'a_one' already prints in the summary line for 'a_one'",
        ),
    ],
)
def test_names_and_summary_names_are_unique(
    entries: list[object], lever: str, key: str, problem: str
) -> None:
    with pytest.raises(LeverDeclarationError) as info:
        parse_tree_levers({"lever": entries})
    assert (info.value.lever, info.value.key) == (lever, key)
    assert problem in str(info.value)


def test_levers_declared_one_after_another_share_a_summary_name() -> None:
    levers = parse_tree_levers(
        {"lever": [_entry(name="a_one", summary_name="pair"), _entry(name="a_two")]}
    )
    assert [row.label for row in levers] == ["pair", "a_two"]
    levers = parse_tree_levers({"lever": [_entry(name="a_one"), _entry(summary_name="a_one")]})
    line = format_levers(resolve(baseline("x", levers=levers), NO_ENV.get))
    assert line.endswith(" w8a8_gemv_entries=mb1_ku8/mb2/mb4/mb8/mb16 a_one=1/1")


@pytest.mark.parametrize(
    ("doc", "key", "problem"),
    [
        ({"levers": []}, "levers", "levers: not a key of this file (it holds [[lever]] tables"),
        ({"lever": [], "a": 1, "b": {}}, "a, b", "a, b: not a key of this file"),
        ({"lever": {"name": "x"}}, "lever", "lever must be an array of tables ([[lever]]), got a"),
        ({"lever": "x"}, "lever", "lever must be an array of tables"),
    ],
)
def test_a_bad_levers_file_names_the_file_and_the_key(
    doc: dict[str, object], key: str, problem: str
) -> None:
    with pytest.raises(DefaultsError) as info:
        parse_tree_levers(doc)
    assert (info.value.path, info.value.key) == ("kernels/LEVERS.toml", key)
    assert str(info.value).startswith(f"kernels/LEVERS.toml: {problem}")


def test_read_tree_levers_reads_and_validates_the_file(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    assert read_tree_levers(tmp_path / "kernels") == DeclaredLevers(file=None, levers=())
    path = write_levers(tmp_path, TREE)
    got = read_tree_levers(str(tmp_path / "kernels"))
    assert got == DeclaredLevers(file=path, levers=tree_levers())
    # read_defaults reads the tree's levers itself, unless they are handed in.
    write_hw(tmp_path, "gb10", TREE_DEFAULTS_TOML)
    assert read_defaults(tmp_path / "kernels", "gb10") == tree_gb10()
    assert read_defaults(tmp_path / "kernels", "gb10", levers=tree_levers()) == tree_gb10()
    # A missing or unparseable HARDWARE.toml is the baseline, tree levers included.
    assert read_defaults(tmp_path / "kernels", "b300") == baseline("b300", levers=tree_levers())
    write_levers(tmp_path, "")
    with pytest.raises(UnknownLeverError, match="'moe_entries', 'moe_rows_max_m', 'moe_splitk'"):
        read_defaults(tmp_path / "kernels", "gb10")


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        ("dir", "kernels/LEVERS.toml: is a directory, not a TOML file: make it a file"),
        ("symlink", "kernels/LEVERS.toml: is a symlink; make it a regular file in the tree"),
        ("dangling", "kernels/LEVERS.toml: is a symlink"),
        ("toml", "kernels/LEVERS.toml: does not parse (Expected ']]'"),
        ("utf8", "kernels/LEVERS.toml: does not parse ("),
        ("entry", "kernels/LEVERS.toml: [[lever]] 'moe_x': baseline must be an integer"),
    ],
)
def test_a_bad_levers_file_is_an_error(tmp_path: Path, make: str, problem: str) -> None:
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    if make == "dir":
        (kernels / "LEVERS.toml").mkdir()
    elif make == "symlink":
        (tmp_path / "real.toml").write_text(TREE, encoding="utf-8")
        (kernels / "LEVERS.toml").symlink_to(tmp_path / "real.toml")
    elif make == "dangling":
        (kernels / "LEVERS.toml").symlink_to(tmp_path / "missing.toml")
    elif make == "toml":
        write_levers(tmp_path, "[[lever]\n")
    elif make == "utf8":
        write_levers(tmp_path, b'[[lever]]\nname = "\xff"\n')
    else:
        write_levers(
            tmp_path,
            '[[lever]]\nname = "moe_x"\ntype = "u32"\nbaseline = -2\n'
            'variables = []\nrule = "row-cap"\n',
        )
    write_hw(tmp_path, "gb10", "[defaults]\n")
    for call in (lambda: read_tree_levers(kernels), lambda: read_defaults(kernels, "gb10")):
        with pytest.raises(DefaultsError) as info:
            call()
        assert info.value.path == "kernels/LEVERS.toml"
        assert str(info.value).startswith(problem), str(info.value)
        assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- docs


def test_the_docs_cover_every_lever_and_variable() -> None:
    text = render_docs()
    for row in LEVERS:
        assert f"| `{row.name}` |" in text
        for variable in row.all_variables():
            assert f"| `{variable}` |" in text
    for band, names in enumerate(GEMV_BANDS):
        assert f"| `w8a8_gemv_entries` | {band} | `{names[0]}`, `{names[1]}` |" in text


def test_docs_defaults_md_is_generated() -> None:
    path = REPO / "docs" / "defaults.md"
    assert path.read_text(encoding="utf-8") == render_docs(), (
        "docs/defaults.md is stale: run "
        "`.venv/bin/python -c 'from metrale_orch.defaults import write_docs; write_docs(\".\")'`"
    )


def test_write_docs_regenerates_the_page_and_is_idempotent(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "defaults.md").write_text("stale\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("# x\n", encoding="utf-8")
    assert write_docs(tmp_path) == (tmp_path / "docs" / "defaults.md",)
    assert (tmp_path / "docs" / "defaults.md").read_text(encoding="utf-8") == render_docs()
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "# x\n"  # links, no copy
    assert write_docs(tmp_path) == ()


# --------------------------------------------------------------------------- CLI


def run_cli(root: Path, *args: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), "defaults", *args], environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_prints_the_summary_line_under_the_given_environment(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", HOPPER_TOML)
    assert run_cli(tmp_path, "hopper") == (0, HOPPER_LINE + "\n", "")
    code, out, _ = run_cli(tmp_path, "hopper", environ={"METRALE_FFN_M16_TC": "on"})
    assert code == 0 and " ffn_m16_tc=on (env) " in out


def test_cli_json_shows_every_lever_value_and_source(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", HOPPER_TOML)
    code, out, _ = run_cli(
        tmp_path, "hopper", "--json", environ={"METRALE_ATTN_DECODE_SPLITK": " 4 "}
    )
    assert code == 0
    doc = json.loads(out)
    assert out == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert (doc["hw"], doc["sm_count"]) == ("hopper", 132)
    assert set(doc["levers"]) == set(SPEC_BASELINES)
    assert doc["levers"]["attn_decode_splitk"] == {"source": "env", "value": "4"}
    assert doc["levers"]["lm_head_batchm_max"] == {"source": "target", "value": 16}
    assert doc["levers"]["w8a8_prefill_max_m_widening"] == {"source": "target", "value": U32_MAX}
    assert doc["levers"]["ffn_gateup_fused"] == {"source": "target", "value": True}


def test_cli_unknown_hardware_exits_2_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    code, out, err = run_cli(tmp_path, "volta")
    assert (code, out) == (2, "")
    assert err.startswith("error: kernels/volta/HARDWARE.toml not found")
    code, _, err = run_cli(tmp_path, "../etc")
    assert code == 2 and "not a hardware name" in err


def test_cli_bad_table_exits_2_naming_the_key(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", "[defaults]\nlm_head_batchm_max = true\n")
    code, out, err = run_cli(tmp_path, "hopper")
    assert (code, out) == (2, "")
    assert err.startswith("error: kernels/hopper/HARDWARE.toml: [defaults] lm_head_batchm_max ")
    assert "Traceback" not in err


def test_cli_warns_when_the_file_does_not_parse(tmp_path: Path) -> None:
    write_hw(tmp_path, "gb10", "[defaults\n")
    code, out, err = run_cli(tmp_path, "gb10")
    assert code == 0
    assert out == format_levers(resolve(baseline("gb10"), NO_ENV.get)) + "\n"
    assert err.startswith("warning: kernels/gb10/HARDWARE.toml does not parse")


def test_cli_resolves_under_its_own_environment_not_the_process_cache(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", HOPPER_TOML)
    resolved({})
    code, out, _ = run_cli(tmp_path, "hopper", environ={"METRALE_GDN_PREFILL_TC": "0"})
    assert code == 0 and " gdn_prefill_tc=off (env) " in out


def test_cli_shows_the_trees_own_levers(tmp_path: Path) -> None:
    write_levers(tmp_path, TREE)
    write_hw(tmp_path, "gb10", TREE_DEFAULTS_TOML)
    code, out, err = run_cli(tmp_path, "gb10")
    assert (code, err) == (0, "")
    assert out == format_levers(resolve(tree_gb10(), NO_ENV.get)) + "\n"
    assert out.endswith(TREE_LINE_TAIL + "\n")
    code, out, _ = run_cli(tmp_path, "gb10", environ={"METRALE_MOE_ENTRIES": "a1,b1"})
    assert code == 0 and " moe_entries=a1/b1 (env) " in out
    code, out, _ = run_cli(tmp_path, "gb10", "--json")
    levers = json.loads(out)["levers"]
    assert levers["moe_entries"] == {"source": "target", "value": ["a2", "b3"]}
    assert levers["w8a8_gemv_entries"] == {"source": "target", "value": list(GEMV_BASELINE)}


def test_cli_docs_prints_the_reference_with_the_trees_levers(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    assert run_cli(tmp_path, "--docs") == (0, render_docs(), "")
    write_levers(tmp_path, TREE)
    assert run_cli(tmp_path, "--docs") == (0, render_docs(tree_levers()), "")
    code, out, err = run_cli(tmp_path, "gb10", "--docs")
    assert (code, out) == (2, "") and err.startswith("error: defaults --docs takes no HW")
    code, out, err = run_cli(tmp_path)
    assert (code, out) == (2, "") and "name a hardware" in err


@pytest.mark.parametrize(
    ("levers", "hardware", "message"),
    [
        (
            '[[lever]]\nname = "moe_x"\ntype = "u32"\nbaseline = 1\nvariables = []\n'
            'rule = "toggle"\n',
            "[defaults]\n",
            "error: kernels/LEVERS.toml: [[lever]] 'moe_x': rule 'toggle' works on bool levers",
        ),
        (
            None,
            "[defaults]\nmoe_x = 1\nmoe_y = true\n",
            "error: kernels/gb10/HARDWARE.toml: [defaults] has 2 unknown levers: 'moe_x', 'moe_y'",
        ),
    ],
)
def test_cli_a_bad_lever_declaration_exits_2_with_one_line(
    tmp_path: Path, levers: str | None, hardware: str, message: str
) -> None:
    if levers is not None:
        write_levers(tmp_path, levers)
    write_hw(tmp_path, "gb10", hardware)
    code, out, err = run_cli(tmp_path, "gb10")
    assert (code, out) == (2, "")
    assert err.startswith(message) and err.count("\n") == 1, err


# --------------------------------------------------------------------------- the build


def _plan_small_tree(root: Path) -> Any:

    layout = discover(root, Target(hardware="hw1", model="m1", quant="q1"))
    return plan_target(root, layout, builtin_toolchains(), identity="fake 1.0")


def test_levers_toml_is_a_file_dependency_and_part_of_every_signature(tmp_path: Path) -> None:

    root = small_tree(tmp_path / "repo")
    before = _plan_small_tree(root)
    assert "kernels/LEVERS.toml" not in before.file_dep_rels
    assert before.signature["levers"] == []
    assert "moe_rows_max_m" not in before.signature["defaults"]

    write_levers(root, TREE)
    after = _plan_small_tree(root)
    assert "kernels/LEVERS.toml" in after.file_dep_rels
    assert root / "kernels" / "LEVERS.toml" in after.file_deps
    assert after.signature["levers"] == DeclaredLevers(file=None, levers=tree_levers()).to_dict()
    assert after.signature["defaults"]["moe_rows_max_m"] == 64
    assert after.signature["defaults"]["moe_entries"] == ["a1", "b1"]
    assert isinstance(after.defaults, TreeDefaults)
    # Compiles are unaffected: the baked defaults are not compiler inputs.
    assert [m.argv for m in after.modules] == [m.argv for m in before.modules]

    # A changed declaration changes the signature (and so re-runs every target).
    write_levers(root, TREE.replace("baseline = 64", "baseline = 65"))
    edited = _plan_small_tree(root)
    assert edited.signature["levers"] != after.signature["levers"]
    assert edited.signature["defaults"]["moe_rows_max_m"] == 65

    write_levers(root, "[[lever]]\nname = 3\n")
    with pytest.raises(LeverDeclarationError, match=r"kernels/LEVERS\.toml: \[\[lever\]\] #1"):
        _plan_small_tree(root)


def test_defaults_imports_nothing_of_the_package_but_errors() -> None:

    modules: set[str] = set()
    for file in Path(D.__file__).parent.glob("*.py"):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    outside = {m for m in modules if m.startswith("metrale_orch")}
    outside = {m for m in outside if not m.startswith("metrale_orch.defaults.")}
    assert outside == {"metrale_orch.errors"}
