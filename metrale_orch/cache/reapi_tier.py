"""A REAPI action cache and CAS as the cache's remote tier (``cache = "grpc://…"``).

Each cache object (the bytes the local tier holds: header, outputs, their hashes) is
one CAS blob, found through one action-cache entry: the ActionResult of a synthetic
Action whose Command names the object's path (namespace, schema, key), with the
object as its one output file, ``object``. Any REAPI cache serves it (bazel-remote,
BuildBuddy, BuildGrid, Buildbarn): the CAS blob is uploaded before the ActionResult
(bazel-remote refuses an entry whose blobs are missing), and a read fetches the
ActionResult, then the blob, verified against its SHA-256, then decoded and verified
by the cache like any object of any tier (key, header, every output's hash). The
action cache has no delete: a corrupt entry is refused, never removed.

Errors are those of the fsspec stores, so :class:`~metrale_orch.cache.bucket.RemoteStore`
keeps one circuit breaker and one set of warnings for every kind of remote:
``PermissionError`` for refused credentials, ``CorruptObject`` for a blob that fails
its digest, ``OSError`` for the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from metrale_orch.cache.objects import CorruptObject, ObjectTooLarge

if TYPE_CHECKING:
    from metrale_orch.remote.client import RemoteClient
    from metrale_orch.remote.digest import Digest
    from metrale_orch.remote.merkle import InputRoot

__all__ = ["OBJECT_OUTPUT", "ReapiObjects"]

T = TypeVar("T")

#: The output file name of an object's ActionResult.
OBJECT_OUTPUT = "object"


@functools.cache
def _empty_root() -> InputRoot:
    """The empty input root every object's synthetic action has (built once)."""
    from metrale_orch.remote.merkle import build_input_root

    return build_input_root({})


class ReapiObjects:
    """Objects in a REAPI cache, by path (see the module docstring). Thread-safe."""

    def __init__(self, client: RemoteClient) -> None:
        self.client = client

    def action_of(self, path: str) -> Digest:
        """The synthetic Action digest that keys ``path``'s object (pure but for protobuf)."""
        from metrale_orch.remote.action import encode_action

        return encode_action(
            ["metrale-orch-cache-object", path], {}, "", [OBJECT_OUTPUT], _empty_root(), {}, None
        ).digest

    def get(self, path: str, max_size: int) -> bytes | None:
        """The object at ``path`` (at most ``max_size`` bytes), or None when absent."""
        from metrale_orch.remote.wire import from_message

        result = self._call(lambda: self.client.get_action_result(self.action_of(path)))
        if result is None:
            return None
        files = [f for f in result.output_files if f.path == OBJECT_OUTPUT]
        if not files:
            raise CorruptObject(f"the action cache entry of {path} names no {OBJECT_OUTPUT!r}")
        digest = from_message(files[0].digest)
        if digest.size > max_size:
            raise ObjectTooLarge(f"{digest.size} bytes, above the {max_size}-byte limit")
        return self._call(lambda: self.client.download(digest))

    def put(self, path: str, data: bytes) -> bool:
        """Publish ``data`` at ``path``: the blob first, then the action cache entry."""
        from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
        from metrale_orch.remote.digest import digest_bytes
        from metrale_orch.remote.wire import digest_message

        digest = digest_bytes(data)
        result = re_pb2.ActionResult(
            output_files=[re_pb2.OutputFile(path=OBJECT_OUTPUT, digest=digest_message(digest))],
            exit_code=0,
        )
        action = self.action_of(path)
        self._call(
            lambda: self.client.update_action_result(action, result, blobs={digest: data}),
            missing_is_absent=False,
        )
        return True

    def close(self) -> None:
        self.client.close()

    def _call(self, fn: Callable[[], T], *, missing_is_absent: bool = True) -> T:
        """``fn()`` with the client's errors as the fsspec stores raise theirs."""
        from metrale_orch.remote.errors import (
            BlobMissing,
            CapabilityError,
            CorruptBlob,
            RemoteAuthError,
            RemoteError,
        )

        try:
            return fn()
        except RemoteAuthError as exc:
            raise PermissionError(str(exc)) from None
        except CorruptBlob as exc:
            raise CorruptObject(str(exc)) from None
        except BlobMissing as exc:
            if not missing_is_absent:
                raise OSError(str(exc)) from None
            # An entry whose blob is gone (evicted): nothing to serve, a miss.
            raise FileNotFoundError(str(exc)) from None
        except CapabilityError as exc:
            raise PermissionError(str(exc)) from None
        except RemoteError as exc:
            raise OSError(str(exc)) from None
