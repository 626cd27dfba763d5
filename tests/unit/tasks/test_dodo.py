"""The doit integration: real ``python -m doit`` runs in temporary projects.

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/tasks/test_dodo.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash
from doit.dependency import Dependency, SqliteDB

from metrale_orch import fsutil
from metrale_orch.graph.selection import explicit_targets
from metrale_orch.graph.specs import signature_parts
from metrale_orch.paths import rel_posix
from metrale_orch.tasks.checker import (
    ContentChecker,
    SignatureCheck,
    TaskDataCodec,
    file_digest,
)
from metrale_orch.tasks.dicts import plan_build_task
from metrale_orch.tasks.doit_api import stored_state

# ------------------------------------------------------------------------------ pure parts


def test_explicit_targets_only_full_names() -> None:
    argv = ["-n", "2", "build:hopper/*", "build", "build:gb10/qwen/w4", "smoke:hopper", "build:"]
    assert explicit_targets(argv) == frozenset({"gb10/qwen/w4"})


def test_rel_posix_strips_only_the_root() -> None:
    root = Path("/r/p")
    assert rel_posix("/r/p/kernels/a.cu", root) == "kernels/a.cu"
    assert rel_posix("/r/px/a.cu", root) == "/r/px/a.cu"
    assert rel_posix("kernels/a.cu", root) == "kernels/a.cu"


def test_signature_parts_digest_each_part_canonically() -> None:
    a = signature_parts({"flags": ["-O3"], "layout": {"b": 1, "a": 2}})
    b = signature_parts({"layout": {"a": 2, "b": 1}, "flags": ["-O3"]})
    assert a == b and sorted(a) == ["flags", "layout"]
    c = signature_parts({"flags": ["-O2"], "layout": {"b": 1, "a": 2}})
    assert c["flags"] != a["flags"] and c["layout"] == a["layout"]


def test_build_task_dict_is_exactly_the_plan(tmp_path: Path) -> None:
    task = plan_build_task(
        root=tmp_path,
        target="hopper/qwen/w4",
        file_deps=[
            tmp_path / "kernels/b.cu",
            tmp_path / "kernels/a.cuh",
            tmp_path / "kernels/b.cu",
        ],
        signature={"flags": []},
        manifest=tmp_path / "build/hopper/qwen/w4/manifest.json",
    )
    assert task["file_dep"] == ["kernels/a.cuh", "kernels/b.cu"]
    assert task["targets"] == ["build/hopper/qwen/w4/manifest.json"]
    (utd,) = task["uptodate"]
    assert isinstance(utd, SignatureCheck)
    import pickle

    # What a process worker receives: everything but uptodate (doit drops it) pickles.
    pickle.dumps({k: v for k, v in task.items() if k != "uptodate"})


def _dep(db: Path) -> Dependency:
    return Dependency(SqliteDB, str(db), checker_cls=ContentChecker, codec_cls=TaskDataCodec)


def test_checker_refreshes_same_bytes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """New mtime + same bytes: unchanged, state refreshed, so the next run reads nothing.
    (Every change time counts as settled here: the racy window has tests of its own in
    tests/unit/tasks/test_saved_state.py.)"""
    from doit.task import Task

    monkeypatch.setattr(fsutil, "RACY_NS", 0)

    src = tmp_path / "a.cu"
    src.write_text("x")
    db = tmp_path / "db"

    def make_task() -> Task:
        return Task("t", [], file_dep=[str(src)], uptodate=[SignatureCheck({"p": "1"})])

    dep = _dep(db)
    task = make_task()
    assert dep.get_status(task, {"t": task}).status == "run"
    task.values = {"outputs": ["", "", "", ""]}  # a build action that installed nothing
    task.save_extra_values()
    dep.save_success(task)
    dep.close()

    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    dep = _dep(db)
    task = make_task()
    assert dep.get_status(task, {"t": task}).status == "up-to-date"
    assert (dep.checker.hashed, dep.checker.refreshed) == (1, 1)
    dep.close()

    dep = _dep(db)
    task = make_task()
    assert dep.get_status(task, {"t": task}).status == "up-to-date"
    assert (dep.checker.hashed, dep.checker.refreshed) == (0, 0)
    dep.close()

    src.write_text("y")  # same size, new bytes
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 9 * 10**9))
    dep = _dep(db)
    task = make_task()
    assert dep.get_status(task, {"t": task}).status == "run"
    dep.close()


def test_checker_never_refreshes_another_tasks_record(tmp_path: Path) -> None:
    """A stale binding (task A) must not write while B's deps are checked."""
    from doit.task import Task

    src = tmp_path / "a.cu"
    src.write_text("x")
    dep = _dep(tmp_path / "db")
    a = Task("a", [], file_dep=[str(src)], uptodate=[SignatureCheck({})])
    b = Task("b", [], file_dep=[str(src)])  # no SignatureCheck: no binding of its own
    for t in (a, b):
        dep.get_status(t, {t.name: t})
        t.values = {"outputs": ["", "", "", ""]}
        t.save_extra_values()
        dep.save_success(t)
    dep.close()
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    dep = _dep(tmp_path / "db")
    a = Task("a", [], file_dep=[str(src)], uptodate=[SignatureCheck({})])
    b = Task("b", [], file_dep=[str(src)])
    assert dep.get_status(a, {"a": a}).status == "up-to-date"
    assert dep.get_status(b, {"b": b}).status == "up-to-date"
    assert dep.checker.refreshed == 1  # a's only
    assert stored_state(dep, "b", str(src))[0] == st.st_mtime_ns  # type: ignore[index]
    dep.close()


def test_file_digest_is_xxh3(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"abc" * 1000)
    assert file_digest(str(p)) == xxhash.xxh3_64_hexdigest(b"abc" * 1000)
