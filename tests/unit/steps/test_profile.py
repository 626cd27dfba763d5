"""The build profile: spans (pure), ``profile.json`` written by ``doit build`` as a user
runs it (one process, ``-n 2 -P process``, ``-n 2 -P thread``), ``metrale-orch profile``,
and one real nvcc build of a sample target.

The tests of this topic that start processes are in
``tests/scenarios/steps/test_profile.py``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from metrale_orch.steps.errors import ProfileError, ProfileMissing
from metrale_orch.steps.profile import (
    Span,
    SpanRecorder,
    read_profile,
    summarize_profile,
)
from metrale_orch.tasks.checker import TaskDataCodec
from tests.support.steps import trace_of

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


def test_the_trace_document_is_sorted_and_names_workers() -> None:
    spans = [
        span("compile", 3_000, 9_000, pid=7, tid=7, module="b"),
        span("build", 1_000, 10_000, pid=7, tid=7),
        span("build", 2_000, 4_000, pid=5, tid=5),
        span("build", 2_000, 4_000, pid=1, tid=3),
        span("key", 1_000, 2_000, pid=7, tid=7, module="b"),
    ]
    doc, data = trace_of(reversed(spans), origin_ns=0, main_pid=1)
    _, again = trace_of(spans, origin_ns=0, main_pid=1)
    assert data == again
    assert json.loads(data) == doc
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
    doc, _ = trace_of(spans, origin_ns=0, main_pid=1)
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
    events = trace_of(spans, origin_ns=0, main_pid=1)[0]["traceEvents"]
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
    values = {"outcome": "built", "profile": [{"step": "key"}]}
    record = {"_values_:": values, "result:": dict(values), "deps:": ("a",)}
    decoded = TaskDataCodec().decode(TaskDataCodec().encode(record))
    assert decoded == {
        "_values_:": {"outcome": "built"},
        "result:": {"outcome": "built"},
        "deps:": ("a",),
    }
    assert "profile" in values  # the reporter's copy is left alone
