"""Interleaved A/B of the edit-build loop's no-op: ``doit build:TARGET`` on the sample tree.

    python bench/ab_scoped_noop.py --before WORKTREE [--target hopper/qwen3-8b/bf16] [--reps 15]

Each side gets its own copy of ``kernels/`` (under ``OUT``, default ``/tmp/ab-scoped``) and
its own local cache, is built once (``doit build``, real compilers), then the no-op of the
one named target runs ``--reps`` times per side, the sides taking turns; ``--before`` is a
checkout of another revision, put first on ``PYTHONPATH``. Bytecode is written (into
``OUT/.pycache-<side>``), as an installed package has it. Prints each side's median.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--target", default="hopper/qwen3-8b/bf16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path("/tmp/ab-scoped"))
    args = ap.parse_args()
    sides = {"before": args.before.resolve(), "now": REPO}
    base = {k: v for k, v in os.environ.items() if not k.startswith("METRALE_ORCH_")}
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    runs: dict[str, tuple[Path, dict[str, str]]] = {}
    for side, source in sides.items():
        root = args.out / side
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(REPO / "kernels", root / "kernels")
        (root / "dodo.py").write_text(DODO)
        env = dict(
            base,
            PYTHONPATH=str(source),
            PYTHONPYCACHEPREFIX=str(args.out / f".pycache-{side}"),
            METRALE_ORCH_LOCAL_CACHE=str(root / "local-cache"),
        )
        runs[side] = (root, env)
        for words in (["build"], [f"build:{args.target}"]):  # built, then its entry kept
            subprocess.run(
                [sys.executable, "-m", "doit", *words],
                cwd=root,
                env=env,
                capture_output=True,
                check=False,
            )
    took: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(args.reps):
        for side, (root, env) in runs.items():
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "doit", f"build:{args.target}"],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            took[side].append(time.perf_counter() - start)
            if "1 up to date" not in done.stdout:
                sys.exit(f"{side}: not a no-op:\n{done.stdout}{done.stderr}")
    for side, values in took.items():
        mid, low = statistics.median(values) * 1000, min(values) * 1000
        print(f"{side:7} median {mid:5.0f} ms, min {low:5.0f}")


if __name__ == "__main__":
    main()
