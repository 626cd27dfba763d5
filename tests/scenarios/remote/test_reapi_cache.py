"""A REAPI action cache + CAS as the team's remote tier (``cache = "grpc://…"``): real doit
runs, real nvcc, a real BuildGrid (CAS and action cache).

As the S3 tier's end-to-end test (tests/scenarios/remote/test_remote_build.py), on one
target: checkout A
compiles and uploads; B, with an empty local cache, gets every module from the action
cache and never runs nvcc to compile, byte for byte A's; C, read-only with one source
changed, compiles that module and stores nothing (its entry stays absent); D points at a
refused port: it builds locally with one warning.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from metrale_orch.cache.bucket import remote_object_path
from metrale_orch.cache.reapi_tier import ReapiObjects
from metrale_orch.remote.client import RemoteClient
from tests.support.reapi_cas_server import CasServer, bgd_command, cas_server
from tests.support.reapi_deps import StackUnavailable
from tests.support.remote import (
    Run,
    build,
    cache_stats,
    checkout,
    logging_nvcc,
    manifest,
    outputs,
)
from tests.support.servers import refused_endpoint

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]


@dataclass(frozen=True, slots=True, kw_only=True)
class Project:
    tmp: Path
    log: Path
    base_env: dict[str, str]
    server: CasServer
    first: Run
    first_root: Path

    def env(self, name: str, **extra: str) -> dict[str, str]:
        return checkout_env(self.tmp, self.base_env, self.server, name, **extra)

    def entry(self, key: str) -> bytes | None:
        """The object the action cache holds for ``key`` (None: no entry)."""
        with RemoteClient(self.server.url, instance=self.server.instance) as client:
            return ReapiObjects(client).get(remote_object_path("", "", key), 1 << 26)


def checkout_env(
    tmp: Path, base: dict[str, str], server: CasServer, name: str, **extra: str
) -> dict[str, str]:
    """A checkout's environment: its own empty local cache, the REAPI tier by default."""
    env = dict(base)
    env["METRALE_ORCH_LOCAL_CACHE"] = str(tmp / f"cache-{name}")
    env["METRALE_ORCH_CACHE"] = server.url
    env["METRALE_ORCH_STORAGE_OPTIONS"] = json.dumps({"instance": server.instance})
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    real = shutil.which("nvcc")
    if real is None:
        pytest.skip("nvcc is not installed")
    try:
        bgd_command()
    except StackUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"BuildGrid is needed for the REAPI tier tests: {exc.reason}")
        pytest.skip(f"no BuildGrid here: {exc.reason}")
    tmp = tmp_path_factory.mktemp("reapi-cache")
    log, base = logging_nvcc(tmp, real)
    with cas_server() as server:
        root = checkout(tmp, "a")
        first = build(root, checkout_env(tmp, base, server, "a"), log)
        assert first.returncode == 0, first.text
        yield Project(tmp=tmp, log=log, base_env=base, server=server, first=first, first_root=root)


def test_first_checkout_compiles_and_stores_every_module(project: Project) -> None:
    modules = manifest(project.first_root)["modules"]
    assert modules and {m["outcome"] for m in modules} == {"compiled"}
    assert len(project.first.compiles) == len(modules)
    assert cache_stats(project.first_root)["uploads"] == len(modules)
    for m in modules:
        assert project.entry(m["key"]) is not None, m["key"]


def test_second_checkout_gets_every_module_from_the_action_cache(project: Project) -> None:
    root = checkout(project.tmp, "b")
    run = build(root, project.env("b"), project.log)
    assert run.returncode == 0, run.text
    assert run.compiles == [], run.nvcc
    doc = manifest(root)
    assert [m["outcome"] for m in doc["modules"]] == ["remote"] * len(doc["modules"])
    assert outputs(root) == outputs(project.first_root)
    stats = cache_stats(root)
    assert stats["remote_hits"] == len(doc["modules"])
    assert stats["misses"] == stats["errors"] == stats["corrupt"] == 0


def test_read_only_checkout_stores_nothing(project: Project) -> None:
    root = checkout(project.tmp, "c")
    changed = root / "kernels" / "b300" / "common" / "gemv_bf16.cu"
    changed.write_text(changed.read_text() + "// changed in checkout c\n")
    run = build(root, project.env("c", METRALE_ORCH_CACHE_MODE="read-only"), project.log)
    assert run.returncode == 0, run.text
    modules = manifest(root)["modules"]
    compiled = [m for m in modules if m["outcome"] == "compiled"]
    assert len(compiled) == 1 == len(run.compiles)
    assert {m["outcome"] for m in modules} == {"compiled", "remote"}
    assert cache_stats(root)["uploads"] == 0
    assert project.entry(compiled[0]["key"]) is None  # read-write would have stored it


def test_unreachable_reapi_cache_builds_locally_with_one_warning(project: Project) -> None:
    root = checkout(project.tmp, "d")
    host_port = refused_endpoint().split("://", 1)[1]
    run = build(root, project.env("d", METRALE_ORCH_CACHE=f"grpc://{host_port}"), project.log)
    assert run.returncode == 0, run.text
    modules = manifest(root)["modules"]
    assert {m["outcome"] for m in modules} == {"compiled"}
    assert outputs(root) == outputs(project.first_root)
    warnings = [line for line in run.text.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1 and f"grpc://{host_port}" in warnings[0], run.text
    assert cache_stats(root)["remote_disabled"] == 1
