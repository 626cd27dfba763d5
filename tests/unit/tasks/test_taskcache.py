"""The build-task cache (``tasks.taskcache`` through ``tasks.specs.cached_build_specs``).

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/tasks/test_taskcache.py``.
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

from metrale_orch.cache import CacheStats
from metrale_orch.graph import taskcache
from metrale_orch.tasks import actions
from metrale_orch.tasks.checker import SignatureCheck
from metrale_orch.tasks.creators import record_task_dicts, replay_task_dicts
from metrale_orch.tasks.outcomes import nonzero_counters
from tests.support.tasks import _one_spec


def test_record_and_replay_task_dicts() -> None:

    dicts = [{"name": "x", "actions": [(actions.skip_action, ["a", "b", False])], "n": (1,)}]
    recorded = record_task_dicts(dicts)
    assert recorded is not None and replay_task_dicts([recorded]) == dicts
    assert record_task_dicts([{"actions": [(lambda: None, [])]}]) is None
    assert record_task_dicts([{"file": Path("a")}]) is None
    assert replay_task_dicts(None) is None and replay_task_dicts([["x"], 1]) is None


def _forged(tmp_path: Path, racy: bool) -> tuple[Path, Path]:
    """A cache whose watch of ``a.toml`` has today's exact stat but an older digest:
    what a same-tick edit right after the scan would leave behind."""
    tree = tmp_path / "kernels"
    tree.mkdir()
    toml = tree / "a.toml"
    toml.write_text("x = 1\n")
    scanned = taskcache.scan(tree, [])
    assert scanned is not None
    change = toml.stat().st_ctime_ns
    watches = tuple((*w[:7], "0" * 16) if w[1] == str(toml) else w for w in scanned.watches)
    started = change + (taskcache.RACY_NS // 2 if racy else taskcache.RACY_NS + 1)
    forged = taskcache.Scan(started_ns=started, watches=watches)
    path = tmp_path / "c"
    taskcache.store(path, "k", forged, _one_spec())
    return path, toml


def test_racy_entries_are_compared_by_content(tmp_path: Path) -> None:
    path, _ = _forged(tmp_path, racy=True)
    assert taskcache.lookup(path, "k").reason == f"changed: {tmp_path / 'kernels/a.toml'}"


def test_settled_entries_are_trusted_by_stat(tmp_path: Path) -> None:
    path, _ = _forged(tmp_path, racy=False)
    found = taskcache.lookup(path, "k")
    assert found.reason == "hit" and found.compared == 0
    assert found.specs == tuple(_one_spec())


def test_racy_hit_is_not_refreshed_until_it_settles(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    tree.mkdir()
    (tree / "a.toml").write_text("x = 1\n")
    scanned = taskcache.scan(tree, [])
    assert scanned is not None
    taskcache.store(tmp_path / "c", "k", scanned, _one_spec())
    # Just written: every watch is racy, so compared, and rewriting would not help.
    found = taskcache.lookup(tmp_path / "c", "k")
    assert found.reason == "hit" and found.compared == len(scanned.watches)
    assert not found.refreshed


def test_another_key_misses(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    tree.mkdir()
    scanned = taskcache.scan(tree, [])
    assert scanned is not None
    taskcache.store(tmp_path / "c", "k", scanned, _one_spec())
    assert taskcache.lookup(tmp_path / "c", "other").reason.startswith("key changed")


def test_the_uses_hint_is_only_a_hint(tmp_path: Path) -> None:
    """read_uses: unknown, damaged or mistyped is None (then every toolchain is probed);
    write_uses keeps the newest KEEP bases."""
    assert taskcache.read_uses(tmp_path, "b") is None
    taskcache.write_uses(tmp_path, "b", ["nvcc", "hip"])
    assert taskcache.read_uses(tmp_path, "b") == ("hip", "nvcc")
    assert taskcache.read_uses(tmp_path, "other") is None
    for i in range(taskcache.KEEP):
        taskcache.write_uses(tmp_path, f"b{i}", [])
    assert taskcache.read_uses(tmp_path, "b") is None
    assert taskcache.read_uses(tmp_path, f"b{taskcache.KEEP - 1}") == ()
    path = tmp_path / taskcache.USES_NAME
    for text in ("{", '{"b": "nvcc"}', '{"b": [1]}', "[]"):
        path.write_text(text)
        assert taskcache.read_uses(tmp_path, "b") is None, text
    taskcache.write_uses(tmp_path, "b", ["x"])  # a damaged file is replaced
    assert taskcache.read_uses(tmp_path, "b") == ("x",)
    # The key an entry was stored under: kept beside the toolchains, None when unknown.
    assert taskcache.last_key(tmp_path, "b") is None
    taskcache.write_uses(tmp_path, "b", ["x"], "k1")
    assert taskcache.last_key(tmp_path, "b") == "k1"
    assert taskcache.read_uses(tmp_path, "b") == ("x",)
    for text in ('{"b": ["x"]}', '{"b": {"key": 3}}', '{"b": {"key": ""}}', '{"b": "k1"}'):
        path.write_text(text)
        assert taskcache.last_key(tmp_path, "b") is None, text
    assert taskcache.read_uses(tmp_path, "b") is None  # '{"b": "k1"}'
    path.write_text('{"b": ["y"]}')  # the toolchains alone, as written before the key was kept
    assert taskcache.read_uses(tmp_path, "b") == ("y",)


# ------------------------------------------------------------------------------ pieces


def test_signature_check_declares_what_doit_would_inspect() -> None:
    check = SignatureCheck({"a": "1"})
    declared = list(inspect.signature(check).parameters)
    from_call = list(inspect.signature(SignatureCheck.__call__).parameters)[1:]
    assert declared == from_call == ["task", "values"]


def test_task_values_keep_nonzero_counters_only() -> None:
    assert nonzero_counters(CacheStats(misses=2, puts=1)) == {"misses": 2, "puts": 1}


def test_scan_refuses_special_files(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    (tree / "a").mkdir(parents=True)
    assert taskcache.scan(tree, []) is not None
    if hasattr(os, "mkfifo") and sys.platform != "win32":
        os.mkfifo(tree / "a" / "fifo")
        assert taskcache.scan(tree, []) is None
    assert taskcache.scan(tmp_path / "missing", []) is None
