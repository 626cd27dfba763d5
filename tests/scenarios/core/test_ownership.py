"""Files that decide what is served are trusted only if they are the user's own (issue 35).

Another user's file is planted with ``os.chown`` to ``nobody`` (the suite runs as root
here; elsewhere these tests skip). The check itself (:mod:`metrale_orch.ownership`), the
memos (the toolkit-hash memo, probe records and plans, the task cache's files,
arch-check verdicts), and one real build: a local cache directory others may write,
holding another user's key where older versions kept the local key, and entries that
user rewrote and signed with it, serves none of them.

The tests of this topic that run in-process are in ``tests/unit/core/test_ownership.py``.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import metrale_orch.toolchain.records as records
from metrale_orch import fsutil
from metrale_orch.cache.objects import KEY_RE, decode_object, encode_object
from metrale_orch.cache.signing import LOCAL_KEY, generate_key_pair, load_signer
from metrale_orch.fsutil import read_json_object, write_own
from metrale_orch.toolchain import archcheck, earlyruns
from metrale_orch.toolchain.definitions import builtin_toolchains
from metrale_orch.toolchain.earlyruns import EarlyRuns
from metrale_orch.toolchain.probe import ProbeMemo, probe_toolchain
from tests.support.build import fake_toolchain_env
from tests.support.core import NOBODY, as_root, give_away, mine, plant
from tests.support.project import doit, make_project, project_env, use_fake_compiler
from tests.support.trust import (
    HAS_NVCC,
    base_env,
    copy_project,
    diff_outputs,
    doit_run,
    one_kernel_tree,
    outputs,
)

NVCC = builtin_toolchains()["nvcc"]
MEMO = ("metrale-orch-probes", "toolchain-hashes.json")


# ------------------------------------------------------------------------------ the memos


@as_root
def test_a_planted_toolkit_hash_memo_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's ``toolchain-hashes.json`` (mode 0666) naming the real binaries by
    their real stamps with other digests does not set the toolchain identity of a fresh
    build directory; the user's own copy of the very same file would (the plant works),
    and the next write replaces the planted file with the user's own."""
    monkeypatch.setattr(fsutil, "RACY_NS", 0)  # the fakes were just written: trust them
    env = fake_toolchain_env(tmp_path / "bin")  # HOME is tmp_path
    program = tmp_path / "bin" / "nvcc"
    real = probe_toolchain(NVCC, program, env, state_dir=tmp_path / "a").identity
    memo = tmp_path.joinpath(".cache", *MEMO)
    assert mine(memo)
    forged = {path: [*entry[:5], "f" * 32] for path, entry in json.loads(memo.read_text()).items()}
    data = json.dumps(forged).encode()
    # the user's own file is used: the forged digests change the identity ...
    plant(memo, data, 0o600, uid=os.getuid())
    assert probe_toolchain(NVCC, program, env, state_dir=tmp_path / "b").identity != real
    # ... another user's is not: the identity is the real toolkit's
    plant(memo, data, 0o666)
    assert probe_toolchain(NVCC, program, env, state_dir=tmp_path / "c").identity == real
    assert mine(memo) and "f" * 32 not in memo.read_text()


