"""Resolution speed: ``walk`` + ``discover`` of every target vs the I/O floor.

The floor is the least any resolver must do for the same tree: list every
directory under ``kernels/`` with ``os.scandir`` and parse every TOML file
with ``tomllib``, on plain ``str`` paths (making ``Path`` objects is not I/O).
That is the same TOML files the resolver parses and the same directories it
lists, give or take the few role subdirectories (``common/vendor``) that only
``Layout.inputs()`` reads. Both are measured in the same run, alternating, in
CPU time; the min and the median of each are reported with their ratio (goal: <= 2).

    python bench/bench_layout.py [--tree DIR] [--repeat 7]   # default: a fresh 1000-target tree
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor import floor
from gen_tree import generate

from metrale_orch.tree import LayoutError, resolve_all


def resolve(root: Path) -> int:
    results = resolve_all(root)
    bad = [t for t, r in results if isinstance(r, LayoutError)]
    if bad:
        raise SystemExit(f"{len(bad)} targets failed to resolve, e.g. {bad[0]}")
    return len(results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tree", type=Path, help="an existing project root (default: generate one)")
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = a.tree or Path(tmp)
        if a.tree is None:
            generate(root)
        targets = resolve(root)
        files = floor(root)
        # CPU time, alternating the two, so a busy machine slows both alike; the minimum
        # is the least disturbed run of each.
        t_floor, t_resolve = [], []
        for _ in range(a.repeat):
            t0 = time.process_time()
            floor(root)
            t1 = time.process_time()
            resolve(root)
            t2 = time.process_time()
            t_floor.append(t1 - t0)
            t_resolve.append(t2 - t1)
        inputs = statistics.mean(
            len(lay.inputs()) for _, lay in resolve_all(root) if not isinstance(lay, LayoutError)
        )
        print(f"tree: {targets} targets, {files} directory entries, {inputs:.1f} inputs/target")
        for label, pick in (("min", min), ("median", statistics.median)):
            f, r = pick(t_floor), pick(t_resolve)
            print(
                f"{label:>6}: floor (scandir + tomllib) {f * 1000:.1f} ms, walk + discover "
                f"{r * 1000:.1f} ms ({r / targets * 1e6:.0f} us/target), ratio {r / f:.2f}"
            )
        print("goal: ratio <= 2")


if __name__ == "__main__":
    main()
