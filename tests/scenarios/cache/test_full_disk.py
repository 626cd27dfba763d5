"""A full disk, for real: a small tmpfs filled to the last byte under doit's database,
the build directory, the local cache, or all three (issue 18).

Each case builds a one-target project with real ``doit`` and the real ``nvcc``
(:mod:`tests.support.trust`), fills the file system, and runs ``doit build``:
exit status 1 where the run could not keep its results (0 when only the cache
could not store: the artefacts are right and the cache is best effort), one line
per place that could not be written naming the path and "no space left on
device", no traceback, a failed target counted as failed with its reason. Then
space is freed, the project is built again and its artefacts are compared byte
for byte with a cache-off build elsewhere: nothing half-written is trusted.

Mounting needs root; elsewhere every case is skipped with that reason.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.trust import (
    HAS_NVCC,
    TARGET,
    Run,
    base_env,
    copy_project,
    diff_outputs,
    doit_run,
    outputs,
    summary_counts,
    write_files,
)

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_NVCC, reason="nvcc and gcc are needed on PATH"),
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0,
        reason="mounting a small tmpfs to fill needs root",
    ),
]

K = "kernels/hw/common/k.cu"
NO_SPACE = "no space left on device"


def _source(value: int) -> str:
    return f'// full disk test\nextern "C" __global__ void k(int* o) {{ o[0] = {value}; }}\n'


def _project(root: Path) -> Path:
    return write_files(
        root,
        {
            "kernels/hw/HARDWARE.toml": '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\n',
            "kernels/hw/m/MODEL.toml": "[model]\n",
            "kernels/hw/m/q/.gitkeep": "",
            K: _source(1),
        },
    )


class Tmpfs:
    """A mounted tmpfs that :meth:`fill` fills to the last byte and :meth:`free` empties."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self._filler = mount / "filler"

    def fill(self) -> None:
        chunk = b"\0" * 65536
        with open(self._filler, "ab", buffering=0) as fh:
            for size in (65536, 4096, 512, 1):
                try:
                    while True:
                        fh.write(chunk[:size])
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
        assert shutil.disk_usage(self.mount).free == 0

    def free(self) -> None:
        self._filler.unlink()


@contextmanager
def full_disk(mount: Path, size: str = "8m") -> Iterator[Tmpfs]:
    mount.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield Tmpfs(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def _places(run: Run) -> list[str]:
    """The lines that say a place could not be written (case as written by each)."""
    return [ln for ln in run.lines if NO_SPACE in ln.lower()]


def _no_crash(run: Run) -> list[str]:
    text = run.out + run.err
    bad = [w for w in ("Traceback", "corrupted", "bad format") if w in text]
    return [f"doit's own error text {bad} in:\n{run.text}"] if bad else []


def _rebuilt_equals_clean(
    root: Path, build: Path, env: Mapping[str, str], tmp_path: Path
) -> list[str]:
    """Free space was made: build again, and compare with a cache-off build elsewhere."""
    problems = []
    again = doit_run(root, ["build"], env)
    if again.returncode != 0 or _places(again):
        problems.append(f"the build after freeing space failed:\n{again.text}")
    clean_env = dict(env)
    clean_env["METRALE_ORCH_CACHE_MODE"] = "off"
    clean_env["METRALE_ORCH_BUILD_DIR"] = str(tmp_path / "clean-build")
    clean_env["METRALE_ORCH_LOCAL_CACHE"] = str(tmp_path / "clean-cache")
    clean = copy_project(root, tmp_path / "clean")
    ref = doit_run(clean, ["build"], clean_env)
    assert ref.returncode == 0, f"the clean reference build failed:\n{ref.text}"
    diff = diff_outputs(
        outputs(root, TARGET, str(build)), outputs(clean, TARGET, str(tmp_path / "clean-build"))
    )
    if diff:
        problems.append(f"after freeing space the artefacts differ from a clean build:\n{diff}")
    return problems


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "existing"])
def test_a_full_disk_under_the_database(tmp_path: Path, existing: bool) -> None:
    """The project (so .doit.db) on the full disk, build dir and cache elsewhere. Fresh:
    the database cannot be created: one line, nothing runs. Existing: the target
    builds, the final save fails whole: one line after the summary; the target is stale
    next time, never trusted on the old record."""
    with full_disk(tmp_path / "mnt") as disk:
        root = _project(disk.mount / "proj")
        build = tmp_path / "build"
        env = base_env(tmp_path / "cache", METRALE_ORCH_BUILD_DIR=str(build))
        if existing:
            assert doit_run(root, ["build"], env).returncode == 0
            write_files(root, {K: _source(2)})
        disk.fill()
        run = doit_run(root, ["build"], env)
        problems = _no_crash(run)
        places = _places(run)
        db = root / ".doit.db"
        if run.returncode != 1 or len(places) != 1 or str(db) not in places[0]:
            problems.append(f"want exit 1 and one line naming {db}:\n{run.text}")
        if not existing and (summary_counts(run) or "nothing was run" not in run.text):
            problems.append(f"a database that cannot be created must stop the run:\n{run.text}")
        if existing and summary_counts(run).get("built") != 1:
            problems.append(f"the target should have built before the save:\n{run.text}")
        disk.free()
        if existing:
            status = subprocess.run(
                [sys.executable, "-m", "metrale_orch", "status", "--exit-code"],
                cwd=root,
                env=dict(env),
                capture_output=True,
                text=True,
                check=False,
            )
            if status.returncode != 1:
                problems.append(f"an unsaved build must be stale:\n{status.stdout}")
        problems += _rebuilt_equals_clean(root, build, env, tmp_path)
    assert not problems, "\n\n".join(problems)


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "existing"])
def test_a_full_disk_under_the_build_dir(tmp_path: Path, existing: bool) -> None:
    """build_dir on the full disk: the target fails, counted, with the path and the
    reason; the report files each say so in a line; exit 1; rebuilt right after."""
    with full_disk(tmp_path / "mnt") as disk:
        root = _project(tmp_path / "proj")
        build = disk.mount / "build"
        env = base_env(tmp_path / "cache", METRALE_ORCH_BUILD_DIR=str(build))
        if existing:
            assert doit_run(root, ["build"], env).returncode == 0
            write_files(root, {K: _source(2)})
        disk.fill()
        run = doit_run(root, ["build"], env)
        problems = _no_crash(run)
        failed = [ln for ln in run.lines if ln.startswith(f"FAILED build:{TARGET}")]
        if run.returncode != 1 or summary_counts(run).get("failed") != 1:
            problems.append(f"want exit 1 and the target counted as failed:\n{run.text}")
        if len(failed) != 1 or NO_SPACE not in failed[0].lower() or str(build) not in failed[0]:
            problems.append(f"want one FAILED line naming {build} and why:\n{run.text}")
        for name in ("cache-stats.json", "profile.json"):
            lines = [ln for ln in _places(run) if str(build / name) in ln]
            if len(lines) != 1:
                problems.append(f"want one line for {build / name}:\n{run.text}")
        disk.free()
        problems += _rebuilt_equals_clean(root, build, env, tmp_path)
    assert not problems, "\n\n".join(problems)


