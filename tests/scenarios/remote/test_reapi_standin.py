"""The benchmarks' REAPI engine stand-in (issue 38): a real ``doit build`` of the small
project with the fake compiler sends every compile to it, at most ``workers`` run at once,
and the outputs its workers declare are installed; nothing compiles here."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.support.project import doit, fake_compiles, make_project, project_env, use_fake_compiler
from tests.support.reapi_standin import standin_engine

#: Distinct compiles of the project's four buildable targets (apple has no toolchain here).
COMPILES = 7


def test_a_build_against_the_standin_runs_every_compile_there(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj")
    use_fake_compiler(root, tmp_path / "bin")
    env = project_env(tmp_path, fake_bin=tmp_path / "bin")
    env.update(
        METRALE_ORCH_CACHE_MODE="off",
        METRALE_ORCH_REMOTE_STRICT="1",
        METRALE_ORCH_REMOTE_JOBS="8",
    )
    with standin_engine(workers=2, seconds=0.05) as engine:
        env["METRALE_ORCH_REMOTE_EXECUTOR"] = engine.url
        run = doit(root, ["build"], env, timeout=120)
    assert run.returncode == 0, run.text
    assert f"remote: {COMPILES} ran remotely" in run.text, run.text
    assert fake_compiles(tmp_path) == []
    assert engine.executed == COMPILES
    assert 1 <= engine.peak <= 2
    calls = Counter(engine.fake.methods())
    assert calls["Execute"] == COMPILES and calls["GetCapabilities"] == 1, calls
    ptx = sorted((root / "build").glob("*/qwen/*/*.ptx"))
    assert len(ptx) == 10  # 7 compiles, 3 of them shared by two targets
    for path in ptx:
        arch = "sm_121f" if path.parts[-4] == "gb10" else "sm_90a"
        text = path.read_text()
        assert text.startswith(f".version 8.0\n.target {arch}\n"), (path, text)
        assert text.endswith(f"/{path.name}\n"), (path, text)
