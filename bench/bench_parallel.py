"""E1-E3: how the build uses the machine's cores (issue 19), against peers in the same run.

    python bench/bench_parallel.py e1 [OUT] [--target hopper/qwen3-8b/bf16] [--jobs N]
    python bench/bench_parallel.py e2 [OUT]
    python bench/bench_parallel.py e3 [OUT] [--jobs 1,8,32,64] [--scale 0.25] [--sleep 0.2]

E1  one target of the sample tree, cold (cache off): ``doit build:TARGET`` against the
    floor, the very same compiles run ``jobs`` at a time by ``xargs -P`` (read from the
    build log, each into a fresh directory, in the staged tree our build left).
E2  the whole sample tree, cold: ``doit build`` with no options against ninja running the
    same compiles (one edge each) at its default parallelism (cores + 2).
E3  the real-shaped tree (``bench/gen_tree.py --profile real``) with a fake compiler that
    sleeps ``--sleep`` seconds and uses no CPU, cache off, at each ``jobs``: build time,
    throughput (compiles per second) against the ideal ``jobs / sleep``, and the
    orchestration cost per (target, module) pair: the wall time beyond the ideal
    ``compiles * sleep / jobs``, over the pairs.

Prints each measurement and its ratio; nothing is asserted (these machines are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Where :func:`clean` moves old builds (under the bench's OUT), deleted at its end.
TRASH = "trash"
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from bench_noop import FAKECC, TOOLCHAIN  # noqa: E402  (the one fake nvcc of the benches)

PY = sys.executable
DODO = "from metrale_orch.dodo import *  # noqa: F403\n"

#: ``<target>: compile <module>: (cd <cwd> &&) <argv>`` lines of the build log.
_COMPILE_LINE = re.compile(
    r": (?P<target>\S+): compile (?P<module>\S+): \(cd (?P<cwd>.+?) &&\) (?P<argv>.*)$"
)
#: The per-compile temporary directory, however an argument spells it.
_TMP = re.compile(r"[^\s,]*?\.tmp/[^/\s,]+")


def env_for(out: Path, **extra: str) -> dict[str, str]:
    """The measured processes' environment: a private cache, off; Python writes bytecode
    as an installed package has it (into ``OUT/.pycache``), unless ``PYTHONDONTWRITEBYTECODE``
    is kept with ``--no-bytecode`` (every run then compiles this package from source)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRALE_ORCH_")}
    env["METRALE_ORCH_LOCAL_CACHE"] = str(out / "local-cache")
    env["METRALE_ORCH_CACHE_MODE"] = "off"
    if not _KEEP_NO_BYTECODE[0]:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(out / ".pycache")
    env.update(extra)
    return env


#: ``--no-bytecode`` (set by :func:`main`).
_KEEP_NO_BYTECODE = [False]


def sample_copy(out: Path) -> Path:
    root = out / "sample"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    shutil.copytree(REPO / "kernels", root / "kernels")
    if (REPO / "toolchains").is_dir():
        shutil.copytree(REPO / "toolchains", root / "toolchains")
    (root / "dodo.py").write_text(DODO)
    return root


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout}{proc.stderr}")
    return took


def logged_compiles(root: Path) -> list[tuple[str, list[str]]]:
    """(stage-relative cwd, argv) of every compile the last build ran, from its log."""
    out = []
    for line in (root / "build" / "metrale-orch.log").read_text().splitlines():
        m = _COMPILE_LINE.search(line)
        if m is None:
            continue
        stage = root / "build" / "stage" / m["target"] / m["cwd"]
        out.append((str(stage), shlex.split(m["argv"])))
    return out


def floor_commands(compiles: list[tuple[str, list[str]]], scratch: Path) -> list[str]:
    """Shell lines running each compile in its staged directory into a fresh directory."""
    lines = []
    for i, (cwd, argv) in enumerate(compiles):
        target = scratch / str(i)
        target.mkdir(parents=True, exist_ok=True)
        args = [_TMP.sub(str(target), a) for a in argv]
        lines.append(f"cd {shlex.quote(cwd)} && {shlex.join(args)}")
    return lines


