"""``require_hits``: a build that may only take modules from the cache (a smoke job on a GPU
runner, after a CPU runner's build job filled the shared cache).

Real ``python -m doit`` runs as the CI workflow makes them: real nvcc on the "CPU runner"
checkout, a second checkout with its own local cache as the "GPU runner", both sharing one
``file://`` remote. The fake compiler proves that a refused miss runs no compiler at all.

The tests of this topic that start processes are in
``tests/scenarios/cache/test_require_hits.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.cache import CacheSettings, open_cache
from metrale_orch.config import EXECUTION_KEYS, ConfigError, load_config
from metrale_orch.steps.errors import MissRefused
from metrale_orch.tasks.report_lines import format_refused

HOPPER = ("hopper/qwen/w4", "hopper/qwen/w8")


# ------------------------------------------------------------------------------ the parts


def test_require_hits_is_a_boolean_setting_that_changes_no_task(tmp_path: Path) -> None:
    assert load_config(tmp_path, {}).require_hits is False
    config = load_config(tmp_path, {"METRALE_ORCH_REQUIRE_HITS": "yes"})
    assert config.require_hits is True and config.sources["require_hits"] == "env"
    assert load_config(tmp_path, {}, {"require_hits": "true"}).require_hits is True
    assert config.to_dict()["require_hits"] is True
    assert "require_hits" in EXECUTION_KEYS  # switching it regenerates and rebuilds nothing
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, {"METRALE_ORCH_REQUIRE_HITS": "maybe"})
    assert str(info.value).startswith("environment METRALE_ORCH_REQUIRE_HITS: require_hits: ")
    (tmp_path / "pyproject.toml").write_text('[tool.metrale-orch]\nrequire_hits = "true"\n')
    with pytest.raises(ConfigError, match=r"pyproject\.toml.*require_hits: must be true or false"):
        load_config(tmp_path, {})


def test_refusal_text_names_target_module_key_and_what_to_do() -> None:
    err = MissRefused("h/m/q", "gemv", "kernels/h/m/q/gemv.cu", "ab" * 16, "the local cache")
    text = str(err)
    assert text.startswith("h/m/q: module gemv (kernels/h/m/q/gemv.cu): NOT COMPILED: ")
    assert f"key {'ab' * 16}: no entry; asked the local cache." in text
    assert "build job for this hardware must run first and share the cache" in text
    assert err.exit_code == 1 and err.to_dict()["key"] == "ab" * 16
    stale = MissRefused("h/m/q", "gemv", "kernels/h/m/q/gemv.cu", "ab" * 16, "x", rejected=True)
    assert "only an entry compiled from other inputs" in str(stale)


def test_refused_summary_line() -> None:
    line = format_refused({"build:h/b/q": 2, "build:h/a/q": 1})
    assert line.startswith("require_hits: 3 module(s) of 2 target(s) not in the shared cache")
    assert "(h/a/q, h/b/q)" in line


def test_cache_says_which_tiers_it_asks(tmp_path: Path) -> None:
    local = tmp_path / "local"
    with open_cache(CacheSettings(local_dir=local)) as cache:
        assert cache.tiers() == (
            "the local cache only, as no remote cache is set (METRALE_ORCH_CACHE)"
        )
    with open_cache(CacheSettings(local_dir=local, remote="memory://team/c")) as cache:
        assert cache.tiers() == "the local cache and the remote memory://team/c"
    with open_cache(CacheSettings(local_dir=local, mode="off")) as cache:
        assert cache.tiers() == "no tier, as cache_mode is off"
