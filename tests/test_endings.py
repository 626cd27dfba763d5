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
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from metrale_orch import dodo
from metrale_orch.cli import main
from metrale_orch.errors import Interrupted, interrupt_exit_code, printable
from metrale_orch.tasks.outcomes import BuildFailed
from metrale_orch.tasks.report_lines import format_interrupted, format_summary
from metrale_orch.tasks.run_end import exit_status
from tests.support.project import (
    FILES,
    DoitRun,
    doit,
    make_project,
    started_targets,
)

NVIDIA = ("gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w4", "hopper/qwen/w8")
#: A file name that is not UTF-8 (what a Latin-1 tool or a corrupted unpack leaves).
BAD_NAME = os.fsdecode(b"k\xff.cu")


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


def test_interrupt_while_tasks_load_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:

    def stopped(*args: object) -> None:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(dodo, "cached_tasks", stopped)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    sigint = signal.getsignal(signal.SIGINT)  # the ending ignores a second Ctrl-C
    try:
        with pytest.raises(SystemExit) as info:
            list(dodo.task_build())
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert info.value.code == 143
    assert err.getvalue() == "interrupted; 0 targets finished and kept\n"


class _InterruptingEnviron(Mapping[str, str]):
    """An environment whose every read raises ``raised``: the command it is given is
    interrupted while it works (``check`` reads its environment first thing)."""

    def __init__(self, raised: BaseException) -> None:
        self.raised = raised

    def __getitem__(self, key: str) -> str:
        raise self.raised

    def __iter__(self) -> Iterator[str]:
        raise self.raised

    def __len__(self) -> int:
        raise self.raised


@pytest.mark.parametrize(
    ("raised", "status"),
    [(KeyboardInterrupt(), 130), (Interrupted(signal.SIGTERM), 143)],
)
def test_cli_commands_end_interrupted_with_one_line(
    tmp_path: Path, raised: BaseException, status: int
) -> None:
    (tmp_path / "kernels").mkdir()
    out, err = io.StringIO(), io.StringIO()
    environ = _InterruptingEnviron(raised)
    code = main(["--root", str(tmp_path), "check"], environ=environ, out=out, err=err)
    assert (code, out.getvalue(), err.getvalue()) == (status, "", "interrupted\n")


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


def test_interrupted_names_its_signal() -> None:
    assert interrupt_exit_code(KeyboardInterrupt()) == 130
    assert interrupt_exit_code(Interrupted(signal.SIGTERM)) == 143
    # doit's process pool re-raises a worker's interrupt from its text.
    assert Interrupted(str(Interrupted(signal.SIGTERM))).signum == signal.SIGTERM
    assert format_interrupted(1) == "interrupted; 1 target finished and kept"


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


def test_exit_status_rules() -> None:
    from doit.exceptions import TaskError, TaskFailed, UnmetDependency

    assert exit_status([]) is None
    assert exit_status([("build", TaskFailed("x")), ("other", UnmetDependency("b"))]) == 1
    assert exit_status([("error", TaskFailed("tree")), ("build", TaskFailed("x"))]) == 2
    assert exit_status([("build", TaskError("doit"))]) == 2
    assert exit_status([("build", BuildFailed("x", {"exit_code": 2}))]) == 2


def test_the_summary_counts_ignored_targets_only_when_there_are_some() -> None:
    common = "build: 1 built, 0 from cache, 0 up to date, 0 skipped, 0 failed"
    assert format_summary({"built": 1}, 0.04) == f"{common} in 0.0 s"
    assert format_summary({"built": 1, "ignored": 2}, 0.04) == f"{common}, 2 ignored in 0.0 s"


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


def test_printable_shows_the_bytes() -> None:
    assert printable(f"kernels/{BAD_NAME}") == "kernels/k\\xff.cu"
    assert printable("kernels/é.cu") == "kernels/é.cu"


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


def test_defaults_of_a_hardware_whose_manifest_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "kernels/h/HARDWARE.toml").mkdir(parents=True)
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(tmp_path), "defaults", "h"], environ={}, out=out, err=err)
    assert (code, out.getvalue()) == (2, "")
    assert err.getvalue() == (
        "error: kernels/h/HARDWARE.toml: is a directory, not a TOML file: make it a file "
        "(or remove it)\n"
    )


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
