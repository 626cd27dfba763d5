"""The graph's specs carry their own file dependencies and signature parts (issue 46):
the doit adapter makes every task dict from a spec in one place (``task_dict``), and
nothing reads a spec's facts back out of a dict (the task cache stores the spec's)."""

from __future__ import annotations

from pathlib import Path

from metrale_orch.graph import taskcache
from metrale_orch.graph.cached import _from_cached
from metrale_orch.graph.specs import BuildSpec, signature_parts
from metrale_orch.tasks import actions
from metrale_orch.tasks.checker import SignatureCheck
from metrale_orch.tasks.dicts import plan_build_task, task_dict

ROOT = Path("/r")
PARTS = signature_parts({"flags": ["-O3"], "tool": "nvcc 13"})
BUILD = BuildSpec(
    target="h/m/q",
    kind="build",
    file_dep=("kernels/h/m/a.cu", "kernels/h/m/q/KERNEL.toml"),
    parts=PARTS,
    manifest="build/h/m/q/manifest.json",
)


def test_a_build_spec_makes_the_task_dict_a_plan_makes() -> None:
    made = task_dict(BUILD, ROOT)
    planned = plan_build_task(
        root=ROOT,
        target="h/m/q",
        file_deps=[ROOT / p for p in BUILD.file_dep],
        signature={"flags": ["-O3"], "tool": "nvcc 13"},
        manifest=ROOT / BUILD.manifest,
    )
    (check,) = made.pop("uptodate")  # type: ignore[misc]
    assert isinstance(check, SignatureCheck) and dict(check.parts) == PARTS
    assert planned.pop("uptodate")[0].parts == PARTS  # type: ignore[index]
    assert made == planned
    assert made["file_dep"] == list(BUILD.file_dep)
    assert made["targets"] == [BUILD.manifest]


def test_skip_and_error_specs_make_their_dicts() -> None:
    named = task_dict(
        BuildSpec(target="a/b/c", kind="skip", message="no nvcc", explicit=True), ROOT
    )
    assert named["actions"] == [(actions.skip_action, ["a/b/c", "no nvcc", True])]
    broad = task_dict(BuildSpec(target="a/b/c", kind="skip", message="no nvcc"), ROOT)
    assert broad["actions"] == [(actions.skip_action, ["a/b/c", "no nvcc", False])]
    error = task_dict(BuildSpec(target="x", kind="error", message="bad\nline", clean=False), ROOT)
    assert error["doc"] == "build x (error: bad line)" and "clean" not in error
    assert "clean" in task_dict(BuildSpec(target="x", kind="error", message="m"), ROOT)


def test_the_task_cache_stores_the_specs_themselves(tmp_path: Path) -> None:
    """What the task cache keeps is the spec (no second value, no dict dug into); a hit
    gives back the spec's facts, and only the command line's part is this run's."""
    skip = BuildSpec(target="a/b/c", kind="skip", message="no nvcc")
    body = taskcache._encode_body([BUILD, skip])
    (build, stored_skip), _extra = taskcache._decode_body(body)
    assert build == BUILD
    assert _comparable(task_dict(build, ROOT)) == _comparable(task_dict(BUILD, ROOT))
    assert _from_cached(stored_skip, frozenset({"a/b/c"})).explicit is True
    assert _from_cached(stored_skip, frozenset()) == skip


def _comparable(task: dict[str, object]) -> dict[str, object]:
    """``task`` with its SignatureCheck as its parts (the check has no equality)."""
    uptodate = task["uptodate"]
    assert isinstance(uptodate, list)
    parts = [dict(u.parts) if isinstance(u, SignatureCheck) else u for u in uptodate]
    return {**task, "uptodate": parts}
