"""Helpers the tests of cache share (the in-process ones in ``tests/unit/cache/``, the ones
that start processes in ``tests/scenarios/cache/``).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from metrale_orch.cache import (
    CacheSettings,
    cache_key,
)

META = {"command": ["nvcc"], "toolchain": "nvcc 13.0", "producer": "test", "compile_seconds": 2.0}


def _key(label: str = "") -> str:
    return cache_key("", {"label": label, "n": uuid.uuid4().hex})


def _local(tmp_path: Path, **kw: Any) -> CacheSettings:
    return CacheSettings(local_dir=tmp_path / "cache", **kw)
