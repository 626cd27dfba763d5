"""REAPI ``Command`` and ``Action`` messages for one compile (pure; hashing only).

:func:`encode_action` is the canonical encoding: arguments as given, environment
variables sorted by name, output paths sorted, platform properties sorted by name
then value (set on both the ``Command`` and, for REAPI 2.2 servers, the ``Action``),
the working directory relative to the input root. The same compile always gets
the same action digest, which is what makes the remote action cache work. The
Command lists only the variables given: a worker sees nothing else (send ``PATH``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from google.protobuf import duration_pb2

from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.digest import Digest, digest_bytes
from metrale_orch.remote.errors import ActionSpecError
from metrale_orch.remote.merkle import Blob, InputRoot
from metrale_orch.remote.wire import digest_message

__all__ = ["ActionBlobs", "command_message", "encode_action", "platform_message"]


class ActionBlobs(NamedTuple):
    """An action's digest and every blob it needs in the CAS (command, action, inputs)."""

    digest: Digest
    blobs: Mapping[Digest, Blob]


def encode_action(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd_rel: str,
    outputs: Iterable[str],
    input_root: InputRoot,
    platform: Mapping[str, str] | Iterable[tuple[str, str]],
    timeout: float | None,
    *,
    do_not_cache: bool = False,
) -> ActionBlobs:
    """The Action of one compile and its blobs (see the module docstring).

    ``cwd_rel`` is the working directory inside the input root (``""`` for the root);
    ``outputs`` are relative to it. ``platform`` is a mapping or (name, value) pairs (a
    name may repeat). ``timeout`` is in seconds (None: the server's default). Raises
    :class:`ActionSpecError` for a field REAPI cannot carry.
    """
    command = command_message(argv, env, cwd_rel, outputs, platform)
    command_data = command.SerializeToString(deterministic=True)
    command_digest = digest_bytes(command_data)
    action = re_pb2.Action(
        command_digest=digest_message(command_digest),
        input_root_digest=digest_message(input_root.digest),
        do_not_cache=do_not_cache,
        platform=command.platform,
    )
    if timeout is not None:
        action.timeout.CopyFrom(_duration(timeout))
    action_data = action.SerializeToString(deterministic=True)
    action_digest = digest_bytes(action_data)
    blobs: dict[Digest, Blob] = dict(input_root.blobs)
    blobs[command_digest] = command_data
    blobs[action_digest] = action_data
    return ActionBlobs(action_digest, MappingProxyType(blobs))


def command_message(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd_rel: str,
    outputs: Iterable[str],
    platform: Mapping[str, str] | Iterable[tuple[str, str]],
) -> re_pb2.Command:
    """The canonical ``Command`` (pure); raises :class:`ActionSpecError`."""
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ActionSpecError("arguments", f"need a non-empty list of strings, not {argv!r}")
    for name in env:
        if not name or "=" in name or "\0" in name:
            raise ActionSpecError("environment", f"{name!r} is not a variable name")
    for text in (*argv, *env.values()):
        _check_text("arguments and environment", text)
    if cwd_rel:
        _check_relative("working directory", cwd_rel)
    paths = sorted(set(outputs))
    for path in paths:
        _check_relative("output path", path)
    return re_pb2.Command(
        arguments=list(argv),
        environment_variables=[
            re_pb2.Command.EnvironmentVariable(name=name, value=env[name]) for name in sorted(env)
        ],
        output_paths=paths,
        working_directory=cwd_rel,
        platform=platform_message(platform),
    )


def platform_message(
    platform: Mapping[str, str] | Iterable[tuple[str, str]],
) -> re_pb2.Platform:
    """Platform properties sorted by name, then value, duplicates dropped (pure)."""
    pairs = platform.items() if isinstance(platform, Mapping) else platform
    props = sorted({(str(name), str(value)) for name, value in pairs})
    for name, value in props:
        if not name:
            raise ActionSpecError("platform", f"a property has an empty name (value {value!r})")
        _check_text("platform", name + value)
    return re_pb2.Platform(properties=[re_pb2.Platform.Property(name=n, value=v) for n, v in props])


def _check_relative(what: str, path: str) -> None:
    if path.startswith("/") or any(p in ("", ".", "..") for p in path.split("/")):
        raise ActionSpecError(what, f"{path!r} must be a plain relative POSIX path")
    _check_text(what, path)


def _check_text(what: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ActionSpecError(what, f"{text!r} is not valid UTF-8") from None


def _duration(seconds: float) -> duration_pb2.Duration:
    if not math.isfinite(seconds) or seconds <= 0:
        raise ActionSpecError("timeout", f"{seconds!r} must be a positive number of seconds")
    nanos = round(seconds * 1e9)
    return duration_pb2.Duration(seconds=nanos // 10**9, nanos=nanos % 10**9)
