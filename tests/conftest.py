"""Fixtures shared by the test modules (the plain helpers live in :mod:`tests.support`).

- every test starts and ends with a new run (:func:`~metrale_orch.tasks.doit_api.new_run`:
  its configuration, probed compiler identities, build sessions with their artefacts and
  file hashes, stop state) and the resolved defaults forgotten, so no test sees what an
  earlier one built, probed or resolved;
- ``fake_project``: the five-target project of :mod:`tests.support.project`
  with its recording fake compiler, and the environment to build it in;
- ``s3`` / ``gcs``: one real local object-store server per test module;
- ``reapi_stack``: one BuildGrid remote-execution stack (:mod:`tests.support.reapi`) for the
  whole session, and ``reapi_stack_factory`` for tests that need their own (fault tests: a
  stopped server, other options). One per session because it costs ~4.5 s to start (a
  PostgreSQL cluster, BuildGrid's schema, the server) and its state is content-addressed:
  tests share it by using actions of their own (a distinct input, command or ``salt``) and
  workers of their own for platforms they invent. A test must not stop its server or its
  default workers. Where the stack cannot run (no PyPI for the BuildGrid venv, no PostgreSQL)
  these fixtures skip with the reason, and fail on CI (``CI=true``); so does a test that needs
  the workers' isolation where no mount namespace can be made (``isolation_error``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metrale_orch.defaults import reset_resolved
from metrale_orch.tasks.doit_api import new_run
from tests.support import reapi
from tests.support.project import make_project, project_env, use_fake_compiler
from tests.support.reapi import PostgresCluster, ReapiStack, StackOptions, StackUnavailable
from tests.support.servers import ObjectServer, gcs_server, s3_server

#: ``pytester`` runs a small suite under the unit tier's guard (tests/scenarios/project).
pytest_plugins = ["pytester"]


def _forget_process_state() -> None:
    new_run()
    reset_resolved()


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    """A new run, and the resolved defaults forgotten, before and after each test."""
    _forget_process_state()
    yield
    _forget_process_state()


@pytest.fixture
def fake_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """``(root, environ)``: :func:`~tests.support.project.make_project` under
    ``tmp_path/proj``, its nvcc replaced by the recording fake (on ``tmp_path/bin``)."""
    root = make_project(tmp_path / "proj")
    use_fake_compiler(root, tmp_path / "bin")
    return root, project_env(tmp_path, fake_bin=tmp_path / "bin")


@pytest.fixture(scope="module")
def s3() -> Iterator[ObjectServer]:
    """A moto S3 server on 127.0.0.1 for the module (a fresh bucket)."""
    with s3_server() as server:
        yield server


@pytest.fixture(scope="module")
def gcs() -> Iterator[ObjectServer]:
    """A GCS emulator on 127.0.0.1 for the module (a fresh bucket)."""
    with gcs_server() as server:
        yield server


@pytest.fixture(scope="session")
def reapi_venv() -> Path:
    """The BuildGrid venv, made once per session if missing (a failure is not retried)."""
    try:
        return reapi.buildgrid_venv(os.environ)
    except StackUnavailable as exc:
        reapi.unavailable(exc.reason)


@pytest.fixture(scope="session")
def reapi_postgres() -> Iterator[PostgresCluster]:
    """One PostgreSQL cluster for the session's REAPI stacks (each gets its own database)."""
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(reapi.postgres_cluster())
        except StackUnavailable as exc:
            reapi.unavailable(exc.reason)
        yield cluster


def _default_options(tmp_path_factory: pytest.TempPathFactory) -> StackOptions:
    # The workers' commands must not see the tests' files (every tmp_path is below basetemp).
    return StackOptions(workers=2, hide=(tmp_path_factory.getbasetemp(),))


@pytest.fixture(scope="session")
def reapi_stack(
    reapi_venv: Path, reapi_postgres: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReapiStack]:
    """The session's BuildGrid stack: instance "main", two workers (OSFamily=linux,
    ISA=x86-64), the metrale platform keys matched, the tests' tmp root hidden."""
    with contextlib.ExitStack() as stack:
        try:
            started = stack.enter_context(
                reapi.reapi_stack(_default_options(tmp_path_factory), postgres=reapi_postgres)
            )
        except StackUnavailable as exc:
            reapi.unavailable(exc.reason)
        yield started


@pytest.fixture
def reapi_stack_factory(
    reapi_venv: Path, reapi_postgres: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ReapiStack]]:
    """``make(**changes) -> ReapiStack``: a stack of the test's own, the session stack's
    options with ``changes`` (see :class:`~tests.support.reapi.StackOptions`); every stack
    made is stopped when the test ends."""
    with contextlib.ExitStack() as stacks:

        def make(**changes: Any) -> ReapiStack:
            options = dataclasses.replace(_default_options(tmp_path_factory), **changes)
            try:
                return stacks.enter_context(reapi.reapi_stack(options, postgres=reapi_postgres))
            except StackUnavailable as exc:
                reapi.unavailable(exc.reason)

        yield make
