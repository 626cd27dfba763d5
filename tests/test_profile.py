"""The build profile: spans (pure), ``profile.json`` written by ``doit build`` as a user
runs it (one process, ``-n 2 -P process``, ``-n 2 -P thread``), ``metrale-orch profile``,
and one real nvcc build of a sample target."""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest

from metrale_orch.cli import main
from metrale_orch.config import default_jobs
from metrale_orch.steps.errors import ProfileError, ProfileMissing
from metrale_orch.steps.profile import (
    Span,
    SpanRecorder,
    encode_profile,
    read_profile,
    summarize_profile,
    trace_document,
)
from metrale_orch.steps.target import build_target
from metrale_orch.tasks.checker import PROFILE_KEY, TaskDataCodec
from metrale_orch.tree import Target
from tests.support import REPO
from tests.support.build import make_cache, make_config
from tests.support.project import doit, fake_compiles, make_project, project_env, use_fake_compiler

NVIDIA = ("gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w4", "hopper/qwen/w8")
MODULE_STEPS = ("key", "lookup", "compile", "store")

# ------------------------------------------------------------------------------ pure


def span(step: str, start: int, end: int, *, pid: int = 10, tid: int = 10, **args: object) -> Span:
    module = str(args.pop("module", ""))
    return Span.from_dict(
        {
            "step": step,
            "target": str(args.pop("target", "hw/m/q")),
            "module": module,
            "start_ns": start,
            "end_ns": end,
            "pid": pid,
            "tid": tid,
            "args": args,
        }
    )


def test_span_round_trips_and_becomes_a_complete_event() -> None:
    s = span("compile", 5_000_999, 9_001_000, module="rmsnorm", outcome="compiled", bytes=12)
    assert Span.from_dict(s.to_dict()) == s
    assert s.to_event(1_000_000) == {
        "name": "compile rmsnorm",
        "cat": "compile",
        "ph": "X",
        "ts": 4000,
        "dur": 4001,
        "pid": 10,
        "tid": 10,
        "args": {"target": "hw/m/q", "module": "rmsnorm", "bytes": 12, "outcome": "compiled"},
    }
    assert span("build", 0, 1).name == "build hw/m/q"
    with pytest.raises(ValueError, match="not a span"):
        Span.from_dict({"step": "lunch", "target": "t"})
    with pytest.raises(ValueError, match="start_ns"):
        Span.from_dict({"step": "key", "target": "t", "start_ns": "0"})


def test_recorder_stamps_this_process_and_thread() -> None:
    rec = SpanRecorder("hw/m/q")
    rec.add("key", 1, module="a", key="k")
    (only,) = rec.spans
    assert (only.pid, only.tid, only.target, only.module) == (
        os.getpid(),
        threading.get_native_id(),
        "hw/m/q",
        "a",
    )
    assert only.end_ns > only.start_ns and dict(only.args) == {"key": "k"}