@as_root
def test_the_build_directorys_memos_of_another_user_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probe records, the build directory's file hashes, plans and arch-check verdicts:
    each written by a real run, then given to another user, is not read."""
    monkeypatch.setattr(fsutil, "RACY_NS", 0)
    monkeypatch.setattr(records, "RACY_NS", 0)
    env = fake_toolchain_env(tmp_path / "bin")
    program = tmp_path / "bin" / "nvcc"
    state = tmp_path / "state"
    probe_toolchain(NVCC, program, env, state_dir=state, memo=ProbeMemo())
    saved = sorted(state.joinpath(records.RECORDS_DIR).glob("*.json"))
    assert saved and all(mine(p) for p in saved) and mine(state / "file-hashes.json")
    store = records.RecordStore(state, "k")
    store.save(records.ProbeRecord.from_json(json.loads(saved[0].read_text())))  # type: ignore[arg-type]
    assert store.load() is not None
    give_away(store.path)
    assert store.load() is None
    give_away(state / "file-hashes.json")
    assert read_json_object(state / "file-hashes.json") == {}
    # a plan another user owns starts nothing
    early = EarlyRuns()
    plan = state / earlyruns.PLAN_NAME
    plan.write_bytes(
        json.dumps(
            {"runs": [{"argv": ["/bin/true"], "cwd": "<probe dir>", "set": {}, "unset": []}]}
        ).encode()
    )
    plan.chmod(0o644)
    try:
        assert early.start_plan(state, {"PATH": "/usr/bin"}) == 1  # the user's own: runs
        early.discard()
        give_away(plan)
        assert early.start_plan(state, {"PATH": "/usr/bin"}) == 0
    finally:
        early.discard()
    # an arch-check verdict another user wrote is not taken
    verdicts = state / archcheck.ARCH_CHECKS
    write_own(verdicts, json.dumps({"k": "planted verdict"}).encode())
    assert archcheck._read_verdicts(verdicts) == {"k": "planted verdict"}
    give_away(verdicts)
    assert archcheck._read_verdicts(verdicts) == {}


# ------------------------------------------------------------------------------ real build


def _rewrite_and_sign(shared: Path, pem: bytes) -> int:
    """Rewrite every entry of the local cache ``shared`` with a poisoned PTX, signed by
    the private key ``pem`` (as the other user who planted it would)."""
    signer = load_signer(pem.decode(), "planted key")
    n = 0
    for path in sorted(p for p in (shared / "objects").rglob("*") if KEY_RE.fullmatch(p.name)):
        obj = decode_object(path.name, path.read_bytes())
        poisoned = {
            name: data.replace(b".entry k", b".entry k /*poisoned*/")
            if name.endswith("ptx")
            else data
            for name, data in obj.outputs.items()
        }
        path.chmod(0o644)
        path.write_bytes(encode_object(path.name, poisoned, dict(obj.meta), signer.section))
        n += 1
    return n


@as_root
@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc and gcc are needed on PATH")
def test_a_shared_local_cache_never_serves_another_users_entries(tmp_path: Path) -> None:
    # A team's shared cache directory: another user's, writable by all; that user planted
    # their key where older versions kept the local key, before this user's first build.
    shared = tmp_path / "scratch-cache"
    shared.mkdir()
    os.chown(shared, NOBODY, -1)
    shared.chmod(0o777)
    pem, _ = generate_key_pair()
    planted = plant(shared / LOCAL_KEY, pem, 0o644)
    _, ci = generate_key_pair("ci")
    env = base_env(
        shared,
        METRALE_ORCH_CACHE_TRUSTED_KEYS=ci.line(),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    src = one_kernel_tree(tmp_path / "src", "ownership test")
    first = copy_project(src, tmp_path / "first")
    run = doit_run(first, ["build"], env)
    assert run.returncode == 0, run.text
    # this user's own key signed the entries: under the user's config directory, private
    key = tmp_path / "config" / "metrale-orch" / LOCAL_KEY
    assert mine(key) and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert planted.read_bytes() == pem and planted.stat().st_uid == NOBODY
    # the other user rewrites every entry and signs it with the planted key
    assert _rewrite_and_sign(shared, pem) >= 1
    second = copy_project(src, tmp_path / "second")
    run = doit_run(second, ["build"], env)
    assert run.returncode == 0, run.text
    text = run.out + run.err
    assert not diff_outputs(outputs(second), outputs(first)), diff_outputs(
        outputs(second), outputs(first)
    )
    assert text.count("no key in cache_trusted_keys signed") == 1, run.text
    stats = json.loads((second / "build" / "cache-stats.json").read_text())
    assert stats["untrusted"] >= 1 and stats["local_hits"] == 0, stats


@as_root
def test_doit_s_database_of_another_user_decides_nothing(tmp_path: Path) -> None:
    """doit's records say which targets are up to date: another user's (or one others may
    write) is ignored with a warning, made anew as this user's own, and every target is
    checked again rather than taken as up to date on its word."""
    root = make_project(tmp_path / "proj")
    use_fake_compiler(root, tmp_path / "bin")
    env = project_env(tmp_path, fake_bin=tmp_path / "bin")
    first = doit(root, ["build:hopper/qwen/w8"], env)
    assert first.returncode == 0, first.text
    db = root / ".doit.db"
    assert mine(db)  # made private, whatever the umask
    again = doit(root, ["build:hopper/qwen/w8"], env)
    assert "1 up to date" in again.text, again.text  # the records hold
    give_away(db)
    db.chmod(0o666)
    run = doit(root, ["build:hopper/qwen/w8"], env)
    assert run.returncode == 0, run.text
    assert "warning: doit's database" in run.text and "ignored and made anew" in run.text
    assert "0 up to date" in run.text, run.text
    assert mine(db)


def test_a_local_cache_others_may_write_without_trusted_keys_is_warned(tmp_path: Path) -> None:
    """Without cache_trusted_keys nothing says who wrote a local entry: a local cache that
    others may write is then said, once, with what to do."""
    root = make_project(tmp_path / "proj")
    use_fake_compiler(root, tmp_path / "bin")
    env = project_env(tmp_path, fake_bin=tmp_path / "bin")
    shared = Path(env["METRALE_ORCH_LOCAL_CACHE"])
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    run = doit(root, ["build:hopper/qwen/w8"], env)
    assert run.returncode == 0, run.text
    said = [line for line in run.text.splitlines() if "writable by group or others" in line]
    assert len(said) == 1 and "cache_trusted_keys is not set" in said[0], run.text
    shared.chmod(0o700)
    run = doit(root, ["forget"], env)
    run = doit(root, ["build:hopper/qwen/w8"], env)
    assert "writable by group or others" not in run.text, run.text
