"""``metrale-orch size`` (metrale_orch.gate.size) and the ``size_budget`` setting.

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/gate/test_size.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.cache import SizeError, parse_size
from metrale_orch.config import ConfigError, load_config
from metrale_orch.gate import Duplicate
from metrale_orch.gate.size import budget_of, duplicates_of, unknown_budget_keys
from tests.support.build import write
from tests.support.gate import TARGETS

# --- values -----------------------------------------------------------------------------------


def test_budget_of_prefers_the_target_over_its_hardware() -> None:
    budgets = {"h": 100, "h/m/q": 5000}
    assert budget_of("h/m/q", budgets) == ("h/m/q", 5000)
    assert budget_of("h/m/other", budgets) == ("h", 100)
    assert budget_of("hc/m/q", budgets) is None
    assert budget_of("hc/m/q", {}) is None
    assert unknown_budget_keys(["h", "h/m/q", "hopper", "h/m/x"], TARGETS) == ("h/m/x", "hopper")


def test_size_budget_setting(tmp_path: Path) -> None:
    write(
        tmp_path,
        "pyproject.toml",
        '[tool.metrale-orch.size_budget]\nhopper = "40M"\n"hopper/qwen3-8b/bf16" = 1500\n'
        'b200 = "1.5GiB"\n',
    )
    config = load_config(tmp_path, {"HOME": str(tmp_path)})
    assert dict(config.size_budget) == {
        "b200": 1536 * 1024**2,
        "hopper": 40 * 1024**2,
        "hopper/qwen3-8b/bf16": 1500,
    }
    assert config.sources["size_budget"] == "pyproject"
    assert config.to_dict()["size_budget"] == dict(sorted(config.size_budget.items()))
    env = {"HOME": str(tmp_path), "METRALE_ORCH_SIZE_BUDGET": '{"hopper": "2M"}'}
    assert dict(load_config(tmp_path, env).size_budget) == {"hopper": 2 * 1024**2}
    assert load_config(tmp_path / "none", {"HOME": str(tmp_path)}).size_budget == {}
    # The cache's size parser is the same one.
    assert parse_size("40M") == 40 * 1024**2
    with pytest.raises(SizeError):
        parse_size("40 megs")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            'hopper = "40 megs"\n',
            "pyproject.toml [tool.metrale-orch]: size_budget.hopper: must be a number of "
            'bytes, or a number with K, M, G or T (powers of 1024) such as "40M", got '
            "'40 megs'",
        ),
        (
            "hopper = -1\n",
            "pyproject.toml [tool.metrale-orch]: size_budget.hopper: must be a number of "
            'bytes, or a number with K, M, G or T (powers of 1024) such as "40M", got -1',
        ),
        (
            "hopper = true\n",
            "pyproject.toml [tool.metrale-orch]: size_budget.hopper: must be a number of "
            'bytes, or a number with K, M, G or T (powers of 1024) such as "40M", got True',
        ),
        (
            '"hopper/qwen3-8b" = "1M"\n',
            'pyproject.toml [tool.metrale-orch]: size_budget."hopper/qwen3-8b": must name a '
            "hardware (hopper) or a target (hw/model/quant)",
        ),
    ],
)
def test_a_bad_budget_names_the_file_and_the_key(tmp_path: Path, table: str, message: str) -> None:
    write(tmp_path, "pyproject.toml", f"[tool.metrale-orch.size_budget]\n{table}")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, {"HOME": str(tmp_path)})
    assert str(caught.value) == message
    write(tmp_path, "pyproject.toml", '[tool.metrale-orch]\nsize_budget = "40M"\n')
    with pytest.raises(ConfigError, match=r"^pyproject\.toml \[tool\.metrale-orch\]: size_budget:"):
        load_config(tmp_path, {"HOME": str(tmp_path)})


def test_duplicates_of_names_each_entry_two_modules_export() -> None:
    got = duplicates_of({"a": ("k", "x"), "b": ("k",), "c": ("x", "y"), "d": ()})
    assert got == (
        Duplicate(entry="k", modules=("a", "b")),
        Duplicate(entry="x", modules=("a", "c")),
    )
    assert duplicates_of({"a": ("k",), "b": ("j",)}) == ()
