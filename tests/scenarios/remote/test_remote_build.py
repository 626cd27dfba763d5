"""End-to-end remote cache (issue 6): real doit runs, real nvcc, a real moto S3 server.

One target of the sample tree (``b300/qwen3-8b/bf16``, 7 modules) is built in
checkout A with ``METRALE_ORCH_CACHE=s3://...`` and its own local cache. Then,
each in a new checkout directory with an EMPTY local cache:

- B gets every module from S3 and never runs nvcc to compile: ``nvcc`` on PATH
  is a wrapper that logs every invocation and forwards to the real compiler;
  only probes (version, dry run) may appear. Every manifest outcome is ``remote`` and the
  artefacts are byte-identical to A's.
- C, read-only, with one source changed (so one module must compile and would be
  uploaded in read-write mode), makes zero write requests (the server's log).
- D points at a refused port: the build compiles locally, prints one warning,
  and the remote costs one failed call before it is switched off (wall time
  reported, not asserted).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.remote import (
    Run,
    build,
    cache_stats,
    checkout,
    logging_nvcc,
    manifest,
    outputs,
)
from tests.support.servers import ObjectServer, refused_endpoint, s3_server

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]


@dataclass(frozen=True, slots=True, kw_only=True)
class Project:
    tmp: Path
    log: Path
    base_env: Mapping[str, str]
    s3: ObjectServer
    first: Run
    first_root: Path

    def checkout(self, name: str) -> Path:
        return checkout(self.tmp, name)

    def env(self, name: str, **extra: str) -> dict[str, str]:
        return checkout_env(self.tmp, self.base_env, self.s3, name, **extra)

    def build(self, root: Path, env: Mapping[str, str]) -> Run:
        return build(root, env, self.log)


def checkout_env(
    tmp: Path, base: Mapping[str, str], s3: ObjectServer, name: str, **extra: str
) -> dict[str, str]:
    """A checkout's environment: its own (new, empty) local cache, the S3 remote by default."""
    env = dict(base)
    env["METRALE_ORCH_LOCAL_CACHE"] = str(tmp / f"cache-{name}")
    env["METRALE_ORCH_CACHE"] = s3.url("team")
    env["METRALE_ORCH_STORAGE_OPTIONS"] = json.dumps(s3.storage_options)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    real = shutil.which("nvcc")
    if real is None:
        pytest.skip("nvcc is not installed")
    tmp = tmp_path_factory.mktemp("remote-build")
    log, base = logging_nvcc(tmp, real)
    with s3_server() as s3:
        root = checkout(tmp, "a")
        first = build(root, checkout_env(tmp, base, s3, "a"), log)
        assert first.returncode == 0, first.text
        yield Project(tmp=tmp, log=log, base_env=base, s3=s3, first=first, first_root=root)


def test_first_checkout_compiles_with_the_wrapper_and_uploads(project: Project) -> None:
    modules = manifest(project.first_root)["modules"]
    assert modules
    assert {m["outcome"] for m in modules} == {"compiled"}
    # The wrapper saw every compile (so an empty log later means nvcc really did not run).
    assert len(project.first.compiles) == len(modules)
    assert all(" --ptx " in f"{c} " or " -ptx " in f"{c} " for c in project.first.compiles)
    assert len(project.s3.writes()) >= len(modules)


def test_second_checkout_gets_every_module_from_s3_without_running_nvcc(
    project: Project,
) -> None:
    root = project.checkout("b")
    env = project.env("b")
    assert not Path(env["METRALE_ORCH_LOCAL_CACHE"]).exists()
    run = project.build(root, env)
    assert run.returncode == 0, run.text
    assert run.compiles == [], run.nvcc
    doc = manifest(root)
    assert [m["outcome"] for m in doc["modules"]] == ["remote"] * len(doc["modules"])
    first = manifest(project.first_root)
    assert [{**m, "outcome": ""} for m in doc["modules"]] == [
        {**m, "outcome": ""} for m in first["modules"]
    ]
    assert outputs(root) == outputs(project.first_root)
    stats = cache_stats(root)
    assert stats["remote_hits"] == len(doc["modules"])
    assert stats["misses"] == stats["errors"] == stats["corrupt"] == 0


def test_read_only_checkout_makes_no_write_requests(project: Project) -> None:
    root = project.checkout("c")
    changed = root / "kernels" / "b300" / "common" / "gemv_bf16.cu"
    changed.write_text(changed.read_text() + "// changed in checkout c\n")
    mark = project.s3.mark()
    run = project.build(root, project.env("c", METRALE_ORCH_CACHE_MODE="read-only"))
    assert run.returncode == 0, run.text
    requests = project.s3.log()[mark:]
    assert project.s3.writes(since=mark) == []
    assert any(method == "GET" for method, _ in requests)
    # One module missed and compiled: read-write mode would have uploaded it.
    outcomes = sorted(m["outcome"] for m in manifest(root)["modules"])
    assert outcomes.count("compiled") == 1 == len(run.compiles)
    assert set(outcomes) == {"compiled", "remote"}
    assert cache_stats(root)["uploads"] == 0


def test_unreachable_remote_builds_locally_with_one_warning(project: Project) -> None:
    root = project.checkout("d")
    options = {**project.s3.storage_options}
    options["client_kwargs"] = {**options["client_kwargs"], "endpoint_url": refused_endpoint()}
    env = project.env(
        "d",
        METRALE_ORCH_CACHE="s3://unreachable/team",
        METRALE_ORCH_STORAGE_OPTIONS=json.dumps(options),
    )
    run = project.build(root, env)
    assert run.returncode == 0, run.text
    modules = manifest(root)["modules"]
    assert {m["outcome"] for m in modules} == {"compiled"}
    assert len(run.compiles) == len(modules)
    assert outputs(root) == outputs(project.first_root)
    warnings = [line for line in run.text.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1, run.text
    assert "s3://unreachable/team" in warnings[0]
    # Bounded: one failed call switched the remote off for the run (one process, -n 1).
    stats = cache_stats(root)
    assert stats["errors"] + stats["timeouts"] == 1
    assert stats["remote_disabled"] == 1
    print(
        f"unreachable remote: {run.seconds:.1f} s for {len(modules)} local compiles "
        f"(first checkout with a live remote: {project.first.seconds:.1f} s)"
    )
