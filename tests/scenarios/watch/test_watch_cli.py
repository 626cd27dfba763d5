"""``metrale-orch watch`` as a command: ``--once`` builds and exits with the build's status,
a selection without targets or a bad setting is one line and exit 2, and the edit loop
compiles here even with a remote executor set."""

from __future__ import annotations

from pathlib import Path

from tests.support.project import fake_compiles, orch


def test_once_builds_then_exits_with_the_builds_status(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    run = orch(root, ["watch", "--once", "hopper/*"], env)
    assert run.returncode == 0, run.text
    (line,) = run.out.splitlines()
    assert "build: hopper/qwen/w4 built" in line and "static smoke ok" in line, line
    assert fake_compiles(tmp_path)
    mul = root / "kernels/hopper/qwen/w8/mul.cu"
    mul.write_text(mul.read_text() + "#error broken\n")
    run = orch(root, ["watch", "--once", "hopper/qwen/w8"], env)
    assert run.returncode == 1, run.text
    assert run.out.splitlines()[1:] == ["    hopper/qwen/w8: mul.cu(1): error: forced failure"]


def test_user_mistakes_are_one_line_and_status_2(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    run = orch(root, ["watch", "--once", "nomatch/*"], env)
    assert (run.returncode, run.out) == (2, "")
    assert run.err == "error: no target of the tree matches build:nomatch/*\n"
    run = orch(root, ["--set", "jobs=many", "watch", "--once"], env)
    assert run.returncode == 2 and len(run.err.splitlines()) == 1, run.text
    assert "jobs" in run.err and "Traceback" not in run.text


def test_a_remote_executor_is_left_out_unless_asked_for(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    # Nothing listens there: a build sending compiles to it would fall back or fail.
    remote = {
        **env,
        "METRALE_ORCH_REMOTE_EXECUTOR": "grpc://127.0.0.1:9",
        "METRALE_ORCH_REMOTE_STRICT": "true",
    }
    run = orch(root, ["watch", "--once", "hopper/qwen/w8"], remote)
    assert run.returncode == 0, run.text
    assert fake_compiles(tmp_path) == ["sm_90a add.cu", "sm_90a mul.cu"]


def test_settings_reach_the_build_as_for_every_command(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    run = orch(root, ["--set", "build_dir=out", "watch", "--once", "hopper/qwen/w8"], env)
    assert run.returncode == 0, run.text
    assert (root / "out/hopper/qwen/w8/mul.ptx").is_file()
    assert not (root / "build/hopper").exists()
