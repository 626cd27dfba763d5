"""The shared case of a file that cannot be used (:class:`~metrale_orch.errors.FileProblem`):
every area's case of it is still its area's error, with its own exit status and line."""

from __future__ import annotations

import pytest

from metrale_orch.errors import EXIT_FAILURE, EXIT_USAGE, FileProblem, MetraleError
from metrale_orch.gate.errors import GateError
from metrale_orch.gate.errors import UnreadableArtefact as GateUnreadable
from metrale_orch.remote.errors import InputRootError, RemoteError
from metrale_orch.resources.errors import (
    BadManifest,
    LockFileError,
    ResourcesError,
    UnreadableArtefact,
)
from metrale_orch.sass.errors import SassError, UndisassemblableArtefact
from metrale_orch.steps.errors import BuildError, ProfileError

CASES = [
    (
        BadManifest,
        ResourcesError,
        EXIT_FAILURE,
        "m.json: no hash; rebuild the target to rewrite it",
    ),
    (UnreadableArtefact, ResourcesError, EXIT_FAILURE, "m.json: no hash"),
    (LockFileError, ResourcesError, EXIT_USAGE, "m.json: no hash"),
    (UndisassemblableArtefact, SassError, EXIT_FAILURE, "m.json: no hash"),
    (
        ProfileError,
        BuildError,
        EXIT_FAILURE,
        "m.json: no hash (run doit build to write a new profile)",
    ),
    (InputRootError, RemoteError, EXIT_USAGE, "input root: 'm.json': no hash"),
    (GateUnreadable, GateError, EXIT_FAILURE, "m.json: no hash"),
]


@pytest.mark.parametrize(
    ("case", "area", "code", "line"), CASES, ids=lambda v: getattr(v, "__name__", "")
)
def test_a_file_problem_is_its_areas_error_with_its_own_status_and_line(
    case: type[FileProblem], area: type[MetraleError], code: int, line: str
) -> None:
    error = case("m.json", "no hash")
    assert isinstance(error, FileProblem) and isinstance(error, area)
    assert (error.path, error.problem) == ("m.json", "no hash")
    assert error.exit_code == code
    assert str(error) == line