def test_a_full_disk_under_the_local_cache(tmp_path: Path) -> None:
    """local_cache on the full disk: the target builds right (exit 0: the cache is best
    effort), one warning names the cache and why; rebuilt right after freeing space."""
    with full_disk(tmp_path / "mnt") as disk:
        root = _project(tmp_path / "proj")
        build = tmp_path / "build"
        cache = disk.mount / "cache"
        env = base_env(cache, METRALE_ORCH_BUILD_DIR=str(build))
        disk.fill()
        run = doit_run(root, ["build"], env)
        problems = _no_crash(run)
        places = _places(run)
        if run.returncode != 0 or summary_counts(run).get("built") != 1:
            problems.append(f"a cache that cannot store must not fail the build:\n{run.text}")
        if len(places) != 1 or str(cache) not in places[0]:
            problems.append(f"want one line naming the cache {cache}:\n{run.text}")
        disk.free()
        write_files(root, {K: _source(3)})  # then back: the cache must hold no torn entry
        assert doit_run(root, ["build"], env).returncode == 0
        write_files(root, {K: _source(1)})
        problems += _rebuilt_equals_clean(root, build, env, tmp_path)
    assert not problems, "\n\n".join(problems)


def test_one_full_disk_under_everything(tmp_path: Path) -> None:
    """Database, build dir and cache on one full disk (the usual case): every place that
    could not be written is a line, the target is failed with its reason, exit 1."""
    with full_disk(tmp_path / "mnt") as disk:
        root = _project(disk.mount / "proj")
        env = base_env(disk.mount / "cache")
        assert doit_run(root, ["build"], env).returncode == 0
        write_files(root, {K: _source(2)})
        disk.fill()
        run = doit_run(root, ["build"], env)
        problems = _no_crash(run)
        if run.returncode != 1 or summary_counts(run).get("failed") != 1:
            problems.append(f"want exit 1 and the target counted as failed:\n{run.text}")
        for where in (root / "build" / "stage", root / ".doit.db"):
            if not any(str(where) in ln for ln in _places(run)):
                problems.append(f"no line names {where}:\n{run.text}")
        disk.free()
        problems += _rebuilt_equals_clean(root, root / "build", env, tmp_path)
    assert not problems, "\n\n".join(problems)