def test_trace_document_is_sorted_and_names_workers() -> None:
    spans = [
        span("compile", 3_000, 9_000, pid=7, tid=7, module="b"),
        span("build", 1_000, 10_000, pid=7, tid=7),
        span("build", 2_000, 4_000, pid=5, tid=5),
        span("build", 2_000, 4_000, pid=1, tid=3),
        span("key", 1_000, 2_000, pid=7, tid=7, module="b"),
    ]
    doc = trace_document(reversed(spans), origin_ns=0, main_pid=1)
    again = trace_document(spans, origin_ns=0, main_pid=1)
    assert encode_profile(doc) == encode_profile(again)
    assert json.loads(encode_profile(doc)) == doc
    events = doc["traceEvents"]
    assert isinstance(events, list)
    meta = {(e["name"], e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M"}
    # Workers are numbered in the order they started work; the main process is "doit".
    assert meta == {
        ("process_name", 1, 0): "doit",
        ("process_name", 5, 0): "worker 2",
        ("process_name", 7, 0): "worker 1",
        ("thread_name", 1, 3): "thread 1",
        ("thread_name", 5, 5): "main",
        ("thread_name", 7, 7): "main",
    }
    xs = [(e["ts"], e["pid"], e["name"]) for e in events if e["ph"] == "X"]
    assert xs == sorted(xs)
    assert xs[:2] == [(1, 7, "build hw/m/q"), (1, 7, "key b")]  # the enclosing span first


def test_summary_lists_the_slowest_compiles_and_the_totals() -> None:
    spans = [
        span("build", 0, 9_000_000, pid=2, tid=2, target="a/m/q"),
        span("build", 0, 5_000_000, pid=3, tid=3, target="b/m/q"),
        span("compile", 0, 3_000_000, target="a/m/q", module="x", outcome="compiled", bytes=10),
        span("compile", 0, 3_000_000, target="a/m/q", module="w", outcome="failed"),
        span("compile", 0, 1_000_000, target="b/m/q", module="y", outcome="compiled", bytes=5),
        span("lookup", 0, 1_000, target="b/m/q", module="z", outcome="remote", bytes=7),
        span("lookup", 0, 1_000, target="b/m/q", module="v", outcome="local", bytes=1),
        span("lookup", 0, 1_000, target="b/m/q", module="y", outcome="miss"),
    ]
    doc = trace_document(spans, origin_ns=0, main_pid=1)
    events = doc["traceEvents"]
    assert isinstance(events, list)
    got = summarize_profile(events, top=2)
    assert [(c.target, c.module, c.seconds, c.outcome) for c in got.slowest] == [
        ("a/m/q", "w", 0.003, "failed"),
        ("a/m/q", "x", 0.003, "compiled"),
    ]
    assert dict(got.outcomes) == {"compiled": 2, "local": 1, "remote": 1, "failed": 1}
    assert (got.targets, got.workers, got.wall_seconds) == (2, 2, 0.009)
    assert (got.compiled_bytes, got.restored_bytes) == (15, 8)
    assert list(got.steps) == ["build", "compile", "lookup"]


def test_summary_counts_the_compiler_s_time_apart_from_the_wait_for_a_slot() -> None:
    # Issue 35: a 1.5 s compile that waited 10.6 s for a slot was listed at 12.1 s.
    spans = [
        span("build", 0, 13_000_000_000, target="a/m/q"),
        span("compile", 0, 12_100_000, module="x", outcome="compiled", seconds=0.0015, wait=0.0106),
        span("compile", 0, 3_000_000, module="y", outcome="compiled", seconds=0.0029, wait=0.0),
        span("lookup", 0, 1_000, module="z", outcome="local", source="memo", bytes=3),
        span("lookup", 0, 1_000, module="v", outcome="local", source="run", bytes=3),
        span("lookup", 0, 1_000, module="w", outcome="local", source="cache", bytes=2),
    ]
    events = trace_document(spans, origin_ns=0, main_pid=1)["traceEvents"]
    assert isinstance(events, list)
    got = summarize_profile(events)
    assert [(c.module, c.seconds, c.wait) for c in got.slowest] == [
        ("y", 0.0029, 0.0),
        ("x", 0.0015, 0.0106),
    ]
    assert got.steps["compile"] == pytest.approx(0.0044)
    assert got.steps["wait"] == pytest.approx(0.0106)
    # Lookups another target of the run answered are shared, not hits, restoring nothing.
    assert (got.shared, got.outcomes["local"], got.restored_bytes) == (2, 1, 2)


def test_read_profile_says_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ProfileMissing, match=r"^no build profile yet: run doit build$"):
        read_profile(tmp_path / "profile.json")
    (tmp_path / "profile.json").write_text('{"traceEvents": 3}')
    with pytest.raises(ProfileError, match="no traceEvents list"):
        read_profile(tmp_path / "profile.json")
    (tmp_path / "profile.json").write_text("{")
    with pytest.raises(ProfileError, match="not JSON"):
        read_profile(tmp_path / "profile.json")


def test_codec_never_stores_the_spans() -> None:
    values = {"outcome": "built", PROFILE_KEY: [{"step": "key"}]}
    record = {"_values_:": values, "result:": dict(values), "deps:": ("a",)}
    decoded = TaskDataCodec().decode(TaskDataCodec().encode(record))
    assert decoded == {
        "_values_:": {"outcome": "built"},
        "result:": {"outcome": "built"},
        "deps:": ("a",),
    }
    assert PROFILE_KEY in values  # the reporter's copy is left alone


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
    doc = trace_document(result.spans, origin_ns=min(s.start_ns for s in result.spans), main_pid=0)
    events = complete_events(json.loads(encode_profile(doc)))
    compiled = [e for e in events if e["cat"] == "compile"]
    assert compiled and all(e["dur"] > 0 and e["args"]["bytes"] > 0 for e in compiled)
