"""Tests for metrale_orch.defaults (SPEC 2) and `metrale-orch defaults`."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
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
    DefaultsError,
    DefaultsValueError,
    Kind,
    Resolved,
    Rule,
    Source,
    SplitkPolicy,
    TargetDefaults,
    TargetLevers,
    UnknownLeverError,
    baseline,
    declare,
    defaults_from_json,
    format_levers,
    parse_defaults,
    read_defaults,
    render_defaults_header,
    render_defaults_json,
    render_docs,
    reset_resolved,
    resolve,
    resolve_batchm_max,
    resolve_max_m,
    resolve_policy,
    resolve_toggle,
    resolved,
    summary_line,
    write_docs,
)
from metrale_orch.errors import MetraleError

REPO = Path(__file__).resolve().parents[1]
U32_MAX = 4294967295
NO_ENV: dict[str, str] = {}

# SPEC 2.1: lever -> (type, baseline), in table order.
SPEC_BASELINES: dict[str, tuple[Kind, object]] = {
    "lm_head_batchm_max": (Kind.U32, 8),
    "ssm_batched_recurrent": (Kind.BOOL, False),
    "gdn_prefill_tc": (Kind.BOOL, False),
    "ssm_ba_gates_hopper": (Kind.BOOL, False),
    "fp8_act_quant_hopper": (Kind.BOOL, False),
    "decode_split_silu": (Kind.BOOL, True),
    "attn_decode_splitk": (Kind.SPLITK, "legacy"),
    "ffn_m16_tc": (Kind.BOOL, False),
    "attn_m16_tc": (Kind.BOOL, False),
    "lm_head_m16_tc": (Kind.BOOL, False),
    "attn_ncol_gemv": (Kind.BOOL, False),
    "ffn_gateup_fused": (Kind.BOOL, False),
    "w8a8_prefill_max_m_widening": (Kind.U32, U32_MAX),
    "w8a8_prefill_max_m_narrowing": (Kind.U32, U32_MAX),
}

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
}

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
]

HOPPER_TOML = """\
[hardware]
arch = "sm_90a"
sm_count = 132

