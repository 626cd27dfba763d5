"""Helpers the tests of secrets share (the in-process ones in ``tests/unit/cache/``, the
ones that start processes in ``tests/scenarios/cache/``).
"""

from __future__ import annotations


def _body(pem: bytes) -> str:
    """The base64 body of a PEM (its secret part), on one line."""
    return "".join(line for line in pem.decode().splitlines() if not line.startswith("-----"))


def leaks(text: str, pem: bytes) -> list[str]:
    """Every 8-character run of ``pem``'s body that ``text`` shows."""
    body = _body(pem)
    return sorted({body[i : i + 8] for i in range(len(body) - 7) if body[i : i + 8] in text})
