"""Tests for metrale_orch.defaults (SPEC 2): resolving the whole table, the process-wide
resolved defaults, and the artefacts they are baked into (the rest is in the other
``tests/unit/defaults/test_defaults_*.py``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_orch import defaults as D
from metrale_orch.defaults import (
    LEVERS,
    AlreadyResolvedError,
    DefaultsError,
    Kind,
    Resolved,
    Source,
    TargetDefaults,
    baseline,
    declare,
    defaults_from_json,
    format_levers,
    parse_defaults,
    render_defaults_header,
    render_defaults_json,
    reset_resolved,
    resolve,
    resolved,
    summary_line,
)
from tests.support.defaults import (
    GEMV_BANDS,
    GEMV_BASELINE,
    HOPPER_LINE,
    NO_ENV,
    SPEC_BASELINES,
    SPEC_VARIABLES,
    U32_MAX,
    _defines,
    hopper,
)

GB10_TOML = """\
[hardware]
arch = "sm_121a"

[defaults]
w8a8_prefill_max_m_widening = 64
w8a8_prefill_max_m_narrowing = 384
"""


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
