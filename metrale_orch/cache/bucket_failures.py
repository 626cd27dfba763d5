"""How a call to a remote store failed: the tier's exceptions and the reading of errors.

fsspec's backends say the same thing in different ways (s3fs maps a 403 to
:class:`PermissionError` and NoSuchBucket to :class:`FileNotFoundError`; gcsfs says both
in words; botocore hides the service's code in ``response``). The functions here read
them (pure); :mod:`metrale_orch.cache.bucket` decides what each means for the breaker.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "MissingBucket",
    "RemoteFailure",
    "RemoteOff",
    "WriteRefused",
    "bucket_of",
    "describe",
    "error_code",
    "is_forbidden",
    "is_missing_bucket",
]


class RemoteFailure(Exception):
    """A remote call failed (``timeout`` True when it ran past its deadline)."""

    def __init__(self, detail: str, *, timeout: bool = False) -> None:
        self.detail = detail
        self.timeout = timeout
        super().__init__(detail)


class WriteRefused(Exception):
    """The store refused a write (403): the remote answered, so no breaker failure."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(str(cause))


class MissingBucket(Exception):
    """A create failed with "not found": on an object store, the bucket is missing."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(str(cause))


class RemoteOff(Exception):
    """The remote is switched off (breaker open, missing extra, bad URL)."""


def is_forbidden(exc: BaseException) -> bool:
    # s3fs maps 403 to PermissionError; gcsfs raises OSError("Forbidden: ...").
    return isinstance(exc, PermissionError) or (
        isinstance(exc, OSError) and str(exc).startswith("Forbidden")
    )


def describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 8:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def error_code(exc: BaseException) -> str:
    """The service's error code (botocore ``ClientError``) behind ``exc``, or ""."""
    for link in _chain(exc):
        response = getattr(link, "response", None)
        if isinstance(response, Mapping):
            error = response.get("Error")
            if isinstance(error, Mapping) and error.get("Code"):
                return str(error["Code"])
    return ""


def is_missing_bucket(exc: BaseException) -> bool:
    # s3fs maps NoSuchBucket to FileNotFoundError (like a missing key); gcsfs says it in words.
    if error_code(exc) == "NoSuchBucket":
        return True
    return any("bucket does not exist" in str(link).lower() for link in _chain(exc))


def bucket_of(url: str) -> str:
    rest = url.split("://", 1)[1] if "://" in url else url
    return rest.split("/", 1)[0]
