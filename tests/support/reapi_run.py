"""Run one REAPI Action the way a remote worker does (the test worker's core; BuildGrid venv).

:func:`run_action` takes an Action already fetched, and:

- materialises the input root from the CAS into a fresh directory (files with their executable
  bit, nested directories, symlinks), so the command sees only what was uploaded, by relative
  path;
- creates the parent directories of the declared outputs (``output_paths``, or
  ``output_files`` + ``output_directories`` from REAPI 2.0 clients);
- runs ``arguments`` in ``root/working_directory`` with exactly the Command's environment
  (nothing inherited; an unqualified ``argv[0]`` is looked up on the Command's ``PATH``, or
  ``/bin:/usr/bin`` without one, as ``execvp`` does), stdin empty, in a process group of its own;
- kills the whole group when ``Action.timeout`` passes (then the status is
  ``DEADLINE_EXCEEDED`` and the result holds what the command wrote until then), and kills
  whatever the command left running in its group once it exits;
- stores stdout, stderr (``stdout_digest``/``stderr_digest``; also ``*_raw`` when asked) and
  the outputs in the CAS: regular files with ``is_executable``, directories as ``Tree``
  blobs, symlinks as ``output_symlinks`` (and the REAPI 2.0 fields when the client used them).

A non-zero exit is a normal result (status OK). A process killed by signal N reports
exit code ``128 + N``, as a shell would. Status codes that are not OK, and why: a missing,
corrupt or malformed input blob is ``FAILED_PRECONDITION`` with a ``PreconditionFailure``
naming the blob (type ``MISSING``, subject ``blobs/<hash>/<size>``: REAPI's signal to re-upload);
an ``argv[0]`` that cannot be executed is ``FAILED_PRECONDITION`` too (not cached); a path
that leaves the input root is ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)
from buildgrid._protos.google.rpc import code_pb2, error_details_pb2, status_pb2
from google.protobuf.timestamp_pb2 import Timestamp

from tests.support.reapi_cas import BlobError, Cas, digest_of, materialise, tree_of

__all__ = ["ActionRun", "Cancelled", "run_action"]

#: How often a running command is polled (and the heartbeat callback called), seconds.
POLL_S = 0.05


class Cancelled(Exception):
    """The heartbeat said the lease is gone (cancelled or reassigned): the command was killed."""


@dataclass(slots=True)
class ActionRun:
    """What running an Action produced: the lease status and, when it ran, its result."""

    status: status_pb2.Status
    result: re_pb2.ActionResult | None = None
    #: Wall seconds per phase, for the worker's event log.
    phases: dict[str, float] = field(default_factory=dict)


def _now() -> Timestamp:
    stamp = Timestamp()
    stamp.GetCurrentTime()
    return stamp


def _status(code: int, message: str, *, missing: str | None = None) -> status_pb2.Status:
    status = status_pb2.Status(code=code, message=message)
    if missing is not None:
        failure = error_details_pb2.PreconditionFailure()
        failure.violations.add(type="MISSING", subject=missing, description=message)
        status.details.add().Pack(failure)
    return status


def _inside(base: Path, relative: str, what: str) -> Path:
    """``base / relative`` for a relative POSIX path that stays below ``base``."""
    pure = PurePosixPath(relative)
    if pure.is_absolute() or ".." in pure.parts:
        raise ValueError(f"{what} {relative!r} leaves the input root")
    return base.joinpath(*pure.parts)


def run_action(
    cas: Cas,
    action: re_pb2.Action,
    scratch: Path,
    *,
    worker: str,
    inline_stdio: bool = False,
    tick: Callable[[], bool] = lambda: True,
    spawned: Callable[[int], None] = lambda pid: None,
) -> ActionRun:
    """Run ``action`` in the empty directory ``scratch``; never raises for the action's faults.

    ``tick`` is called every :data:`POLL_S` while the command runs (the worker heartbeats from
    it); when it returns False the command's group is killed and :class:`Cancelled` raised.
    ``spawned`` gets the command's PID (= its process group) once it started.
    """
    meta = re_pb2.ExecutedActionMetadata(worker=worker)
    meta.worker_start_timestamp.CopyFrom(_now())
    run = ActionRun(status=_status(code_pb2.OK, ""))
    try:
        meta.input_fetch_start_timestamp.CopyFrom(_now())
        started = time.monotonic()
        command = cas.read_message(action.command_digest, re_pb2.Command)
        root = scratch / "root"
        materialise(cas, action.input_root_digest, root)
        cwd = _inside(root, command.working_directory, "working_directory")
        outputs = _declared_outputs(command)
        for path in outputs:
            _inside(cwd, path, "output path").parent.mkdir(parents=True, exist_ok=True)
        meta.input_fetch_completed_timestamp.CopyFrom(_now())
        run.phases["fetch"] = time.monotonic() - started
    except BlobError as exc:
        return ActionRun(
            status=_status(code_pb2.FAILED_PRECONDITION, str(exc), missing=exc.subject)
        )
    except ValueError as exc:
        return ActionRun(status=_status(code_pb2.INVALID_ARGUMENT, str(exc)))

    env = {v.name: v.value for v in command.environment_variables}
    timeout = action.timeout.ToTimedelta().total_seconds() if action.HasField("timeout") else 0.0
    meta.execution_start_timestamp.CopyFrom(_now())
    started = time.monotonic()
    with open(scratch / "stdout", "wb") as out, open(scratch / "stderr", "wb") as err:
        try:
            proc = subprocess.Popen(
                list(command.arguments),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            return ActionRun(
                status=_status(
                    code_pb2.FAILED_PRECONDITION,
                    f"cannot execute {command.arguments[0]!r}: {exc.strerror}",
                )
            )
        spawned(proc.pid)
        timed_out = _wait(proc, timeout, tick)
    meta.execution_completed_timestamp.CopyFrom(_now())
    run.phases["execute"] = time.monotonic() - started
    if timed_out:
        run.status = _status(
            code_pb2.DEADLINE_EXCEEDED, f"the action ran past its timeout of {timeout:g} s"
        )

    meta.output_upload_start_timestamp.CopyFrom(_now())
    started = time.monotonic()
    result = _collect(cas, command, cwd, outputs, scratch, inline_stdio)
    result.exit_code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    meta.output_upload_completed_timestamp.CopyFrom(_now())
    meta.worker_completed_timestamp.CopyFrom(_now())
    result.execution_metadata.CopyFrom(meta)
    run.phases["upload"] = time.monotonic() - started
    run.result = result
    return run


def _declared_outputs(command: re_pb2.Command) -> list[str]:
    if command.output_paths:
        return list(command.output_paths)
    return [*command.output_files, *command.output_directories]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _wait(
    proc: subprocess.Popen[bytes],
    timeout: float,
    tick: Callable[[], bool],
) -> bool:
    """Wait for ``proc``; True if it was killed for running past ``timeout`` (0: none)."""
    started = time.monotonic()
    timed_out = False
    try:
        while proc.poll() is None:
            if timeout and time.monotonic() - started >= timeout:
                timed_out = True
                break
            if not tick():
                raise Cancelled()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=POLL_S)
    finally:
        # The command's leftovers (background children) die with it, and so does the command
        # itself when the worker is interrupted.
        _kill_group(proc)
        proc.wait()
    return timed_out


def _collect(
    cas: Cas,
    command: re_pb2.Command,
    cwd: Path,
    outputs: list[str],
    scratch: Path,
    inline_stdio: bool,
) -> re_pb2.ActionResult:
    result = re_pb2.ActionResult()
    stdout = (scratch / "stdout").read_bytes()
    stderr = (scratch / "stderr").read_bytes()
    blobs: list[bytes] = [stdout, stderr]
    legacy = not command.output_paths
    legacy_dirs = set(command.output_directories)
    for path in sorted(set(outputs)):
        full = cwd.joinpath(*PurePosixPath(path).parts)
        try:
            st = full.lstat()
        except FileNotFoundError:
            continue  # an output the command did not make is simply absent
        if full.is_symlink():
            link = re_pb2.OutputSymlink(path=path, target=os.readlink(full))
            if not legacy:
                result.output_symlinks.append(link)
            elif path in legacy_dirs:
                result.output_directory_symlinks.append(link)
            else:
                result.output_file_symlinks.append(link)
        elif full.is_dir():
            tree = tree_of(full)
            data = tree.tree_message().SerializeToString()
            blobs.extend([data, *tree.files.values()])
            out_dir = result.output_directories.add(path=path)
            out_dir.tree_digest.CopyFrom(digest_of(data))
        else:
            data = full.read_bytes()
            blobs.append(data)
            out_file = result.output_files.add(path=path, is_executable=bool(st.st_mode & 0o100))
            out_file.digest.CopyFrom(digest_of(data))
    digests = cas.upload(blobs)
    result.stdout_digest.CopyFrom(digests[0])
    result.stderr_digest.CopyFrom(digests[1])
    if inline_stdio:
        result.stdout_raw = stdout
        result.stderr_raw = stderr
    return result
