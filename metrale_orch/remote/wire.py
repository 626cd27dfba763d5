"""Between the client's values and REAPI messages: one home for the Digest conversion."""

from __future__ import annotations

from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.digest import Digest

__all__ = ["digest_message", "from_message"]


def digest_message(digest: Digest) -> re_pb2.Digest:
    """The REAPI ``Digest`` message of ``digest`` (pure)."""
    return re_pb2.Digest(hash=digest.hash, size_bytes=digest.size)


def from_message(message: re_pb2.Digest) -> Digest:
    """The :class:`Digest` of a REAPI ``Digest`` message (pure)."""
    return Digest(message.hash, message.size_bytes)
