"""What a cache needs: :class:`CacheSettings`, checked on construction (pure).

Built from a project's :class:`~metrale_orch.config.Config` or by hand in tests;
frozen, with ``storage_options`` held as a read-only mapping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from metrale_orch.cache.bucket import RemoteStore
from metrale_orch.cache.errors import CacheSettingsError, TrustedKeyError
from metrale_orch.cache.local import DEFAULT_MAX_OBJECT_SIZE
from metrale_orch.config import (
    CACHE_MODES,
    Config,
    key_line_name,
    key_line_problem,
    source_label,
)

__all__ = ["CacheSettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSettings:
    """Everything a cache needs; build one with :meth:`from_config` or by hand in tests."""

    local_dir: Path
    #: fsspec URL of the remote tier, "" for none.
    remote: str = ""
    mode: str = "read-write"
    namespace: str = ""
    #: Deadline in seconds of every remote call.
    timeout: float = 2.0
    storage_options: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    #: Consecutive failures (after a first success) that switch the remote off.
    failure_threshold: int = 3
    #: Upload in a background thread (``Cache.close`` waits); False: upload inside ``put``.
    background_uploads: bool = True
    #: The largest object stored or read, in bytes: a bigger one is refused, never read whole.
    max_object_size: int = DEFAULT_MAX_OBJECT_SIZE
    #: Public key lines; set: a remote entry is served only when one of them signed it.
    trusted_keys: tuple[str, ...] = ()
    #: The private key what this cache publishes is signed with (PEM text or a file's
    #: path; "" for none). Secret: never in ``repr``.
    signing_key: str = field(default="", repr=False)
    #: Where ``signing_key`` was set, for messages (its file or variable, never its text).
    signing_key_where: str = "cache_signing_key"
    #: This user's own key, which signs what is compiled here when no ``signing_key`` is
    #: set and trusted keys are (:func:`~metrale_orch.config.default_local_key`: under the
    #: user's configuration directory, never the local cache, which others may share).
    #: None: none, so such entries are unsigned and not served on later runs.
    local_key: Path | None = None

    def __post_init__(self) -> None:
        if self.mode not in CACHE_MODES:
            raise CacheSettingsError("mode", self.mode, f"must be one of {', '.join(CACHE_MODES)}")
        if isinstance(self.timeout, bool) or not (
            isinstance(self.timeout, int | float)
            and math.isfinite(self.timeout)
            and self.timeout > 0
        ):
            raise CacheSettingsError("timeout", self.timeout, "must be a positive number")
        if isinstance(self.failure_threshold, bool) or not (
            isinstance(self.failure_threshold, int) and self.failure_threshold >= 1
        ):
            raise CacheSettingsError("failure_threshold", self.failure_threshold, "must be >= 1")
        if isinstance(self.max_object_size, bool) or not (
            isinstance(self.max_object_size, int) and self.max_object_size >= 1
        ):
            raise CacheSettingsError(
                "max_object_size", self.max_object_size, "must be a positive number of bytes"
            )
        for i, line in enumerate(self.trusted_keys):
            text = line if isinstance(line, str) else ""
            problem = key_line_problem(text) if text else "not a public key line"
            if problem:  # never quoted: it may be a private key
                raise TrustedKeyError(key_line_name(i, text), problem)
        object.__setattr__(self, "trusted_keys", tuple(sorted(set(self.trusted_keys))))
        object.__setattr__(self, "local_dir", Path(self.local_dir))
        if self.local_key is not None:
            object.__setattr__(self, "local_key", Path(self.local_key))
        object.__setattr__(self, "storage_options", MappingProxyType(dict(self.storage_options)))

    @classmethod
    def from_config(cls, config: Config) -> CacheSettings:
        """The settings of a project's :class:`~metrale_orch.config.Config`."""
        return cls(
            local_dir=config.local_cache,
            remote=config.cache,
            mode=config.cache_mode,
            namespace=config.cache_namespace,
            timeout=config.cache_timeout,
            storage_options=config.storage_options,
            trusted_keys=config.cache_trusted_keys,
            signing_key=config.cache_signing_key,
            signing_key_where=source_label(config, "cache_signing_key"),
            local_key=config.local_key,
        )

    def remote_store(self, *, writable: bool, warn: Callable[[str], None]) -> RemoteStore:
        """The store of the remote tier (``remote`` must be set), its deadline, failure
        threshold and object size bound from these settings."""
        return RemoteStore(
            self.remote or "",
            storage_options=self.storage_options,
            namespace=self.namespace,
            timeout=float(self.timeout),
            failure_threshold=self.failure_threshold,
            writable=writable,
            warn=warn,
            max_size=self.max_object_size,
        )
