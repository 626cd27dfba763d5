"""How runs end: interrupts, exit statuses, broken names and files, as a user meets them.

Each scenario runs ``python -m doit`` (or ``metrale-orch``) in a small project
whose compiler is the recording fake of ``tests.support.project`` (slowed down
with ``FAKECC_DELAY`` where a run must be caught in the middle):

- Ctrl-C / SIGTERM during ``doit build``: one line, ``interrupted; N targets
  finished and kept``, exit 130 / 143, and the finished targets stay up to date;
- exit statuses: 0 ok, 1 a target failed to build, 2 a tree or configuration error;
- a file name that is not UTF-8 and a manifest that is a directory: one line
  naming the file from ``doit build``, ``doit list`` and ``metrale-orch check``;
- ``build_dir`` inside (or equal to) ``kernels/`` is refused before anything is
  written or deleted.

The tests of this topic that run in-process are in ``tests/unit/tasks/test_endings.py``.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metrale_orch.cli import main
from tests.support.project import (
    FILES,
    DoitRun,
    doit,
    make_project,
    started_targets,
)
from tests.support.tasks import BAD_NAME

NVIDIA = ("gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w4", "hopper/qwen/w8")


def check(root: Path, env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), "check"], environ=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def one_line_error(run: DoitRun, needle: str) -> None:
    """``needle`` appears in the output, on one line, and nothing crashed."""
    assert "Traceback" not in run.text, run.text
    assert any(needle in line for line in run.text.splitlines()), run.text


# ------------------------------------------------------------------------------ interrupts


def _interrupted_build(
    root: Path, env: dict[str, str], sig: signal.Signals, *args: str
) -> tuple[int, str, str]:
    """Start ``doit build`` with a slow compiler; send ``sig`` while the second target
    compiles (shortly after the first one's manifest appears). Returns status and output."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "doit", *args, "build"],
        cwd=root,
        env={**env, "FAKECC_DELAY": "0.6"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _any_manifest(root / "build"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        time.sleep(0.2)  # the first target's task ends; the next one is compiling
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def _any_manifest(build: Path) -> bool:
    """Whether a target's manifest exists yet (compiles' temporary directories come and
    go under ``build/`` while it is looked at)."""
    try:
        return any(build.glob("*/*/*/manifest.json"))
    except FileNotFoundError:
        return False


def _kept(out: str) -> int:
    """N of the final ``interrupted; N targets finished and kept`` line (asserted)."""
    last = out.splitlines()[-1]
    words = last.split(" ")
    assert last.startswith("interrupted; ") and last.endswith(" finished and kept"), out
    assert words[2] == ("target" if words[1] == "1" else "targets"), last
    return int(words[1])


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_build_ends_with_one_line_and_keeps_what_finished(
    fake_project: tuple[Path, dict[str, str]], sig: signal.Signals, status: int
) -> None:
    root, env = fake_project
    code, out, err = _interrupted_build(root, env, sig)
    assert code == status, out + err
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    assert err == "", err
    kept = _kept(out)
    assert 1 <= kept < len(NVIDIA), out
    # Only progress lines come before it: no summary, no doit report.
    assert all(line.startswith(("[", "done build:")) for line in out.splitlines()[:-1]), out
    # What it kept is up to date in doit's database: the next run builds only the rest.
    rest = doit(root, ["build"], env)
    assert rest.returncode == 0, rest.text
    assert len(started_targets(rest)) == len(NVIDIA) - kept, rest.text


def test_sigterm_under_process_workers_is_one_line_too(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    code, out, err = _interrupted_build(root, env, signal.SIGTERM, "-n", "2", "-P", "process")
    assert code == 143, out + err
    assert "Traceback" not in out + err
    kept = _kept(out)
    rest = doit(root, ["build"], env)
    assert rest.returncode == 0 and len(started_targets(rest)) == len(NVIDIA) - kept, rest.text


def test_sigterm_to_a_cli_command_is_one_line(tmp_path: Path) -> None:
    """A real ``metrale-orch`` process stopped by SIGTERM while it works."""
    script = (
        "import sys, time\n"
        "from collections.abc import Mapping\n"
        "from metrale_orch import cli\n"
        "class Slow(Mapping):\n"
        "    # The command's first read of its environment blocks: it is caught working.\n"
        "    def wait(self):\n"
        "        print('working', flush=True)\n"
        "        time.sleep(60)\n"
        "    def __getitem__(self, key):\n"
        "        self.wait()\n"
        "        raise KeyError(key)\n"
        "    def __iter__(self):\n"
        "        self.wait()\n"
        "        return iter(())\n"
        "    def __len__(self):\n"
        "        self.wait()\n"
        "        return 0\n"
        "sys.exit(cli.main(['--root', sys.argv[1], 'check'], environ=Slow()))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "working\n"
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (143, "interrupted\n")


# ------------------------------------------------------------------------------ exit statuses


def test_a_compile_failure_exits_1_a_tree_error_2(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    mul = root / "kernels/hopper/qwen/w8/mul.cu"
    mul.write_text("#error broken\n")
    # `doit build` runs the group `build`, which doit alone would count as an error (2).
    failed = doit(root, ["build"], env)
    assert failed.returncode == 1, failed.text
    assert "FAILED build:hopper/qwen/w8" in failed.out and "UnmetDependency" not in failed.text
    assert doit(root, ["-n", "2", "-P", "thread", "build"], env).returncode == 1
    mul.write_text('extern "C" __global__ void mul_k(float* out) {}\n')
    assert doit(root, ["build"], env).returncode == 0
    # A tree error (an undeclared shadow) is the user's to fix in the tree: 2.
    (root / "kernels/hopper/qwen/w8/add.cu").write_text('extern "C" __global__ void a() {}\n')
    broken = doit(root, ["build"], env)
    assert broken.returncode == 2, broken.text


# ------------------------------------------------------------------------------ broken names


def test_a_file_name_that_is_not_utf8_is_one_line_everywhere(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    (root / "kernels/hopper/common" / BAD_NAME).write_text("// bad name\n")
    shown = "kernels/hopper/common/k\\xff.cu: the name is not valid UTF-8"
    build = doit(root, ["build"], env)
    assert build.returncode == 2, build.text
    one_line_error(build, shown)
    assert sorted(
        ln.split(":", 2)[1] for ln in build.out.splitlines() if ln.startswith("FAILED")
    ) == list(NVIDIA)  # every target reads hopper/common
    listing = doit(root, ["list", "--all", "--status"], env)
    assert listing.returncode == 0 and "Traceback" not in listing.text, listing.text
    code, out, err = check(root, env)
    assert code == 2 and out == "", err
    assert f"problem: {shown}" in err and "[target gb10/qwen/w4" in err


def test_an_unnamable_file_in_a_role_subdirectory_fails_its_targets(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    vendored = root / "kernels/hopper/qwen/w4/vendor"
    vendored.mkdir()
    (vendored / BAD_NAME.replace(".cu", ".cuh")).write_text("// bad name\n")
    build = doit(root, ["build"], env)
    assert build.returncode == 2, build.text
    one_line_error(build, "kernels/hopper/qwen/w4/vendor/k\\xff.cuh: the name is not valid UTF-8")
    failed = sorted(ln.split(":", 2)[1] for ln in build.out.splitlines() if ln.startswith("FAILED"))
    assert failed == ["gb10/qwen/w4", "hopper/qwen/w4"]


def test_an_unnamable_quant_directory_fails_the_tree_in_one_line(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    (root / "kernels/hopper/qwen" / os.fsdecode(b"w\xff")).mkdir()
    build = doit(root, ["build"], env)
    assert build.returncode == 2
    one_line_error(build, "kernels/hopper/qwen/w\\xff: the name is not valid UTF-8")
    listing = doit(root, ["list"], env)
    assert listing.returncode == 0 and "Traceback" not in listing.text, listing.text


# ------------------------------------------------------------------------------ broken manifests


@pytest.mark.parametrize(
    ("manifest", "failing"),
    [
        ("kernels/hopper/HARDWARE.toml", None),  # the whole tree: hopper is gone otherwise
        ("kernels/gb10/qwen/MODEL.toml", None),
        ("kernels/hopper/qwen/w8/KERNEL.toml", ["gb10/qwen/w8", "hopper/qwen/w8"]),
    ],
)
def test_a_manifest_that_is_a_directory_is_one_line_everywhere(
    fake_project: tuple[Path, dict[str, str]], manifest: str, failing: list[str] | None
) -> None:
    root, env = fake_project
    path = root / manifest
    if path.exists():
        path.unlink()
    path.mkdir()
    message = f"{manifest}: is a directory, not a TOML file"
    build = doit(root, ["build"], env)
    assert build.returncode == 2, build.text
    one_line_error(build, message)
    failed = sorted(ln.split(":", 2)[1] for ln in build.out.splitlines() if ln.startswith("FAILED"))
    assert failed == (failing or ["(tree)"]), build.text
    listing = doit(root, ["list", "--all"], env)
    assert listing.returncode == 0 and "Traceback" not in listing.text, listing.text
    code, out, err = check(root, env)
    assert code == 2 and out == "" and f"problem: {message}" in err, err
    assert "check: ok" not in err
    # Fixed, the tree builds: nothing of the refusal is remembered.
    path.rmdir()
    make_project(root, {manifest: FILES.get(manifest, "")})
    fixed = doit(root, ["build"], env)
    assert fixed.returncode == 0, fixed.text
    assert check(root, env)[0] == 0


# ------------------------------------------------------------------------------ build_dir


def test_a_build_dir_in_kernels_is_refused_before_anything_is_deleted(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    before = sorted(p.relative_to(root).as_posix() for p in (root / "kernels").rglob("*"))
    for value in ("kernels", "kernels/out", "."):
        bad = {**env, "METRALE_ORCH_BUILD_DIR": value}
        run = doit(root, ["build"], bad)
        assert run.returncode == 2, run.text
        one_line_error(run, "environment METRALE_ORCH_BUILD_DIR: build_dir:")
        code, _, err = check(root, bad)
        assert code == 2 and "METRALE_ORCH_BUILD_DIR: build_dir" in err
    after = sorted(p.relative_to(root).as_posix() for p in (root / "kernels").rglob("*"))
    assert after == before
    assert not (root / "kernels/out").exists()
