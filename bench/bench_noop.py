"""P1 and P5: the no-op and fresh-checkout cost of ``doit build`` on the synthetic tree.

    python bench/bench_noop.py [OUT] [--models 25] [--reps 5] [gen_tree options]

Generates the tree with ``bench/gen_tree.py`` (default: 8 hardware trees x 25
models x 5 quants = 1000 targets, ~40 inputs each), points its nvcc toolchain
at a tiny shell script (only the up-to-date path is measured), builds once,
then measures, each as the median of ``--reps`` runs in fresh processes:

P1  no-op ``doit build`` (ours)
    vs ``ninja`` on an equivalent build.ninja (one edge per target, the same
    inputs, a stamp output), and
    vs plain doit: a dodo with the same file deps hard-coded (doit's defaults:
    md5 checker, console reporter; sqlite3 backend), and
    vs plain doit declaring, besides, every installed file of each target (its
    artefacts, baked defaults and manifest) as the task's ``targets``: the
    files metrale-orch checks on every no-op (doit checks that they exist).
    Also shown: ours with the task cache removed before each run (what the
    first run after a change to the tree's shape or a manifest costs).
P5  fresh checkout (every input gets a new mtime, same bytes):
    first ``doit build`` vs the hashing floor (read + xxh3 of every unique input
    once, in one process, plus the no-op cost), then the second run vs the no-op.
    Plain doit after the same touch is shown for contrast (its md5 checker
    re-hashes on every run).

Python writes bytecode as an installed package would have it (doit's own is
compiled at install time), into ``OUT/.pycache`` so the checkout stays clean;
``--no-bytecode`` keeps ``PYTHONDONTWRITEBYTECODE`` as the environment has it
(every run then compiles this package from source).

Prints each measurement and the ratios against the peers measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable

FAKECC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fakecc 1.0 (benchmark stand-in)"; exit 0; fi
out=""; prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out="$a"; fi
  prev="$a"
done
if [ -n "$FAKECC_SLEEP" ]; then sleep "$FAKECC_SLEEP"; fi
printf '.version 8.0\\n.target sm_90a\\n' > "$out"
"""

TOOLCHAIN = """[toolchain]
name = "nvcc"
vendors = ["nvidia", "cuda"]
program = "fakecc"
version_args = ["--version"]
output = "ptx"
argv = ["{program}", "{output_kind_flag}", "{arch_flags}", "{flags}", "-I{include}",
        "{source}", "-o", "{output}"]
"""

PLAIN_DODO = '''"""Plain doit, the same file deps hard-coded (doit defaults, sqlite3 backend)."""
import json
from pathlib import Path

OUTPUTS = False  # True: each target's module outputs are its doit targets
DOIT_CONFIG = {"backend": "sqlite3", "dep_file": ".doit-plain.db", "verbosity": 0,
               "default_tasks": ["build"]}


def stamp(path):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("ok")


def stamps(paths):
    for path in paths:
        stamp(path)


def task_build():
    deps = json.loads(Path("plain-deps.json").read_text())
    outs = json.loads(Path("plain-outputs.json").read_text()) if OUTPUTS else {}
    for name, files in deps.items():
        targets = outs.get(name) or ["plain-out/" + name + ".stamp"]
        yield {"name": name, "actions": [(stamps, [targets])], "file_dep": files,
               "targets": targets}
'''


def run(argv: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t0
    if check and proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
    return dt


def median(argv: list[str], cwd: Path, env: dict[str, str], reps: int) -> float:
    return statistics.median(run(argv, cwd, env) for _ in range(reps))


def write_ninja(root: Path, deps: dict[str, list[str]]) -> None:
    lines = ["rule stamp", "  command = touch $out", ""]
    for name, files in sorted(deps.items()):
        ins = " ".join(f.replace(" ", "$ ").replace(":", "$:") for f in files)
        lines.append(f"build ninja-out/{name}.stamp: stamp {ins}")
    (root / "build.ninja").write_text("\n".join(lines) + "\n")


def touch_inputs(root: Path, files: set[str]) -> None:
    bump = 10**9 * 3600
    for rel in files:
        p = root / rel
        st = p.stat()
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + bump))


