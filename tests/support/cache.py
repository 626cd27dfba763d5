"""Helpers the tests of the cache area share, the in-process ones (``tests/unit/cache/``) and
the ones that start processes (``tests/scenarios/cache/``) alike.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from metrale_orch.cache import CacheSettings, cache_key

META = {"command": ["nvcc"], "toolchain": "nvcc 13.0", "producer": "test", "compile_seconds": 2.0}


def _key(label: str = "") -> str:
    return cache_key("", {"label": label, "n": uuid.uuid4().hex})


def _local(tmp_path: Path, **kw: Any) -> CacheSettings:
    return CacheSettings(local_dir=tmp_path / "cache", **kw)


def _body(pem: bytes) -> str:
    """The base64 body of a PEM (its secret part), on one line."""
    return "".join(line for line in pem.decode().splitlines() if not line.startswith("-----"))


def leaks(text: str, pem: bytes) -> list[str]:
    """Every 8-character run of ``pem``'s body that ``text`` shows."""
    body = _body(pem)
    return sorted({body[i : i + 8] for i in range(len(body) - 7) if body[i : i + 8] in text})
