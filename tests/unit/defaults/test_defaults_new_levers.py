"""Tests for metrale_orch.defaults (SPEC 2): the three new levers (the rest is in the other
``tests/unit/defaults/test_defaults_*.py``).
"""

from __future__ import annotations

import tomllib

import pytest

from metrale_orch.defaults import (
    DefaultsValueError,
    Resolved,
    Source,
    baseline,
    format_levers,
    parse_defaults,
    resolve,
    resolve_points,
)
from tests.support.defaults import (
    GEMV_BANDS,
    GEMV_BASELINE,
    HOPPER_TOML,
    NO_ENV,
    U32_MAX,
    doc_with,
    gemv,
)

# --------------------------------------------------------------------------- the three new levers

BANDS_TEXT = (
    "band 0: mb1_ku8|mb1_ku2_o4; band 1: mb2|mb2_ku2_o2; band 2: mb4|mb4_ku2_o2; "
    "band 3: mb8|mb8_ku2_o2; band 4: mb16|mb16_ku1_o2"
)


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
