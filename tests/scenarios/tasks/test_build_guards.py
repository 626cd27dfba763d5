"""Guards of the build itself: containment, leftovers of killed compiles, exact statistics.

The tests of this topic that run in-process are in
``tests/unit/tasks/test_build_guards.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from metrale_orch.steps.errors import ContainmentError
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support.build import fake_toolchain_env, make_cache, make_config, small_tree
from tests.support.project import doit

TARGET = Target.parse("hw1/m1/q1")


def _build(root: Path, tmp: Path) -> object:
    env = fake_toolchain_env(tmp / "bin", tmp / "log.jsonl")
    config = make_config(root, tmp / "cache")
    return build_target(root, TARGET, config=config, cache=make_cache(config), environ=env)


def test_a_symlinked_directory_is_refused_by_the_build(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "p")
    real = tmp_path / "elsewhere-common"
    (root / "kernels/hw1/common").rename(real)
    (root / "kernels/hw1/common").symlink_to(real, target_is_directory=True)
    with pytest.raises(ContainmentError, match=r"kernels/hw1/common.*symlink"):
        _build(root, tmp_path)
    assert not (root / "build/hw1/m1/q1/manifest.json").exists()


def test_a_redirect_out_of_kernels_names_the_model_toml_and_key(tmp_path: Path) -> None:
    """The build refuses the file the redirect reached and says where the fix is: the
    MODEL.toml (root-relative) and its [model] kernel_source."""
    root = small_tree(
        tmp_path / "p",
        {
            "kernels/hw1/m1/MODEL.toml": '[model]\nkernel_source = "../../outside/m1"\n',
            "outside/m1/MODEL.toml": "[model]\n",
            "outside/m1/q1/evil.cu": 'extern "C" __global__ void evil() {}\n',
        },
    )
    with pytest.raises(ContainmentError) as caught:
        _build(root, tmp_path)
    assert str(caught.value) == (
        "hw1/m1/q1: outside/m1/q1/evil.cu: lies outside kernels/; kernel trees build only "
        "their own files (reached through [model] kernel_source of kernels/hw1/m1/MODEL.toml); "
        "point that kernel_source at a model directory inside kernels/"
    )
    assert caught.value.via == "kernels/hw1/m1/MODEL.toml"
    assert not (root / "build/hw1/m1/q1/manifest.json").exists()


def test_leftovers_of_killed_compiles_are_swept(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "p")
    tmp_root = root / "build/.tmp"
    dead = tmp_root / "add.999999999.abc123"  # no such pid
    dead.mkdir(parents=True)
    (dead / "add.ptx").write_text("partial")
    mine = tmp_root / f"add.{os.getpid()}.keep"  # this process: maybe in use
    mine.mkdir()
    _build(root, tmp_path)
    assert not dead.exists()
    assert mine.exists()


@pytest.mark.slow
def test_statistics_are_exact_under_threads(fake_project: tuple[Path, dict[str, str]]) -> None:
    """``doit -n 4 -P thread``: each task counts only its own lookups (was ~4x inflated)."""
    root, env = fake_project
    run = doit(root, ["-n", "4", "-P", "thread", "build"], env)
    assert run.returncode == 0, run.text
    manifests = sorted((root / "build").glob("*/*/*/manifest.json"))
    modules = [m for p in manifests for m in json.loads(p.read_text())["modules"]]
    stats = json.loads((root / "build/cache-stats.json").read_text())
    compiled = sum(1 for m in modules if m["outcome"] == "compiled")
    assert stats["misses"] == compiled, (stats, compiled)
    assert stats["misses"] + stats["local_hits"] + stats["remote_hits"] <= len(modules)


def test_undecodable_keyed_variable_is_keyed_not_a_traceback(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "p")
    env = fake_toolchain_env(tmp_path / "bin", tmp_path / "log.jsonl")
    config = make_config(root, tmp_path / "cache")
    keys = []
    for value in (b"/tmp/\xffd", b"/tmp/\xfed"):
        result = build_target(
            root,
            TARGET,
            config=config,
            cache=make_cache(config),
            environ={**env, "CPATH": os.fsdecode(value)},
        )
        keys.append({m.name: m.key for m in result.modules})
    assert keys[0] != keys[1]  # distinct bytes stay distinct in the key
