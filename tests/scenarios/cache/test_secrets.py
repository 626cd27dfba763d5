"""Secrets are never printed, not even in part (issue 35).

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/cache/test_secrets.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.cache import CacheSettings
from metrale_orch.cache.errors import TrustedKeyError
from metrale_orch.cache.signing import generate_key_pair
from metrale_orch.config import ConfigError, load_config
from tests.support.cache import leaks
from tests.support.trust import base_env, orch_run

# ------------------------------------------------------------------------------ cache_trusted_keys


def test_a_private_key_pasted_into_trusted_keys_is_never_shown(tmp_path: Path) -> None:
    pem, public = generate_key_pair("ci-2026")
    (tmp_path / "pyproject.toml").write_text(
        f"[tool.metrale-orch]\ncache_trusted_keys = [\"{public.line()}\", '''{pem.decode()}''']\n"
    )
    with pytest.raises(ConfigError) as bad:
        load_config(tmp_path, {})
    text = str(bad.value)
    assert "line 2 of cache_trusted_keys" in text and "private key" in text, text
    assert "pyproject.toml" in text and "\n" not in text
    assert not leaks(text, pem), leaks(text, pem)
    # the same through the command: one line, exit 2, nothing of the key anywhere
    run = orch_run(tmp_path, ["cache", "verify"], base_env(tmp_path / "cache"))
    assert run.returncode == 2 and "line 2 of cache_trusted_keys" in run.err, run.text
    assert not leaks(run.out + run.err, pem) and "Traceback" not in run.err, run.text
    # from the environment, and in settings made by hand
    env = {"METRALE_ORCH_CACHE_TRUSTED_KEYS": pem.decode()}
    with pytest.raises(ConfigError) as from_env:
        load_config(tmp_path / "elsewhere", env)
    assert "line 1 of cache_trusted_keys" in str(from_env.value)
    assert not leaks(str(from_env.value), pem)
    with pytest.raises(TrustedKeyError) as by_hand:
        CacheSettings(local_dir=tmp_path / "c", trusted_keys=(public.line(), pem.decode()))
    assert "line 2 of cache_trusted_keys" in str(by_hand.value)
    assert not leaks(str(by_hand.value) + repr(by_hand.value), pem)
