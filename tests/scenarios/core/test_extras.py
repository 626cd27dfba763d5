"""A missing extra is one line with its fix, through the real commands.

Each case runs a command as a user does (``doit`` or ``metrale-orch`` in a subprocess) on the
fake-compiler project, with a ``sitecustomize`` on ``PYTHONPATH`` that makes importing one
optional module raise ``ModuleNotFoundError`` (as on a machine without the extra). The
command says, in one line, what needs what and the ``pip install`` to run; strict remote
execution and commands that cannot work without the part exit 2, everything else warns and
builds here. No traceback either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from metrale_orch.extras import GPU, REMOTE, ExtraMissing, import_extra, missing_extra
from tests.support.project import DODO, doit, orch, project_env
from tests.support.smoke import make_tree, needs_nvcc

#: Makes every module named in METRALE_TEST_MISSING (comma-separated), and those under
#: it, impossible to import, as if its distribution were not installed.
SITECUSTOMIZE = """\
import os, sys

_MISSING = tuple(m for m in os.environ.get("METRALE_TEST_MISSING", "").split(",") if m)


class _Missing:
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in _MISSING):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Missing())
"""

KEY = "ed25519:rCu9uXGg9BNTKtF11ZiWg/WJ2fHhkzAVYm+B7OGGhks="
REMOTE_FIX = "pip install 'metrale-orch[remote]'"


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One command without one module: the line it must print and its exit status."""

    missing: str
    settings: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ("doit", "build:hopper/qwen/w8")
    line: str
    exit_code: int = 0


CASES = {
    "remote execution: warn, build here": Case(
        missing="grpc",
        settings=(("REMOTE_EXECUTOR", "grpc://127.0.0.1:1"),),
        line=f"warning: remote execution needs grpc: {REMOTE_FIX}; compiling here",
    ),
    "remote execution without protobuf": Case(
        missing="google.protobuf",
        settings=(("REMOTE_EXECUTOR", "grpc://127.0.0.1:1"),),
        line=f"warning: remote execution needs google.protobuf: {REMOTE_FIX}; compiling here",
    ),
    "strict remote execution: exit 2": Case(
        missing="grpc",
        settings=(("REMOTE_EXECUTOR", "grpc://127.0.0.1:1"), ("REMOTE_STRICT", "1")),
        line=f"FAILED build:hopper/qwen/w8: remote execution needs grpc: {REMOTE_FIX}",
        exit_code=2,
    ),
    "remote check": Case(
        missing="grpc",
        settings=(("REMOTE_EXECUTOR", "grpc://127.0.0.1:1"),),
        command=("metrale-orch", "remote", "check", "hopper"),
        line=f"error: remote execution needs grpc: {REMOTE_FIX}",
        exit_code=2,
    ),
    "S3 cache": Case(
        missing="s3fs",
        settings=(("CACHE", "s3://bucket/kernels"),),
        line="warning: remote cache s3://bucket/kernels needs s3fs: "
        "pip install 'metrale-orch[s3]'; using the local cache only",
    ),
    "GCS cache": Case(
        missing="gcsfs",
        settings=(("CACHE", "gs://bucket/kernels"),),
        line="warning: remote cache gs://bucket/kernels needs gcsfs: "
        "pip install 'metrale-orch[gcs]'; using the local cache only",
    ),
    "REAPI cache": Case(
        missing="grpc",
        settings=(("CACHE", "grpc://127.0.0.1:1"),),
        line=f"warning: remote cache grpc://127.0.0.1:1 needs grpc: {REMOTE_FIX}; "
        "using the local cache only",
    ),
    "signed cache: build without the cache": Case(
        missing="cryptography",
        settings=(("CACHE_TRUSTED_KEYS", KEY),),
        line="warning: cache signing (cache_trusted_keys, cache_signing_key) needs "
        "cryptography: pip install cryptography; building without the cache",
    ),
    "why-miss --remote: exit 2": Case(  # it cannot work without the extra (issue 43 review)
        missing="s3fs",
        settings=(("CACHE", "s3://bucket/kernels"),),
        command=("metrale-orch", "why-miss", "--remote", "hopper/qwen/w8"),
        line="error: remote cache s3://bucket/kernels needs s3fs: pip install 'metrale-orch[s3]'",
        exit_code=2,
    ),
    "cache keygen": Case(
        missing="cryptography",
        command=("metrale-orch", "cache", "keygen", "new.key"),
        line="error: a signing key needs cryptography: pip install cryptography",
        exit_code=2,
    ),
}


def _without(env: dict[str, str], tmp: Path, missing: str) -> dict[str, str]:
    """``env`` in which ``missing`` cannot be imported."""
    hook = tmp / "missing-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {**env, "PYTHONPATH": str(hook), "METRALE_TEST_MISSING": missing}


def _run(root: Path, command: tuple[str, ...], env: dict[str, str]) -> tuple[int, str]:
    """Run ``doit ...`` or ``metrale-orch ...`` in ``root`` as a user does."""
    done = (doit if command[0] == "doit" else orch)(root, command[1:], env)
    return done.returncode, done.text


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_a_missing_extra_is_one_line_with_its_fix(
    case: Case, fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    env.update({f"METRALE_ORCH_{key}": value for key, value in case.settings})
    code, text = _run(root, case.command, _without(env, tmp_path, case.missing))
    assert "Traceback" not in text, text
    assert text.splitlines().count(case.line) == 1, text
    assert code == case.exit_code, text
    if case.command[0] == "doit" and case.exit_code == 0:  # built here
        assert (root / "build/hopper/qwen/w8/manifest.json").is_file(), text
    if "keygen" in case.command:
        assert not (root / "new.key").exists()


@pytest.mark.nvcc
@needs_nvcc
def test_a_smoke_without_cupy_says_what_to_install(tmp_path: Path) -> None:
    """`doit smoke:<hw>` without CuPy: the static checks run, and the summary line names
    the extra the numbers need."""
    make_tree(tmp_path)
    (tmp_path / "dodo.py").write_text(DODO)
    env = _without(project_env(tmp_path), tmp_path, "cupy")
    run = doit(tmp_path, ["smoke:hw1"], env)
    assert run.returncode == 0, run.text
    assert "Traceback" not in run.text, run.text
    assert run.out.rstrip("\n").splitlines()[-1] == (
        "smoke hw1: 2 static passed, 1 numeric skipped "
        "(numeric smoke needs cupy; pip install 'metrale-orch[gpu]'), 0 failed"
    )


def test_an_import_error_of_no_extra_is_not_hidden() -> None:
    """A module missing that no extra provides is a bug: its ImportError stays."""
    assert missing_extra(ModuleNotFoundError("x", name="xxhash"), GPU, "numbers") is None
    with pytest.raises(ModuleNotFoundError):
        import_extra(REMOTE, "remote execution", "metrale_orch_no_such_module")
    found = missing_extra(ModuleNotFoundError("x", name="numpy.typing"), GPU, "numbers")
    assert isinstance(found, ExtraMissing)
    assert str(found) == "numbers needs numpy.typing: pip install 'metrale-orch[gpu]'"
