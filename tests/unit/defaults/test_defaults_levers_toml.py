"""Tests for metrale_orch.defaults (SPEC 2): levers a tree declares in ``kernels/LEVERS.toml``
(the rest is in the other ``tests/unit/defaults/test_defaults_*.py``).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from metrale_orch.defaults import (
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
    resolve,
    resolved,
    summary_line,
)
from tests.support.defaults import (
    HOPPER_TOML,
    NO_ENV,
    SPEC_BASELINES,
    TREE,
    TREE_DEFAULTS_TOML,
    TREE_LINE_TAIL,
    U32_MAX,
    _defines,
    doc_with,
    hopper,
    tree_gb10,
    tree_levers,
    write_hw,
    write_levers,
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
