"""The REAPI client's errors: what the caller may fall back from, and what it must fix.

- :class:`RemoteUnavailable`: infrastructure trouble (unreachable, no answer within
  the deadline, overloaded (:class:`RemoteOverloaded`), the connection lost, no worker
  took the action, the server's own UNAVAILABLE). The caller may run the action locally instead; the
  ``reason`` is short and human ("unreachable: grpc://127.0.0.1:9 (connection refused)").
- :class:`RemoteAuthError`: the server refused the credentials (UNAUTHENTICATED,
  PERMISSION_DENIED); the message names the header setting to fix.
- :class:`RemoteRejected`: the server refused a request as malformed or out of
  precondition (INVALID_ARGUMENT, FAILED_PRECONDITION, ...), :class:`BlobMissing`
  a blob it should have, :class:`CorruptBlob` an answer that failed verification
  (never returned), :class:`CapabilityError` a server that lacks what the client needs.
- Misuse, found before anything is sent: :class:`RemoteConfigError`,
  :class:`InputRootError`, :class:`ActionSpecError`, :class:`BlobChanged` (an input
  file changed after it was hashed), :class:`MissingResultBlobs`.

A missing ``remote`` extra (grpcio, protobuf) is :class:`~metrale_orch.extras.ExtraMissing`,
as every other missing optional part is.

An action that ran and exited non-zero is a result, never an error.
"""

from __future__ import annotations

from metrale_orch.errors import FileProblem, MetraleError

__all__ = [
    "ActionSpecError",
    "BlobChanged",
    "BlobMissing",
    "CapabilityError",
    "CorruptBlob",
    "InputRootError",
    "MissingResultBlobs",
    "RemoteAuthError",
    "RemoteConfigError",
    "RemoteError",
    "RemoteOverloaded",
    "RemoteRejected",
    "RemoteUnavailable",
]


class RemoteError(MetraleError):
    """Base of the REAPI client's errors."""

    exit_code = 1


class RemoteUnavailable(RemoteError):
    """The remote cannot serve now (see the module docstring); falling back is safe."""

    url: str
    reason: str

    template = "remote execution {url}: {reason}"


class RemoteOverloaded(RemoteUnavailable):
    """The server refused a call as overloaded (RESOURCE_EXHAUSTED): asking again later,
    and sending fewer at once, serves."""


class RemoteAuthError(RemoteError):
    """The server refused the credentials sent (or their absence)."""

    url: str
    code: str
    detail: str
    headers: tuple[str, ...]

    def __str__(self) -> str:
        sent = f"sent headers: {', '.join(self.headers)}" if self.headers else "no auth header sent"
        return (
            f"remote execution {self.url} refused the credentials ({self.code}: {self.detail}; "
            f"{sent}): set the API key header in the remote headers setting "
            "(e.g. x-buildbuddy-api-key=...) or fix its permissions"
        )


class RemoteRejected(RemoteError):
    """The server refused a request (not an outage: retrying the same request fails again)."""

    url: str
    call: str
    code: str
    detail: str

    template = "remote execution {url}: {call} refused ({code}: {detail})"


class BlobMissing(RemoteError):
    """A blob the server should hold is not in its CAS."""

    url: str
    digest: str

    template = "remote execution {url}: blob {digest} is not in the CAS"


class CorruptBlob(RemoteError):
    """A downloaded blob does not match its digest; it is never returned or kept."""

    url: str
    digest: str
    got: str

    template = "remote execution {url}: blob {digest} failed verification (received {got})"


class CapabilityError(RemoteError):
    """The server lacks something the client needs (SHA-256, execution, AC updates)."""

    url: str
    problem: str

    template = "remote execution {url}: {problem}"


class RemoteConfigError(RemoteError):
    """A remote setting (the URL, a header, the CA file) cannot be used as given."""

    exit_code = 2
    what: str
    problem: str

    template = "remote execution {what}: {problem}"


class InputRootError(FileProblem, RemoteError):
    """An input path cannot go into a REAPI input root."""

    exit_code = 2

    template = "input root: {path!r}: {problem}"


class ActionSpecError(RemoteError):
    """A Command or Action field cannot be encoded as REAPI requires."""

    exit_code = 2
    what: str
    problem: str

    template = "remote action {what}: {problem}"


class BlobChanged(RemoteError):
    """A file changed between hashing it and uploading it."""

    path: str
    digest: str

    template = (
        "{path}: changed after it was hashed ({digest} expected); nothing was uploaded for it"
    )


class MissingResultBlobs(RemoteError):
    """An ActionResult names blobs the CAS lacks (upload them before the result)."""

    url: str
    missing: tuple[str, ...]

    def __str__(self) -> str:
        shown = ", ".join(self.missing[:3]) + (" ..." if len(self.missing) > 3 else "")
        return (
            f"remote execution {self.url}: the action result names {len(self.missing)} "
            f"blob(s) the CAS lacks ({shown}); upload them first"
        )
