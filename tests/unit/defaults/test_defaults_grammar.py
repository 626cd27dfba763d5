"""Tests for metrale_orch.defaults (SPEC 2): the override grammar (the rest is in the other
``tests/unit/defaults/test_defaults_*.py``).
"""

from __future__ import annotations

import pytest

from metrale_orch.defaults import (
    Resolved,
    Source,
    SplitkPolicy,
    resolve_batchm_max,
    resolve_max_m,
    resolve_policy,
    resolve_toggle,
)
from tests.support.defaults import (
    U32_MAX,
)

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