def clean(root: Path) -> None:
    """Move the last build out of the way; :func:`empty_trash` deletes it when the bench ends.

    Deleting it here would be measured: ext4 without a journal (these machines) skips
    every recently deleted inode when it allocates one, so each of the next build's
    file creations walked the previous build's 23,000 freed inodes (perf: a fifth of
    E3's samples in ext4_create -> recently_deleted, 31 s of system time instead of 13).
    """
    trash = root.parent / TRASH
    trash.mkdir(exist_ok=True)
    for name in ("build", ".doit.db"):
        path = root / name
        if path.exists():
            path.rename(trash / f"{root.name}-{name}-{time.time_ns()}")


#: ``--keep-trash``: why a user would leave the last builds in ``OUT/trash``.
KEEP_TRASH_HELP = (
    "leave the builds moved away in OUT/trash: deleted, their inodes slow the next few "
    "minutes' file creations (ext4 without a journal), so the next bench would pay for them"
)


def empty_trash(out: Path, keep: bool = False) -> None:
    """Delete the builds :func:`clean` moved away, unless ``keep`` (``--keep-trash``)."""
    if not keep:
        shutil.rmtree(out / TRASH, ignore_errors=True)


def e1(args: argparse.Namespace) -> None:
    out: Path = args.out
    root = sample_copy(out)
    jobs = args.jobs or len(os.sched_getaffinity(0))
    env = env_for(out, METRALE_ORCH_JOBS=str(jobs))
    serial = env_for(out, METRALE_ORCH_JOBS="1")
    ours = []
    floors = []
    ones = []
    for _ in range(args.reps):
        clean(root)
        ones.append(timed([PY, "-m", "doit", f"build:{args.target}"], root, serial))
        clean(root)
        ours.append(timed([PY, "-m", "doit", f"build:{args.target}"], root, env))
        compiles = logged_compiles(root)
        scratch = Path(tempfile.mkdtemp(dir=out))
        script = "\n".join(floor_commands(compiles, scratch)) + "\n"
        floors.append(_xargs(script, jobs, root, env))
        shutil.rmtree(scratch)
    o, f, s = min(ours), min(floors), min(ones)
    print(f"E1 {args.target}: {len(compiles)} compiles, jobs = {jobs}, best of {args.reps}")
    print(f"  doit build:{args.target} (jobs = {jobs}): {o:.2f} s")
    print(f"  floor, xargs -P {jobs} of the same compiles: {f:.2f} s")
    print(f"  ratio: {o / f:.2f}x (goal <= 1.15x)")
    print(f"  the same build with jobs = 1: {s:.2f} s ({s / o:.2f}x slower)")


def _xargs(script: str, jobs: int, root: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        ["xargs", "-P", str(jobs), "-d", "\n", "-n", "1", "bash", "-c"],
        input=script,
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"the floor failed:\n{proc.stdout}{proc.stderr}")
    return took


def e2(args: argparse.Namespace) -> None:
    out: Path = args.out
    root = sample_copy(out)
    env = env_for(out)
    if shutil.which("ninja") is None:
        sys.exit("ninja is not installed (pip install ninja)")
    ours = []
    ninjas = []
    for _ in range(args.reps):
        clean(root)
        ours.append(timed([PY, "-m", "doit", "build"], root, env))
        compiles = logged_compiles(root)
        scratch = Path(tempfile.mkdtemp(dir=out))
        lines = floor_commands(compiles, scratch)
        edges = ["rule run", "  command = $cmd", ""]
        for i, line in enumerate(lines):
            edges += [f"build out{i}: run", f"  cmd = {line.replace('$', '$$')}", ""]
        (scratch / "build.ninja").write_text("\n".join(edges))
        ninjas.append(timed(["ninja", "-C", str(scratch)], root, env))
        shutil.rmtree(scratch)
    o, n = min(ours), min(ninjas)
    cores = len(os.sched_getaffinity(0))
    print(f"E2 the sample tree: {len(compiles)} compiles, {cores} cores, best of {args.reps}")
    print(f"  doit build (no options): {o:.2f} s")
    print(f"  ninja, the same compiles at its default -j ({cores + 2}): {n:.2f} s")
    print(f"  ratio: {o / n:.2f}x (goal <= 1.10x)")


