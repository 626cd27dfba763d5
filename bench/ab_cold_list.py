"""An interleaved A/B of cold task generation on a tree ``bench_real.py`` made.

    python bench/ab_cold_list.py TREE --before CHECKOUT [--reps 15]

Each round removes the task cache and runs ``doit list`` with the package from
``CHECKOUT`` (another revision's work tree, on ``PYTHONPATH``), removes it again and
runs it with the package this interpreter has installed, then runs plain doit listing
the same tasks (``TREE/dodo_plain.py``, written by ``bench_real.py``). Prints the median
and the fastest wall time of each, and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_real import Run, bench_env, drop_task_cache, install_fakes


def _list(tree: Path, env: dict[str, str], dodo: str = "dodo.py") -> float:
    """Wall ms of one ``doit list`` in ``tree``; exits if it fails."""
    run = Run([sys.executable, "-m", "doit", "-f", dodo, "list"], tree, env)
    if run.rc != 0:
        sys.exit(f"doit list failed in {tree}:\n{run.out}{run.err}")
    return run.seconds * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    tree = args.tree.resolve()
    if not (tree / "dodo_plain.py").is_file():
        sys.exit(f"{tree}: no dodo_plain.py; make the tree with bench/bench_real.py first")
    env = bench_env(tree, install_fakes(tree), bytecode=True)
    env.pop("PYTHONPATH", None)
    sides = {"before": {**env, "PYTHONPATH": str(args.before.resolve())}, "after": env}
    got: dict[str, list[float]] = {"before": [], "after": [], "plain": []}
    for side_env in sides.values():  # bytecode written once per side
        drop_task_cache(tree)
        _list(tree, side_env)
    for _ in range(args.reps):
        for side, side_env in sides.items():
            drop_task_cache(tree)
            got[side].append(_list(tree, side_env))
        got["plain"].append(_list(tree, env, "dodo_plain.py"))
    med = {side: statistics.median(runs) for side, runs in got.items()}
    for side, runs in got.items():
        fastest = min(runs)
        print(f"{side:>6}: median {med[side]:.0f} ms, fastest {fastest:.0f} ms ({args.reps} runs)")
    print(
        f"after / before {med['after'] / med['before']:.2f}x; against plain doit list: "
        f"before {med['before'] / med['plain']:.2f}x, after {med['after'] / med['plain']:.2f}x"
    )


if __name__ == "__main__":
    main()
