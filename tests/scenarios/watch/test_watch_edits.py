"""``metrale-orch watch`` as a user runs it: after each kind of change, once its cycle has
run, every artefact equals a clean build of the tree as it is (byte for byte); a save of
the same bytes builds nothing; a compile error is reported and its fix built; ``doit
build`` afterwards, or while watch waits, works and compiles nothing left to do."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.project import doit, fake_compiles
from tests.support.smoke import needs_nvcc
from tests.support.watch import Watch, artefacts, clean_build, start_watch

PATTERN = "hopper/*"
MUL = "kernels/hopper/qwen/w8/mul.cu"


def _kernel(name: str, extra: str = "") -> str:
    return f'extern "C" __global__ void {name}(float* o) {{ o[0] = 1.0f; }}\n{extra}'


def _same_as_clean(root: Path, tmp: Path, env: dict[str, str]) -> None:
    clean = clean_build(root, tmp / "clean", PATTERN, env)
    watched = {k: v for k, v in artefacts(root / "build").items() if k.startswith("hopper/")}
    assert watched == artefacts(clean)


def _started(root: Path, env: dict[str, str], tmp: Path) -> Watch:
    watch = start_watch(root, [PATTERN], env)
    first = watch.cycle()
    assert "build: " in first[0] and "hopper/qwen/w8 built" in first[0], first
    fake_compiles(tmp)
    return watch


@pytest.fixture
def watched(fake_project: tuple[Path, dict[str, str]], tmp_path: Path) -> Iterator[Watch]:
    """``metrale-orch watch 'hopper/*'`` on the fake project, its first build done; at the
    end it must stop on Ctrl-C with 130."""
    root, env = fake_project
    watch = _started(root, env, tmp_path)
    try:
        yield watch
        assert watch.stop() == 130
    finally:
        watch.kill()


def _atomic_save(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.swp~")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_every_kind_of_change_ends_equal_to_a_clean_build(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    watch = _started(root, env, tmp_path)
    try:
        mul = root / MUL
        # An edit: only the target it reaches compiles.
        mul.write_text(mul.read_text() + "// edit\n")
        line = watch.cycle()[0]
        assert "mul.cu changed: hopper/qwen/w8 built" in line and "w4" not in line, line
        assert fake_compiles(tmp_path) == ["sm_90a mul.cu"]
        _same_as_clean(root, tmp_path, env)
        # The same bytes again: no cycle, no compile.
        mul.write_text(mul.read_text())
        assert watch.settle(root / "build") == []
        assert fake_compiles(tmp_path) == []
        # An editor's atomic save (a temporary file renamed over the source).
        _atomic_save(mul, mul.read_text() + "// atomic\n")
        assert "hopper/qwen/w8 built" in watch.cycle()[0]
        _same_as_clean(root, tmp_path, env)
        # A burst: several files saved at once build in one or more cycles, never stale.
        (root / "kernels/hopper/common/util.cuh").write_text("#define UTIL_SCALE 4.0f\n")
        mul.write_text(mul.read_text() + "// burst\n")
        scale = root / "kernels/hopper/qwen/w4/scale.cu"
        scale.write_text(scale.read_text() + "// burst\n")
        assert "changed" in watch.cycle()[0]
        watch.settle(root / "build")
        _same_as_clean(root, tmp_path, env)
        # An added file, then its removal.
        added = root / "kernels/hopper/qwen/w8/div.cu"
        added.write_text(_kernel("div_k"))
        assert "+hopper/qwen/w8/div.cu" in watch.cycle()[0]
        assert (root / "build/hopper/qwen/w8/div.ptx").is_file()
        _same_as_clean(root, tmp_path, env)
        added.unlink()
        assert "-hopper/qwen/w8/div.cu" in watch.cycle()[0]
        _same_as_clean(root, tmp_path, env)
        # An added model: a new target joins the selection.
        (root / "kernels/hopper/llama/w4").mkdir(parents=True)
        (root / "kernels/hopper/llama/w4/gate.cu").write_text(_kernel("gate_k"))
        (root / "kernels/hopper/llama/MODEL.toml").write_text("[model]\n")
        lines = watch.cycle()
        watch.settle(root / "build")
        assert (root / "build/hopper/llama/w4/gate.ptx").is_file(), lines + watch.seen
        _same_as_clean(root, tmp_path, env)
    finally:
        assert watch.stop() == 130
    fake_compiles(tmp_path)
    # doit afterwards: nothing left to compile.
    run = doit(root, [f"build:{PATTERN}"], env)
    assert run.returncode == 0, run.text
    assert "0 built" in run.out and fake_compiles(tmp_path) == []


def test_a_branch_switch_rewriting_hundreds_of_files(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path, watched: Watch
) -> None:
    root, env = fake_project
    common = root / "kernels/hopper/common"
    for i in range(300):  # headers the sources do not include: files the tree holds
        (common / f"gen{i:03}.cuh").write_text(f"#define GEN{i} {i}\n")
    (root / MUL).write_text(_kernel("mul_k", "// switched\n"))
    (root / "kernels/hopper/qwen/w4/scale.cu").write_text(_kernel("scale_k", "// sw\n"))
    watched.cycle()
    watched.settle(root / "build")
    _same_as_clean(root, tmp_path, env)


def test_a_compile_error_then_its_fix(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path, watched: Watch
) -> None:
    root, env = fake_project
    mul = root / MUL
    good = mul.read_text()
    before = artefacts(root / "build")
    mul.write_text(good + "#error broken\n")
    lines = watched.cycle()
    assert "hopper/qwen/w8 failed" in lines[0], lines
    assert lines[1:] == ["    hopper/qwen/w8: mul.cu(1): error: forced failure"], lines
    assert artefacts(root / "build") == before  # the last good build stays installed
    # A write seen half done (its truncation and its bytes in two bursts, on a loaded
    # machine) is a second cycle of the same failure: let watch go idle first.
    watched.settle(root / "build")
    mul.write_text(good + "// fixed\n")
    assert "hopper/qwen/w8 built" in watched.cycle()[0]
    watched.settle(root / "build")
    _same_as_clean(root, tmp_path, env)
    assert watched.proc.poll() is None  # watch went on


def test_doit_build_while_watch_waits(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    watch = _started(root, env, tmp_path)
    try:
        watch.settle(root / "build")
        # watch holds no lock while it waits: doit builds at once (gb10 is not watched).
        run = doit(root, ["build"], env, timeout=60)
        assert run.returncode == 0, run.text
        assert "waiting for the build lock" not in run.text
        assert "2 built" in run.out and "2 up to date" in run.out, run.out
        assert watch.settle(root / "build") == []  # doit's build touched no watched file
        # And watch goes on.
        (root / MUL).write_text(_kernel("mul_k", "// after\n"))
        assert "hopper/qwen/w8 built" in watch.cycle()[0]
        watch.settle(root / "build")
        _same_as_clean(root, tmp_path, env)
    finally:
        assert watch.stop(signal.SIGTERM) == 143


@needs_nvcc
@pytest.mark.parametrize("target", ["hopper/qwen/w8"])
def test_real_nvcc_edit_matches_a_clean_build(tmp_path: Path, target: str) -> None:
    from tests.support.project import make_project, project_env

    root = make_project(tmp_path / "proj")
    env = project_env(tmp_path)
    watch = start_watch(root, [target], env)
    try:
        assert f"{target} built" in watch.cycle(timeout=180)[0]
        mul = root / MUL
        mul.write_text(mul.read_text().replace("2.0f", "3.0f"))
        assert f"{target} built (1 shared, 1 compiled)" in watch.cycle(timeout=180)[0]
        clean = clean_build(root, tmp_path / "clean", target, env)
        assert artefacts(root / "build") == artefacts(clean)
    finally:
        assert watch.stop() == 130


def test_a_failed_smoke_check_is_reported_and_watch_goes_on(
    fake_project: tuple[Path, dict[str, str]], watched: Watch
) -> None:
    root, _env = fake_project
    (root / "kernels/hopper/qwen/w8/SMOKE.toml").write_text(
        '[[case]]\nname = "absent"\nmodule = "mul"\nentry = "not_there_k"\n'
        'grid = [1, 1, 1]\nblock = [32, 1, 1]\nreference = "none"\nargs = []\n'
    )
    watched.cycle()  # a graph change: the whole selection, nothing to rebuild
    mul = root / MUL
    for n in range(2):
        mul.write_text(mul.read_text() + f"// {n}\n")
        lines = watched.cycle()
        assert "hopper/qwen/w8 built" in lines[0] and "smoke ok" not in lines[0], lines
        assert any(ln.startswith("    FAIL hopper/qwen/w8 mul::") for ln in lines), lines
    assert (root / "build/hopper/qwen/w8/mul.ptx").is_file()  # nothing installed undone


def test_a_cycle_waits_for_a_build_holding_the_lock_and_says_so(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path, watched: Watch
) -> None:
    from metrale_orch.tasks.runlock import BuildLock

    root, env = fake_project
    lock = BuildLock(root / "build")
    lock.acquire(lambda _line: None)
    try:
        (root / MUL).write_text(_kernel("mul_k", "// while locked\n"))
        said = watched.quiet(2.0)
        assert any("waiting for the build lock" in line for line in said), said
    finally:
        lock.release()
    assert "hopper/qwen/w8 built" in watched.cycle()[0]
    _same_as_clean(root, tmp_path, env)
