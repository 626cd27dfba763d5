"""``metrale-orch why-miss TARGET [MODULE]``: each module that misses the cache, the nearest
stored entry of the module, and what differs, by name (issue 37, item 5).

One small project (one target ``hw/m/q``: module ``a`` including ``p.h``, module ``b``
including nothing, a define in the leaf's KERNEL.toml) is built once with real nvcc, with a
local cache and a ``file://`` remote. Every other step copies the built project, changes
ONE thing and asks ``why-miss``, which only stages and keys (nothing is compiled): it names
the changed part for a define in KERNEL.toml, an extra flag, an edited header and
``METRALE_EXTRA_NVCC_FLAGS``; an untouched module says it hits. The records live in the
entries' meta, never in their keys (the keys are pinned by test_wrong_hits, test_cache*,
test_signing).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from metrale_orch.cache import RECORD_META, CacheSettings, open_cache
from metrale_orch.cache.local import read_object_head, scan_objects
from metrale_orch.cache.objects import decode_object, encode_object, read_header
from metrale_orch.cache.records import TierHeads
from metrale_orch.cache.signing import generate_key_pair
from metrale_orch.steps.keyrecord import Stored, key_record, nearest, record_changes
from tests.support.servers import ObjectServer
from tests.support.trust import HAS_NVCC, Run, base_env, doit_run, orch_run, write_files

TARGET = "hw/m/q"
HW = '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\n'
LEAF = "kernels/hw/m/q/KERNEL.toml"
HEADER = "kernels/hw/common/p.h"
FILES = {
    "kernels/hw/HARDWARE.toml": HW,
    "kernels/hw/m/MODEL.toml": "[model]\n",
    LEAF: '[build]\nextra_nvcc_flags = ["-DSCALE=2"]\n',
    HEADER: "#pragma once\n#define P 3\n",
    "kernels/hw/common/a.cu": (
        '#include "p.h"\nextern "C" __global__ void ka(int* o) { o[0] = P * SCALE; }\n'
    ),
    "kernels/hw/common/b.cu": 'extern "C" __global__ void kb(int* o) { o[0] = SCALE; }\n',
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    """The project built once, its local cache and its remote."""

    root: Path
    cache: Path
    remote: Path
    tmp: Path

    def env(self, **extra: str) -> dict[str, str]:
        return base_env(self.cache, **{"METRALE_ORCH_CACHE": f"file://{self.remote}", **extra})

    def copy(self, name: str, files: Mapping[str, str | None] = {}) -> Path:
        """A fresh checkout of the project (no build directory), with ``files`` changed."""
        root = self.tmp / f"checkout-{name}"
        shutil.copytree(self.root, root, ignore=shutil.ignore_patterns("build", ".doit.db*"))
        return write_files(root, files)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    if not HAS_NVCC:
        pytest.skip("nvcc and gcc are needed on PATH")
    tmp = tmp_path_factory.mktemp("whymiss")
    project = Built(
        root=write_files(tmp / "p", FILES), cache=tmp / "cache", remote=tmp / "remote", tmp=tmp
    )
    run = doit_run(project.root, ["build"], project.env())
    assert run.returncode == 0, run.text
    yield project


def why_miss(root: Path, env: Mapping[str, str], *args: str) -> Run:
    return orch_run(root, ["why-miss", TARGET, *args], env)


def lines_of(run: Run, module: str) -> list[str]:
    head = f"{TARGET}: {module}: "
    return [ln.removeprefix(head) for ln in run.out.splitlines() if ln.startswith(head)]


# ------------------------------------------------------------------------------ hits


def test_an_unchanged_checkout_hits_every_module_one_line_each(built: Built) -> None:
    run = why_miss(built.copy("same"), built.env())
    assert run.returncode == 0, run.text
    for module in ("a", "b"):
        (line,) = lines_of(run, module)
        assert line.startswith("hit ("), run.text
    last = run.out.splitlines()[-1]
    assert last == f"{TARGET}: 0 of 2 modules miss the local cache {built.cache}", run.text
    assert "Traceback" not in run.text


def test_entries_keep_a_record_of_their_key_parts(built: Built) -> None:
    objects = scan_objects(built.cache).objects()
    records = []
    for obj in objects:
        head = read_object_head(obj.path)
        assert head is not None
        key, got = read_header(*head)
        assert key == obj.key and got.outputs == {}
        records.append(got.meta[RECORD_META])
    assert sorted(r["module"] for r in records) == ["a", "b"]
    a = next(r for r in records if r["module"] == "a")
    assert a["target"] == TARGET and a["hardware"] == "hw" and a["arch"] == "sm_90a"
    assert a["source"] == "kernels/hw/common/a.cu"
    assert [i[0] for i in a["inputs"]] == ["a.cu", "p.h"]
    assert [i[2] for i in a["inputs"]] == ["kernels/hw/common/a.cu", HEADER]


# ------------------------------------------------------------------------------ one change each


def test_a_define_changed_in_kernel_toml_is_named(built: Built) -> None:
    root = built.copy("define", {LEAF: '[build]\nextra_nvcc_flags = ["-DSCALE=5"]\n'})
    run = why_miss(root, built.env())
    assert run.returncode == 0, run.text
    for module in ("a", "b"):
        summary, *changes = lines_of(run, module)
        assert summary.startswith("miss (") and f"(stored by {TARGET}), 1 difference" in summary
        assert changes == ["define SCALE changed: 2 -> 5"], run.text
    assert run.out.splitlines()[-1].startswith(f"{TARGET}: 2 of 2 modules miss")


def test_an_extra_flag_is_named(built: Built) -> None:
    flags = '[build]\nextra_nvcc_flags = ["-DSCALE=2", "--extra-device-vectorization"]\n'
    run = why_miss(built.copy("flag", {LEAF: flags}), built.env())
    assert run.returncode == 0, run.text
    assert lines_of(run, "a")[1:] == ["flag added: --extra-device-vectorization"], run.text
    assert lines_of(run, "b")[1:] == ["flag added: --extra-device-vectorization"], run.text


def test_an_edited_header_is_named_and_the_module_without_it_hits(built: Built) -> None:
    root = built.copy("header", {HEADER: "#pragma once\n#define P 4\n"})
    run = why_miss(root, built.env())
    assert run.returncode == 0, run.text
    assert lines_of(run, "a")[1:] == [f"header {HEADER} changed"], run.text
    (b,) = lines_of(run, "b")
    assert b.startswith("hit ("), run.text
    assert run.out.splitlines()[-1].startswith(f"{TARGET}: 1 of 2 modules misses the local")


def test_the_extra_flags_environment_variable_is_named(built: Built) -> None:
    env = built.env(METRALE_EXTRA_NVCC_FLAGS="-DEXTRA=1")
    run = why_miss(built.copy("env"), env)
    assert run.returncode == 0, run.text
    for module in ("a", "b"):
        assert lines_of(run, module)[1:] == [
            "define added: EXTRA=1",
            "environment METRALE_EXTRA_NVCC_FLAGS set",
        ], run.text


def test_one_module_json_and_exit_code(built: Built) -> None:
    root = built.copy("json", {HEADER: "#pragma once\n#define P 5\n"})
    run = why_miss(root, built.env(), "a", "--json", "--exit-code")
    assert run.returncode == 1, run.text
    doc = json.loads(run.out)
    assert doc["target"] == TARGET and doc["misses"] == 1
    (module,) = doc["modules"]
    assert module["module"] == "a" and module["outcome"] == "miss"
    assert module["nearest"]["target"] == TARGET
    assert module["changes"] == [{"part": "header", "text": f"header {HEADER} changed"}]
    hits = why_miss(root, built.env(), "b", "--exit-code")
    assert hits.returncode == 0 and len(hits.out.splitlines()) == 2, hits.text


def test_a_new_module_has_no_stored_entry(built: Built) -> None:
    root = built.copy("new", {"kernels/hw/common/c.cu": 'extern "C" __global__ void kc() {}\n'})
    run = why_miss(root, built.env(), "c")
    assert run.returncode == 0, run.text
    (line,) = lines_of(run, "c")
    assert line.startswith("miss (") and line.endswith("no stored entry of this module"), run.text


def test_an_entry_whose_read_files_changed_is_named_stale(built: Built, tmp_path: Path) -> None:
    """The key is there, but a file its compile read has other content now (here: the
    entry's record of it is altered): a build would compile again, and says which file."""
    cache = tmp_path / "cache"
    shutil.copytree(built.cache, cache)
    for obj in scan_objects(cache).objects():
        got = decode_object(obj.key, obj.path.read_bytes())
        if got.meta[RECORD_META]["module"] != "a":  # type: ignore[index]
            continue
        meta = dict(got.meta)
        meta["inputs"] = [
            [k, p, "0" * 32 if p == "p.h" else d]
            for k, p, d in meta["inputs"]  # type: ignore[attr-defined]
        ]
        obj.path.write_bytes(encode_object(obj.key, dict(got.outputs), meta))
    run = why_miss(built.copy("stale"), base_env(cache), "a")
    assert run.returncode == 0, run.text
    assert lines_of(run, "a") == [
        lines_of(run, "a")[0],
        f"header {HEADER} changed since the entry was compiled",
    ], run.text
    assert "was compiled from files that changed since" in lines_of(run, "a")[0], run.text


def test_an_entry_no_trusted_key_signed_is_named(built: Built, tmp_path: Path) -> None:
    """With ``cache_trusted_keys``, the build's unsigned entries are not served: the key is
    there, the module still compiles, and ``why-miss`` says why (no key file is made)."""
    _, ci = generate_key_pair("ci")
    config = tmp_path / "config"
    env = built.env(METRALE_ORCH_CACHE_TRUSTED_KEYS=ci.line(), XDG_CONFIG_HOME=str(config))
    env["METRALE_ORCH_LOCAL_CACHE"] = str(tmp_path / "cache")
    del env["METRALE_ORCH_CACHE"]  # the shared remote stays as the first build left it
    shutil.copytree(built.cache, tmp_path / "cache")
    root = built.copy("untrusted")
    run = why_miss(root, env, "b")
    assert run.returncode == 0, run.text
    summary, reason = lines_of(run, "b")
    assert "is not signed by a trusted key (cache_trusted_keys)" in summary, run.text
    assert reason == "not served: unsigned", run.text
    assert not config.exists()
    # A build then compiles it and signs it with this user's own key, which the local
    # tier trusts: the entry hits.
    assert doit_run(root, ["build"], env).returncode == 0
    (line,) = lines_of(why_miss(root, env, "b"), "b")
    assert line.startswith("hit ("), line


# ------------------------------------------------------------------------------ the remote tier


def test_remote_names_the_nearest_entry_of_the_bucket(built: Built, tmp_path: Path) -> None:
    env = built.env(METRALE_ORCH_LOCAL_CACHE=str(tmp_path / "empty"))
    root = built.copy("remote", {LEAF: '[build]\nextra_nvcc_flags = ["-DSCALE=7"]\n'})
    local = why_miss(root, env, "a")
    assert lines_of(local, "a") == [lines_of(local, "a")[0]], local.text
    assert "no stored entry of this module" in lines_of(local, "a")[0], local.text
    remote = why_miss(root, env, "a", "--remote")
    assert remote.returncode == 0, remote.text
    assert lines_of(remote, "a")[1:] == ["define SCALE changed: 2 -> 7"], remote.text
    assert remote.out.splitlines()[-1].endswith(f"misses the remote cache file://{built.remote}")


def test_remote_without_a_remote_is_one_clear_error(built: Built) -> None:
    run = why_miss(built.copy("noremote"), base_env(built.cache), "--remote")
    assert run.returncode == 1, run.text
    assert run.err.strip() == (
        "error: remote tier: no remote cache is configured (set `cache` to its URL)"
    ), run.text


def test_an_unreachable_remote_is_one_clear_error(built: Built) -> None:
    options = {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}
    env = built.env(
        METRALE_ORCH_CACHE="s3://bucket/team", METRALE_ORCH_STORAGE_OPTIONS=json.dumps(options)
    )
    root = built.copy("unreachable", {HEADER: "#pragma once\n#define P 6\n"})
    run = why_miss(root, env, "a", "--remote")
    assert run.returncode == 1, run.text
    assert run.err.splitlines() == [
        "error: remote cache s3://bucket/team: cannot be read: connection refused by 127.0.0.1:1"
    ], run.text


def _lists_and_reads_headers(settings: CacheSettings) -> None:
    """``RemoteStore.keys``/``head`` through :class:`TierHeads`: the entries with a record,
    one without, a header past the first ranged read, an absent key."""
    record = {"schema": 1, "hardware": "hw", "module": "m"}
    with open_cache(settings) as cache:
        keys = sorted(cache.key({"n": n}) for n in range(3))
        for i, key in enumerate(keys):
            meta: dict[str, object] = {RECORD_META: record} if i else {"command": ["x"]}
            if i == 2:  # a header past the first ranged read
                meta["pad"] = "p" * 100_000
            cache.put(key, {"m.ptx": b"x" * 70000 * i}, meta)
    heads = TierHeads(settings, remote=True)
    try:
        found = heads.records()
        assert sorted(found.found) == keys[1:] and found.unrecorded == 1
        assert heads.meta(keys[1]) == {RECORD_META: record}
        assert heads.meta(keys[2]) == {RECORD_META: record, "pad": "p" * 100_000}
        assert heads.meta("f" * 32) is None
        assert heads.records(lambda head: False).found == {}
    finally:
        heads.close()


def test_the_bucket_tier_lists_and_reads_headers_on_memory(tmp_path: Path) -> None:
    url = f"memory://whymiss-{tmp_path.name}"
    _lists_and_reads_headers(
        CacheSettings(local_dir=tmp_path / "l", remote=url, background_uploads=False)
    )


def test_the_bucket_tier_lists_and_reads_headers_on_s3(tmp_path: Path, s3: ObjectServer) -> None:
    settings = CacheSettings(
        local_dir=tmp_path / "l",
        remote=s3.url(f"whymiss-{tmp_path.name}"),
        storage_options=s3.storage_options,
        background_uploads=False,
    )
    _lists_and_reads_headers(settings)
    before = len(s3.log())
    heads = TierHeads(settings, remote=True)
    try:
        heads.records()
    finally:
        heads.close()
    assert s3.writes(before) == []  # a diagnosis never writes


# ------------------------------------------------------------------------------ mistakes


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("hw/m", "not a target: 'hw/m' (expected hw/model/quant)"),
        ("hw/nope/q", "nope"),
    ],
)
def test_a_bad_target_is_one_line_exit_2(built: Built, target: str, expected: str) -> None:
    run = orch_run(built.root, ["why-miss", target], built.env())
    assert run.returncode == 2, run.text
    (line,) = run.err.splitlines()
    assert line.startswith("error: ") and expected in line and "Traceback" not in run.text


