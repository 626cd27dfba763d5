"""Helpers the tests of cache hardening share (the in-process ones in ``tests/unit/cache/``,
the ones that start processes in ``tests/scenarios/cache/``; moved from
``tests/test_cache_hardening.py``).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from metrale_orch.cache import (
    CacheSettings,
    cache_key,
)

META = {"command": ["nvcc"], "toolchain": "nvcc 13.0", "producer": "t", "compile_seconds": 1.0}
OUTPUTS = {"m.ptx": b".version 9.0\n" * 20}


def _key(label: str = "") -> str:
    return cache_key("", {"label": label, "id": uuid.uuid4().hex})


def _path(local_dir: Path, key: str) -> Path:
    return local_dir / "objects" / key[:2] / key


def _settings(tmp_path: Path, name: str = "cache", **kw: Any) -> CacheSettings:
    return CacheSettings(local_dir=tmp_path / name, **kw)
