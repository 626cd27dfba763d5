"""An interleaved A/B of the no-op ``doit build`` on a tree ``bench_noop.py`` made.

    python bench/ab_noop.py TREE --before CHECKOUT [--reps 9] [--p5]

"before" runs the package from ``CHECKOUT`` (another revision's work tree, on
``PYTHONPATH``), "after" the one this interpreter has installed. Each side runs once
to write its task cache, then the sides take turns, ``--reps`` runs each; every run
must be a no-op (exit 0, nothing built). Prints the median wall time and CPU (user +
sys of doit and its children) of each side and their ratios.

With ``--p5`` every measured run is P5's second run: before it, every file under the
tree's ``kernels/`` is touched (same bytes, a later mtime) and the same side runs once
unmeasured, so each side re-hashes what it must and the measured run shows whether
that first run recorded what it learnt.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_noop import touch_inputs


def _run(tree: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one ``doit build`` in ``tree``; exits on anything but a no-op."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "doit", "build"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
    if proc.returncode != 0 or " 0 built" not in proc.stdout + proc.stderr:
        sys.exit(f"not a no-op (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return wall, cpu


def _touch_kernels(tree: Path) -> None:
    """bench_noop's P5 touch, of every file under ``tree/kernels``."""
    files = {str(p.relative_to(tree)) for p in (tree / "kernels").rglob("*") if p.is_file()}
    touch_inputs(tree, files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--p5", action="store_true", help="measure the second run after a touch")
    args = ap.parse_args()
    tree = args.tree.resolve()
    env = dict(os.environ)
    path = [str(tree / "bin"), str(Path(sys.executable).parent), env["PATH"]]
    env["PATH"] = os.pathsep.join(path)
    env["METRALE_ORCH_LOCAL_CACHE"] = str(tree / "local-cache")
    env["PYTHONPYCACHEPREFIX"] = str(tree / ".pycache")
    env.pop("PYTHONPATH", None)
    sides = {"before": {**env, "PYTHONPATH": str(args.before.resolve())}, "after": env}
    for side_env in sides.values():
        _run(tree, side_env)  # each side's task cache written
    got: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    for _ in range(args.reps):
        for side, side_env in sides.items():
            if args.p5:
                _touch_kernels(tree)
                _run(tree, side_env)
            got[side].append(_run(tree, side_env))
    med = {
        side: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for side, runs in got.items()
    }
    for side, (wall, cpu) in med.items():
        print(f"{side:>6}: wall {wall:.0f} ms, CPU {cpu:.0f} ms (median of {args.reps})")
    (bw, bc), (aw, ac) = med["before"], med["after"]
    print(f"after / before: wall {aw / bw:.2f}x, CPU {ac / bc:.2f}x")


if __name__ == "__main__":
    main()
