"""Helpers the tests of compile share (the in-process ones in ``tests/unit/steps/``, the
ones that start processes in ``tests/scenarios/steps/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metrale_orch.steps.results import TargetResult
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support.build import (
    make_cache,
    make_config,
)

T = Target(hardware="hw1", model="m1", quant="q1")


def _build(
    root: Path, env: dict[str, str], cache_dir: Path, target: Target = T, **kw: Any
) -> TargetResult:
    config = make_config(root, cache_dir)
    cache = kw.pop("cache", make_cache(config))
    return build_target(root, target, config=config, cache=cache, environ=env, **kw)
