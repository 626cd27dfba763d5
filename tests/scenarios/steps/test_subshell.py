"""Paths nvcc's sub-shell would misread (:mod:`metrale_orch.steps.subshell`).

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/steps/test_subshell.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from metrale_orch.steps.errors import UnsafePathError
from metrale_orch.steps.subshell import (
    cwd_problem,
    include_problem,
    toolkit_problem,
    variable_problem,
)
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support.build import (
    compiles,
    fake_toolchain_env,
    make_cache,
    make_config,
    output_kinds_tree,
    small_tree,
)
from tests.support.trust import (
    HAS_NVCC,
    REAL_NVCC,
    base_env,
    diff_outputs,
    doit_run,
    outputs,
    write_files,
)

needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="nvcc and gcc are needed on PATH")

#: Directory names (one path component) a project may live in and still build.
SAFE_NAMES = [
    "a$b",
    "a$HOME",
    "tail$",
    "a b",
    "it's",
    'say "hi"',
    'a";touch pwned;"b',
    "x,y",
    "s;c&d|e(f)<g>",
    "*?!#~=:{}[]%@^+",
    "back\\slash",
    "tab\there",
    "é",
]
#: Directory names that break every compile below them, with the text the error names.
UNSAFE_NAMES = [("a`b", "`"), ('a\\"b', '\\"'), ("a$(b", "$("), ("a${b", "${"), ("a$$b", "$$")]


def _nvcc_builds(cwd: Path, *args: str, environ: dict[str, str] | None = None) -> bool:
    done = subprocess.run(
        [REAL_NVCC, "--ptx", "-arch=sm_90a", *args],
        cwd=cwd,
        env={**os.environ, **(environ or {})},
        capture_output=True,
        check=False,
        timeout=120,
    )
    return done.returncode == 0 and (cwd / "k.ptx").is_file()


def _kernel_dir(folder: Path, *, include: bool = True) -> Path:
    """``folder`` holding ``k.cu`` and, with ``include``, the ``inc.cuh`` it reads."""
    folder.mkdir(parents=True)
    if include:
        (folder / "inc.cuh").write_text("#define K 3\n")
    (folder / "k.cu").write_text(
        '#include "inc.cuh"\nextern "C" __global__ void k(int* o) { *o = K; }\n'
    )
    return folder


#: Where a path reaches nvcc -> (what it gets, the table of what breaks it there).
def _in_cwd(odd: Path, plain: Path) -> tuple[Path, tuple[str, ...], dict[str, str]]:
    return odd, ("k.cu", "-o", "k.ptx", "-Xcompiler=-MD,-MF,k.d"), {}


def _in_output(odd: Path, plain: Path) -> tuple[Path, tuple[str, ...], dict[str, str]]:
    (plain / "k.ptx").symlink_to(odd / "k.ptx")  # nvcc writes through; the check reads it
    return plain, ("k.cu", "-o", str(odd / "k.ptx")), {}


def _in_include(odd: Path, plain: Path) -> tuple[Path, tuple[str, ...], dict[str, str]]:
    (plain / "inc.cuh").unlink()
    return plain, (f"-I{odd}", "k.cu", "-o", "k.ptx"), {}


def _in_tmpdir(odd: Path, plain: Path) -> tuple[Path, tuple[str, ...], dict[str, str]]:
    return plain, ("k.cu", "-o", "k.ptx"), {"TMPDIR": str(odd)}


def _in_ccbin(odd: Path, plain: Path) -> tuple[Path, tuple[str, ...], dict[str, str]]:
    gcc = shutil.which("gcc")
    assert gcc
    (odd / "gcc").symlink_to(gcc)
    return plain, ("k.cu", "-o", "k.ptx"), {"NVCC_CCBIN": str(odd / "gcc")}


_POSITIONS = {
    "cwd": (_in_cwd, cwd_problem),
    # nvcc quotes -o as it quotes its toolkit's directories: nothing escaped (why the
    # build hands it a relative -o).
    "-o": (_in_output, toolkit_problem),
    "-I": (_in_include, include_problem),
    "TMPDIR": (_in_tmpdir, variable_problem),
    "NVCC_CCBIN": (_in_ccbin, variable_problem),
}
#: Texts to try in each position: everything the tables name, and what they let through.
_TEXTS = ["$", "`", '"', '\\"', "'", ",", "$(", "${", " ", ";&|()<>", "\\", "*?!#~"]


@pytest.mark.nvcc
@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("position", sorted(_POSITIONS))
def test_nvcc_fails_exactly_where_the_tables_say(tmp_path: Path, position: str) -> None:
    """The findings the tables encode, measured: in each place a path reaches nvcc,
    it fails on a directory holding a text the table names, and builds otherwise."""
    place, problem = _POSITIONS[position]
    wrong = []
    for i, text in enumerate(_TEXTS):
        odd = _kernel_dir(tmp_path / f"{i}" / f"a{text}b")
        plain = _kernel_dir(tmp_path / f"{i}" / "plain")
        cwd, args, environ = place(odd, plain)
        expected = problem(str(odd)) is None
        if _nvcc_builds(cwd, *args, environ=environ) != expected:
            wrong.append(f"{text!r}: nvcc {'failed' if expected else 'built'}")
    assert wrong == []


# ------------------------------------------------------------------------------ the argv


def test_no_compiler_argument_names_the_root_or_the_build_directory(tmp_path: Path) -> None:
    """Everything but the program reaches the (fake, recording) compiler relative to its
    working directory."""
    root = small_tree(tmp_path / "a$b" / "proj")
    log = tmp_path / "nvcc.log"
    env = fake_toolchain_env(tmp_path / "fakebin", log)
    config = make_config(root, tmp_path / "cache")
    result = build_target(
        root,
        Target(hardware="hw1", model="m1", quant="q1"),
        config=config,
        cache=make_cache(config),
        environ=env,
    )
    assert not result.failures, result.failure_text()
    logged = compiles(log)
    assert len(logged) == 3
    for entry in logged:
        assert entry["cwd"].startswith(str(root / "build" / "stage"))
        words = [w for w in entry["argv"] if str(tmp_path) in w]
        assert words == [], entry["argv"]
        assert any(w.startswith("../") and w.endswith(".ptx") for w in entry["argv"])


def test_build_target_refuses_before_any_compile(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "a`b" / "proj")
    log = tmp_path / "nvcc.log"
    config = make_config(root, tmp_path / "cache")
    with pytest.raises(UnsafePathError, match=r"the build directory .* contains '`'"):
        build_target(
            root,
            Target(hardware="hw1", model="m1", quant="q1"),
            config=config,
            cache=make_cache(config),
            environ=fake_toolchain_env(tmp_path / "fakebin", log),
        )
    assert compiles(log) == [] and not (root / "build" / "stage").exists()


# ------------------------------------------------------------------------------ real builds

_TARGETS = ("h/m/q", "hc/m/q", "hf/m/q")  # PTX, cubin, fatbin


def _project(root: Path) -> Path:
    return write_files(output_kinds_tree(root), {})


@pytest.fixture(scope="module")
def plain_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    if not HAS_NVCC:
        pytest.skip("nvcc and gcc are needed on PATH")
    base = tmp_path_factory.mktemp("plain")
    root = _project(base / "proj")
    run = doit_run(root, ["build"], base_env(base / "cache"))
    assert run.returncode == 0, run.text
    return {t: outputs(root, t) for t in _TARGETS}


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", SAFE_NAMES)
def test_a_root_holding_shell_characters_builds_byte_identically(
    tmp_path: Path, name: str, plain_outputs: dict[str, dict[str, bytes]]
) -> None:
    """Artefacts, baked defaults and manifests (keys included) equal a plain root's."""
    root = _project(tmp_path / name / "proj")
    run = doit_run(root, ["build"], base_env(tmp_path / "cache"))
    assert run.returncode == 0, run.text
    for target in _TARGETS:
        got = outputs(root, target)
        assert got, (target, run.text)
        assert got == plain_outputs[target], diff_outputs(got, plain_outputs[target])
    assert not list(tmp_path.rglob("pwned"))  # no part of the path ran as a command


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize(("name", "text"), UNSAFE_NAMES)
def test_a_root_that_cannot_build_gives_one_error_before_any_compile(
    tmp_path: Path, name: str, text: str
) -> None:
    root = _project(tmp_path / name / "proj")
    run = doit_run(root, ["build"], base_env(tmp_path / "cache"))
    assert run.returncode == 2, run.text
    assert "Traceback" not in run.text
    failed = [ln for ln in run.lines if ln.startswith("FAILED")]
    assert len(failed) == 1, run.text
    assert f"the build directory {root / 'build'} contains {text!r}" in failed[0]
    assert "nvcc's sub-shell" in failed[0]
    assert not (root / "build" / "stage").exists()  # nothing was staged or compiled
