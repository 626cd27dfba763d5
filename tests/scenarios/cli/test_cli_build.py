"""``metrale-orch status / why / rdeps`` against real doit builds (fake compiler)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from metrale_orch.cli import main
from tests.support.project import doit, make_project, project_env, use_fake_compiler


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("cli")
    root = make_project(tmp / "proj")
    use_fake_compiler(root, tmp / "bin")
    env = project_env(tmp, fake_bin=tmp / "bin")
    run = doit(root, ["build"], env)
    assert run.returncode == 0, run.text
    return root, env


def cli(root: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *args], environ=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def status_json(root: Path, env: dict[str, str], *args: str) -> dict[str, dict[str, object]]:
    code, out, err = cli(root, env, "status", *args, "--json")
    assert code == 0, err
    return {t["target"]: t for t in json.loads(out)["targets"]}


def test_status_all_wildcards_and_text(built: tuple[Path, dict[str, str]]) -> None:
    root, env = built
    every = status_json(root, env)
    assert {k: v["status"] for k, v in every.items()} == {
        "apple/llama/f16": "skipped",
        "gb10/qwen/w4": "up to date",
        "gb10/qwen/w8": "up to date",
        "hopper/qwen/w4": "up to date",
        "hopper/qwen/w8": "up to date",
    }
    assert "metal" in str(every["apple/llama/f16"]["detail"])
    assert sorted(status_json(root, env, "hopper/*")) == ["hopper/qwen/w4", "hopper/qwen/w8"]
    assert sorted(status_json(root, env, "build:*/qwen/w8")) == ["gb10/qwen/w8", "hopper/qwen/w8"]
    code, out, _ = cli(root, env, "status", "gb10/*")
    assert code == 0
    assert out.splitlines()[0].split() == ["up", "to", "date", "gb10/qwen/w4"]
    code, _, err = cli(root, env, "status", "nothing/*")
    assert code == 2 and "no target matches 'nothing/*'" in err
    # --exit-code: a skipped target (no compiler here) is not a change.
    assert cli(root, env, "status", "--exit-code")[0] == 0
    assert cli(root, env, "status", "--exit-code", "--json")[0] == 0


def test_why_and_status_name_what_changed(
    built: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = built
    leaf = root / "kernels/hopper/qwen/w8/mul.cu"
    hw = root / "kernels/gb10/HARDWARE.toml"
    old_leaf, old_hw = leaf.read_text(), hw.read_text()
    try:
        leaf.write_text(old_leaf + "// edit\n")
        hw.write_text(old_hw + '\n[build]\nextra_nvcc_flags = ["-DX"]\n')
        (root / "kernels/hopper/qwen/w4/extra.cuh").write_text("#pragma once\n")
        st = status_json(root, env)
        assert st["hopper/qwen/w8"]["status"] == "stale"
        assert st["hopper/qwen/w8"]["changed"] == ["kernels/hopper/qwen/w8/mul.cu"]
        assert st["hopper/qwen/w4"]["added"] == ["kernels/hopper/qwen/w4/extra.cuh"]
        assert "layout" in st["hopper/qwen/w4"]["signature"]  # type: ignore[operator]
        assert "flags" in st["gb10/qwen/w4"]["signature"]  # type: ignore[operator]
        # Like `git diff --exit-code`: 1 when anything is stale, only with the flag.
        code, out, _ = cli(root, env, "status", "--exit-code")
        assert code == 1 and "stale    hopper/qwen/w8  (1 changed input(s))" in out
        assert cli(root, env, "status", "--exit-code", "--json")[0] == 1
        assert cli(root, env, "status")[0] == 0
        assert cli(root, env, "status", "--exit-code", "apple/*")[0] == 0

        code, out, _ = cli(root, env, "why", "gb10/qwen/w8")
        assert code == 0
        assert "gb10/qwen/w8 is stale:" in out
        assert "changed input: kernels/gb10/HARDWARE.toml" in out
        assert "changed input: kernels/hopper/qwen/w8/mul.cu" in out
        assert "flags: define added: X" in out  # the value, not only the part
        code, out, _ = cli(root, env, "why", "build:hopper/qwen/w4")
        assert "new input: kernels/hopper/qwen/w4/extra.cuh" in out
        assert "signature part changed: layout" in out
    finally:
        leaf.write_text(old_leaf)
        hw.write_text(old_hw)
        (root / "kernels/hopper/qwen/w4/extra.cuh").unlink()
    # Same bytes back (new mtimes): up to date again, by content.
    code, out, _ = cli(root, env, "why", "hopper/qwen/w8")
    assert (code, out) == (0, "hopper/qwen/w8 is up to date\n")
    code, out, _ = cli(root, env, "why", "apple/llama/f16")
    assert "is skipped: toolchain 'metal' is not installed" in out
    code, _, err = cli(root, env, "why", "hopper/*")
    assert code == 2 and "not a pattern" in err


def test_why_missing_output_and_never_built(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    use_fake_compiler(root, tmp_path / "bin")
    env = project_env(tmp_path, fake_bin=tmp_path / "bin")
    code, out, _ = cli(root, env, "why", "hopper/qwen/w4")
    assert code == 0 and "never built" in out
    assert doit(root, ["build:hopper/qwen/w4"], env).returncode == 0
    (root / "build/hopper/qwen/w4/manifest.json").unlink()
    code, out, _ = cli(root, env, "why", "hopper/qwen/w4")
    assert "missing output: build/hopper/qwen/w4/manifest.json" in out


def test_an_ignored_target_is_ignored_everywhere(tmp_path: Path) -> None:
    """After `doit ignore`, nothing changed: status, why and the summary line say
    "ignored" (not 3 changed inputs and every signature part), --exit-code treats it as
    doit does (nothing to build), and after `doit forget` it is stale with no record
    and the next build restores it."""
    root = make_project(tmp_path / "p")
    use_fake_compiler(root, tmp_path / "bin")
    env = project_env(tmp_path, fake_bin=tmp_path / "bin")
    assert doit(root, ["build:hopper/*"], env).returncode == 0
    ignored = doit(root, ["ignore", "build:hopper/qwen/w8"], env)
    assert ignored.returncode == 0, ignored.text

    st = status_json(root, env, "hopper/*")
    assert st["hopper/qwen/w4"]["status"] == "up to date"
    assert st["hopper/qwen/w8"] == {
        "target": "hopper/qwen/w8",
        "status": "ignored",
        "detail": "`doit ignore`d: `doit build` skips it until `doit forget build:hopper/qwen/w8`",
    }
    code, out, _ = cli(root, env, "status", "--exit-code", "hopper/*")
    assert code == 0, out
    assert "ignored     hopper/qwen/w8" in out and "1 ignored, 1 up to date" in out
    code, out, _ = cli(root, env, "why", "hopper/qwen/w8")
    assert code == 0
    assert out.startswith("hopper/qwen/w8 is ignored (marked by `doit ignore build:hopper")
    assert "changed input" not in out and "signature part" not in out
    assert "`doit forget build:hopper/qwen/w8` drops the mark" in out

    run = doit(root, ["build:hopper/*"], env)
    assert run.returncode == 0, run.text
    summary = [ln for ln in run.out.splitlines() if ln.startswith("build: ")]
    assert len(summary) == 1 and ", 1 up to date, 0 skipped, 0 failed, 1 ignored in" in summary[0]
    assert "ignored 1 target(s) marked by `doit ignore` (hopper/qwen/w8)" in run.out
    assert "!! build" not in run.out  # doit's line for the group: it says nothing
    listed = doit(root, ["list", "--status", "build:hopper/qwen/w8"], env)
    assert listed.out.startswith("I build:hopper/qwen/w8"), listed.text

    assert doit(root, ["forget", "build:hopper/qwen/w8"], env).returncode == 0
    st = status_json(root, env, "hopper/qwen/w8")
    assert st["hopper/qwen/w8"]["status"] == "stale" and st["hopper/qwen/w8"]["never_built"]
    code, out, _ = cli(root, env, "why", "hopper/qwen/w8")
    assert "never built successfully, or forgotten (no record in .doit.db)" in out
    run = doit(root, ["build:hopper/*"], env)
    assert run.returncode == 0 and "ignored" not in run.out, run.text
    assert status_json(root, env, "hopper/*")["hopper/qwen/w8"]["status"] == "up to date"


def test_rdeps_targets_and_modules(built: tuple[Path, dict[str, str]]) -> None:
    root, env = built
    code, out, err = cli(root, env, "rdeps", "kernels/hopper/common/util.cuh", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["file"] == "kernels/hopper/common/util.cuh"
    assert {t["target"]: t["modules"] for t in doc["targets"]} == {
        "gb10/qwen/w4": ["add", "scale"],
        "gb10/qwen/w8": ["add"],
        "hopper/qwen/w4": ["add", "scale"],
        "hopper/qwen/w8": ["add"],
    }
    code, out, _ = cli(root, env, "rdeps", str(root / "kernels/gb10/common/extra.cu"))
    assert out.splitlines() == [
        "gb10/qwen/w4: extra",
        "gb10/qwen/w8: extra",
        "kernels/gb10/common/extra.cu reaches 2 target(s)",
    ]
    code, out, _ = cli(root, env, "rdeps", "kernels/hopper/HARDWARE.toml")
    assert "hopper/qwen/w4: (an input; no module includes it)" in out
    code, out, _ = cli(root, env, "rdeps", "README.md")
    assert out == "README.md reaches no target\n"
