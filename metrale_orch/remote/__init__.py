"""Remote execution over REAPI v2 (gRPC): the client, input roots, and action messages.

The package imports nothing heavy itself: grpcio and protobuf (the ``remote`` extra,
``pip install 'metrale-orch[remote]'``) are loaded on first use of a name below, and
only then, so the package works without the extra until a remote URL is configured.
That first use is the one place that turns a missing extra into
:class:`~metrale_orch.extras.ExtraMissing` (one line naming the extra).

Modules, bottom up: :mod:`~.errors` and :mod:`~.digest` (pure, no protobuf),
:mod:`~._proto` (generated stubs; :mod:`~.regen` writes them), :mod:`~.wire`,
:mod:`~.merkle` (input roots), :mod:`~.action` (Command and Action), :mod:`~.rpc`
(the channel and error mapping), :mod:`~.cas` and :mod:`~.execution` (the calls),
:mod:`~.client` (:class:`AsyncRemoteClient` on ``grpc.aio``, and :class:`RemoteClient`,
the same for synchronous callers on a private loop thread, :mod:`~.loop`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metrale_orch.extras import REMOTE, import_extra
from metrale_orch.remote.digest import EMPTY, Digest, digest_bytes, digest_file, parse_digest
from metrale_orch.remote.errors import (
    ActionSpecError,
    BlobChanged,
    BlobMissing,
    CapabilityError,
    CorruptBlob,
    InputRootError,
    MissingResultBlobs,
    RemoteAuthError,
    RemoteConfigError,
    RemoteError,
    RemoteRejected,
    RemoteUnavailable,
)

if TYPE_CHECKING:
    from metrale_orch.remote.action import ActionBlobs, encode_action
    from metrale_orch.remote.cas import UploadStats
    from metrale_orch.remote.client import AsyncRemoteClient, Capabilities, RemoteClient
    from metrale_orch.remote.execution import ExecuteResult, Timings
    from metrale_orch.remote.merkle import InputFile, InputRoot, MerkleMemo, build_input_root

__all__ = [
    "EMPTY",
    "ActionBlobs",
    "ActionSpecError",
    "AsyncRemoteClient",
    "BlobChanged",
    "BlobMissing",
    "Capabilities",
    "CapabilityError",
    "CorruptBlob",
    "Digest",
    "ExecuteResult",
    "InputFile",
    "InputRoot",
    "InputRootError",
    "MerkleMemo",
    "MissingResultBlobs",
    "RemoteAuthError",
    "RemoteClient",
    "RemoteConfigError",
    "RemoteError",
    "RemoteRejected",
    "RemoteUnavailable",
    "Timings",
    "UploadStats",
    "build_input_root",
    "digest_bytes",
    "digest_file",
    "encode_action",
    "parse_digest",
]

#: Names loaded on first use -> the module that defines them (each needs the extra).
_LAZY = {
    "ActionBlobs": "action",
    "encode_action": "action",
    "UploadStats": "cas",
    "AsyncRemoteClient": "client",
    "Capabilities": "client",
    "RemoteClient": "client",
    "ExecuteResult": "execution",
    "Timings": "execution",
    "InputFile": "merkle",
    "InputRoot": "merkle",
    "MerkleMemo": "merkle",
    "build_input_root": "merkle",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = import_extra(REMOTE, "remote execution", f"{__name__}.{module}")
    return getattr(loaded, name)
