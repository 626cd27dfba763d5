"""A compile's remote form is complete and honest: run by a worker that sees only the
input root and the form's environment (a materialising test double of a REAPI worker),
every module of a real target compiles to the same bytes as here; what names or reads a
file outside the input root runs here instead, counted.

The tests of this topic that run in-process are in ``tests/unit/steps/test_remote_form.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from metrale_orch.executor import Action, LocalExecutor
from metrale_orch.proc import Completed
from metrale_orch.steps.remote_form import OUT_DIR
from metrale_orch.steps.session import BuildSession
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support import REPO
from tests.support.build import make_cache, make_config, small_tree

TARGET = "b300/qwen3-8b/bf16"


class MaterialisingWorker:
    """Runs an action's remote form as a REAPI worker would: the input root's files copied
    into a fresh directory, the form's environment only, outputs brought back in memory
    (as :class:`~metrale_orch.executor.reapi.ReapiBackend` brings them). Actions
    without a form, or whose form says why not, run locally (recorded)."""

    def __init__(self) -> None:
        self.local = LocalExecutor(2)
        self.remote: list[Action] = []
        self.ran_here: list[str] = []
        #: Per remote action, what its compile's temporary directory's parent held then.
        self.scratch_seen: list[list[str]] = []

    @property
    def jobs(self) -> int:
        return 2

    @property
    def running(self) -> int:
        return self.local.running

    def stop(self) -> None:
        self.local.stop()

    async def run(self, action: Action) -> Completed:
        form = action.remote
        if form is None or form.local_reason:
            self.ran_here.append(form.local_reason if form else "no form")
            return await self.local.run(action)
        self.remote.append(action)
        if action.scratch is not None:
            parent = action.scratch.parent
            self.scratch_seen.append(sorted(os.listdir(parent)) if parent.is_dir() else [])
        with tempfile.TemporaryDirectory() as tmp:
            top = Path(tmp)
            for rel in form.files:
                dest = top / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(form.root / rel, dest)
            for rel in form.outputs:
                (top / rel).parent.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            proc = subprocess.run(
                form.argv, cwd=top / form.cwd, env=dict(form.env), capture_output=True, text=True
            )
            outputs = {
                local: (top / rel).read_bytes()
                for rel, local in form.outputs.items()
                if (top / rel).is_file()
            }
        return Completed(
            argv=form.argv,
            returncode=proc.returncode,
            stdout=proc.stdout,
            stderr=proc.stderr,
            seconds=time.perf_counter() - start,
            where="remote",
            outputs=outputs,
        )


def _layout() -> Target:
    return Target.parse(TARGET)


def _artefacts(build_dir: Path) -> dict[str, bytes]:
    out = build_dir / TARGET
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.ptx"))}


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_remote_forms_compile_to_the_same_bytes(tmp_path: Path) -> None:
    environ = dict(os.environ)
    layout = _layout()
    here = make_config(REPO, tmp_path / "c1", build_dir=str(tmp_path / "local"))
    local = build_target(REPO, layout, config=here, cache=make_cache(here), environ=environ)
    assert not local.failures

    worker = MaterialisingWorker()
    there = make_config(REPO, tmp_path / "c2", build_dir=str(tmp_path / "remote"))
    session = BuildSession(worker, remote=True)
    result = build_target(
        REPO, layout, config=there, cache=make_cache(there), environ=environ, session=session
    )
    assert not result.failures, result.failures
    assert worker.ran_here == []
    assert len(worker.remote) == len(result.modules)
    for action in worker.remote:
        form = action.remote
        assert form is not None
        assert form.root == tmp_path / "remote" / "stage" / TARGET
        assert all(rel.startswith(f"{form.cwd}/{OUT_DIR}/") for rel in form.outputs)
        assert set(form.env) <= {"PATH", "NVCC_CCBIN", "CPATH", *environ}
        assert not any(str(tmp_path) in a for a in form.argv[1:])  # no machine path
        assert form.platform["metrale-toolchain"] == "nvcc"
    built = _artefacts(tmp_path / "remote")
    assert len(built) == len(result.modules) and built == _artefacts(tmp_path / "local")
    assert [m.key for m in result.modules] == [m.key for m in local.modules]
    # A remote compile's outputs come back in memory: no temporary directory was made.
    assert worker.scratch_seen == [[]] * len(worker.remote)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_what_the_root_cannot_hold_compiles_here(tmp_path: Path) -> None:
    """A header named through CPATH outside the tree is known before the compile: that
    module runs here. One the compiler found by an absolute path is seen in its
    dependency list after the remote compile: it is compiled again here."""
    environ = dict(os.environ)
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "unused_extra.h").write_text("#define UNUSED_EXTRA 1\n")
    layout = _layout()
    worker = MaterialisingWorker()
    config = make_config(REPO, tmp_path / "c", build_dir=str(tmp_path / "b"))
    result = build_target(
        REPO,
        layout,
        config=config,
        cache=make_cache(config),
        environ={**environ, "CPATH": str(inc)},
        session=BuildSession(worker, remote=True),
    )
    assert not result.failures, result.failures
    assert worker.remote == []
    assert worker.ran_here and all("CPATH names" in r for r in worker.ran_here), worker.ran_here


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_file_read_by_absolute_path_is_compiled_again_here(tmp_path: Path) -> None:
    """The include scanner cannot follow a computed ``#include`` to a file outside the
    tree, so no form can know of it; the remote compile's dependency list names it: the
    result is not used, the module compiles here, and this machine's compile is installed."""
    outside = tmp_path / "outside.h"
    outside.write_text("#define SCALE_BY 3.0f\n")
    root = small_tree(
        tmp_path / "proj",
        {
            "kernels/hw1/common/scale.cu": (
                f'#define OUTSIDE_HEADER "{outside}"\n#include OUTSIDE_HEADER\n'
                'extern "C" __global__ void scale(float* x) { x[0] *= SCALE_BY; }\n'
            )
        },
    )
    worker = MaterialisingWorker()
    config = make_config(root, tmp_path / "c", build_dir=str(tmp_path / "b"))
    result = build_target(
        root,
        Target.parse("hw1/m1/q1"),
        config=config,
        cache=make_cache(config),
        environ=dict(os.environ),
        session=BuildSession(worker, remote=True),
    )
    assert not result.failures, result.failures
    again = [r for r in worker.ran_here if "outside.h" in r]
    assert len(again) == 1 and "outside the input root" in again[0], worker.ran_here
    assert len(worker.remote) == len(result.modules)  # every module went out once
    ptx = (tmp_path / "b" / "hw1/m1/q1").rglob("scale*.ptx")
    assert any("3.0" in p.read_text() or "0f40400000" in p.read_text() for p in ptx)