def test_an_unknown_module_names_the_modules(built: Built) -> None:
    run = why_miss(built.root, built.env(), "zz")
    assert run.returncode == 2, run.text
    assert run.err.strip() == f"error: {TARGET} has no module 'zz'; its modules: a, b"


# ------------------------------------------------------------------------------ pure parts


def _record(**parts: object) -> dict[str, object]:
    base: dict[str, object] = {
        "plan_schema": 2,
        "toolchain": "nvcc",
        "identity": "Cuda V13.0.88 | host: gcc 13.2 | d1",
        "arch": "sm_90a",
        "argv": ["nvcc", "--ptx", "-arch=sm_90a", "-O3", "-D", "A=1", "k.cu", "-o", "k.ptx"],
        "env": {"NVCC_APPEND_FLAGS": "secret"},
        "module": {"entry": "k.cu", "artefact": "k.ptx"},
        "inputs": [["k.cu", "1"], ["h.h", "2"]],
    }
    base.update(parts)
    return key_record(
        base,
        namespace="",
        target="hw/m/q",
        hardware="hw",
        module="k",
        source="kernels/hw/common/k.cu",
        tree=lambda p: f"kernels/hw/common/{p}",
    )


def test_record_changes_name_each_part() -> None:
    old = _record()
    new = _record(
        arch="sm_100a",
        argv=["nvcc", "--ptx", "-arch=sm_100a", "-O3", "-DA=2", "-G", "k.cu", "-o", "k.ptx"],
        identity="Cuda V13.0.88 | host: gcc 14.1 | d2",
        env={"NVCC_APPEND_FLAGS": "other", "NVCC_CCBIN": "g++"},
        inputs=[["k.cu", "9"], ["g.h", "3"]],
    )
    assert [c.text for c in record_changes(new, old)] == [
        "arch changed: sm_90a -> sm_100a",
        "define A changed: 1 -> 2",
        "environment NVCC_APPEND_FLAGS changed",
        "environment NVCC_CCBIN set",
        "flag added: -G",
        "header kernels/hw/common/g.h now included",
        "header kernels/hw/common/h.h no longer included",
        "source kernels/hw/common/k.cu changed",
        "toolchain host compiler changed: 'gcc 13.2' -> 'gcc 14.1'",
    ]
    assert "secret" not in json.dumps(old)  # a variable's value is kept as a digest only
    assert record_changes(old, old) == ()


def test_the_toolchain_identity_digest_alone_is_named() -> None:
    changes = record_changes(_record(identity="Cuda V13.0.88 | host: gcc 13.2 | d9"), _record())
    assert [c.part for c in changes] == ["toolchain"]
    assert "same versions" in changes[0].text


def test_nearest_takes_the_fewest_differences_then_the_smaller_key() -> None:
    current = _record(argv=["nvcc", "--ptx", "-arch=sm_90a", "-O3", "-D", "A=1", "-G", "k.cu"])
    one = _record()
    two = _record(arch="sm_100a")
    other_module = {**_record(), "module": "z", "source": "kernels/hw/common/z.cu"}
    found = nearest(
        current,
        [
            Stored(key="c" * 32, record=two),
            Stored(key="b" * 32, record=one),
            Stored(key="a" * 32, record=one),
            Stored(key="0" * 32, record=other_module),
        ],
    )
    assert found is not None
    entry, changes = found
    assert entry.key == "a" * 32 and [c.text for c in changes] == ["flag added: -G"]
    assert nearest(current, [Stored(key="0" * 32, record=other_module)]) is None
