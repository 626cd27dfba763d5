"""Guards of the build itself: containment, leftovers of killed compiles, exact statistics.

These are the tests of this topic that run in-process; the others are in
``tests/scenarios/tasks/test_build_guards.py``.
"""

from __future__ import annotations

from pathlib import Path

from metrale_orch.steps.staging import uncontained


def test_uncontained_names_escapes_and_links(tmp_path: Path) -> None:
    kernels = tmp_path / "kernels"
    (kernels / "a").mkdir(parents=True)
    (kernels / "a/x.cu").write_text("x")
    outside = tmp_path / "outside.cu"
    outside.write_text("o")
    (kernels / "a/link.cu").symlink_to(outside)
    bad = dict(uncontained(kernels, [kernels / "a/x.cu", outside, kernels / "a/link.cu"]))
    assert set(bad) == {outside, kernels / "a/link.cu"}
    assert "outside kernels/" in bad[outside]
    assert "symlink" in bad[kernels / "a/link.cu"]
