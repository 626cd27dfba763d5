"""An adversarial review of what issue 43 landed: each finding with the test that shows it.

Each test runs the real command on a small project (:mod:`tests.support.project`, the fake
compiler) and fails without its fix.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

from metrale_orch.cli import main
from tests.support.nvcc_tree import run_cli
from tests.support.project import doit, make_project, project_env, use_fake_compiler


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The test project with the fake compiler, and the environment of its runs."""
    root = make_project(tmp_path / "proj")
    use_fake_compiler(root, tmp_path / "bin")
    return root, project_env(tmp_path, fake_bin=tmp_path / "bin")


def _cli(root: Path, env: Mapping[str, str], *argv: str) -> tuple[int, str, str]:
    return run_cli(root, list(argv), env)


def test_why_miss_writes_nothing_in_the_build_dir_set_aside(tmp_path: Path) -> None:
    """``--set build_dir=X why-miss``: the target lookup goes through the task cache of X,
    not of the default ``build/`` (which the user said not to use, and which it created)."""
    root, env = _project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    code, _out, err = _cli(
        root, env, "--set", f"build_dir={elsewhere}", "why-miss", "hopper/qwen/w4"
    )
    assert code == 0, err
    assert not (root / "build").exists()
    assert (elsewhere / ".state").is_dir()


def test_profile_top_0_does_not_say_the_build_compiled_nothing(tmp_path: Path) -> None:
    """``profile --top 0`` lists no compile; it must not say the build had none (it had 5)."""
    root, env = _project(tmp_path)
    assert doit(root, ["build"], env).returncode == 0
    for argv in (["profile", "--top", "0"], ["profile", "--build", "1", "--top", "0"]):
        code, out, err = _cli(root, env, *argv)
        assert code == 0, err
        assert "no compiles" not in out
        assert out.splitlines()[0].endswith("none listed (--top 0)")
        assert "modules: 7 compiled" in out


def test_profile_build_not_kept_names_the_one_build_kept(tmp_path: Path) -> None:
    """``--build N`` not kept, with one build in the history: "1 build, #1", not
    "1 builds, #1 to #1"."""
    root, env = _project(tmp_path)
    assert doit(root, ["build"], env).returncode == 0
    code, out, err = _cli(root, env, "profile", "--build", "2")
    assert (code, out) == (2, "")
    assert err == "error: --build 2: not kept; the history holds 1 build, #1 (see --list)\n"


def test_cache_gc_refuses_a_size_of_400_digits_in_one_line(tmp_path: Path) -> None:
    """``cache gc --max-size`` of 400 digits: one line, exit 2, as the settings refuse it
    (B4); it was "internal error: OverflowError" from the report's MiB."""
    root, env = _project(tmp_path)
    code, out, err = _cli(root, env, "cache", "gc", "--max-size", "9" * 400)
    assert (code, out) == (2, "")
    assert err.startswith("error: size '999")
    assert err.endswith("e.g. 500M or 2G, of at most 1024T\n")
    assert err.count("\n") == 1
    code, _out, err = _cli(root, env, "cache", "gc", "--max-size", "1024T")
    assert code == 0, err


def test_a_build_dir_that_is_a_file_is_one_line_for_every_command(tmp_path: Path) -> None:
    """``build_dir`` naming a file (or a path under one): one line naming it, exit 2, as any
    bad setting; it was "internal error: FileExistsError" (``why-miss``) and a doit
    traceback per target after "cannot take the build lock" (``doit build``)."""
    root, env = _project(tmp_path)
    plain = tmp_path / "plain"
    plain.write_text("not a directory\n")
    for where, said in (
        (plain, "is a file"),
        (plain / "sub", f"lies under {str(plain)!r}, a file"),
    ):
        line = (
            f"build_dir: {str(where)!r} {said}, not a directory: choose a directory (e.g. build/)"
        )
        for argv in (["status"], ["why-miss", "hopper/qwen/w4"], ["compdb"]):
            code, out, err = _cli(root, env, "--set", f"build_dir={where}", *argv)
            assert (code, out, err) == (2, "", f"error: command line: {line}\n"), argv
    run = doit(root, ["build"], {**env, "METRALE_ORCH_BUILD_DIR": str(plain)})
    assert run.returncode == 2
    assert "Traceback" not in run.text
    assert (
        f"FAILED build:(tree): environment METRALE_ORCH_BUILD_DIR: build_dir: {str(plain)!r}"
        in run.text
    )
    assert plain.read_text() == "not a directory\n"


def test_a_doit_argument_that_is_no_utf8_does_not_crash_the_build_lock(tmp_path: Path) -> None:
    """``doit build X=<byte 0xff>`` (a doit variable from a file name's bytes): the lock's
    note names the command with the byte as ``\\xff``; it was a UnicodeEncodeError traceback
    before anything ran (exit 3)."""
    root, env = _project(tmp_path)
    run = doit(root, ["build", "X=\udcff"], env)
    assert run.returncode == 0, run.text
    assert "Traceback" not in run.text
    assert "build: 4 built, 0 from cache, 0 up to date, 1 skipped, 0 failed" in run.text


def test_a_root_that_is_no_directory_is_one_line_for_every_command(tmp_path: Path) -> None:
    """``--root`` (or ``METRALE_ORCH_ROOT``) naming no directory: one line, exit 2, whatever
    the command, as ``doit`` alone said it; ``status`` said "internal error:
    FileNotFoundError" and ``layout`` "0 targets, 0 failing" (exit 0) for a typo."""
    missing = tmp_path / "no-such-project"
    for argv in (["status"], ["layout"], ["check"], ["doit", "list"]):
        code, out, err = run_cli(missing, argv, {})
        assert (code, out, err) == (2, "", f"error: --root {missing}: not a directory\n"), argv
    out_, err_ = io.StringIO(), io.StringIO()
    code = main(["layout"], environ={"METRALE_ORCH_ROOT": str(missing)}, out=out_, err=err_)
    assert (code, err_.getvalue()) == (2, f"error: METRALE_ORCH_ROOT {missing}: not a directory\n")
