"""A tiny REAPI client for the stack's own tests (runs in the BuildGrid venv).

``python -m tests.support.reapi_probe`` reads one JSON request on stdin,
``{"url": "grpc://127.0.0.1:PORT", "instance": "main", "ops": [op, ...]}``, runs the ops in
order on one channel and writes ``{"results": [result, ...]}`` on stdout. Bytes travel as
base64 (keys ending in ``_b64``). :mod:`tests.support.reapi` wraps it in typed calls; the
project's own client (``metrale_orch.remote``) is tested against the stack, not with this.

Ops (``"op"`` key):

- ``wait_ready`` ``{timeout}``: GetCapabilities until it answers; ``{ok, waited_s, error}``.
- ``execute`` ``{action, deadline, skip_cache_lookup}``: uploads the action's input root,
  Command and Action, calls Execute and follows the stream to the end or the deadline;
  ``action`` is :meth:`tests.support.reapi.ProbeAction.to_dict`'s form.
- ``read_blob`` ``{hash, size, via}``: one blob through ``batch`` (BatchReadBlobs) or
  ``bytestream``, unchecked: what the server sends.
- ``upload`` ``{data_b64, force}``: stores a blob (``force``: BatchUpdateBlobs even when
  FindMissingBlobs says the server has it).
- ``get_action_result`` ``{hash, size}`` / ``update_action_result`` ``{hash, size, exit_code}``.

Every failing call is reported as ``{"rpc_code": NAME, "rpc_message": ...}`` in its result,
never raised.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as re_grpc,
)
from buildgrid._protos.google.bytestream import bytestream_pb2 as bs_pb2
from buildgrid._protos.google.bytestream import bytestream_pb2_grpc as bs_grpc
from buildgrid._protos.google.rpc import code_pb2, error_details_pb2

from tests.support.reapi_cas import Cas, channel, digest_of, tree_of

__all__ = ["Probe", "main"]

Json = dict[str, Any]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _digest_json(digest: re_pb2.Digest) -> Json:
    return {"hash": digest.hash, "size": digest.size_bytes}


def _rpc_error(exc: grpc.RpcError) -> Json:
    return {"rpc_code": exc.code().name, "rpc_message": exc.details() or ""}


class Probe:
    """The ops of one request, on one channel."""

    def __init__(self, url: str, instance: str) -> None:
        self.instance = instance
        self.channel = channel(url)
        self.cas = Cas(self.channel, instance)
        self._caps = re_grpc.CapabilitiesStub(self.channel)
        self._exec = re_grpc.ExecutionStub(self.channel)
        self._ac = re_grpc.ActionCacheStub(self.channel)
        self._cas_raw = re_grpc.ContentAddressableStorageStub(self.channel)
        self._bytestream = bs_grpc.ByteStreamStub(self.channel)

    def run(self, op: Json) -> Json:
        handlers: Mapping[str, Callable[[Json], Json]] = {
            "wait_ready": self.wait_ready,
            "execute": self.execute,
            "read_blob": self.read_blob,
            "upload": self.upload,
            "get_action_result": self.get_action_result,
            "update_action_result": self.update_action_result,
        }
        try:
            return handlers[op["op"]](op)
        except grpc.RpcError as exc:
            return _rpc_error(exc)

    def wait_ready(self, op: Json) -> Json:
        started = time.monotonic()
        deadline = started + float(op.get("timeout", 30))
        error = ""
        while time.monotonic() < deadline:
            try:
                self._caps.GetCapabilities(
                    re_pb2.GetCapabilitiesRequest(instance_name=self.instance), timeout=1.0
                )
                return {"ok": True, "waited_s": time.monotonic() - started}
            except grpc.RpcError as exc:
                error = f"{exc.code().name}: {exc.details()}"
                time.sleep(0.05)
        return {"ok": False, "waited_s": time.monotonic() - started, "error": error}

    # -- execute ------------------------------------------------------------------------------

    def _prepare(self, spec: Json) -> tuple[re_pb2.Action, list[bytes], Json]:
        """The spec's Action, every blob it needs in the CAS, and its digests as JSON."""
        with tempfile.TemporaryDirectory(prefix="reapi-probe-") as tmp:
            root = Path(tmp)
            for rel, item in sorted(spec.get("files", {}).items()):
                path = root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(item["data_b64"]))
                path.chmod(0o755 if item.get("executable") else 0o644)
            for rel, target in sorted(spec.get("symlinks", {}).items()):
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, root / rel)
            for rel in spec.get("directories", []):
                (root / rel).mkdir(parents=True, exist_ok=True)
            tree = tree_of(root)
        platform = re_pb2.Platform()
        for name, values in sorted(spec.get("platform", {}).items()):
            for value in sorted(values):
                platform.properties.add(name=name, value=value)
        command = re_pb2.Command(
            arguments=spec["argv"],
            environment_variables=[
                re_pb2.Command.EnvironmentVariable(name=k, value=v)
                for k, v in sorted(spec.get("env", {}).items())
            ],
            output_paths=sorted(spec.get("output_paths", [])),
            output_files=sorted(spec.get("output_files", [])),
            output_directories=sorted(spec.get("output_directories", [])),
            working_directory=spec.get("working_directory", ""),
            platform=platform,
        )
        command_data = command.SerializeToString()
        action = re_pb2.Action(
            command_digest=digest_of(command_data),
            input_root_digest=tree.root_digest,
            do_not_cache=bool(spec.get("do_not_cache", False)),
            platform=platform,
        )
        if spec.get("salt"):
            action.salt = spec["salt"].encode()
        if spec.get("timeout"):
            action.timeout.FromNanoseconds(int(float(spec["timeout"]) * 1e9))
        action_data = action.SerializeToString()
        files = {
            rel: digest_of(base64.b64decode(item["data_b64"])).hash
            for rel, item in spec.get("files", {}).items()
        }
        return (
            action,
            [*tree.blobs(), command_data, action_data],
            {
                "action_digest": _digest_json(digest_of(action_data)),
                "command_digest": _digest_json(action.command_digest),
                "input_root_digest": _digest_json(tree.root_digest),
                "input_files": files,
            },
        )

    def execute(self, op: Json) -> Json:
        action, blobs, out = self._prepare(op["action"])
        started = time.monotonic()
        out["stages"] = []
        try:
            self.cas.upload(blobs)
        except grpc.RpcError as exc:
            out.update(_rpc_error(exc))
            out["elapsed_s"] = time.monotonic() - started
            return out
        digest = digest_of(action.SerializeToString())
        request = re_pb2.ExecuteRequest(
            instance_name=self.instance,
            action_digest=digest,
            skip_cache_lookup=bool(op.get("skip_cache_lookup", False)),
        )
        stages: list[str] = []
        try:
            for operation in self._exec.Execute(request, timeout=float(op.get("deadline", 60))):
                meta = re_pb2.ExecuteOperationMetadata()
                if operation.metadata.Unpack(meta):
                    stage = re_pb2.ExecutionStage.Value.Name(meta.stage)
                    if not stages or stages[-1] != stage:
                        stages.append(stage)
                if operation.done:
                    out.update(self._response(operation))
                    break
        except grpc.RpcError as exc:
            out.update(_rpc_error(exc))
        out["stages"] = stages
        out["elapsed_s"] = time.monotonic() - started
        return out

    def _response(self, operation: Any) -> Json:
        if operation.HasField("error"):
            return {
                "status_code": code_pb2.Code.Name(operation.error.code),
                "status_message": operation.error.message,
            }
        response = re_pb2.ExecuteResponse()
        operation.response.Unpack(response)
        out: Json = {
            "status_code": code_pb2.Code.Name(response.status.code),
            "status_message": response.status.message,
            "missing": _missing(response.status),
            "cached_result": response.cached_result,
            "message": response.message,
        }
        if response.HasField("result"):
            out["result"] = self._result(response.result)
        return out

    def _result(self, result: re_pb2.ActionResult) -> Json:
        wanted = [f.digest for f in result.output_files]
        trees = {d.path: d.tree_digest for d in result.output_directories}
        wanted.extend(trees.values())
        stdio = [
            (result.stdout_raw, result.stdout_digest),
            (result.stderr_raw, result.stderr_digest),
        ]
        wanted.extend(digest for raw, digest in stdio if not raw and digest.hash)
        blobs = self.cas.download(wanted)
        outputs = {
            f.path: {"data_b64": _b64(blobs[f.digest.hash]), "executable": f.is_executable}
            for f in result.output_files
        }
        for path, tree_digest in trees.items():
            tree = re_pb2.Tree.FromString(blobs[tree_digest.hash])
            outputs.update(self._tree_files(path, tree))
        meta = result.execution_metadata
        stamps = {
            name: getattr(meta, name).ToNanoseconds() / 1e9
            for name in (
                "queued_timestamp",
                "worker_start_timestamp",
                "input_fetch_start_timestamp",
                "execution_start_timestamp",
                "execution_completed_timestamp",
                "worker_completed_timestamp",
            )
            if meta.HasField(name)
        }

        (out_raw, out_digest), (err_raw, err_digest) = stdio
        return {
            "exit_code": result.exit_code,
            "stdout_b64": _b64(out_raw or blobs.get(out_digest.hash, b"")),
            "stderr_b64": _b64(err_raw or blobs.get(err_digest.hash, b"")),
            "stdout_inline": bool(result.stdout_raw),
            "outputs": outputs,
            "symlinks": {
                s.path: s.target
                for s in [
                    *result.output_symlinks,
                    *result.output_file_symlinks,
                    *result.output_directory_symlinks,
                ]
            },
            "worker": meta.worker,
            "timestamps": stamps,
        }

    def _tree_files(self, base: str, tree: re_pb2.Tree) -> Json:
        by_hash = {digest_of(d.SerializeToString()).hash: d for d in tree.children}
        out: Json = {}

        def walk(prefix: str, directory: re_pb2.Directory) -> None:
            files = self.cas.download([f.digest for f in directory.files])
            for f in directory.files:
                out[f"{prefix}/{f.name}"] = {
                    "data_b64": _b64(files[f.digest.hash]),
                    "executable": f.is_executable,
                }
            for d in directory.directories:
                walk(f"{prefix}/{d.name}", by_hash[d.digest.hash])

        walk(base, tree.root)
        return out

    # -- blobs and the action cache -----------------------------------------------------------

    def read_blob(self, op: Json) -> Json:
        digest = re_pb2.Digest(hash=op["hash"], size_bytes=int(op["size"]))
        if op.get("via", "batch") == "batch":
            response = self._cas_raw.BatchReadBlobs(
                re_pb2.BatchReadBlobsRequest(instance_name=self.instance, digests=[digest]),
                timeout=10,
            )
            answer = response.responses[0]
            return {
                "status_code": code_pb2.Code.Name(answer.status.code),
                "status_message": answer.status.message,
                "data_b64": _b64(answer.data),
            }
        name = f"blobs/{digest.hash}/{digest.size_bytes}"
        name = f"{self.instance}/{name}" if self.instance else name
        data = b"".join(
            r.data
            for r in self._bytestream.Read(bs_pb2.ReadRequest(resource_name=name), timeout=10)
        )
        return {"status_code": "OK", "status_message": "", "data_b64": _b64(data)}

    def upload(self, op: Json) -> Json:
        data = base64.b64decode(op["data_b64"])
        digest = digest_of(data)
        if not op.get("force"):
            self.cas.upload([data])
            return {"digest": _digest_json(digest), "status_code": "OK"}
        response = self._cas_raw.BatchUpdateBlobs(
            re_pb2.BatchUpdateBlobsRequest(
                instance_name=self.instance,
                requests=[re_pb2.BatchUpdateBlobsRequest.Request(digest=digest, data=data)],
            ),
            timeout=10,
        )
        status = response.responses[0].status
        return {
            "digest": _digest_json(digest),
            "status_code": code_pb2.Code.Name(status.code),
            "status_message": status.message,
        }

    def get_action_result(self, op: Json) -> Json:
        digest = re_pb2.Digest(hash=op["hash"], size_bytes=int(op["size"]))
        result = self._ac.GetActionResult(
            re_pb2.GetActionResultRequest(instance_name=self.instance, action_digest=digest),
            timeout=10,
        )
        return {"exit_code": result.exit_code, "worker": result.execution_metadata.worker}

    def update_action_result(self, op: Json) -> Json:
        digest = re_pb2.Digest(hash=op["hash"], size_bytes=int(op["size"]))
        result = re_pb2.ActionResult(exit_code=int(op.get("exit_code", 0)))
        self._ac.UpdateActionResult(
            re_pb2.UpdateActionResultRequest(
                instance_name=self.instance, action_digest=digest, action_result=result
            ),
            timeout=10,
        )
        return {"status_code": "OK"}


def _missing(status: Any) -> list[str]:
    """The MISSING subjects of a status's PreconditionFailure details."""
    subjects: list[str] = []
    for detail in status.details:
        failure = error_details_pb2.PreconditionFailure()
        if detail.Unpack(failure):
            subjects.extend(v.subject for v in failure.violations if v.type == "MISSING")
    return subjects


def main() -> int:
    request = json.load(sys.stdin)
    probe = Probe(request["url"], request.get("instance", ""))
    results = [probe.run(op) for op in request["ops"]]
    json.dump({"results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
