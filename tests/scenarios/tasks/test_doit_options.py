"""Options before ``doit`` are obeyed (issue 35): ``metrale-orch [--root DIR] [--set
KEY=VALUE]... doit ARGS`` runs doit in DIR with every setting applied, as ``--set`` does
for every other command, or refuses the option with one line; never accepts and drops it.

Real doit runs (``python -m metrale_orch``) on the small project with the recording fake
compiler, started from a directory that is not the project.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.project import fake_compiles, make_project, project_env, use_fake_compiler
from tests.support.trust import orch_run

TARGET = "hopper/qwen/w8"


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = make_project(tmp_path / "proj")
    use_fake_compiler(root, tmp_path / "bin")
    return root, project_env(tmp_path, fake_bin=tmp_path / "bin")


def _cached_objects(env: dict[str, str]) -> list[Path]:
    local = Path(env["METRALE_ORCH_LOCAL_CACHE"])
    return [p for p in local.rglob("*") if p.is_file() and "objects" in p.parts]


def test_root_before_doit_runs_doit_in_that_root(tmp_path: Path) -> None:
    root, env = _project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = orch_run(elsewhere, ["--root", str(root), "doit", "list"], env)
    assert run.returncode == 0, run.text
    assert f"build:{TARGET}" in run.out


def test_require_hits_before_doit_refuses_to_compile(tmp_path: Path) -> None:
    root, env = _project(tmp_path)
    run = orch_run(root, ["--set", "require_hits=true", "doit", f"build:{TARGET}"], env)
    assert run.returncode != 0, run.text
    assert fake_compiles(tmp_path) == []
    assert "require_hits" in run.out + run.err


def test_cache_mode_off_before_doit_stores_nothing(tmp_path: Path) -> None:
    root, env = _project(tmp_path)
    run = orch_run(
        tmp_path, ["--root", str(root), "--set", "cache_mode=off", "doit", f"build:{TARGET}"], env
    )
    assert run.returncode == 0, run.text
    assert fake_compiles(tmp_path) == ["sm_90a add.cu", "sm_90a mul.cu"]
    assert _cached_objects(env) == []
    # the same build without the option does store: the test can see a write
    again = orch_run(root, ["doit", "forget"], env)
    assert again.returncode == 0, again.text
    run = orch_run(root, ["doit", f"build:{TARGET}"], env)
    assert run.returncode == 0, run.text
    assert _cached_objects(env) != []


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("jobs=0", "jobs: must be a positive integer"),
        ("no_such_key=1", "no_such_key: unknown setting"),
        ("log_backups=2", "log_backups: cannot be set for a doit run"),
        ("cache_mode", "expected KEY=VALUE"),
    ],
)
def test_a_setting_a_doit_run_cannot_take_is_refused_in_one_line(
    tmp_path: Path, setting: str, said: str
) -> None:
    root, env = _project(tmp_path)
    run = orch_run(root, ["--set", setting, "doit", f"build:{TARGET}"], env)
    assert run.returncode == 2, run.text
    assert said in run.err and len(run.err.strip().splitlines()) == 1, run.err
    assert fake_compiles(tmp_path) == []
