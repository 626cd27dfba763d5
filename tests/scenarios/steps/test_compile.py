"""Planning and building one target (SPEC 3.3, 3.4 key side, 4.1) with a recording fake nvcc.

The tests of this topic that run in-process are in ``tests/unit/steps/test_compile.py``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash

from metrale_orch.steps.errors import CompileError
from metrale_orch.steps.memo import Obtained
from metrale_orch.steps.results import TargetResult
from metrale_orch.steps.session import BuildSession
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support.build import (
    compiles,
    fake_toolchain_env,
    make_config,
    small_tree,
    write,
)
from tests.support.steps import _build


@pytest.fixture
def fake(tmp_path: Path) -> tuple[dict[str, str], Path]:
    log = tmp_path / "fake-nvcc.log"
    return fake_toolchain_env(tmp_path / "fakebin", log), log


def _keys(result: TargetResult) -> dict[str, str]:
    return {m.name: m.key for m in result.modules}


# ------------------------------------------------------------------------------------ build


def test_build_installs_artefacts_defaults_and_manifest(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, log = fake
    root = small_tree(tmp_path / "repo")
    result = _build(root, env, tmp_path / "cache")
    assert not result.failed
    assert [m.outcome for m in result.modules] == ["compiled"] * 3
    assert len(compiles(log)) == 3
    # Each compile ran in its role dir of the stage with relative paths.
    cwds = {
        Path(c["cwd"]).relative_to(root / "build/stage/hw1/m1/q1").as_posix() for c in compiles(log)
    }
    assert cwds == {"common", "m1/q1"}
    out = root / "build/hw1/m1/q1"
    assert sorted(p.name for p in out.iterdir()) == [
        "leaf.ptx", "manifest.json", "scale_q1.ptx", "target_defaults.h",
        "target_defaults.json", "vector_add.ptx",
    ]  # fmt: skip
    text = (out / "manifest.json").read_text()
    manifest = json.loads(text)
    assert text == json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    assert manifest["schema"] == 1
    assert manifest["target"] == "hw1/m1/q1"
    assert manifest["arch"] == "sm_90a"
    assert manifest["toolchain"]["name"] == "nvcc"
    assert "release 99.0" in manifest["toolchain"]["identity"]
    assert manifest["flags"] == ["-DA=1", "-DX", "-DB=1", "-DC=1"]
    assert manifest["defaults"]["sm_count"] == 100
    assert str(tmp_path) not in text
    for mod in manifest["modules"]:
        data = (out / mod["artefact"]).read_bytes()
        assert mod["xxh3"] == xxhash.xxh3_128_hexdigest(data)
        assert mod["outcome"] == "compiled"
        assert (root / mod["source"]).is_file()
    assert {m["name"]: m["source"] for m in manifest["modules"]}["leaf"] == (
        "kernels/hw1/m1/q1/leaf.cu"
    )
    assert "#define METRALE_TARGET_SM_COUNT 100" in (out / "target_defaults.h").read_text()
    assert json.loads((out / "target_defaults.json").read_text())["lm_head_batchm_max"] == 12
    assert result.manifest == "build/hw1/m1/q1/manifest.json"
    assert json.loads(json.dumps(result.to_dict()))["modules"][0]["outcome"] == "compiled"


def test_second_build_hits_the_local_cache(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, log = fake
    root = small_tree(tmp_path / "repo")
    first = _build(root, env, tmp_path / "cache")
    shutil.rmtree(root / "build")
    second = _build(root, env, tmp_path / "cache")
    assert [m.outcome for m in second.modules] == ["local"] * 3
    assert _keys(first) == _keys(second)
    assert len(compiles(log)) == 3
    manifest = json.loads((root / "build/hw1/m1/q1/manifest.json").read_text())
    assert {m["outcome"] for m in manifest["modules"]} == {"local"}


def test_keys_are_shared_across_checkout_directories(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, log = fake
    a = small_tree(tmp_path / "a")
    b = small_tree(tmp_path / "elsewhere/b")
    first = _build(a, env, tmp_path / "cache")
    second = _build(b, env, tmp_path / "cache")
    assert _keys(first) == _keys(second)
    assert [m.outcome for m in second.modules] == ["local"] * 3
    assert len(compiles(log)) == 3
    assert (a / "build/hw1/m1/q1/leaf.ptx").read_bytes() == (
        b / "build/hw1/m1/q1/leaf.ptx"
    ).read_bytes()


def test_header_under_if0_changes_exactly_its_includers_keys(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, _ = fake
    root = small_tree(tmp_path / "repo")
    before = _keys(_build(root, env, tmp_path / "cache"))
    write(root, "kernels/hw1/common/unrelated.cuh", "// unrelated v2\n")
    assert _keys(_build(root, env, tmp_path / "cache")) == before
    write(root, "kernels/hw1/common/deep.cuh", "// deep v2\n")
    after = _keys(_build(root, env, tmp_path / "cache"))
    changed = {name for name in before if before[name] != after[name]}
    # add.cu and leaf.cu include util.cuh, which includes deep.cuh under #if 0.
    assert changed == {"vector_add", "leaf"}


def test_key_covers_flags_env_allowlist_and_identity(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, _ = fake
    root = small_tree(tmp_path / "repo")
    base = _keys(_build(root, env, tmp_path / "cache"))
    assert _keys(_build(root, {**env, "UNRELATED_VAR": "1"}, tmp_path / "cache")) == base
    prepended = _keys(_build(root, {**env, "NVCC_PREPEND_FLAGS": "-G"}, tmp_path / "cache"))
    assert all(prepended[n] != base[n] for n in base)
    write(root, "kernels/hw1/m1/q1/KERNEL.toml", '[modules]\nscale = "scale_q1"\n')
    noflags = _keys(_build(root, env, tmp_path / "cache"))
    assert all(noflags[n] != base[n] for n in base)


def test_compiler_failure_is_reported_and_others_continue(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, log = fake
    root = small_tree(tmp_path / "repo")
    assert not _build(root, env, tmp_path / "cache").failed
    before = {p.name: p.read_bytes() for p in (root / "build/hw1/m1/q1").iterdir()}
    write(root, "kernels/hw1/m1/q1/leaf.cu", "#error nope\n")
    result = _build(root, env, tmp_path / "cache")
    assert result.failed
    assert {m.name: m.outcome for m in result.modules} == {
        "vector_add": "local", "leaf": "failed", "scale_q1": "local",
    }  # fmt: skip
    (failure,) = result.failures
    assert isinstance(failure, CompileError)
    assert (failure.target, failure.module, failure.returncode) == ("hw1/m1/q1", "leaf", 1)
    assert "leaf.cu" in failure.argv and "--ptx" in failure.argv
    assert "the fake compiler was told to fail" in failure.output
    text = result.failure_text()
    assert "hw1/m1/q1: module leaf (kernels/hw1/m1/q1/leaf.cu)" in text
    assert "nvcc --ptx" in text and "told to fail" in text
    assert failure.source == "kernels/hw1/m1/q1/leaf.cu"
    # A failed build installs nothing: the last good build stays, manifest and all.
    out = root / "build/hw1/m1/q1"
    assert before == {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"manifest.json", "leaf.ptx", "vector_add.ptx"} <= set(before)
    assert result.to_dict()["failures"][0]["exit_code"] == 1
    assert len(compiles(log)) == 4
    assert not list((root / "build/.tmp").iterdir())  # the failed compile's removed too


def test_compiler_writing_nothing_is_a_failure(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, _ = fake
    root = small_tree(tmp_path / "repo", {"kernels/hw1/common/scale.cu": "// FAKE_NO_OUTPUT\n"})
    result = _build(root, env, tmp_path / "cache")
    (failure,) = result.failures
    assert failure.module == "scale_q1"
    assert "wrote no scale_q1.ptx" in str(failure)
    assert not list((root / "build/.tmp").iterdir())


def test_stale_artefacts_removed_and_no_temporaries_left(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, _ = fake
    root = small_tree(tmp_path / "repo")
    _build(root, env, tmp_path / "cache")
    write(root, "kernels/hw1/m1/q1/KERNEL.toml", '[modules]\nscale = "scaled"\n')
    (root / "kernels/hw1/common/add.cu").unlink()
    _build(root, env, tmp_path / "cache")
    out = root / "build/hw1/m1/q1"
    assert sorted(p.name for p in out.iterdir()) == [
        "leaf.ptx", "manifest.json", "scaled.ptx", "target_defaults.h", "target_defaults.json",
    ]  # fmt: skip
    assert not list((root / "build/.tmp").iterdir())
    assert not (root / "build/stage/hw1/m1/q1/common/add.cu").exists()


def test_unchanged_rebuild_rewrites_nothing(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, _ = fake
    root = small_tree(tmp_path / "repo")
    _build(root, env, tmp_path / "cache")
    out = root / "build/hw1/m1/q1"
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "manifest.json"}
    _build(root, env, tmp_path / "cache")
    assert {
        p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "manifest.json"
    } == stamps


def _one_session(
    tmp_path: Path, env: dict[str, str]
) -> tuple[BuildSession, Callable[[str], TargetResult]]:
    """Quants q2 and q3 of one model (common modules alike, one leaf each), built with
    one session and no cache: the session and a build of a quant."""
    root = small_tree(
        tmp_path / "repo",
        {"kernels/hw1/m1/q2/only.cu": "// q2\n", "kernels/hw1/m1/q3/only.cu": "// q3\n"},
    )
    config = make_config(root, tmp_path / "cache", cache_mode="off")
    session = BuildSession.local(jobs=2, build_dir=config.build_dir)

    def build(quant: str) -> TargetResult:
        target = Target(hardware="hw1", model="m1", quant=quant)
        return build_target(root, target, config=config, cache=None, environ=env, session=session)

    return session, build


def test_identical_modules_compile_once_per_session(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    env, log = fake
    _session, build = _one_session(tmp_path, env)
    results = [build(q) for q in ("q2", "q3")]
    # Same flags and bytes: the common modules compile for q2 only; q3 reuses them.
    assert {m.name: m.outcome for m in results[1].modules} == {
        "vector_add": "local", "only": "compiled", "scale": "local",
    }  # fmt: skip
    assert results[1].cache_stats["memo"] == 2
    assert len(compiles(log)) == 4


def test_a_module_another_target_compiled_is_shared_not_from_cache(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    # Issue 35: q3's common modules were said "from cache" though no cache served them.
    from metrale_orch.tasks.outcomes import summarise_result
    from metrale_orch.tasks.report_lines import format_modules

    env, _log = fake
    _session, build = _one_session(tmp_path, env)
    first, second = build("q2"), build("q3")
    assert {m.name: m.shared for m in first.modules} == {
        "vector_add": "", "only": "", "scale": "",
    }  # fmt: skip
    assert {m.name: m.shared for m in second.modules} == {
        "vector_add": "compiled", "only": "", "scale": "compiled",
    }  # fmt: skip
    outcome, modules = summarise_result(second)
    assert (outcome, modules) == ("built", {"compiled": 1, "shared": 2})
    assert format_modules(modules) == "3 modules: 2 shared, 1 compiled"
    assert format_modules({"local": 2, "remote": 1}) == "3 modules: 2 local hits, 1 remote hit"


def test_a_memoised_artefact_is_verified_before_reuse(
    tmp_path: Path, fake: tuple[dict[str, str], Path]
) -> None:
    # Two targets may share a key while a file the scan missed differs between their
    # stages: the second takes the first's artefact only if what its compile read still
    # holds. Stand-in for such a file: the memo's record of one input says other bytes.
    env, log = fake
    session, build = _one_session(tmp_path, env)

    first = {m.name: m for m in build("q2").modules}
    key = first["vector_add"].key
    held = session.memo.get(key, first["vector_add"].artefact)
    assert held is not None and any(path.endswith("util.cuh") for _, path, _ in held.inputs)
    session.memo.put(
        key,
        first["vector_add"].artefact,
        Obtained(
            held.data,
            tuple((k, p, "0" * 32 if p.endswith("util.cuh") else h) for k, p, h in held.inputs),
        ),
    )
    second = {m.name: m.outcome for m in build("q3").modules}
    assert second == {"vector_add": "compiled", "only": "compiled", "scale": "local"}
    assert len(compiles(log)) == 5


def test_process_door_reports_argv_exit_code_and_tail(tmp_path: Path) -> None:
    import sys

    from metrale_orch.proc import ProcessError, run_process

    script = "import sys; print('out'); sys.stderr.write('x' * 5000 + 'END'); sys.exit(7)"
    with pytest.raises(ProcessError) as err:
        run_process([sys.executable, "-c", script], cwd=tmp_path, env={}, timeout=30)
    assert err.value.returncode == 7
    assert err.value.argv[1:] == ("-c", script)
    assert err.value.output.startswith("out\n")
    assert err.value.tail.endswith("END") and len(err.value.tail) < len(err.value.output)
    assert "exited with status 7" in str(err.value)
    with pytest.raises(ProcessError, match="program not found") as missing:
        run_process([str(tmp_path / "no-such-program")], env={})
    assert missing.value.returncode is None
    with pytest.raises(ProcessError, match=r"timed out after 0\.2 s"):
        run_process([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.2)
    done = run_process([sys.executable, "-c", "print('hi')"], cwd=tmp_path, env={})
    assert (done.returncode, done.stdout) == (0, "hi\n")
