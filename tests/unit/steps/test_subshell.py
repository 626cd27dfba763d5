"""Paths nvcc's sub-shell would misread (:mod:`metrale_orch.steps.subshell`).

The tables are checked against the real nvcc (it misreads what they name, and
only that), then real builds in project roots holding shell characters are
compared byte for byte with a plain root's, and the roots that cannot build
give one error before any compile.

The tests of this topic that start processes are in
``tests/scenarios/steps/test_subshell.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.steps.errors import UnsafePathError
from metrale_orch.steps.subshell import (
    check_compile_paths,
    cwd_problem,
    include_problem,
    toolkit_problem,
    variable_problem,
)

# ------------------------------------------------------------------------------ the tables


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("/x/a`b/build", "`"),
        ('/x/a\\"b/build', '\\"'),
        ("/x/a$(id)/build", "$("),
        ("/x/a${HOME}/build", "${"),
        ("/x/a$$b/build", "$$"),
        ("/x/a$(b`c/build", "$("),  # the first one in the path
        ("/x/a$b/build", None),
        ('/x/a"b/build', None),  # nvcc escapes it
        ("/x/a b;c'd,e\\f/build", None),
    ],
)
def test_cwd_problem_names_the_first_breaking_text(path: str, text: str | None) -> None:
    found = cwd_problem(path)
    assert (found[0] if found else None) == text
    if found:
        assert "sub-shell" in found[1]


@pytest.mark.parametrize(
    ("path", "variable", "include", "toolkit"),
    [
        ("/x/a$b", "$", None, "$"),
        ("/x/a`b", "`", "`", "`"),
        ('/x/a"b', None, '"', '"'),
        ('/x/a\\"b', '\\"', '"', '"'),
        ("/x/a'b", None, "'", None),
        ("/x/a,b", None, ",", None),
        ("/x/a b;c&d|(e)<f>\\g", None, None, None),
    ],
)
def test_variable_include_and_toolkit_problems(
    path: str, variable: str | None, include: str | None, toolkit: str | None
) -> None:
    assert (variable_problem(path) or (None,))[0] == variable
    assert (include_problem(path) or (None,))[0] == include
    assert (toolkit_problem(path) or (None,))[0] == toolkit


# ------------------------------------------------------------------------------ the check


def test_check_passes_a_plain_layout(tmp_path: Path) -> None:
    check_compile_paths(
        build_dir=tmp_path / "p q" / "build",
        environ={"TMPDIR": str(tmp_path), "NVCC_CCBIN": "/usr/bin/gcc"},
        toolkit=("/usr/local/cuda",),
        host_compiler_env="NVCC_CCBIN",
        compat_dir=tmp_path / "p q" / "compat",
    )


def test_check_names_the_build_directory_the_text_and_what_to_do(tmp_path: Path) -> None:
    build = tmp_path / "a`b" / "build"
    with pytest.raises(UnsafePathError) as caught:
        check_compile_paths(build_dir=build, environ={})
    err = caught.value
    assert (err.what, err.path, err.text) == ("the build directory", str(build), "`")
    assert str(err).startswith(f"the build directory {build} contains '`', which nvcc's sub-shell")
    assert "METRALE_ORCH_BUILD_DIR" in str(err) and err.exit_code == 2


def test_check_follows_a_symlinked_build_directory(tmp_path: Path) -> None:
    """The compiler sees the physical path (getcwd): a plain link to a bad place is bad."""
    (tmp_path / "a`b").mkdir()
    (tmp_path / "build").symlink_to(tmp_path / "a`b")
    with pytest.raises(UnsafePathError) as caught:
        check_compile_paths(build_dir=tmp_path / "build", environ={})
    assert caught.value.path == str(tmp_path / "a`b") and caught.value.text == "`"


@pytest.mark.parametrize(
    ("environ", "toolkit", "what", "text"),
    [
        ({"TMPDIR": "/t/a$b"}, (), "TMPDIR", "$"),
        ({"NVCC_CCBIN": "/opt/a$b/gcc"}, (), "NVCC_CCBIN", "$"),
        ({"NVCC_CCBIN": "/opt/a,b'c/gcc", "TMPDIR": "/t/a,b"}, ("/a b",), "", ""),
        ({"NVCC_CCBIN": "gcc-12"}, ("/v/a`b/cuda",), "the compiler's toolkit", "`"),
    ],
)
def test_check_names_variables_and_the_toolkit(
    tmp_path: Path, environ: dict[str, str], toolkit: tuple[str, ...], what: str, text: str
) -> None:
    def check() -> None:
        check_compile_paths(
            build_dir=tmp_path / "build",
            environ=environ,
            toolkit=toolkit,
            host_compiler_env="NVCC_CCBIN",
        )

    if not what:  # nvcc reads commas and single quotes there as they are
        check()
        return
    with pytest.raises(UnsafePathError) as caught:
        check()
    assert (caught.value.what, caught.value.text) == (what, text)


def test_check_a_compat_directory_reached_through_the_root(tmp_path: Path) -> None:
    """A build directory outside the project reaches the compat directory through the
    root's path: the relative ``-I`` would hold the root's comma."""
    root = tmp_path / "a,b" / "proj"
    with pytest.raises(UnsafePathError) as caught:
        check_compile_paths(build_dir=tmp_path / "build", environ={}, compat_dir=root / "compat")
    assert caught.value.what == "the HIP compat directory" and caught.value.text == ","
    # Both inside the project: the -I is ../compat, whatever the root holds.
    check_compile_paths(build_dir=root / "build", environ={}, compat_dir=root / "compat")
