"""Helpers the tests of the steps area share, the in-process ones (``tests/unit/steps/``) and
the ones that start processes (``tests/scenarios/steps/``) alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from metrale_orch.steps.profile import Span
from metrale_orch.steps.results import TargetResult
from metrale_orch.steps.target import build_target
from metrale_orch.steps.trace import TraceEvents
from metrale_orch.tree import Target
from tests.support.build import make_cache, make_config, small_tree

T = Target(hardware="hw1", model="m1", quant="q1")


def trace_of(
    spans: Iterable[Span], *, origin_ns: int, main_pid: int
) -> tuple[dict[str, object], bytes]:
    """The profile document of ``spans`` and its bytes, as the reporter makes them (the
    spans handed over as they travel)."""
    trace = TraceEvents(origin_ns)
    trace.add(s.to_dict() for s in spans)
    return trace.document(main_pid)


def _build(
    root: Path, env: dict[str, str], cache_dir: Path, target: Target = T, **kw: Any
) -> TargetResult:
    config = make_config(root, cache_dir)
    cache = kw.pop("cache", make_cache(config))
    return build_target(root, target, config=config, cache=cache, environ=env, **kw)


COMMON_SCALE = (
    '#define SCALE_FAST scale_fast\n#include "scale_impl.cuh"\n'
    'extern "C" __global__ void scale() {}\n'
)


LEAF_TOML = (
    '[build]\nextra_nvcc_flags = ["-DC=1", "-DB=1"]\n[modules]\nscale = "scale_q1"\n'
    '[shadow]\nscale = "a leaf scale"\n'
)


def _fork_tree(root: Path, leaf_toml: str = LEAF_TOML, extra: dict[str, str] | None = None) -> Path:
    """small_tree with a leaf scale.cu that drops scale_fast from its common namesake."""
    return small_tree(
        root,
        {
            "kernels/hw1/common/scale.cu": COMMON_SCALE,
            "kernels/hw1/common/scale_impl.cuh": (
                'extern "C" __global__ void SCALE_FAST(float* x) {}\n'
            ),
            "kernels/hw1/m1/q1/scale.cu": 'extern "C" __global__ void scale() {}\n',
            "kernels/hw1/m1/q1/KERNEL.toml": leaf_toml,
            **(extra or {}),
        },
    )


STATE = Path("build") / ".state"


#: What a CI cache or a hand could leave in the kept files, as JSON text.
POISON = {
    "nan": '{"schema": 1, "targets": {"hopper/qwen3/bf16": NaN, "hopper/qwen3/nvfp4": 1}}',
    "infinity": '{"schema": 1, "targets": {"hopper/qwen3/bf16": Infinity}}',
    "negative": '{"schema": 1, "targets": {"hopper/qwen3/bf16": -50, "hopper/llama/bf16": -1}}',
    "huge": '{"schema": 1, "targets": {"hopper/qwen3/bf16": 1e308, "hopper/llama/bf16": 1e308}}',
    "huge-int": '{"schema": 1, "targets": {"hopper/qwen3/bf16": 1' + "0" * 400 + "}}",
    "deep": '{"schema": 1, "targets": ' + "[" * 100_000 + "]" * 100_000 + "}",
}
