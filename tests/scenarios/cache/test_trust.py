"""A build that says "done" is right: the scenarios of issue 11, items 1, 2, 5 and 6.

Each test builds a tiny project (one target ``hw/m/q``, one common module)
with real ``doit`` and the real ``nvcc``, and compares what it got with a clean
build (``METRALE_ORCH_CACHE_MODE=off``, another directory). Races are made
deterministic by a wrapper ``nvcc`` first on ``PATH`` that holds one compile
until the test releases it (:class:`tests.support.trust.Hold`). Every test
collects all its findings before failing, so one run tells the whole story.

Items 3 and 4 (include forms, inputs outside the tree and in the environment)
are the mutation suite of ``tests/scenarios/cache/test_wrong_hits.py``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from metrale_orch.fsutil import RACY_NS
from metrale_orch.paths import STATE_DIR
from metrale_orch.toolchain.records import RECORDS_DIR
from tests.support.trust import (
    HAS_NVCC,
    REAL_NVCC,
    TARGET,
    Hold,
    Run,
    artefacts,
    base_env,
    copy_project,
    diff_outputs,
    doit_run,
    doit_runs,
    doit_start,
    orch_run,
    outputs,
    summary_counts,
    wait_for,
    with_path,
    write_files,
    write_script,
)

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(not HAS_NVCC, reason="nvcc and gcc are needed on PATH"),
]

K = "kernels/hw/common/k.cu"
HW = "kernels/hw/HARDWARE.toml"


def hardware(*flags: str) -> str:
    text = '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\n'
    if flags:
        text += "\n[build]\nextra_nvcc_flags = [" + ", ".join(f'"{f}"' for f in flags) + "]\n"
    return text


def source(value: str, tag: str) -> str:
    """The common module: stores ``value`` (a literal or a macro); ``tag`` keeps keys per test."""
    return (
        f"// trust test: {tag}\n#ifndef X\n#define X 1\n#endif\n"
        f'extern "C" __global__ void k(int* o) {{ o[0] = {value}; }}\n'
    )


def project(root: Path, value: str, tag: str, *flags: str) -> Path:
    return write_files(
        root,
        {
            HW: hardware(*flags),
            "kernels/hw/m/MODEL.toml": "[model]\n",
            "kernels/hw/m/q/.gitkeep": "",
            K: source(value, tag),
        },
    )


def clean_build(src: Path, dst: Path, env: Mapping[str, str]) -> Path:
    """A copy of ``src`` built with the cache off (and an empty cache dir): the truth."""
    root = copy_project(src, dst)
    clean_env = dict(env)
    clean_env["METRALE_ORCH_CACHE_MODE"] = "off"
    clean_env["METRALE_ORCH_LOCAL_CACHE"] = str(dst.parent / f"{dst.name}-no-cache")
    run = doit_run(root, ["build"], clean_env)
    assert run.returncode == 0, f"the clean reference build failed:\n{run.text}"
    return root


def check(problems: list[str]) -> None:
    assert not problems, "\n\n".join(problems)


def expect_ok(problems: list[str], what: str, run: Run) -> bool:
    if run.returncode != 0:
        problems.append(f"{what} failed:\n{run.text}")
        return False
    return True


def expect_equal(problems: list[str], what: str, got: Path, clean: Path) -> None:
    diff = diff_outputs(outputs(got), outputs(clean))
    if diff:
        problems.append(f"{what}: the artefacts differ from a clean build:\n{diff}")


def expect_rebuilt(problems: list[str], what: str, run: Run) -> None:
    if summary_counts(run).get("up to date", 0) != 0:
        problems.append(f"{what} reported the target up to date:\n{run.text}")


# ------------------------------------------------------------------------------ item 1


@pytest.mark.slow
def test_second_build_waits_for_the_first_and_the_cache_stays_true(tmp_path: Path) -> None:
    """Start a build, hold its compile, edit a common .cu, start a second build (it waits,
    naming the first's pid), let both finish, revert the edit: the final build equals a
    clean build (the edited constant is never served under the original's key)."""
    hold = Hold(tmp_path)
    env = hold.env(base_env(tmp_path / "cache"))
    root = project(tmp_path / "proj", "11", "item1-wait")
    problems: list[str] = []

    hold.arm()
    first = doit_start(root, ["build"], env, tmp_path / "logs", "first")
    second = None
    try:
        assert hold.wait_started(first), f"the first build never compiled:\n{first.output()}"
        write_files(root, {K: source("22", "item1-wait")})
        second = doit_start(root, ["build"], env, tmp_path / "logs", "second")
        second_proc = second.proc
        # Release the first once the second says it waits (or has ended: it did not wait).
        wait_for(
            lambda: "waiting" in second.output().lower(),
            timeout=20,
            alive=lambda: second_proc.poll() is None,
        )
        hold.release()
        run1, run2 = first.finish(), second.finish()
    finally:
        hold.release()
        first.kill()
        if second is not None:
            second.kill()

    expect_ok(problems, "the first build", run1)
    expect_ok(problems, "the second build", run2)
    waiting = [ln for ln in run2.lines if "waiting" in ln.lower()]
    if len(waiting) != 1 or str(first.pid) not in waiting[0]:
        problems.append(
            f"the second build must wait, printing one 'waiting' line naming the first's "
            f"pid {first.pid}; got {waiting!r}"
        )

    write_files(root, {K: source("11", "item1-wait")})  # revert the edit
    final = doit_run(root, ["build"], env)
    if expect_ok(problems, "the final build", final):
        clean = clean_build(root, tmp_path / "clean", env)
        expect_equal(problems, "the final build after the revert", root, clean)
    check(problems)


@pytest.mark.slow
def test_six_concurrent_builds_in_one_project_all_succeed(tmp_path: Path) -> None:
    """Six `doit build` at once in one project, twice (a first build, then after an edit):
    all succeed, with no vanished temporary file, and the artefacts equal a clean build."""
    env = base_env(tmp_path / "cache")
    root = project(tmp_path / "proj", "33", "item1-six")
    problems: list[str] = []
    for value in ("33", "44"):
        write_files(root, {K: source(value, "item1-six")})
        for i, run in enumerate(doit_runs([(root, ["build"], env)] * 6)):
            text = run.out + run.err
            if run.returncode != 0 or "No such file or directory" in text or "Traceback" in text:
                problems.append(f"concurrent build {i} (X = {value}) failed:\n{run.text}")
    clean = clean_build(root, tmp_path / "clean", env)
    expect_equal(problems, "after 6 concurrent builds", root, clean)
    check(problems)


# ------------------------------------------------------------------------------ item 2


def _version(env: Mapping[str, str]) -> str:
    done = subprocess.run(
        ["nvcc", "--version"], env=dict(env), capture_output=True, text=True, check=True
    )
    return done.stdout


def _after_swap(
    tmp_path: Path, env_after: Mapping[str, str], tag: str, was: Mapping[str, bytes], version: str
) -> None:
    """The build after a toolkit swap (the caller made it): never up to date, and the
    artefacts equal a clean build under the new toolkit (which really differ from ``was``)."""
    root = tmp_path / "proj"
    assert _version(env_after) == version, "harness: the swap must keep `nvcc --version`"
    problems: list[str] = []
    again = doit_run(root, ["build"], env_after)
    if expect_ok(problems, f"the build after the swap ({tag})", again):
        expect_rebuilt(problems, f"the build after the swap ({tag})", again)
        clean = clean_build(root, tmp_path / "clean", env_after)
        assert artefacts(clean) != was, f"{tag}: the swap changes nothing (harness error)"
        expect_equal(problems, f"the build after the swap ({tag})", root, clean)
    check(problems)


def _settle() -> None:
    """Wait until the wrappers just written are older than the racy window, so the first
    build keeps a probe record: the swap must be seen through it (only the dry runs run)."""
    time.sleep(RACY_NS / 1e9 + 0.2)


def _expect_record(root: Path) -> None:
    found = list((root / "build" / STATE_DIR / RECORDS_DIR).glob("*.json"))
    assert found, "harness: the first build kept no probe record"


def _wrapper(real: str, *extra: str) -> str:
    return "#!/bin/sh\nexec " + real + "".join(f" {a}" for a in extra) + ' "$@"\n'


def test_wrapper_nvcc_that_starts_adding_a_define_is_a_new_toolkit(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    write_script(bin_dir / "nvcc", _wrapper(REAL_NVCC))
    project(tmp_path / "proj", "X", "item2-content")
    env = with_path(base_env(tmp_path / "cache"), bin_dir)
    _settle()
    first = doit_run(tmp_path / "proj", ["build"], env)
    assert first.returncode == 0, first.text
    _expect_record(tmp_path / "proj")
    version = _version(env)
    write_script(bin_dir / "nvcc", _wrapper(REAL_NVCC, "-DX=2"))
    _after_swap(tmp_path, env, "wrapper content", artefacts(tmp_path / "proj"), version)


def test_wrapper_nvcc_choosing_its_toolkit_by_environment_is_seen(tmp_path: Path) -> None:
    kits = tmp_path / "toolkits"
    write_script(kits / "a" / "nvcc", _wrapper(REAL_NVCC))
    write_script(kits / "b" / "nvcc", _wrapper(REAL_NVCC, "-DX=2"))
    bin_dir = tmp_path / "bin"
    write_script(
        bin_dir / "nvcc", '#!/bin/sh\nexec "$TRUST_TOOLKITS/${TRUST_TOOLKIT:-a}/nvcc" "$@"\n'
    )
    project(tmp_path / "proj", "X", "item2-env")
    env = with_path(base_env(tmp_path / "cache", TRUST_TOOLKITS=str(kits)), bin_dir)
    env_a = {**env, "TRUST_TOOLKIT": "a"}
    env_b = {**env, "TRUST_TOOLKIT": "b"}
    _settle()
    first = doit_run(tmp_path / "proj", ["build"], env_a)
    assert first.returncode == 0, first.text
    _expect_record(tmp_path / "proj")
    _after_swap(tmp_path, env_b, "toolkit by env", artefacts(tmp_path / "proj"), _version(env_a))


# ------------------------------------------------------------------------------ item 5


def _file_lines(root: Path) -> list[str]:
    ptx = (root / "build" / TARGET / "k.ptx").read_text()
    return [ln.strip() for ln in ptx.splitlines() if ln.strip().startswith(".file")]


@pytest.mark.parametrize("via", ["extra_nvcc_flags", "NVCC_APPEND_FLAGS"])
def test_lineinfo_ptx_of_a_second_checkout_names_its_own_paths(tmp_path: Path, via: str) -> None:
    env = base_env(tmp_path / "cache")
    if via == "NVCC_APPEND_FLAGS":  # the flag reaches nvcc through the environment only
        env["NVCC_APPEND_FLAGS"] = "-lineinfo"
        a = project(tmp_path / "checkout-a", "X", "item5-env").resolve()
    else:
        a = project(tmp_path / "checkout-a", "X", "item5", "-lineinfo").resolve()
    first = doit_run(a, ["build"], env)
    assert first.returncode == 0, first.text
    lines_a = _file_lines(a)
    assert any(str(a) + "/" in ln for ln in lines_a), f"-lineinfo names no path: {lines_a}"

    b = copy_project(a, tmp_path / "checkout-b").resolve()
    second = doit_run(b, ["build"], env)
    assert second.returncode == 0, second.text
    lines_b = _file_lines(b)
    problems = []
    leaked = [ln for ln in lines_b if str(a) + "/" in ln]
    if leaked:
        problems.append(f"checkout B's PTX names checkout A's paths: {leaked}")
    if not any(str(b) + "/" in ln for ln in lines_b):
        problems.append(f"checkout B's PTX names none of B's paths: {lines_b}")
    check(problems)


# ------------------------------------------------------------------------------ item 6


@pytest.mark.slow
@pytest.mark.parametrize("when", ["first-build", "after-forget", "signature-rebuild"])
def test_edit_made_during_a_build_is_seen_by_the_next(tmp_path: Path, when: str) -> None:
    hold = Hold(tmp_path)
    env = hold.env(base_env(tmp_path / "cache"))
    if when == "after-forget":
        # After `doit forget` the cache would serve the module without compiling: keep it off
        # (in every run, so nothing else differs between them).
        env["METRALE_ORCH_CACHE_MODE"] = "off"
    root = project(tmp_path / "proj", "5", f"item6-{when}")
    if when != "first-build":
        first = doit_run(root, ["build"], env)
        assert first.returncode == 0, first.text
    if when == "after-forget":
        forget = doit_run(root, ["forget"], env)
        assert forget.returncode == 0, forget.text
    if when == "signature-rebuild":
        write_files(root, {HW: hardware("-DSIG=1")})  # a flag: the signature changes

    hold.arm()
    run = doit_start(root, ["build"], env, tmp_path / "logs", "held")
    try:
        assert hold.wait_started(run), f"the build never compiled:\n{run.output()}"
        write_files(root, {K: source("6", f"item6-{when}")})  # the edit, mid-compile
        hold.release()
        held = run.finish()
    finally:
        hold.release()
        run.kill()
    assert held.returncode == 0, held.text

    problems: list[str] = []
    nxt = doit_run(root, ["build"], env)
    if expect_ok(problems, "the next build", nxt):
        expect_rebuilt(problems, "the build after an edit made during a build", nxt)
        clean = clean_build(root, tmp_path / "clean", env)
        expect_equal(problems, "the next build", root, clean)
    check(problems)


@pytest.mark.parametrize("damage", ["deleted", "overwritten"])
def test_damaged_artefact_is_stale_and_restored(tmp_path: Path, damage: str) -> None:
    env = base_env(tmp_path / "cache")
    root = project(tmp_path / "proj", "5", f"item6-{damage}")
    first = doit_run(root, ["build"], env)
    assert first.returncode == 0, first.text
    ptx = root / "build" / TARGET / "k.ptx"
    good = ptx.read_bytes()
    if damage == "deleted":
        ptx.unlink()
    else:
        bad = good.replace(b"%r1, 5;", b"%r1, 7;")  # same size, other bytes
        assert bad != good and len(bad) == len(good), "harness: the PTX has no `%r1, 5;`"
        ptx.write_bytes(bad)

    problems: list[str] = []
    status = orch_run(root, ["status"], env)
    line = [ln for ln in status.lines if TARGET in ln]
    if not line or "stale" not in line[0]:
        problems.append(f"`status` does not call the target stale:\n{status.text}")
    why = orch_run(root, ["why", TARGET], env)
    if "stale" not in why.out + why.err or "k.ptx" not in why.out + why.err:
        problems.append(f"`why {TARGET}` does not name the damaged output k.ptx:\n{why.text}")
    rebuild = doit_run(root, ["build"], env)
    if expect_ok(problems, "the build after the damage", rebuild):
        if not ptx.is_file() or ptx.read_bytes() != good:
            problems.append(f"`doit build` did not restore k.ptx ({damage}):\n{rebuild.text}")
        after = orch_run(root, ["status"], env)
        line = [ln for ln in after.lines if TARGET in ln]
        if not line or "up to date" not in line[0]:
            problems.append(f"`status` after the restore:\n{after.text}")
    check(problems)
