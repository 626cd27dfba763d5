"""Signed cache entries (issue 22): only entries a trusted key signed are served.

The store-level tests plant well-formed objects under real keys in S3 (moto), the GCS
emulator and a local tier copied from a remote, and check that a reader with
``cache_trusted_keys`` refuses each (a miss, counted, one warning naming the tier),
installs nothing, and still serves what a trusted key signed (two keys at once:
rotation). One real doit + real nvcc run checks the whole path: a poisoned PTX planted
under the module's real key in S3 is not installed; the build equals a cache-off build.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from metrale_orch.cache import Cache, CacheSettings, CacheStats
from metrale_orch.cache.errors import SigningKeyError
from metrale_orch.cache.maintenance import verify_local
from metrale_orch.cache.objects import PREFIX_SIZE, decode_object, encode_object, header_length
from metrale_orch.cache.signing import LOCAL_KEY, Signing, generate_key_pair, load_signer
from metrale_orch.config import ConfigError, load_config
from tests.support.reapi_cas_server import bgd_command, cas_server
from tests.support.reapi_deps import StackUnavailable
from tests.support.servers import ObjectServer
from tests.support.trust import (
    HAS_NVCC,
    base_env,
    copy_project,
    diff_outputs,
    doit_run,
    one_kernel_tree,
    orch_run,
    outputs,
)

KEY = "0123456789abcdef0123456789abcdef"
KEY2 = "fedcba9876543210fedcba9876543210"
OUT = {"k.ptx": b"// the real PTX\n.version 8.0\n", "k.d": b"k.ptx: k.cu\n"}
POISON = {"k.ptx": b"// POISONED PTX\n.version 8.0\n", "k.d": b"k.ptx: k.cu\n"}
META: Mapping[str, object] = {"command": ["nvcc", "--ptx"], "compile_seconds": 0.5}


def keypair(tmp: Path, name: str) -> tuple[Path, str]:
    """(private key file, public key line) of a fresh key."""
    pem, public = generate_key_pair(name)
    path = tmp / f"{name}.pem"
    path.write_bytes(pem)
    path.chmod(0o600)  # a private key others may read is refused, as ssh does
    return path, public.line()


def settings(tmp: Path, name: str, remote: str = "", **kw: Any) -> CacheSettings:
    local = tmp / f"local-{name}"
    key = tmp / f"config-{name}" / LOCAL_KEY  # each user's own configuration directory
    return CacheSettings(
        local_dir=local, remote=remote, background_uploads=False, local_key=key, **kw
    )


def get(cache: Cache, key: str = KEY) -> Mapping[str, bytes] | None:
    hit = cache.get(key)
    return None if hit is None else dict(hit.outputs)


@pytest.fixture(params=["s3", "gcs", "grpc"])
def remote(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, object]]]:
    """(a fresh URL prefix, storage options) on moto S3, the GCS emulator, or a fresh
    REAPI action cache + CAS (BuildGrid: the object travels as one CAS blob, its
    signature in its header)."""
    if request.param == "grpc":
        try:
            bgd_command()
        except StackUnavailable as exc:
            if os.environ.get("CI"):
                pytest.fail(f"BuildGrid is needed for the REAPI tier: {exc.reason}")
            pytest.skip(f"no BuildGrid here: {exc.reason}")
        with cas_server() as cas:
            yield cas.url, {"instance": cas.instance}
        return
    server: ObjectServer = request.getfixturevalue(request.param)
    yield server.url(f"sig-{uuid.uuid4().hex[:8]}"), dict(server.storage_options)


# ------------------------------------------------------------------------------ remote tiers


def test_planted_object_under_a_real_key_is_not_served(
    remote: tuple[str, dict[str, object]], tmp_path: Path
) -> None:
    url, opts = remote
    ci_key, ci_line = keypair(tmp_path, "ci")
    # anyone with write access: a well-formed, unsigned object under the real key
    with Cache(settings(tmp_path, "planter", url, storage_options=opts)) as planter:
        planter.put(KEY, POISON, META)
    with Cache(settings(tmp_path, "ci", url, storage_options=opts, signing_key=str(ci_key))) as ci:
        ci.put(KEY2, OUT, META)
    reader_settings = settings(tmp_path, "dev", url, storage_options=opts, trusted_keys=(ci_line,))
    with Cache(reader_settings) as reader:
        assert get(reader) is None
        assert get(reader, KEY2) == OUT
        assert get(reader) is None  # asked again: still a miss, still one warning
        stats, warnings = reader.stats, reader.warnings()
    assert (stats.unsigned, stats.untrusted, stats.verified) == (2, 0, 1)
    assert (stats.misses, stats.remote_hits) == (2, 1)
    refusals = [w for w in warnings if "no key in cache_trusted_keys signed" in w]
    assert len(refusals) == 1 and url in refusals[0] and KEY in refusals[0], warnings
    # nothing of the planted object reached the local tier; the signed one did
    local = reader_settings.local_dir / "objects"
    assert not (local / KEY[:2] / KEY).exists()
    assert (local / KEY2[:2] / KEY2).is_file()


def test_rotation_two_trusted_keys_both_served(
    remote: tuple[str, dict[str, object]], tmp_path: Path
) -> None:
    url, opts = remote
    old_key, old_line = keypair(tmp_path, "ci-2025")
    new_key, new_line = keypair(tmp_path, "ci-2026")
    for name, key, path in (("old", KEY, old_key), ("new", KEY2, new_key)):
        with Cache(settings(tmp_path, name, url, storage_options=opts, signing_key=str(path))) as w:
            w.put(key, OUT, META)
    trusted = (old_line, new_line)
    with Cache(settings(tmp_path, "dev", url, storage_options=opts, trusted_keys=trusted)) as r:
        assert get(r) == OUT and get(r, KEY2) == OUT
        assert (r.stats.verified, r.stats.remote_hits, r.stats.misses) == (2, 2, 0)
    only_new = (new_line,)
    with Cache(settings(tmp_path, "dev2", url, storage_options=opts, trusted_keys=only_new)) as r:
        assert get(r) is None and get(r, KEY2) == OUT
        assert (r.stats.untrusted, r.stats.verified) == (1, 1)


# ------------------------------------------------------------------------------ mutations


def _header(data: bytes) -> dict[str, object]:
    hlen = header_length(data)
    doc: dict[str, object] = json.loads(data[PREFIX_SIZE : PREFIX_SIZE + hlen])
    return doc


def _resign(key: str, outputs: Mapping[str, bytes], sig: Mapping[str, str]) -> bytes:
    """An object for ``key`` and ``outputs`` carrying the signature section ``sig`` as is."""
    return encode_object(key, outputs, META, lambda _message: sig)


def _mutations(
    ci: Callable[[bytes], Mapping[str, str]], stranger: Callable[[bytes], Mapping[str, str]]
) -> dict[str, bytes]:
    sig = _header(encode_object(KEY, OUT, META, ci))["sig"]
    other = _header(encode_object(KEY2, OUT, META, ci))["sig"]
    assert isinstance(sig, dict) and isinstance(other, dict)
    raw = base64.b64decode(sig["sig"])
    return {
        "signed by an untrusted key": encode_object(KEY, OUT, META, stranger),
        "valid signature, output bytes swapped": _resign(KEY, POISON, sig),
        "valid signature, for another key": _resign(KEY, OUT, other),
        "unsigned": encode_object(KEY, POISON, META),
        "truncated signature": _resign(
            KEY, OUT, {**sig, "sig": base64.b64encode(raw[:40]).decode()}
        ),
        "malformed section": _resign(KEY, OUT, {"alg": "ed25519", "pub": "x", "sig": "y"}),
    }


@pytest.mark.parametrize(
    "mutation",
    [
        "signed by an untrusted key",
        "valid signature, output bytes swapped",
        "valid signature, for another key",
        "unsigned",
        "truncated signature",
        "malformed section",
    ],
)
def test_every_mutation_is_a_warned_miss(mutation: str, tmp_path: Path) -> None:
    ci_key, ci_line = keypair(tmp_path, "ci")
    stranger = load_signer(str(keypair(tmp_path, "stranger")[0]), "test").section
    ci = load_signer(str(ci_key), "test").section
    signed = encode_object(KEY, OUT, META, ci)
    data = _mutations(ci, stranger)[mutation]
    decode_object(KEY, data)  # well-formed: only its signer is wrong
    store = tmp_path / "bucket"
    (store / "default" / "v1" / KEY[:2]).mkdir(parents=True)
    (store / "default" / "v1" / KEY[:2] / KEY).write_bytes(data)
    s = settings(tmp_path, "dev", f"file://{store}", trusted_keys=(ci_line,))
    with Cache(s) as reader:
        assert reader.get(KEY) is None
        stats, warnings = reader.stats, reader.warnings()
    assert stats.misses == 1 and stats.verified == 0
    assert stats.unsigned + stats.untrusted == 1
    assert sum("no key in cache_trusted_keys signed" in w for w in warnings) == 1, warnings
    assert not (s.local_dir / "objects" / KEY[:2] / KEY).exists()
    # the genuine object is served: the mutation, not the set-up, made the miss
    (store / "default" / "v1" / KEY[:2] / KEY).write_bytes(signed)
    with Cache(settings(tmp_path, "dev2", f"file://{store}", trusted_keys=(ci_line,))) as r:
        assert get(r) == OUT


# ------------------------------------------------------------------------------ local tier


def test_local_tier_copied_from_a_remote_does_not_launder(tmp_path: Path) -> None:
    ci_key, ci_line = keypair(tmp_path, "ci")
    remote = f"file://{tmp_path / 'bucket'}"
    with Cache(settings(tmp_path, "planter", remote)) as planter:
        planter.put(KEY, POISON, META)
    with Cache(settings(tmp_path, "ci", remote, signing_key=str(ci_key))) as ci:
        ci.put(KEY2, OUT, META)
    # a developer copies the bucket into their local cache (or filled it before trust)
    dev = settings(tmp_path, "dev", trusted_keys=(ci_line,))
    shutil.copytree(tmp_path / "bucket" / "default" / "v1", dev.local_dir / "objects")
    with Cache(dev) as reader:
        assert get(reader) is None
        assert get(reader, KEY2) == OUT  # a copy keeps its signature
        assert (reader.stats.unsigned, reader.stats.verified, reader.stats.local_hits) == (1, 1, 1)
        assert any(str(dev.local_dir) in w for w in reader.warnings())
        reader.put(KEY, OUT, META)  # the compile replaces the refused entry
        assert get(reader) == OUT
    with Cache(dev) as again:  # a later run hits it locally: trusted locally
        assert get(again) == OUT and again.stats.local_hits == 1


def test_writer_without_key_publishes_nothing_and_says_so_once(tmp_path: Path) -> None:
    _, ci_line = keypair(tmp_path, "ci")
    bucket = tmp_path / "bucket"
    dev = settings(tmp_path, "dev", f"file://{bucket}", trusted_keys=(ci_line,))
    with Cache(dev) as writer:
        writer.put(KEY, OUT, META)
        writer.put(KEY2, OUT, META)
        warnings = writer.warnings()
        assert writer.stats.uploads == 0
        assert get(writer) == OUT  # its own compile is trusted locally
    assert sum("not publishing to the remote cache" in w for w in warnings) == 1, warnings
    assert not bucket.exists() or not any(p.is_file() for p in bucket.rglob("*"))
    # the local tier is private, its key too
    assert stat.S_IMODE(dev.local_dir.stat().st_mode) == 0o700
    assert dev.local_key is not None and not (dev.local_dir / LOCAL_KEY).exists()
    assert stat.S_IMODE(dev.local_key.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(dev.local_key.stat().st_mode) == 0o600
    # another user's reader trusts only the listed keys: this user's local entry is not one
    other = settings(tmp_path, "other", trusted_keys=(ci_line,))
    shutil.copytree(dev.local_dir / "objects", other.local_dir / "objects")
    with Cache(other) as reader:
        assert get(reader) is None and reader.stats.untrusted == 1


def test_without_trusted_keys_unsigned_and_signed_entries_read(tmp_path: Path) -> None:
    ci_key, _ = keypair(tmp_path, "ci")
    remote = f"file://{tmp_path / 'bucket'}"
    with Cache(settings(tmp_path, "old", remote)) as old:
        old.put(KEY, OUT, META)
    with Cache(settings(tmp_path, "ci", remote, signing_key=str(ci_key))) as ci:
        ci.put(KEY2, OUT, META)
    with Cache(settings(tmp_path, "dev", remote)) as reader:
        assert get(reader) == OUT and get(reader, KEY2) == OUT
        assert reader.stats.verified == reader.stats.unsigned == 0
    assert not (tmp_path / "config-dev" / LOCAL_KEY).exists()  # no key work without keys


def test_verify_reports_untrusted_local_entries(tmp_path: Path) -> None:
    ci_key, ci_line = keypair(tmp_path, "ci")
    local = tmp_path / "local"
    with Cache(CacheSettings(local_dir=local)) as plain:
        plain.put(KEY, OUT, META)
    with Cache(CacheSettings(local_dir=local, signing_key=str(ci_key))) as ci:
        ci.put(KEY2, OUT, META)
    signing = Signing(
        trusted_keys=(ci_line,), signing_key="", signing_key_where="x", local_key=None
    )
    result = verify_local(local, trust=signing.local_trust())
    assert (result.checked, result.ok, result.verified, len(result.bad)) == (2, 1, 1, 0)
    assert [k for k, _ in result.untrusted] == [KEY]
    assert verify_local(local).untrusted == ()


# ------------------------------------------------------------------------------ configuration


def test_config_keys_and_their_errors(tmp_path: Path) -> None:
    key, line = keypair(tmp_path, "ci")
    pem = key.read_text()
    env = {"METRALE_ORCH_CACHE_SIGNING_KEY": pem, "METRALE_ORCH_CACHE_TRUSTED_KEYS": line}
    config = load_config(tmp_path, env)
    assert config.cache_trusted_keys == (line,)
    shown = json.dumps(config.to_dict()) + repr(config) + repr(CacheSettings.from_config(config))
    assert "PRIVATE KEY" not in shown and pem.splitlines()[1] not in shown
    assert config.to_dict()["cache_signing_key"] == "<set>"
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.metrale-orch]\ncache_trusted_keys = ["{line}", "ed25519:AAAA"]\n'
    )
    with pytest.raises(ConfigError) as bad:
        load_config(tmp_path, {})
    assert "pyproject.toml" in str(bad.value) and "line 2 of cache_trusted_keys" in str(bad.value)
    (tmp_path / "pyproject.toml").write_text('[tool.metrale-orch]\ncache_signing_key = "no.pem"\n')
    config = load_config(tmp_path, {})
    with pytest.raises(SigningKeyError) as missing:
        Cache(CacheSettings.from_config(config))
    text = str(missing.value)
    assert "pyproject.toml" in text and "cache_signing_key" in text
    # the value is never quoted: a one-line value that names no file may be the key itself
    assert "cannot read it as a key file" in text and "no.pem" not in text
    assert "\n" not in text
    (tmp_path / "bad.pem").write_text(
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
    )
    with pytest.raises(SigningKeyError) as garbled:
        load_signer(str(tmp_path / "bad.pem"), "environment METRALE_ORCH_CACHE_SIGNING_KEY")
    assert "METRALE_ORCH_CACHE_SIGNING_KEY" in str(garbled.value) and "AAAA" not in str(
        garbled.value
    )


def test_keygen_writes_a_private_key_and_prints_its_line(tmp_path: Path) -> None:
    env = base_env(tmp_path / "cache")
    run = orch_run(tmp_path, ["cache", "keygen", "ci.pem", "--label", "ci-2026"], env)
    assert run.returncode == 0, run.text
    lines = [ln for ln in run.out.splitlines() if ln.startswith("cache_trusted_keys = ")]
    assert len(lines) == 1 and lines[0].endswith(' ci-2026"]'), run.text
    assert stat.S_IMODE((tmp_path / "ci.pem").stat().st_mode) == 0o600
    assert "PRIVATE KEY" not in run.out
    line = json.loads(lines[0].split(" = ", 1)[1])[0]
    signed = encode_object(KEY, OUT, META, load_signer(str(tmp_path / "ci.pem"), "t").section)
    reader = Signing(trusted_keys=(line,), signing_key="", signing_key_where="x", local_key=None)
    assert reader.remote.check(decode_object(KEY, signed))[0] == "verified"
    again = orch_run(tmp_path, ["cache", "keygen", "ci.pem"], env)
    assert again.returncode == 2 and "exists" in again.err and "Traceback" not in again.err


def test_summary_line_counts_refusals() -> None:
    stats = CacheStats(misses=3, unsigned=2, untrusted=1, verified=4)
    assert (
        "3 refused as not signed by a trusted key (2 unsigned, 1 untrusted)" in stats.summary_line()
    )
    assert stats.signature_line() == "signatures: 4 verified, 2 unsigned, 1 untrusted"
    assert CacheStats.from_dict(stats.to_dict()) == stats


# ------------------------------------------------------------------------------ real build


def _poison_bucket(bucket: Path) -> int:
    """Rewrite every object in ``bucket`` with a poisoned PTX, well-formed and unsigned."""
    n = 0
    for path in sorted(p for p in bucket.rglob("*") if p.is_file()):
        obj = decode_object(path.name, path.read_bytes())
        poisoned = {
            name: data.replace(b".entry k", b".entry k /*poisoned*/")
            if name.endswith("ptx")
            else data
            for name, data in obj.outputs.items()
        }
        path.chmod(0o644)
        path.write_bytes(encode_object(path.name, poisoned, dict(obj.meta)))
        n += 1
    return n


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc and gcc are needed on PATH")
def test_real_build_never_installs_a_planted_ptx(tmp_path: Path) -> None:
    ci_key, ci_line = keypair(tmp_path, "ci")
    src = one_kernel_tree(tmp_path / "src", "signing test")
    bucket = tmp_path / "bucket"
    remote = {"METRALE_ORCH_CACHE": f"file://{bucket}"}
    clean_env = base_env(tmp_path / "clean-cache", METRALE_ORCH_CACHE_MODE="off")
    clean = copy_project(src, tmp_path / "clean")
    assert doit_run(clean, ["build"], clean_env).returncode == 0
    # an unsigned writer fills the bucket, then someone poisons its PTX in place
    planter = copy_project(src, tmp_path / "planter")
    run = doit_run(planter, ["build"], base_env(tmp_path / "c-planter", **remote))
    assert run.returncode == 0, run.text
    assert _poison_bucket(bucket) >= 1
    trusted = {**remote, "METRALE_ORCH_CACHE_TRUSTED_KEYS": ci_line}
    dev = copy_project(src, tmp_path / "dev")
    run = doit_run(dev, ["build"], base_env(tmp_path / "c-dev", **trusted))
    assert run.returncode == 0, run.text
    assert "no key in cache_trusted_keys signed" in run.out + run.err, run.text
    assert not diff_outputs(outputs(dev), outputs(clean)), diff_outputs(
        outputs(dev), outputs(clean)
    )
    # the CI signer republishes (a fresh bucket); the next fresh checkout hits and matches
    shutil.rmtree(bucket)
    ci = copy_project(src, tmp_path / "ci")
    ci_env = base_env(tmp_path / "c-ci", **remote, METRALE_ORCH_CACHE_SIGNING_KEY=str(ci_key))
    assert doit_run(ci, ["build"], ci_env).returncode == 0
    dev2 = copy_project(src, tmp_path / "dev2")
    run = doit_run(dev2, ["build"], base_env(tmp_path / "c-dev2", **trusted))
    assert run.returncode == 0 and " 0 misses" in run.out, run.text
    assert not diff_outputs(outputs(dev2), outputs(clean))
    assert os.path.isdir(tmp_path / "c-dev2")
