"""Helpers for the trust tests: tiny projects built by real ``doit`` / ``metrale-orch`` runs.

Everything is black-box: a project is a directory with ``dodo.py`` and a
``kernels/`` tree (one hardware ``hw``, one model ``m``, one quant ``q``: one
target ``hw/m/q``), built by ``python -m doit`` and inspected with the
``metrale-orch`` command, as a user does. Artefacts are compared as the set of
files in the target's output directory, byte for byte (``manifest.json`` without
its per-run ``outcome`` fields).

Compiler wrappers are small ``sh`` scripts put first on ``PATH`` that ``exec``
the real ``nvcc`` / ``gcc``. :class:`Hold` is a wrapper ``nvcc`` that blocks one
compile until the test releases it, which makes races deterministic.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DODO",
    "HAS_NVCC",
    "REAL_GCC",
    "REAL_NVCC",
    "TARGET",
    "Hold",
    "Run",
    "Started",
    "artefacts",
    "base_env",
    "copy_project",
    "diff_outputs",
    "doit_run",
    "doit_runs",
    "doit_start",
    "one_kernel_tree",
    "orch_run",
    "outputs",
    "summary_counts",
    "wait_for",
    "with_path",
    "write_files",
    "write_script",
]

#: The real compilers, found before any test puts a wrapper first on PATH.
REAL_NVCC = shutil.which("nvcc") or ""
REAL_GCC = shutil.which("gcc") or ""
HAS_NVCC = bool(REAL_NVCC and REAL_GCC)

DODO = "from metrale_orch.dodo import *  # noqa: F403\n"
TARGET = "hw/m/q"

#: Variables the compilers (or the orchestrator) read: never inherited from the caller.
_SCRUBBED = ("METRALE_", "NVCC_", "FAKECC_", "FAKE_NVCC", "TRUST_")
_SCRUBBED_NAMES = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "CUDA_HOME", "CUDA_PATH")


# ------------------------------------------------------------------------------ projects


def one_kernel_tree(root: Path, label: str) -> Path:
    """A project of one NVIDIA target (``hw/m/q``, sm_90a) with one common kernel whose
    source is unique to this call (``label`` and a random token): no earlier entry of
    any cache can serve it. Returns ``root``."""
    return write_files(
        root,
        {
            "kernels/hw/HARDWARE.toml": '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\n',
            "kernels/hw/m/MODEL.toml": "[model]\n",
            "kernels/hw/m/q/.gitkeep": "",
            "kernels/hw/common/k.cu": (
                f"// {label} {uuid.uuid4().hex}\n"
                'extern "C" __global__ void k(int* o) { o[0] = 7; }\n'
            ),
        },
    )


def write_files(root: Path, files: Mapping[str, str | None], *, dodo: bool = True) -> Path:
    """Write ``files`` (relative path -> text; ``None`` deletes) under ``root``.

    Files under a ``bin/`` directory are made executable. Returns ``root``.
    """
    root.mkdir(parents=True, exist_ok=True)
    if dodo and not (root / "dodo.py").exists():
        (root / "dodo.py").write_text(DODO)
    for rel, text in files.items():
        path = root / rel
        if text is None:
            path.unlink(missing_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if path.parent.name == "bin":
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return root


def write_script(path: Path, text: str) -> Path:
    """An executable script at ``path`` (content replaced atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path


def copy_project(src: Path, dst: Path) -> Path:
    """A fresh checkout of ``src`` at ``dst``: every file but the build outputs and doit's DB."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("build", ".doit.db*", "__pycache__"))
    return dst


def base_env(cache: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without compiler or orchestrator settings, a private cache."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_SCRUBBED) and k not in _SCRUBBED_NAMES
    }
    env["METRALE_ORCH_LOCAL_CACHE"] = str(cache)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"  # "waiting" lines are read while a run is still going
    env.update(extra)
    return env


def with_path(env: Mapping[str, str], bin_dir: Path) -> dict[str, str]:
    """``env`` with ``bin_dir`` first on ``PATH``."""
    out = dict(env)
    out["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
    return out


# ------------------------------------------------------------------------------ runs


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    returncode: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return f"$ {' '.join(self.argv)}\n[exit {self.returncode}]\n{self.out}{self.err}"

    @property
    def lines(self) -> list[str]:
        return (self.out + "\n" + self.err).splitlines()


def _doit_argv(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "doit", *args]


def doit_run(root: Path, args: Sequence[str], env: Mapping[str, str], timeout: float = 180) -> Run:
    """``python -m doit ARGS`` in ``root``, to the end."""
    argv = _doit_argv(args)
    proc = subprocess.run(
        argv, cwd=root, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    return Run(("doit", *args), proc.returncode, proc.stdout, proc.stderr)


def doit_runs(
    jobs: Sequence[tuple[Path, Sequence[str], Mapping[str, str]]], timeout: float = 180
) -> list[Run]:
    """Several ``doit`` runs at once (independent projects, or a race on purpose)."""
    started = [
        (
            list(args),
            subprocess.Popen(
                _doit_argv(args),
                cwd=root,
                env=dict(env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for root, args, env in jobs
    ]
    runs = []
    deadline = time.monotonic() + timeout
    for args, proc in started:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        runs.append(Run(("doit", *args), proc.returncode, out, err))
    return runs


@dataclass
class Started:
    """A ``doit`` run in the background whose output goes to files (readable while it runs)."""

    proc: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path
    args: tuple[str, ...]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        out = self.out_path.read_text(errors="replace") if self.out_path.exists() else ""
        err = self.err_path.read_text(errors="replace") if self.err_path.exists() else ""
        return out + "\n" + err

    def finish(self, timeout: float = 180) -> Run:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        out = self.out_path.read_text(errors="replace")
        err = self.err_path.read_text(errors="replace")
        return Run(("doit", *self.args), self.proc.returncode, out, err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def doit_start(
    root: Path, args: Sequence[str], env: Mapping[str, str], logs: Path, name: str
) -> Started:
    """Start ``python -m doit ARGS`` in ``root`` without waiting; output in ``logs/name.*``."""
    logs.mkdir(parents=True, exist_ok=True)
    out_path, err_path = logs / f"{name}.out", logs / f"{name}.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(_doit_argv(args), cwd=root, env=dict(env), stdout=out, stderr=err)
    return Started(proc, out_path, err_path, tuple(args))


def orch_run(root: Path, args: Sequence[str], env: Mapping[str, str], timeout: float = 120) -> Run:
    """The ``metrale-orch`` command (the venv's console script) in ``root``."""
    script = Path(sys.executable).with_name("metrale-orch")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "metrale_orch"]
    argv += list(args)
    proc = subprocess.run(
        argv, cwd=root, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    return Run(("metrale-orch", *args), proc.returncode, proc.stdout, proc.stderr)


_COUNT_RE = re.compile(r"(\d+) (built|from cache|up to date|skipped|failed|ignored)")


def summary_counts(run: Run) -> dict[str, int]:
    """The counts of the last ``build: ...`` summary line ({} when there is none)."""
    lines = [ln for ln in run.out.splitlines() if ln.startswith("build: ")]
    if not lines:
        return {}
    return {label: int(n) for n, label in _COUNT_RE.findall(lines[-1])}


def wait_for(
    what: Callable[[], bool], *, timeout: float = 60, alive: Callable[[], bool] | None = None
) -> bool:
    """Poll ``what`` until true (True), ``timeout`` passes or ``alive`` turns false (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        if alive is not None and not alive():
            return what()
        time.sleep(0.05)
    return what()


# ------------------------------------------------------------------------------ artefacts


def _strip_outcome(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _strip_outcome(v) for k, v in doc.items() if k != "outcome"}
    if isinstance(doc, list):
        return [_strip_outcome(v) for v in doc]
    return doc


def outputs(root: Path, target: str = TARGET, build: str = "build") -> dict[str, bytes]:
    """Every file of the target's output directory (``manifest.json`` without ``outcome``)."""
    out_dir = root / build / target
    found: dict[str, bytes] = {}
    if not out_dir.is_dir():
        return found
    for path in sorted(out_dir.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(out_dir).as_posix()
        data = path.read_bytes()
        if rel == "manifest.json":
            try:
                doc = _strip_outcome(json.loads(data))
            except ValueError:
                pass
            else:
                data = json.dumps(doc, indent=1, sort_keys=True).encode()
        found[rel] = data
    return found


def artefacts(root: Path, target: str = TARGET) -> dict[str, bytes]:
    """The target's artefacts and baked defaults: :func:`outputs` without the manifest."""
    return {k: v for k, v in outputs(root, target).items() if k != "manifest.json"}


def diff_outputs(got: Mapping[str, bytes], want: Mapping[str, bytes], *, limit: int = 12) -> str:
    """A short human account of how two output sets differ ("" when equal)."""
    if got == want:
        return ""
    parts = []
    for name in sorted({*got, *want}):
        if name not in got:
            parts.append(f"  missing {name}")
        elif name not in want:
            parts.append(f"  extra {name}")
        elif got[name] != want[name]:
            a = want[name].decode(errors="replace").splitlines()
            b = got[name].decode(errors="replace").splitlines()
            lines = [
                ln
                for ln in difflib.unified_diff(a, b, "clean", "got", n=0, lineterm="")
                if not ln.startswith(("---", "+++", "@@"))
            ]
            parts.append(f"  {name} differs:")
            parts += [f"    {ln}" for ln in lines[:limit]]
    return "\n".join(parts)


# ------------------------------------------------------------------------------ a held compile

_HOLD_WRAPPER = """#!/bin/sh
# Test wrapper nvcc: the first compile after the test arms it waits for a release.
compile=0
for a in "$@"; do
  case "$a" in
    -o|-o*|--output-file|--output-file=*) compile=1 ;;
  esac
done
for a in "$@"; do
  case "$a" in
    --dryrun|-dryrun|--version|-V|-M|-MM|--generate-dependencies) compile=0 ;;
  esac
done
ctl="${TRUST_HOLD_DIR:-}"
if [ "$compile" = 1 ] && [ -n "$ctl" ] && mv "$ctl/arm" "$ctl/armed.$$" 2>/dev/null; then
  echo "$$" > "$ctl/started.tmp" && mv "$ctl/started.tmp" "$ctl/started"
  i=0
  while [ ! -e "$ctl/release" ] && [ "$i" -lt 1800 ]; do sleep 0.05; i=$((i + 1)); done
fi
exec @REAL@ "$@"
"""


class Hold:
    """A wrapper ``nvcc`` in ``bin_dir`` that holds one compile mid-way, on request.

    ``arm()`` makes the next compile (not a ``--version``/``--dryrun`` probe) wait
    after writing ``started``; ``release()`` lets it go on. At most 90 s of waiting,
    so nothing hangs when a test fails.
    """

    def __init__(self, base: Path) -> None:
        self.bin_dir = base / "bin"
        self.ctl = base / "hold"
        self.ctl.mkdir(parents=True, exist_ok=True)
        write_script(self.bin_dir / "nvcc", _HOLD_WRAPPER.replace("@REAL@", REAL_NVCC))

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        out = with_path(env, self.bin_dir)
        out["TRUST_HOLD_DIR"] = str(self.ctl)
        return out

    def arm(self) -> None:
        for name in ("started", "release"):
            (self.ctl / name).unlink(missing_ok=True)
        (self.ctl / "arm").write_text("")

    def wait_started(self, run: Started, timeout: float = 90) -> bool:
        return wait_for(
            (self.ctl / "started").exists, timeout=timeout, alive=lambda: run.proc.poll() is None
        )

    def release(self) -> None:
        (self.ctl / "arm").unlink(missing_ok=True)
        (self.ctl / "release").write_text("")
