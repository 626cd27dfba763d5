"""What the compile-time order saves, measured alone: cold builds of the real-shaped tree
with compiles of uneven length, the package as it is against a copy that orders nothing.

    python bench/ab_order.py [--out /tmp/ab-order] [--scale 0.1] [--jobs 8] [--reps 3]

The fake compiler sleeps a time fixed by its source's name, most compiles 0.05-0.3 s and
one in twenty 1.5 s (the real tree's compiles take 0.5-2 s, a few far longer), using no
CPU. Each side first builds once (cache off) to keep its compile times; then each rep
removes the artefacts and doit's database but keeps ``build/.state`` (the times) and
builds again cold, the sides taking turns. "Without" is a copy of the package where doit
starts the targets in the tree's order and the executor takes waiting compiles as they
come (:data:`SWITCHED_OFF`). Prints each side's median wall time and the ratio.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ab_mechanisms import _package  # noqa: E402  (a package copy with a switch off)
from bench_noop import TOOLCHAIN  # noqa: E402
from bench_parallel import env_for  # noqa: E402  (cache off, a local cache of the run's own)

#: The stand-in nvcc: sleeps by its source's name (see the module docstring).
UNEVEN_CC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fakecc 1.0 (benchmark stand-in)"; exit 0; fi
out=""; src=""; prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out="$a"; fi
  case "$a" in *.cu) src="$a";; esac
  prev="$a"
done
n=$(basename "$src" | cksum | cut -d' ' -f1)
if [ $((n % 20)) -eq 0 ]; then ms=1500; else ms=$((50 + n % 250)); fi
sleep "$(awk "BEGIN { print $ms / 1000 }")"
printf '.version 8.0\\n.target sm_90a\\n' > "$out"
"""

#: The edits that switch the compile-time order off (doit's start order, the executor's).
SWITCHED_OFF: list[tuple[str, str, str]] = [
    (
        "graph/cached.py",
        "    if config is None:\n        return list(specs)",
        "    return list(specs)",
    ),
    ("tasks/building.py", "read_times(build_dir / STATE_DIR)", 'read_times(build_dir / "none")'),
]


def _tree(out: Path, name: str, scale: float) -> Path:
    root = out / name
    shutil.rmtree(root, ignore_errors=True)
    gen = [sys.executable, str(HERE / "gen_tree.py"), str(root), "--profile", "real"]
    subprocess.run([*gen, "--scale", str(scale)], check=True, capture_output=True)
    (root / "toolchains").mkdir(exist_ok=True)
    (root / "toolchains" / "nvcc.toml").write_text(TOOLCHAIN)
    return root


def _cold(root: Path) -> None:
    """Everything but the kept state goes: the next build compiles every module again."""
    for db in root.glob(".doit.db*"):
        db.unlink()
    build = root / "build"
    for child in build.iterdir() if build.is_dir() else []:
        if child.name != ".state":
            shutil.rmtree(child) if child.is_dir() else child.unlink()


def _build(root: Path, env: dict[str, str]) -> float:
    _cold(root)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "doit", "build"], cwd=root, env=env, capture_output=True, text=True
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"doit build failed in {root}:\n{proc.stdout}{proc.stderr}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/ab-order"))
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    bin_dir = out / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "fakecc").write_text(UNEVEN_CC)
    (bin_dir / "fakecc").chmod(0o755)
    sides: dict[str, tuple[Path, dict[str, str]]] = {}
    for name, changes in (("base", None), ("no-order", SWITCHED_OFF)):
        env = env_for(out, METRALE_ORCH_JOBS=str(args.jobs))
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        env["PYTHONPATH"] = str(_package(out, name, changes))
        root = _tree(out, f"tree-{name}", args.scale)
        _build(root, env)  # keeps this side's compile times
        sides[name] = (root, env)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.reps):
        for name, (root, env) in sides.items():
            times[name].append(_build(root, env))
    base, off = (statistics.median(times[n]) for n in ("base", "no-order"))
    print(f"compile-time order, jobs {args.jobs}, scale {args.scale}, median of {args.reps}:")
    print(f"  as is:         {base:6.2f} s  {[round(t, 2) for t in times['base']]}")
    print(f"  without order: {off:6.2f} s  {[round(t, 2) for t in times['no-order']]}")
    print(f"  saves {off - base:+.2f} s ({base / off:.2f}x)")


if __name__ == "__main__":
    main()
