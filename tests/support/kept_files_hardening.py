"""Helpers the tests of kept files hardening share (the in-process ones in
``tests/unit/steps/``, the ones that start processes in ``tests/scenarios/steps/``).
"""

from __future__ import annotations

from pathlib import Path

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
