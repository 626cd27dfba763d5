"""What the per-user toolkit hashes save: ``doit list`` in a new build directory of the
sample tree, with the user's cache home keeping ``metrale-orch-probes/toolchain-hashes.json``
against an empty one, interleaved.

    python bench/ab_toolkit_hashes.py [--out /tmp/ab-hashes] [--reps 8]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/ab-hashes"))
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args()
    tree = args.out / "tree"
    shutil.rmtree(args.out, ignore_errors=True)
    shutil.copytree(REPO / "kernels", tree / "kernels")
    (tree / "dodo.py").write_text("from metrale_orch.dodo import *  # noqa: F403\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRALE_")}
    env["METRALE_ORCH_LOCAL_CACHE"] = str(args.out / "cache")
    kept, empty = args.out / "home-kept", args.out / "home-empty"

    def new_build_dir_list(home: Path) -> float:
        shutil.rmtree(tree / "build", ignore_errors=True)
        for db in tree.glob(".doit.db*"):
            db.unlink()
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "doit", "list"],
            cwd=tree,
            env={**env, "XDG_CACHE_HOME": str(home)},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            sys.exit(done.stdout + done.stderr)
        return time.perf_counter() - start

    for _ in range(2):
        new_build_dir_list(kept)
    times: dict[str, list[float]] = {"kept": [], "empty": []}
    for _ in range(args.reps):
        times["kept"].append(new_build_dir_list(kept))
        shutil.rmtree(empty, ignore_errors=True)
        empty.mkdir()
        times["empty"].append(new_build_dir_list(empty))
    for name, got in times.items():
        print(
            f"new build directory, doit list, toolkit hashes {name:5s}: "
            f"median {statistics.median(got) * 1000:.0f} ms, fastest {min(got) * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
