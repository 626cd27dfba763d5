"""A doit task's values are typed (``metrale_orch.tasks.values``), and a database written
before they were (the keys as 003cd74 wrote them) still reads: nothing rebuilds for it, and
a record whose fields have the wrong type reads as absent, so that target rebuilds."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

from doit.dependency import Dependency, SqliteDB
from doit.task import Task

from metrale_orch.fsutil import file_digest, file_state
from metrale_orch.tasks.checker import ContentChecker, SignatureCheck, TaskDataCodec, encode_outputs
from metrale_orch.tasks.outcomes import BuildFailed
from metrale_orch.tasks.values import (
    BuildRecord,
    BuildValues,
    SummaryValues,
    persisted,
    pop_inputs,
)

PARTS = {"flags": "f1", "layout": "l1"}


def _old_values(artefact: Path) -> dict[str, object]:
    """What 003cd74's build action returned for a built target (its keys, spelled there)."""
    st = artefact.stat()
    state = file_state(st, file_digest(str(artefact)), time.time_ns())
    return {
        "outcome": "built",
        "modules": {"compiled": 2},
        "seconds": 1.25,
        "cache": {"misses": 2, "puts": 2},
        "inputs": {"kernels/a.cu": "0123456789abcdef"},
        "outputs": encode_outputs({str(artefact): state}),
        "plan": '{"modules":["a"]}',
        "external": {"/opt/x.h": [1, 2, "d", 3, 4]},
        "profile": [{"step": "build", "ts": 1}],
        "warnings": ["w1"],
    }


def _dep(db: Path) -> Dependency:
    return Dependency(SqliteDB, str(db), checker_cls=ContentChecker, codec_cls=TaskDataCodec)


def _task() -> Task:
    return Task("build:hw/m/q", [], file_dep=[], uptodate=[SignatureCheck(PARTS)])


def _save(db: Path, values: dict[str, object]) -> None:
    """Save ``values`` as doit saves a successful build's (the checker's saver included)."""
    dep = _dep(db)
    task = _task()
    assert dep.get_status(task, {task.name: task}).status == "run"
    task.values = dict(values)
    task.save_extra_values()
    dep.save_success(task)
    dep.close()


def _status(db: Path) -> str:
    dep = _dep(db)
    task = _task()
    try:
        return str(dep.get_status(task, {task.name: task}).status)
    finally:
        dep.close()


def test_the_previous_versions_values_read_field_by_field_and_encode_the_same(
    tmp_path: Path,
) -> None:
    artefact = tmp_path / "a.ptx"
    artefact.write_text("ptx")
    old = _old_values(artefact)
    values = BuildValues.from_values(old)
    assert values.outcome == "built"
    assert values.modules == {"compiled": 2}
    assert values.seconds == 1.25
    assert values.inputs == {"kernels/a.cu": "0123456789abcdef"}
    assert values.warnings == ("w1",)
    assert values.profile == ({"step": "build", "ts": 1},)
    assert values.to_values() == old  # the same dict: the same record on disk
    assert list(persisted(old)) == [k for k in old if k != "profile"]


def test_a_database_of_the_previous_version_is_up_to_date(tmp_path: Path) -> None:
    """Nothing rebuilds after the upgrade: the record's keys are the ones read now."""
    artefact = tmp_path / "a.ptx"
    artefact.write_text("ptx")
    db = tmp_path / ".doit.db"
    old = _old_values(artefact)
    del old["external"]  # a file outside the tree that does not exist would stale it
    _save(db, old)
    assert _status(db) == "up-to-date"
    dep = _dep(db)
    saved = dep.get_values("build:hw/m/q")
    dep.close()
    record = BuildRecord.from_values(saved)
    assert record.signature == PARTS
    assert record.plan == '{"modules":["a"]}'
    assert record.outputs == tuple(old["outputs"])  # type: ignore[arg-type]
    assert "inputs" not in saved and "profile" not in saved  # never stored
    os.remove(artefact)
    assert _status(db) == "run"  # the record's outputs are still checked


def test_a_record_of_the_wrong_shape_reads_as_absent_and_rebuilds(tmp_path: Path) -> None:
    assert BuildValues.from_values(None) == BuildValues()
    assert BuildValues.from_values({"outcome": "exploded", "modules": {"a": "x"}}) == BuildValues()
    assert BuildValues.from_values({"seconds": True, "refused": 2.0}) == BuildValues()
    assert BuildRecord.from_values({"signature": ["flags"], "plan": 3}) == BuildRecord()
    db = tmp_path / ".doit.db"
    _save(db, {"outputs": ["", "", "", ""]})
    dep = _dep(db)
    dep.backend.set("build:hw/m/q", "_values_:", {"signature": ["f1"], "outputs": "x"})
    dep.close()
    assert _status(db) == "run"


def test_values_leave_out_what_is_absent_and_round_trip() -> None:
    values = BuildValues(outcome="skipped", skipped="toolchain 'metal' is not installed")
    assert values.to_values() == {
        "outcome": "skipped",
        "skipped": "toolchain 'metal' is not installed",
    }
    assert BuildValues.from_values(values.to_values()) == values
    summary = SummaryValues(summary="smoke: 3 passed", report="build/s.xml", passed=3, failed=0)
    assert summary.to_values() == {
        "summary": "smoke: 3 passed",
        "report": "build/s.xml",
        "passed": 3,
        "failed": 0,
    }
    assert SummaryValues.from_values(summary.to_values()) == summary
    assert BuildRecord(signature={"p": "1"}).to_values() == {"signature": {"p": "1"}}


def test_inputs_are_taken_out_before_the_save() -> None:
    values: dict[str, object] = {"outcome": "built", "inputs": {"a": "1"}}
    assert pop_inputs(values) == {"a": "1"}
    assert values == {"outcome": "built"}
    assert pop_inputs(values) == {}
    assert pop_inputs(None) == {}


def test_a_failure_carries_typed_values_across_a_process_worker() -> None:
    """doit's process workers pickle a failure back to the loop."""
    fail = BuildFailed("build:hw/m/q: no", BuildValues(outcome="stopped", cache={"misses": 1}))
    back = pickle.loads(pickle.dumps(fail))
    assert back.values == BuildValues(outcome="stopped", cache={"misses": 1})
    assert str(back) == str(fail)