def e3(args: argparse.Namespace) -> None:
    out: Path = args.out
    root = out / "real"
    if root.exists():
        clean(root)
        root.rename(out / TRASH / f"real-{time.time_ns()}")
    subprocess.run(
        [PY, str(HERE / "gen_tree.py"), str(root), "--profile", "real", "--scale", str(args.scale)],
        check=True,
        capture_output=True,
    )
    bin_dir = out / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "fakecc"
    fake.write_text(FAKECC)  # bench_noop's stand-in, sleeping $FAKECC_SLEEP seconds
    fake.chmod(0o755)
    (root / "toolchains").mkdir(exist_ok=True)
    (root / "toolchains" / "nvcc.toml").write_text(TOOLCHAIN)
    print(f"E3 the real-shaped tree (--scale {args.scale}), fake compiler sleeping {args.sleep} s")
    for jobs in [int(j) for j in args.jobs.split(",")]:
        clean(root)
        env = env_for(out, METRALE_ORCH_JOBS=str(jobs))
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        env["FAKECC_SLEEP"] = str(args.sleep)
        took = timed([PY, "-m", "doit", "build"], root, env)
        events = json.loads((root / "build" / "profile.json").read_text())["traceEvents"]
        spans = [e for e in events if e.get("cat") == "compile"]
        compiles = len(spans)
        pairs = sum(1 for e in events if e.get("cat") == "key")
        # Throughput while compiles run: from the first compile's start to the last's end.
        window = (max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)) / 1e6
        ideal = compiles * args.sleep / jobs
        rate = compiles / window
        per_pair_ms = max(0.0, took - ideal) / max(1, pairs) * 1000
        print(
            f"  jobs {jobs:>3}: {took:7.2f} s wall for {compiles} compiles ({pairs} pairs), "
            f"ideal {ideal:.1f} s ({took / ideal:.2f}x); while compiling {rate:6.1f}/s = "
            f"{rate / (jobs / args.sleep):.2f} x jobs/sleep; "
            f"orchestration {per_pair_ms:.2f} ms per pair"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="bench", required=True)
    for name in ("e1", "e2", "e3"):
        p = sub.add_parser(name)
        p.add_argument("out", type=Path, nargs="?", default=HERE / "out" / f"parallel-{name}")
        p.add_argument("--reps", type=int, default=1)
        p.add_argument(
            "--no-bytecode", action="store_true", help="leave PYTHONDONTWRITEBYTECODE as it is"
        )
        p.add_argument("--keep-trash", action="store_true", help=KEEP_TRASH_HELP)
    sub.choices["e1"].add_argument("--target", default="hopper/qwen3-8b/bf16")
    sub.choices["e1"].add_argument("--jobs", type=int, default=0)
    sub.choices["e3"].add_argument("--jobs", default="1,8,32,64")
    sub.choices["e3"].add_argument("--scale", type=float, default=0.25)
    sub.choices["e3"].add_argument("--sleep", type=float, default=0.2)
    args = ap.parse_args()
    args.out = args.out.resolve()
    _KEEP_NO_BYTECODE[0] = args.no_bytecode
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        {"e1": e1, "e2": e2, "e3": e3}[args.bench](args)
    finally:
        empty_trash(args.out, args.keep_trash)


if __name__ == "__main__":
    main()