[defaults]
lm_head_batchm_max = 16
ssm_batched_recurrent = true
gdn_prefill_tc = true
ssm_ba_gates_hopper = true
fp8_act_quant_hopper = true
decode_split_silu = true
attn_decode_splitk = "auto"
ffn_m16_tc = false
attn_m16_tc = true
lm_head_m16_tc = true
attn_ncol_gemv = false
ffn_gateup_fused = true
"""

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
    "fp8_act_quant_hopper=on w8a8_prefill_max_m=max/max"
)


def hopper() -> TargetDefaults:
    return parse_defaults("hopper", tomllib.loads(HOPPER_TOML))


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


@pytest.fixture
def process_cache() -> Iterator[None]:
    reset_resolved()
    yield
    reset_resolved()


# --------------------------------------------------------------------------- the table


def test_the_table_holds_the_spec_levers_types_baselines_and_variables() -> None:
    assert [row.name for row in LEVERS] == list(SPEC_BASELINES)
    for row in LEVERS:
        kind, value = SPEC_BASELINES[row.name]
        assert (row.kind, row.baseline) == (kind, value), row.name
        assert type(row.baseline) is type(value), row.name
        assert (row.variable, row.umbrella, row.kill) == SPEC_VARIABLES[row.name], row.name
    assert BASELINE_BATCHM_MAX == 8
    assert DENSE_GEMV_BATCHM_MAX_M == 16


def test_the_value_types_carry_one_field_per_row() -> None:
    names = [row.name for row in LEVERS]
    for cls in (TargetDefaults, TargetLevers):
        assert [f.name for f in dataclasses.fields(cls)] == ["hw", "sm_count", *names]
    assert not {"hw", "sm_count"} & set(names)


def test_rules_match_types_and_only_toggles_have_umbrellas_or_kill_switches() -> None:
    expected = {Kind.BOOL: {Rule.TOGGLE}, Kind.U32: {Rule.HEAD_BAND, Rule.ROW_CAP}}
    expected[Kind.SPLITK] = {Rule.SPLITK}
    for row in LEVERS:
        assert row.rule in expected[row.kind], row.name
        if row.rule is not Rule.TOGGLE:
            assert row.umbrella is None and row.kill is None, row.name
            assert row.variable is not None, row.name


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
    return "auto" if kind is Kind.SPLITK else 7


@pytest.mark.parametrize("row", LEVERS, ids=lambda r: r.name)
def test_each_key_replaces_exactly_its_field(row: D.Lever) -> None:
    value: Any = _other_value(row.kind, row.baseline)
    parsed = parse_defaults("hopper", doc_with({row.name: value}))
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
    assert err.key == "ffn_gateup_fuse"
    assert err.valid == tuple(SPEC_BASELINES)
    text = str(err)
    assert "kernels/hopper/HARDWARE.toml" in text and "'ffn_gateup_fuse'" in text
    assert all(name in text for name in SPEC_BASELINES)


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
    known = {v for row in LEVERS for v in row.variables()}
    assert set(asked) <= known
    assert {row.variable for row in LEVERS if row.variable} <= set(asked)


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
        "fp8_act_quant_hopper=on w8a8_prefill_max_m=max/384"
    )


def test_the_w8a8_pair_prints_wide_narrow_with_the_widening_tag() -> None:
    gb10 = parse_defaults("gb10", tomllib.loads(GB10_TOML))
    line = format_levers(resolve(gb10, NO_ENV.get))
    assert line.startswith("target defaults (gb10): sm_count=48 lm_head_batchm_max=8 ")
    assert line.endswith(
        " attn_decode_splitk=legacy ffn_m16_tc=off attn_m16_tc=off "
        "lm_head_m16_tc=off attn_ncol_gemv=off ffn_gateup_fused=off "
        "fp8_act_quant_hopper=off w8a8_prefill_max_m=64/384"
    )
    wide = resolve(gb10, {"METRALE_W8A8_PREFILL_MAX_M_WIDENING": "0"}.get)
    assert format_levers(wide).endswith(" w8a8_prefill_max_m=0/384 (env)")


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
    if name.startswith("w8a8_"):
        return raw is not None and _u32(raw) is not None
    if name == "attn_decode_splitk":
        return raw is not None and (
            raw.strip(" \t").lower() in {"legacy", "auto", "off", "false", "no"}
            or _u32(raw) is not None
        )
    return raw is not None or (umbrella is not None and umbrella in env)


ALL_VARIABLES = sorted({v for names in SPEC_VARIABLES.values() for v in names if v} | {"OTHER"})
VALUES = st.one_of(
    st.sampled_from(
        ["", "0", "1", "off", "No", "auto", "LEGACY", " 12 ", "+3", "-1", "4294967296"]
    ),
    st.text(alphabet=" \t+-0123456789abcdefilnostuyAFLNO", max_size=8),
)


def _declarations() -> st.SearchStrategy[TargetDefaults]:
    def value(row: D.Lever) -> st.SearchStrategy[object]:
        if row.kind is Kind.BOOL:
            return st.booleans()
        if row.kind is Kind.U32:
            return st.sampled_from([0, 1, 8, 16, 64, U32_MAX])
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


@pytest.mark.usefixtures("process_cache")
def test_resolved_keeps_its_first_resolution() -> None:
    first = resolved({"METRALE_LM_HEAD_BATCHM_MAX": "12"})
    assert first.hw == "" and first.lm_head_batchm_max == Resolved(value=12, source=Source.ENV)
    assert resolved({}) is first
    assert resolved() is first
    assert summary_line() == format_levers(first)
    assert summary_line().startswith("target defaults (unknown): sm_count=48 ")
    reset_resolved()
    assert resolved({}).lm_head_batchm_max.source is Source.TARGET


@pytest.mark.usefixtures("process_cache")
def test_resolved_reads_the_process_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("METRALE_FFN_GATEUP_FUSED", "1")
    assert resolved().ffn_gateup_fused == Resolved(value=True, source=Source.ENV)


@pytest.mark.usefixtures("process_cache")
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
    text = json.dumps(doc, sort_keys=True)
    assert defaults_from_json(json.loads(text)) == d
    assert defaults_from_json({"hw": "x"}) == baseline("x")


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"hw": "x", "sm_count": 0}, "sm_count"),
        ({"hw": 3}, "hw"),
        ({"hw": "x", "ssm_batched_recurrent": 1}, "ssm_batched_recurrent"),
        ({"hw": "x", "nope": 1}, "nope"),
    ],
)
def test_a_bad_baked_json_names_the_key(doc: dict[str, object], key: str) -> None:
    with pytest.raises(DefaultsError) as info:
        defaults_from_json(doc)
    assert info.value.key == key and "target_defaults.json" in str(info.value)


def _defines(header: str) -> dict[str, str]:
    return dict(re.findall(r"^#define (METRALE_\w+) (.+)$", header, flags=re.MULTILINE))


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
    bools = {f"METRALE_{row.name.upper()}": row.name for row in LEVERS if row.kind is Kind.BOOL}
    assert defines == {m: "1" if d.value(name) else "0" for m, name in bools.items()}


def _probe_source(d: TargetDefaults) -> str:
    """A .cu that checks every macro against `d`, byte by byte for the strings."""
    lines = ['#include "target_defaults.h"', '#include "target_defaults.h"']
    lines.append(f'static_assert(METRALE_TARGET_SM_COUNT == {d.sm_count}, "sm_count");')

    def string_checks(macro: str, text: str) -> None:
        data = text.encode("utf-8")
        lines.append(f'static_assert(sizeof({macro}) == {len(data) + 1}, "{macro} size");')
        for i, byte in enumerate(data):
            lines.append(
                f'static_assert((unsigned char)({macro})[{i}] == {byte}u, "{macro}[{i}]");'
            )

    string_checks("METRALE_TARGET_HW", d.hw)
    device: list[str] = []
    for row in LEVERS:
        value = d.value(row.name)
        if row.kind is Kind.SPLITK:
            string_checks(row.macro, str(value))
            device.append(f"(unsigned)({row.macro})[0]")
        elif row.kind is Kind.BOOL:
            lines.append(f'static_assert({row.macro} == {int(bool(value))}, "{row.name}");')
            device.append(f"(unsigned)({row.macro})")
        else:
            lines.append(f'static_assert({row.macro} == {value}ull, "{row.name}");')
            lines.append(f'static_assert(sizeof({row.macro}) == 4, "{row.name} is 32-bit");')
            device.append(row.macro)
    lines.append('extern "C" __global__ void metrale_defaults_probe(unsigned* out) {')
    lines += [f"    out[{i}] = {expr};" for i, expr in enumerate(device)]
    lines.append("}")
    return "\n".join(lines) + "\n"


@pytest.mark.nvcc
def test_the_header_compiles_with_nvcc(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    tricky = dataclasses.replace(
        hopper(),
        hw='hop"per\\??=\u00e9',
        attn_decode_splitk='a\tb"c\\d?\n',
        lm_head_batchm_max=0,
        ffn_m16_tc=True,
        w8a8_prefill_max_m_narrowing=384,
        sm_count=U32_MAX,
    )
    for d in (hopper(), tricky):
        (tmp_path / "target_defaults.h").write_text(render_defaults_header(d), encoding="utf-8")
        (tmp_path / "probe.cu").write_text(_probe_source(d), encoding="utf-8")
        argv = [nvcc, "--ptx", "-arch=sm_90a", "probe.cu", "-o", "probe.ptx"]
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert ".entry metrale_defaults_probe(" in (tmp_path / "probe.ptx").read_text()


# --------------------------------------------------------------------------- docs


def test_the_docs_cover_every_lever_and_variable() -> None:
    text = render_docs()
    for row in LEVERS:
        assert f"| `{row.name}` |" in text
        for variable in row.variables():
            assert f"| `{variable}` |" in text


def test_docs_defaults_md_is_generated() -> None:
    path = REPO / "docs" / "defaults.md"
    assert path.read_text(encoding="utf-8") == render_docs(), (
        "docs/defaults.md is stale: run "
        "`.venv/bin/python -c 'from metrale_orch.defaults import write_docs; write_docs(\".\")'`"
    )


def test_the_readme_block_is_generated() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(
        re.escape(D.DOCS_BEGIN) + r"\n(.*?)" + re.escape(D.DOCS_END), text, flags=re.DOTALL
    )
    assert block is not None, "README.md lost its defaults block markers"
    assert block[1] == render_docs(), (
        "the README defaults block is stale: run "
        "`.venv/bin/python -c 'from metrale_orch.defaults import write_docs; write_docs(\".\")'`"
    )


def test_write_docs_regenerates_both_and_is_idempotent(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(
        f"# x\n\n{D.DOCS_BEGIN}\nstale\n{D.DOCS_END}\n\ntail\n", encoding="utf-8"
    )
    changed = write_docs(tmp_path)
    assert changed == (tmp_path / "docs" / "defaults.md", tmp_path / "README.md")
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert readme == f"# x\n\n{D.DOCS_BEGIN}\n{render_docs()}{D.DOCS_END}\n\ntail\n"
    assert write_docs(tmp_path) == ()
    (tmp_path / "README.md").write_text("# no markers\n", encoding="utf-8")
    with pytest.raises(DefaultsError, match=r"README\.md"):
        write_docs(tmp_path)


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


@pytest.mark.usefixtures("process_cache")
def test_cli_resolves_under_its_own_environment_not_the_process_cache(tmp_path: Path) -> None:
    write_hw(tmp_path, "hopper", HOPPER_TOML)
    resolved({})
    code, out, _ = run_cli(tmp_path, "hopper", environ={"METRALE_GDN_PREFILL_TC": "0"})
    assert code == 0 and " gdn_prefill_tc=off (env) " in out


def test_defaults_imports_nothing_of_the_package_but_errors() -> None:
    import ast

    tree = ast.parse(Path(D.__file__).read_text(encoding="utf-8"))
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in modules if m.startswith("metrale_orch")} == {"metrale_orch.errors"}
