"""What the stack's probe is asked to run, and what came back: typed values over its JSON.

:class:`ProbeAction` becomes the ``action`` of a :mod:`tests.support.reapi_probe` ``execute``
op (:meth:`ProbeAction.to_dict`); :class:`ExecuteOutcome` and :class:`BlobRead` are read from
its results. Plain values, no I/O (the probe runs in the BuildGrid venv, these in the tests).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["BlobRead", "ExecuteOutcome", "ProbeAction"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _empty() -> Mapping[str, Any]:
    return _EMPTY


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeAction:
    """An Action to build, upload and Execute: its input root, Command and Action fields."""

    argv: tuple[str, ...]
    #: The Command's environment: all the worker's command gets.
    env: Mapping[str, str] = field(default_factory=_empty)
    #: The input root's files by relative POSIX path.
    files: Mapping[str, bytes] = field(default_factory=_empty)
    #: Which of ``files`` are executable.
    executables: frozenset[str] = frozenset()
    symlinks: Mapping[str, str] = field(default_factory=_empty)
    #: Empty directories to include.
    directories: tuple[str, ...] = ()
    working_directory: str = ""
    output_paths: tuple[str, ...] = ()
    #: REAPI 2.0 outputs (workers create their parents; ``output_paths`` wins when set).
    output_files: tuple[str, ...] = ()
    output_directories: tuple[str, ...] = ()
    platform: Mapping[str, Sequence[str]] = field(default_factory=_empty)
    #: ``Action.timeout`` (0: none).
    timeout_s: float = 0.0
    do_not_cache: bool = False
    #: ``Action.salt``: a different action with everything else equal.
    salt: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The probe's JSON form."""
        return {
            "argv": list(self.argv),
            "env": dict(sorted(self.env.items())),
            "files": {
                path: {"data_b64": _b64(data), "executable": path in self.executables}
                for path, data in sorted(self.files.items())
            },
            "symlinks": dict(sorted(self.symlinks.items())),
            "directories": list(self.directories),
            "working_directory": self.working_directory,
            "output_paths": list(self.output_paths),
            "output_files": list(self.output_files),
            "output_directories": list(self.output_directories),
            "platform": {k: sorted(v) for k, v in sorted(self.platform.items())},
            "timeout": self.timeout_s,
            "do_not_cache": self.do_not_cache,
            "salt": self.salt,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteOutcome:
    """One Execute as the client saw it.

    ``rpc_code`` is the Execute call's own outcome ("OK" when the stream ended with a done
    operation, else the gRPC code, e.g. "DEADLINE_EXCEEDED" for a client deadline);
    ``status_code`` the ExecuteResponse's status ("" when none came).
    """

    action_hash: str
    action_size: int
    rpc_code: str
    rpc_message: str
    status_code: str
    status_message: str
    #: ``PreconditionFailure`` MISSING subjects (``blobs/<hash>/<size>``).
    missing: tuple[str, ...]
    cached_result: bool
    #: None when no ActionResult came back.
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    stdout_inline: bool
    outputs: Mapping[str, bytes]
    executables: frozenset[str]
    symlinks: Mapping[str, str]
    worker: str
    #: The ExecuteOperationMetadata stages seen, in order (QUEUED, EXECUTING, COMPLETED, ...).
    stages: tuple[str, ...]
    elapsed_s: float
    #: The uploaded input files' digest hashes, by path.
    input_files: Mapping[str, str]
    #: ExecutedActionMetadata timestamps (seconds since the epoch), by field name.
    timestamps: Mapping[str, float] = field(default_factory=_empty)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExecuteOutcome:
        result: Mapping[str, Any] = data.get("result") or {}
        outputs = result.get("outputs", {})
        return cls(
            action_hash=data["action_digest"]["hash"],
            action_size=int(data["action_digest"]["size"]),
            rpc_code=data.get("rpc_code", "OK"),
            rpc_message=data.get("rpc_message", ""),
            status_code=data.get("status_code", ""),
            status_message=data.get("status_message", ""),
            missing=tuple(data.get("missing", ())),
            cached_result=bool(data.get("cached_result", False)),
            exit_code=result.get("exit_code") if result else None,
            stdout=_unb64(result.get("stdout_b64", "")),
            stderr=_unb64(result.get("stderr_b64", "")),
            stdout_inline=bool(result.get("stdout_inline", False)),
            outputs=MappingProxyType({p: _unb64(o["data_b64"]) for p, o in outputs.items()}),
            executables=frozenset(p for p, o in outputs.items() if o["executable"]),
            symlinks=MappingProxyType(dict(result.get("symlinks", {}))),
            worker=result.get("worker", ""),
            stages=tuple(data.get("stages", ())),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            input_files=MappingProxyType(dict(data.get("input_files", {}))),
            timestamps=MappingProxyType(dict(result.get("timestamps", {}))),
        )

    @property
    def ok(self) -> bool:
        """The call and the execution succeeded (whatever the exit code)."""
        return self.rpc_code == "OK" and self.status_code == "OK"


@dataclass(frozen=True, slots=True, kw_only=True)
class BlobRead:
    """A blob as the server served it: the call's code and message, and the bytes."""

    code: str
    message: str
    data: bytes

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BlobRead:
        return cls(
            code=data.get("rpc_code") or data.get("status_code", ""),
            message=data.get("rpc_message") or data.get("status_message", ""),
            data=_unb64(data.get("data_b64", "")),
        )
