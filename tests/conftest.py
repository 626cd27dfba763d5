"""Fixtures shared by the test modules (the plain helpers live in :mod:`tests.support`).

- every test starts and ends with the package's process-wide memos empty
  (artefacts and file hashes, probed compiler identities, resolved defaults), so
  no test sees what an earlier one built, probed or resolved;
- ``fake_project``: the five-target project of :mod:`tests.support.project`
  with its recording fake compiler, and the environment to build it in;
- ``s3`` / ``gcs``: one real local object-store server per test module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale_orch.defaults import reset_resolved
from metrale_orch.steps.memo import reset_build_memo
from metrale_orch.toolchain.probe import reset_identity_memo
from tests.support.project import make_project, project_env, use_fake_compiler
from tests.support.servers import ObjectServer, gcs_server, s3_server


def _forget_process_state() -> None:
    reset_build_memo()
    reset_identity_memo()
    reset_resolved()


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    """Empty the process-wide memos before and after each test (a few dict clears)."""
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
