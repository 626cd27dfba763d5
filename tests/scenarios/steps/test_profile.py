"""The build profile: spans (pure), ``profile.json`` written by ``doit build`` as a user
runs it (one process, ``-n 2 -P process``, ``-n 2 -P thread``), ``metrale-orch profile``,
and one real nvcc build of a sample target.

These are the tests of this topic that start processes; the others are in
``tests/unit/steps/test_profile.py``.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest

from metrale_orch.cli import main
from metrale_orch.config import default_jobs
from metrale_orch.steps.profile import (
    summarize_profile,
)
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support import REPO
from tests.support.build import make_cache, make_config
from tests.support.project import doit, fake_compiles, make_project, project_env, use_fake_compiler
from tests.support.steps import trace_of

NVIDIA = ("gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w4", "hopper/qwen/w8")


# ------------------------------------------------------------------------------ doit builds


@pytest.fixture
def fake(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = make_project(tmp_path / "proj")
    use_fake_compiler(root, tmp_path / "bin")
    return root, project_env(tmp_path, fake_bin=tmp_path / "bin")


def trace(root: Path) -> dict[str, object]:
    doc = json.loads((root / "build/profile.json").read_text())
    assert isinstance(doc, dict)
    return doc


def complete_events(doc: Mapping[str, object]) -> list[dict[str, object]]:
    """The ``X`` events, each checked against the trace-event format."""
    events = doc["traceEvents"]
    assert isinstance(events, list)
    out = []
    for e in events:
        assert e["ph"] in ("X", "M", "C"), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and e["args"]["name"]
            continue
        if e["ph"] == "C":  # the counter of the compilers' peak memory
            assert e["name"] == "memory in use" and e["args"]["MiB"] >= 0, e
            continue
        assert set(e) == {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}, e
        assert all(isinstance(e[k], int) and e[k] >= 0 for k in ("ts", "dur", "pid", "tid"))
        assert e["name"] == f"{e['cat']} {e['args'].get('module') or e['args']['target']}"
        out.append(e)
    return out


def manifest_outcomes(root: Path) -> dict[tuple[str, str], str]:
    out = {}
    for target in NVIDIA:
        doc = json.loads((root / "build" / target / "manifest.json").read_text())
        for mod in doc["modules"]:
            out[target, mod["name"]] = mod["outcome"]
    return out


def check_profile(root: Path, workers: str) -> list[dict[str, object]]:
    """What holds for every profile of a full build of the fake project."""
    doc = trace(root)
    events = complete_events(doc)
    text = (root / "build/profile.json").read_text()
    assert str(root) not in text and str(Path.home()) not in text  # root-relative only
    outcomes = manifest_outcomes(root)
    compiles = {(e["args"]["target"], e["args"]["module"]) for e in events if e["cat"] == "compile"}
    n_compiles = sum(e["cat"] == "compile" for e in events)
    assert n_compiles == len(compiles)  # exactly one compile span per compiled module
    assert compiles == {k for k, o in outcomes.items() if o == "compiled"}
    assert all(e["args"]["outcome"] == "compiled" for e in events if e["cat"] == "compile")
    lookups = {
        (e["args"]["target"], e["args"]["module"]): e["args"]["outcome"]
        for e in events
        if e["cat"] == "lookup"
    }
    assert lookups == {k: ("miss" if o == "compiled" else o) for k, o in outcomes.items()}
    assert Counter(e["cat"] for e in events)["key"] == len(outcomes)
    # Each target ran on one worker; its steps lie inside its build span, its modules'
    # pipelines (lookup, compile, store) on lanes of that worker's process; a worker
    # runs one target at a time.
    builds = {e["args"]["target"]: e for e in events if e["cat"] == "build"}
    assert sorted(builds) == sorted(NVIDIA)
    for e in events:
        b = builds[str(e["args"]["target"])]
        assert e["pid"] == b["pid"], e
        if e["cat"] not in ("lookup", "compile", "store"):
            assert e["tid"] == b["tid"], e
        assert b["ts"] <= e["ts"] and e["ts"] + e["dur"] <= b["ts"] + b["dur"], e
    by_worker: dict[tuple[object, object], list[tuple[int, int]]] = {}
    for b in builds.values():
        by_worker.setdefault((b["pid"], b["tid"]), []).append((b["ts"], b["ts"] + b["dur"]))
    for spans in by_worker.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    # Every worker is named; the main process is "doit".
    names = {
        (e["name"], e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]  # type: ignore[union-attr]
        if e["ph"] == "M"
    }
    pids = {b["pid"] for b in builds.values()}
    tids = set(by_worker)
    assert all(("process_name", p, 0) in names for p in pids)
    assert all(("thread_name", p, t) in names for p, t in tids)
    doit_pids = {k[1] for k, v in names.items() if v == "doit"}
    if workers == "process":
        assert len(pids) <= 2 and not pids & doit_pids, names
        assert all(names["process_name", p, 0].startswith("worker ") for p in pids)
    elif workers in ("thread", "default"):  # the default: `jobs` target threads
        assert pids == doit_pids and len(tids) <= max(2, default_jobs()), names
    else:
        assert pids == doit_pids and len(tids) == 1, names
    return events


@pytest.mark.parametrize(
    ("args", "workers"),
    [
        ([], "default"),
        (["-n", "1"], "one"),
        (["-n", "2", "-P", "process"], "process"),
        (["-n", "2", "-P", "thread"], "thread"),
    ],
)
def test_doit_build_writes_the_profile(
    fake: tuple[Path, dict[str, str]], tmp_path: Path, args: list[str], workers: str
) -> None:
    root, env = fake
    run = doit(root, [*args, "build"], env)
    assert run.returncode == 0, run.text
    events = check_profile(root, workers)
    assert sum(e["cat"] == "compile" for e in events) == len(fake_compiles(tmp_path))
    # Never stored in doit's database: a no-op would decode them on every run.
    assert b"start_ns" not in (root / ".doit.db").read_bytes()

    # A no-op leaves the last build's profile as it was.
    before = (root / "build/profile.json").stat()
    noop = doit(root, [*args, "build"], env)
    assert noop.returncode == 0 and "0 built, 0 from cache, 4 up to date" in noop.out
    assert (root / "build/profile.json").stat().st_mtime_ns == before.st_mtime_ns

    # Everything from the local cache: lookups only, no compile span.
    shutil.rmtree(root / "build")
    (root / ".doit.db").unlink()
    again = doit(root, [*args, "build"], env)
    assert again.returncode == 0, again.text
    events = check_profile(root, workers)
    assert not [e for e in events if e["cat"] == "compile"]
    assert {e["args"]["outcome"] for e in events if e["cat"] == "lookup"} == {"local"}


def run_cli(root: Path, env: Mapping[str, str], *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *args], environ=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_profile_command(fake: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = fake
    assert run_cli(root, env, "profile") == (1, "", "error: no build profile yet: run doit build\n")
    (root / "kernels/hopper/qwen/w8/mul.cu").write_text("#error broken\n")
    run = doit(root, ["-n", "2", "-P", "process", "build:hopper/*"], env)
    assert run.returncode == 1, run.text
    code, out, err = run_cli(root, env, "profile")
    assert (code, err) == (0, ""), err
    lines = out.splitlines()
    assert lines[0] == "slowest compiles (build/profile.json):"
    assert lines[1].split() == ["target", "module", "seconds", "outcome"]
    rows = [ln.split() for ln in lines[2:5]]
    # add (common) compiles once, for whichever target reached it first.
    assert sorted((r[1], r[0] if r[1] != "add" else "either", r[3]) for r in rows) == [
        ("add", "either", "compiled"),
        ("mul", "hopper/qwen/w8", "failed"),
        ("scale", "hopper/qwen/w4", "compiled"),
    ]
    seconds = [float(r[2]) for r in rows]
    assert seconds == sorted(seconds, reverse=True)
    assert lines[5].startswith("targets: 2 in ") and lines[5].endswith(" s on 2 workers")
    # The other target's add was shared in the run (an empty cache served nothing).
    assert lines[6].startswith(
        "modules: 2 compiled, 0 local hits, 0 remote hits, 1 shared, 1 failed; "
    )
    assert lines[7].startswith("time by step: ") and "compile " in lines[7]
    code, out, _ = run_cli(root, env, "profile", "--top", "1")
    assert code == 0 and len(out.splitlines()) == 6


def test_compile_times_fit_in_jobs_times_wall(tmp_path: Path) -> None:
    # Issue 35: the compile spans hold the wait for a slot, so their sum (119 s) passed
    # jobs x wall (a 12.4 s build). A sleeping compiler, 2 jobs, 4 targets at once and 7
    # compiles: most wait; the compilers' own seconds still fit in 2 x wall.
    root = make_project(tmp_path / "proj")
    use_fake_compiler(root, tmp_path / "bin")
    env = project_env(tmp_path, fake_bin=tmp_path / "bin")
    env.update(METRALE_ORCH_JOBS="2", FAKECC_DELAY="0.3")
    run = doit(root, ["-n", "4", "-P", "thread", "build"], env)
    assert run.returncode == 0, run.text
    assert len(fake_compiles(tmp_path)) == 7
    events = complete_events(trace(root))
    summary = summarize_profile(events)
    assert len(summary.slowest) == 7
    assert summary.steps["compile"] <= 2 * summary.wall_seconds, summary
    assert sum(c.seconds for c in summary.slowest) == pytest.approx(summary.steps["compile"])
    # Each compile's span holds its wait and its compiler's time, said apart.
    for e in events:
        if e["cat"] == "compile":
            args = e["args"]
            assert args["seconds"] >= 0.3 and args["wait"] >= 0, e
            assert args["seconds"] + args["wait"] <= e["dur"] / 1e6 + 0.002, e
    assert summary.steps["wait"] > 0.3, summary  # 7 compiles, 2 slots: some waited
    code, out, err = run_cli(root, env, "profile")
    assert (code, err) == (0, ""), err
    listed = [float(line.split()[2]) for line in out.splitlines()[2:9]]
    assert sum(listed) <= 2 * summary.wall_seconds + 0.07, out
    assert "waiting for a compile slot " in out, out


# ------------------------------------------------------------------------------ real nvcc


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_real_nvcc_build_has_a_span_per_module(tmp_path: Path) -> None:
    root = REPO
    if not (root / "kernels").is_dir():
        pytest.skip("the sample tree kernels/ is not there yet")
    config = make_config(root, tmp_path / "cache", build_dir=str(tmp_path / "build"))
    result = build_target(
        root,
        Target.parse("hopper/qwen3-8b/bf16"),
        config=config,
        cache=make_cache(config),
        environ=dict(os.environ),
    )
    assert not result.failures, result.failure_text()
    steps = Counter((s.step, s.module) for s in result.spans)
    for module in result.modules:
        assert steps["key", module.name] == 1
        assert steps["lookup", module.name] == 1
        assert steps["compile", module.name] == (module.outcome == "compiled")
    assert steps["build", ""] == steps["plan", ""] == steps["stage", ""] == 1
    assert steps["install", ""] == 1
    _, data = trace_of(result.spans, origin_ns=min(s.start_ns for s in result.spans), main_pid=0)
    events = complete_events(json.loads(data))
    compiled = [e for e in events if e["cat"] == "compile"]
    assert compiled and all(e["dur"] > 0 and e["args"]["bytes"] > 0 for e in compiled)
