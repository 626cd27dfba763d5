"""Cold-build overhead of a change: this checkout's package vs another git revision's.

    .venv/bin/python bench/bench_cold_overhead.py [--base REV] [--reps 2] [--jobs 1]
        [--compile-jobs N] [--drop HW ...]

Both sides build a copy of the repository's ``kernels/`` with real nvcc, cold
(no ``build/``, no ``.doit.db``, an empty local cache), as ``python -m doit``
subprocesses of this interpreter, each from a virtualenv of its own made here with
``pip install -e`` of its side (the base side a ``git worktree`` of ``REV``): a
side's doit plugins are then its own (a later revision's entry points name modules
an older one lacks), and both resolve the same dependency versions. Runs alternate
(base, new, base, new ...) so machine noise hits both; prints each wall time,
the medians and the ratio new/base. Used for issue 11's "cold build costs at most
5 % more" (dependency output and verification).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _venv(where: Path, source: Path) -> Path:
    """A virtualenv at ``where`` with ``source`` installed editable; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", str(source)], check=True)
    return python


def _build(project: Path, env: dict[str, str], jobs: int, python: Path) -> float:
    for name in ("build", ".doit.db", "cache"):
        path = project / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    argv = [str(python), "-m", "doit"]
    if jobs > 1:
        argv += ["-n", str(jobs), "-P", "process"]
    start = time.perf_counter()
    done = subprocess.run([*argv, "build"], cwd=project, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"build failed in {project}:\n{done.stdout}\n{done.stderr}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD~1", help="git revision to compare with")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=1, help="doit's -n (with -P process above 1)")
    ap.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="HW",
        help="leave kernels/HW out of both copies (a hardware the base revision cannot "
        "build here: before issue 21, strix-hip fails wherever Debian's hipcc is installed)",
    )
    ap.add_argument(
        "--compile-jobs",
        type=int,
        help="METRALE_ORCH_JOBS for both sides (the compiles at once; revisions before "
        "issue 19 compile one at a time and ignore it)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="metrale-overhead.") as tmp:
        work = Path(tmp)
        base_tree = work / "base-src"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_tree), args.base],
            check=True,
            capture_output=True,
        )
        try:
            sides: dict[str, tuple[Path, dict[str, str], Path]] = {}
            for side in ("base", "new"):
                python = _venv(work / f"{side}-venv", base_tree if side == "base" else REPO)
                project = work / side
                shutil.copytree(REPO / "kernels", project / "kernels")
                for hw in args.drop:
                    shutil.rmtree(project / "kernels" / hw)
                (project / "dodo.py").write_text(
                    "from metrale_orch.dodo import *  # noqa: F403\n", encoding="utf-8"
                )
                env = {k: v for k, v in os.environ.items() if not k.startswith("METRALE_ORCH_")}
                env["METRALE_ORCH_LOCAL_CACHE"] = str(project / "cache")
                if args.compile_jobs is not None:
                    env["METRALE_ORCH_JOBS"] = str(args.compile_jobs)
                env.pop("PYTHONPATH", None)
                env.pop("VIRTUAL_ENV", None)
                sides[side] = (project, env, python)
            times: dict[str, list[float]] = {"base": [], "new": []}
            for rep in range(args.reps):
                for side in ("base", "new"):
                    project, env, python = sides[side]
                    seconds = _build(project, env, args.jobs, python)
                    times[side].append(seconds)
                    print(f"rep {rep + 1} {side}: {seconds:.2f} s", flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)],
                check=False,
                capture_output=True,
            )
    base = statistics.median(times["base"])
    new = statistics.median(times["new"])
    print(f"cold build -n {args.jobs}: base ({args.base}) {base:.2f} s, new {new:.2f} s")
    print(f"overhead: new/base = {new / base:.3f}x ({(new / base - 1) * 100:+.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
