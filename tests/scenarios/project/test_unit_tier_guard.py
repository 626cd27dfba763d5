"""The unit tier's guard fails a test that starts a process, however it starts it.

A small suite under the guard's hooks (``tests/unit/conftest.py``) is run by pytest's own
``pytester``: a test that runs ``subprocess``, one that catches the guard's error with a broad
``except``, one that forks, one whose module-scoped fixture starts a process, and one that
starts none. Only the last passes, and each failure says where the test belongs.
"""

from __future__ import annotations

import pytest

SUITE = """
import os, subprocess
import pytest

@pytest.fixture(scope="module")
def server():
    return subprocess.run(["true"], check=False)

def test_runs_subprocess():
    subprocess.run(["true"], check=True)

def test_swallows_the_refusal():
    try:
        os.system("true")
    except Exception:
        pass

def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)

def test_module_fixture_spawns(server):
    pass

def test_in_process():
    assert sum(range(4)) == 6
"""


def test_a_unit_test_that_starts_a_process_fails_with_where_it_belongs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        "from tests.unit.conftest import"
        " pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown"
    )
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=3, errors=1)
    out = result.stdout.str()
    assert out.count("belong in tests/scenarios/") >= 4, out
    for how in ("Popen._execute_child", "os.system", "os.fork"):
        assert how in out, out


def test_the_guard_is_off_outside_the_unit_tier() -> None:
    import subprocess

    assert subprocess.run(["true"], check=False).returncode == 0


def test_the_session_fixtures_a_scenario_started_stop_after_the_last_unit_test(
    pytester: pytest.Pytester,
) -> None:
    """The last test of a run tears down the session's fixtures too (a BuildGrid stack a
    scenario started): stopping them may start a process, and fails nothing."""
    pytester.makeconftest(
        "import subprocess, pytest\n"
        "@pytest.fixture(scope='session')\n"
        "def stack():\n"
        "    yield\n"
        "    subprocess.run(['true'], check=True)\n"
    )
    pytester.makepyfile(**{"scenarios/test_a": "def test_a(stack):\n    pass\n"})
    pytester.makepyfile(
        **{
            "unit/conftest": "from tests.unit.conftest import"
            " pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown",
            "unit/test_b": "def test_b():\n    pass\n",
        }
    )
    result = pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
