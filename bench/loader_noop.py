"""The no-op through each door into doit: plain ``doit`` (the one-line dodo file alone) vs
the package's task loader (named in ``pyproject.toml``), interleaved, on the sample tree.

    python bench/loader_noop.py [--out /tmp/loader-noop] [--reps 8]

Two copies of ``kernels/`` (one with the loader's four lines of ``pyproject.toml``) share
one local cache; each is built once for real, then ``doit build`` and ``doit
build:hopper/qwen3-8b/bf16`` run ``--reps`` times on each side, the sides taking turns;
every measured run must be a no-op. Prints the median and the fastest run of each.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DODO = "from metrale_orch.dodo import *  # noqa: F403\n"
LOADER = (
    '[tool.doit]\nloader = "metrale"\n\n'
    '[tool.doit.plugins.loader]\nmetrale = "metrale_orch.tasks.loader:Loader"\n'
)
TARGET = "hopper/qwen3-8b/bf16"


def _tree(out: Path, name: str, loader: bool) -> Path:
    tree = out / name
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(REPO / "kernels", tree / "kernels")
    (tree / "dodo.py").write_text(DODO)
    if loader:
        (tree / "pyproject.toml").write_text(LOADER)
    return tree


def _doit(tree: Path, args: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "doit", *args], cwd=tree, env=env, capture_output=True, text=True
    )
    return time.perf_counter() - start, proc.stdout + proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/loader-noop"))
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRALE_")}
    env["METRALE_ORCH_LOCAL_CACHE"] = str(args.out / "cache")
    sides = {"plain": _tree(args.out, "plain", False), "loader": _tree(args.out, "loader", True)}
    cases = {
        f"{side} {what}": (tree, sel)
        for side, tree in sides.items()
        for what, sel in (("build", ["build"]), ("scoped", [f"build:{TARGET}"]))
    }
    for tree, sel in cases.values():
        _doit(tree, sel, env)  # built (the first from the compilers, the rest from the cache)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.reps):
        for name, (tree, sel) in cases.items():
            seconds, text = _doit(tree, sel, env)
            if "0 built" not in text or " 0 failed" not in text:
                sys.exit(f"{name}: not a no-op:\n{text}")
            times[name].append(seconds)
    for name, got in times.items():
        print(
            f"{name:14s} median {statistics.median(got) * 1000:5.0f} ms, "
            f"fastest {min(got) * 1000:5.0f} ms"
        )


if __name__ == "__main__":
    main()
