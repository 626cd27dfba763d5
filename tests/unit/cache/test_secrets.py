"""Secrets are never printed, not even in part (issue 35).

A private key pasted into ``cache_trusted_keys`` is named by its line's position, never
quoted: no 8 characters of its base64 body appear in the error or in the command's
output. ``cache_signing_key`` given a public key line says so. A private key file others
may read (or another user's) is refused with the path and the ``chmod 600`` to run, as
ssh refuses one.

The tests of this topic that start processes are in
``tests/scenarios/cache/test_secrets.py``.
"""

from __future__ import annotations

import io
import os
import pwd
import stat
from pathlib import Path

import pytest

from metrale_orch.cache import Cache, CacheSettings
from metrale_orch.cache.errors import SigningKeyError
from metrale_orch.cache.signing import LOCAL_KEY, generate_key_pair
from metrale_orch.config import ConfigError, load_config
from tests.support.cache import _body, leaks

KEY = "0123456789abcdef0123456789abcdef"
OUT = {"k.ptx": b"// PTX\n", "k.d": b"k.ptx: k.cu\n"}


def _key_file(path: Path, mode: int) -> tuple[Path, bytes]:
    pem, _ = generate_key_pair()
    path.write_bytes(pem)
    path.chmod(mode)
    return path, pem


def test_a_malformed_key_line_is_named_by_position_and_label(tmp_path: Path) -> None:
    pem, public = generate_key_pair()
    # a line that does not look private (the key's base64 after the prefix) is not quoted
    pasted = f"ed25519:{_body(pem)} laptop"
    env = {"METRALE_ORCH_CACHE_TRUSTED_KEYS": f"{public.line()},{pasted}"}
    with pytest.raises(ConfigError) as bad:
        load_config(tmp_path, env)
    text = str(bad.value)
    assert "line 2 of cache_trusted_keys (label laptop)" in text, text
    assert "an Ed25519 public key is 32" in text and not leaks(text, pem), text


# ------------------------------------------------------------------------------ cache_signing_key


def test_a_public_key_line_as_the_signing_key_says_so(tmp_path: Path) -> None:
    _, public = generate_key_pair("ci")
    for env in (
        {"METRALE_ORCH_CACHE_SIGNING_KEY": public.line()},
        {"METRALE_ORCH_CACHE_SIGNING_KEY": public.line().split()[0]},
    ):
        with pytest.raises(ConfigError) as bad:
            load_config(tmp_path, env)
        text = str(bad.value)
        assert "METRALE_ORCH_CACHE_SIGNING_KEY" in text and "cache_signing_key" in text
        assert "is a public key line" in text and "takes a private key" in text, text
        assert "cannot read" not in text and public.line().split()[0] not in text


def test_a_signing_key_file_others_may_read_is_refused_with_the_chmod(tmp_path: Path) -> None:
    path, pem = _key_file(tmp_path / "ci.pem", 0o644)
    config = load_config(tmp_path, {"METRALE_ORCH_CACHE_SIGNING_KEY": str(path)})
    with pytest.raises(SigningKeyError) as refused:
        Cache(CacheSettings.from_config(config))
    text = str(refused.value)
    assert f"`chmod 600 {path}`" in text and "readable by group or others" in text, text
    assert "METRALE_ORCH_CACHE_SIGNING_KEY" in text and "\n" not in text
    assert not leaks(text, pem)
    path.chmod(0o600)  # as the message says: then it is used
    with Cache(CacheSettings.from_config(config)) as cache:
        cache.put(KEY, OUT, {"command": ["nvcc"]})
    path.chmod(0o660)
    with pytest.raises(SigningKeyError, match="writable by group or others"):
        Cache(CacheSettings.from_config(config))


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root")
def test_a_signing_key_of_another_user_is_refused(tmp_path: Path) -> None:
    path, _ = _key_file(tmp_path / "theirs.pem", 0o600)
    os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    config = load_config(tmp_path, {"METRALE_ORCH_CACHE_SIGNING_KEY": str(path)})
    with pytest.raises(SigningKeyError, match=r"owned by uid .* a file of your own"):
        Cache(CacheSettings.from_config(config))


def test_the_local_key_others_may_read_is_refused_and_said_once(tmp_path: Path) -> None:
    """This user's local key (under the config directory) made world-readable is not
    used: what is compiled is stored unsigned, and one warning names the chmod."""
    _, ci = generate_key_pair("ci")
    config = load_config(
        tmp_path,
        {
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "METRALE_ORCH_LOCAL_CACHE": str(tmp_path / "cache"),
            "METRALE_ORCH_CACHE_TRUSTED_KEYS": ci.line(),
        },
    )
    key = tmp_path / "config" / "metrale-orch" / LOCAL_KEY
    assert config.local_key == key
    with Cache(CacheSettings.from_config(config)) as cache:
        cache.put(KEY, OUT, {"command": ["nvcc"]})
        assert cache.get(KEY) is not None and cache.warnings() == []
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    key.chmod(0o644)
    with Cache(CacheSettings.from_config(config)) as cache:
        assert cache.get(KEY) is None  # signed by the refused key: no longer trusted
        cache.put(KEY, OUT, {"command": ["nvcc"]}, replace=True)
        warned = [w for w in cache.warnings() if "local signing key" in w]
    assert len(warned) == 1 and f"`chmod 600 {key}`" in warned[0], warned


# ------------------------------------------------------------------------------ review findings


def test_a_one_line_key_as_the_signing_key_is_never_shown(tmp_path: Path) -> None:
    """A PEM body without its armour (a common way to keep a CI secret) is no file name:
    the error says the value is not shown, and shows none of it."""
    pem, _ = generate_key_pair()
    body = _body(pem)
    config = load_config(tmp_path, {"METRALE_ORCH_CACHE_SIGNING_KEY": body})
    with pytest.raises(SigningKeyError) as refused:
        Cache(CacheSettings.from_config(config))
    text = str(refused.value)
    assert "not shown" in text and "METRALE_ORCH_CACHE_SIGNING_KEY" in text, text
    assert not leaks(text, pem), leaks(text, pem)


def test_a_malformed_set_shows_no_value(tmp_path: Path) -> None:
    from metrale_orch.cli import main

    pem, _ = generate_key_pair()
    for item in (pem.decode(), f"cache_signing_key:{_body(pem)}"):
        err = io.StringIO()
        code = main(["--root", str(tmp_path), "--set", item, "layout"], err=err, environ={})
        text = err.getvalue()
        assert code == 2 and "expected KEY=VALUE" in text, text
        assert not leaks(text, pem), leaks(text, pem)


def test_a_keygen_label_with_private_in_it_still_parses(tmp_path: Path) -> None:
    _, public = generate_key_pair("private-ci")
    config = load_config(tmp_path, {"METRALE_ORCH_CACHE_TRUSTED_KEYS": public.line()})
    assert config.cache_trusted_keys == (public.line(),)
