"""Tests for metrale_orch.defaults (SPEC 2): the table of levers and its parsing.

The defaults are tested across ``tests/unit/defaults/test_defaults_*.py``, one file per group
of rules; the tests that start processes are in ``tests/scenarios/defaults/test_defaults.py``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from metrale_orch import defaults as D
from metrale_orch.defaults import (
    BASELINE_BATCHM_MAX,
    DENSE_GEMV_BATCHM_MAX_M,
    LEVERS,
    DefaultsError,
    DefaultsValueError,
    Kind,
    Rule,
    TargetDefaults,
    TargetLevers,
    UnknownLeverError,
    baseline,
    format_levers,
    parse_defaults,
    read_defaults,
    resolve,
)
from metrale_orch.errors import MetraleError
from tests.support.defaults import (
    GEMV_BANDS,
    HOPPER_TOML,
    NO_ENV,
    SPEC_BASELINES,
    SPEC_VARIABLES,
    U32_MAX,
    doc_with,
    hopper,
    write_hw,
)


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