def hash_floor(root: Path, files: set[str]) -> float:
    import xxhash

    t0 = time.perf_counter()
    for rel in sorted(files):
        with open(root / rel, "rb") as fh:
            xxhash.xxh3_64(fh.read()).hexdigest()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", default=HERE / "out" / "noop")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=2, help="workers of the first (setup) build")
    ap.add_argument(
        "--no-bytecode", action="store_true", help="leave PYTHONDONTWRITEBYTECODE as it is"
    )
    args, gen_args = ap.parse_known_args()
    root: Path = args.out.resolve()
    if root.exists():
        shutil.rmtree(root)
    subprocess.run([PY, str(HERE / "gen_tree.py"), str(root), *gen_args], check=True)
    (root / "bin").mkdir()
    (root / "bin" / "fakecc").write_text(FAKECC)
    (root / "bin" / "fakecc").chmod(0o755)
    (root / "toolchains").mkdir(exist_ok=True)
    (root / "toolchains" / "nvcc.toml").write_text(TOOLCHAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRALE_ORCH_")}
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{Path(PY).parent}{os.pathsep}{env.get('PATH', '')}"
    env["METRALE_ORCH_LOCAL_CACHE"] = str(root / "local-cache")
    if not args.no_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(root / ".pycache")

    # The exact file deps of every task, as our dodo generates them.
    sys.path.insert(0, str(HERE.parent))
    from metrale_orch.graph.generate import resolve_build_specs

    cwd = os.getcwd()
    os.chdir(root)
    try:
        specs = resolve_build_specs(root, env)
    finally:
        os.chdir(cwd)
    deps = {s.target: list(s.file_dep) for s in specs if s.kind == "build"}
    errors = [s for s in specs if s.kind != "build"]
    if errors:
        sys.exit(f"{len(errors)} target(s) do not build: {errors[0].message}")
    unique = {f for files in deps.values() for f in files}
    edges = sum(len(f) for f in deps.values())
    print(f"tree: {len(deps)} targets, {edges} edges, {len(unique)} unique inputs ({root})")

    doit = [PY, "-m", "doit"]
    t = run([*doit, "-n", str(args.jobs), "-P", "process", "build"], root, env)
    print(f"setup: first build (fake compiler, -n {args.jobs}): {t:.1f} s")
    (root / "plain-deps.json").write_text(json.dumps(deps))
    (root / "dodo_plain.py").write_text(PLAIN_DODO)
    plain = [*doit, "-f", "dodo_plain.py"]
    run(plain, root, env)
    # The second peer declares every installed file of a target (what metrale-orch
    # checks on a no-op: artefacts, baked defaults, manifest) as that task's targets.
    outputs = {}
    for name in deps:
        folder = root / "build" / name
        outputs[name] = sorted(f"plain-out/{name}/{p.name}" for p in folder.iterdir())
    (root / "plain-outputs.json").write_text(json.dumps(outputs))
    (root / "dodo_plain_outputs.py").write_text(
        PLAIN_DODO.replace("OUTPUTS = False", "OUTPUTS = True").replace(
            ".doit-plain.db", ".doit-plain-outputs.db"
        )
    )
    plain_out = [*doit, "-f", "dodo_plain_outputs.py"]
    run(plain_out, root, env)
    n_outputs = sum(len(v) for v in outputs.values())
    write_ninja(root, deps)
    ninja = [str(Path(PY).parent / "ninja")] if (Path(PY).parent / "ninja").exists() else ["ninja"]
    run(ninja, root, env)

    # P1: the peers take turns, so a change in the machine's load hits them alike.
    runs: dict[str, list[float]] = {
        "ours": [],
        "plain": [],
        "plain_out": [],
        "ninja": [],
        "import": [],
    }
    for _ in range(args.reps):
        runs["ours"].append(run([*doit, "build"], root, env))
        runs["plain"].append(run(plain, root, env))
        runs["plain_out"].append(run(plain_out, root, env))
        runs["ninja"].append(run(ninja, root, env))
        runs["import"].append(run([PY, "-c", "import doit.doit_cmd"], root, env))
    ours, plain_t, plain_out_t, ninja_t, import_t = (statistics.median(runs[k]) for k in runs)
    cold = []
    for _ in range(args.reps):
        for entry in (root / "build" / ".state").glob("build-tasks.*.cache"):
            entry.unlink()
        cold.append(run([*doit, "build"], root, env))
    ours_cold = statistics.median(cold)
    print(f"\nP1 no-op (median of {args.reps}, interleaved)")
    print(f"  doit build (metrale-orch)   {ours * 1000:8.0f} ms")
    print(f"  plain doit, same deps       {plain_t * 1000:8.0f} ms   ratio {ours / plain_t:.2f}x")
    print(
        f"  plain doit, + same outputs  {plain_out_t * 1000:8.0f} ms   "
        f"ratio {ours / plain_out_t:.2f}x   ({n_outputs} outputs declared as targets)"
    )
    print(f"  ninja, same deps            {ninja_t * 1000:8.0f} ms   ratio {ours / ninja_t:.2f}x")
    print(f"  (python + import doit       {import_t * 1000:8.0f} ms)")
    print(f"  (ours, task cache removed   {ours_cold * 1000:8.0f} ms: generates the tasks)")
    print(f"  (bytecode: {'as the environment says' if args.no_bytecode else 'written'})")

    # P5
    touch_inputs(root, unique)
    first = run([*doit, "build"], root, env)
    second = median([*doit, "build"], root, env, args.reps)
    floor = hash_floor(root, unique)
    touch_inputs(root, unique)  # the same for plain doit (its own pass)
    plain_first = run(plain, root, env)
    plain_second = run(plain, root, env)
    print("\nP5 fresh checkout (every input touched, same bytes)")
    print(f"  first doit build            {first * 1000:8.0f} ms")
    print(
        f"  hashing floor + no-op       {(floor + ours) * 1000:8.0f} ms   "
        f"(hash {len(unique)} files once: {floor * 1000:.0f} ms)   "
        f"ratio {first / (floor + ours):.2f}x"
    )
    print(
        f"  second run                  {second * 1000:8.0f} ms   "
        f"ratio to no-op {second / ours:.2f}x"
    )
    print(
        f"  plain doit: first {plain_first * 1000:.0f} ms, second {plain_second * 1000:.0f} ms "
        "(md5 checker: re-hashes every run)"
    )


if __name__ == "__main__":
    main()
