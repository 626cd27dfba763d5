"""profile.json and the build history keep their bytes (issue 45: the end-of-run writes
were made cheaper, and no file of a run may change for it).

``tests/cases/profile/spans.json`` holds a run's spans as its reporter gathers them
(``Span.to_dict()`` each): doit's process and two workers, several threads, spans tied on
start, pid, tid and name (the longer first, equal ones as given), an arg named like the
span's target, non-ASCII text, compiles with a peak memory. ``profile.json`` and
``profile-history.json`` beside it are the bytes the package wrote for them before that
change (a history of this one build, ended at the case's ``finished_ns``).
"""

from __future__ import annotations

import json
from typing import Any

from metrale_orch.steps.history import encode_history, new_record
from metrale_orch.steps.profile import Span
from metrale_orch.steps.trace import TraceEvents
from tests.support import REPO
from tests.support.steps import trace_of

CASE = REPO / "tests" / "cases" / "profile"


def case_document() -> tuple[dict[str, Any], dict[str, object], bytes]:
    """The case, its trace document and the document's bytes, as the run's profile writer
    makes them."""
    case: dict[str, Any] = json.loads((CASE / "spans.json").read_text(encoding="utf-8"))
    spans = [Span.from_dict(s) for s in case["spans"]]
    doc, data = trace_of(spans, origin_ns=case["origin_ns"], main_pid=case["main_pid"])
    return case, doc, data


def test_profile_json_keeps_its_bytes() -> None:
    _, doc, data = case_document()
    assert data == (CASE / "profile.json").read_bytes()
    assert json.loads(data) == doc


def test_the_events_made_as_spans_arrive_give_the_same_bytes() -> None:
    case: dict[str, Any] = json.loads((CASE / "spans.json").read_text(encoding="utf-8"))
    trace = TraceEvents(case["origin_ns"])
    spans = case["spans"]
    for part in (spans[: len(spans) // 3], spans[len(spans) // 3 :], [{"step": "other"}]):
        trace.add(part)  # as targets end; a span of someone else's is left out
    doc, data = trace.document(main_pid=case["main_pid"])
    assert data == (CASE / "profile.json").read_bytes()
    assert doc == case_document()[1]  # handed over in parts or at once


def test_the_build_history_keeps_its_bytes() -> None:
    case, doc, _ = case_document()
    events = doc["traceEvents"]
    assert isinstance(events, list)
    record = new_record((), events, finished_ns=case["finished_ns"], words=case["words"])
    assert encode_history((record,)) == (CASE / "profile-history.json").read_bytes()
