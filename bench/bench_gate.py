"""G1 on the real-shaped tree: ``coverage`` and ``resources --check``, cold and cached.

    python bench/bench_gate.py [OUT] [--scale 1.0] [--reps 5] [--jobs 1] [--targets PATTERN]
        [--before DIR] [--reuse]

Generates ``bench/gen_tree.py --profile real`` (as bench/bench_real.py does), declares
the kernels the server loads by name in the NVIDIA commons' family and fusion files
(the generator writes those files in another shape, which the gate ignores): every
kernel file of ``kernels/<hw>/common`` by its module name (after ``[modules]``
renames) and its first kernel, as ``[[family]] kernels``, and three of them as
``[[rule]] kernels`` and ``[[rule.run]] launches``. Then it builds every target with
bench_real's fake compilers, except that the fake nvcc writes PTX that assembles: one
small real kernel per ``__global__`` of the source, each a ``.visible .entry``. The
``ptxas`` beside that nvcc (where the gate and the register report look for it) is the
real one on PATH (CUDA 13.0's here): every answer is a real ``ptxas -v`` run.

After one ``metrale-orch resources --lock`` it measures, in fresh processes:

- ``coverage`` cold (``build/.state/coverage.json`` removed) and cached (median of
  ``--reps``);
- ``resources --check`` cold (``build/.state/resources.json`` removed) and cached;

and prints one line each, wall and CPU seconds (user + system: steadier than wall on a
shared machine), with the targets, modules and ptxas runs the command reported, and
the cached runs against issue 37's goal of 2 s. ``--before DIR``: the cached runs of
another revision's package (``DIR`` first on ``PYTHONPATH``, e.g. ``git archive REV
metrale_orch | tar -x -C DIR``) take turns with this one's. ``--reuse``: measure the
tree already built at ``OUT`` (no generation, build or lock). ``--targets PATTERN``
builds and checks only the targets the wildcard selects (the suite's smoke test).
The HIP, SCALE and Metal targets are in the run as in the tree: the fake hipcc writes
no code object, so coverage names each of their modules (counted per hardware below);
SCALE and Metal targets are unchecked.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import resource
import shutil
import sys
import tomllib
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_real import (  # noqa: E402
    FAKE,
    PY,
    VERSIONS,
    Run,
    bench_env,
    clean_build,
    install_fakes,
    med,
    ms,
)
from gen_tree import generate_real  # noqa: E402

#: The goal of issue 37 for a cached run.
GOAL_S = 2.0
NVIDIA = ("gb10", "hopper", "b200", "b300")

#: bench_real's fake writes entries without bodies; this one writes PTX ptxas assembles.
_BODYLESS = (
    'fh.write("// fake " + KIND + "\\n.version 8.8\\n.target " + str(arch) + "\\n")\n'
    '    fh.write("".join(".visible .entry " + n + "(\\n" for n in names))'
)
_ASSEMBLES = (
    'fh.write("// fake " + KIND + "\\n.version 8.8\\n.target " + str(arch) '
    '+ "\\n.address_size 64\\n")\n'
    "    fh.write(\"\".join(ENTRY.replace('KNAME', n) for n in names))"
)
ENTRY = (
    "\\n.visible .entry KNAME(\\n\\t.param .u64 KNAME_out,\\n\\t.param .u32 KNAME_n\\n)\\n{\\n"
    "\\t.reg .pred %p<2>;\\n\\t.reg .b32 %r<6>;\\n\\t.reg .b64 %rd<4>;\\n"
    "\\tld.param.u64 %rd1, [KNAME_out];\\n\\tld.param.u32 %r2, [KNAME_n];\\n"
    "\\tmov.u32 %r3, %ctaid.x;\\n\\tmov.u32 %r4, %ntid.x;\\n\\tmov.u32 %r5, %tid.x;\\n"
    "\\tmad.lo.s32 %r1, %r3, %r4, %r5;\\n\\tsetp.ge.s32 %p1, %r1, %r2;\\n"
    "\\t@%p1 bra $L_done;\\n\\tcvta.to.global.u64 %rd2, %rd1;\\n"
    "\\tmul.wide.s32 %rd3, %r1, 4;\\n\\tadd.s64 %rd2, %rd2, %rd3;\\n"
    "\\tst.global.u32 [%rd2], %r1;\\n$L_done:\\n\\tret;\\n}\\n"
)


def install_nvcc(root: Path) -> Path:
    """The fake nvcc writing PTX that assembles, and the real ptxas beside it."""
    if _BODYLESS not in FAKE:
        raise SystemExit("bench_real.FAKE changed: update bench_gate's PTX writer")
    text = FAKE.format(python=PY, kind="nvcc", version=VERSIONS["nvcc"], arch="?")
    text = text.replace(_BODYLESS, _ASSEMBLES).replace(
        "args = sys.argv[1:]", f'args = sys.argv[1:]\nENTRY = "{ENTRY}"', 1
    )
    nvcc = root / "fakes" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True, exist_ok=True)
    nvcc.write_text(text)
    nvcc.chmod(0o755)
    real = shutil.which("ptxas")
    if real is None:
        raise SystemExit("bench_gate needs the real ptxas on PATH (CUDA's bin directory)")
    (nvcc.parent / "ptxas").symlink_to(Path(real).resolve())
    return Path(real).resolve()


_KERNEL = re.compile(r"__global__\s+void\s+(\w+)")


def declare_kernels(root: Path) -> int:
    """Append the gate's family and fusion declarations to each NVIDIA common; returns
    how many (module, function) pairs they name."""
    total = 0
    for hw in NVIDIA:
        common = root / "kernels" / hw / "common"
        toml = common / "KERNEL.toml"
        renames = tomllib.loads(toml.read_text()).get("modules", {}) if toml.is_file() else {}
        pairs = []
        for source in sorted(common.glob("*.cu")):
            first = _KERNEL.search(source.read_text())
            if first is not None:
                pairs.append((renames.get(source.stem, source.stem), first[1]))
        total += len(pairs)
        names = ", ".join(f'"{m}::{f}"' for m, f in pairs)
        with (common / "KERNEL_FAMILIES.toml").open("a") as fh:
            fh.write(f'\n[[family]]\nname = "served_{hw}"\nkernels = [{names}]\n')
        refs = [f'{{ module = "{m}", func = "{f}" }}' for m, f in pairs[:3]]
        with (common / "FUSIONS.toml").open("a") as fh:
            fh.write(
                f'\n[[rule]]\nname = "served_{hw}"\nkernels = [{", ".join(refs[:2])}]\n'
                f"\n[[rule.run]]\nlaunches = [{refs[-1]}]\n"
            )
    return total


def summary(run: Run) -> str:
    """The command's last line (its summary), or why it failed."""
    lines = (run.out + run.err).strip().splitlines()
    return lines[-1] if lines else f"(no output, exit {run.rc})"


def problems_by_hw(run: Run) -> str:
    """coverage's problem lines (``<target>: <module>: <what>``, not the unchecked
    targets' lines), counted per hardware."""
    counts = Counter(
        line.split("/", 1)[0].split(":", 1)[0]
        for line in run.out.splitlines()
        if line.count(": ") >= 2 and ": unchecked: " not in line
    )
    return ", ".join(f"{hw} {n}" for hw, n in sorted(counts.items())) or "none"


class Timed:
    """A :class:`Run` with the CPU seconds (user + system) its process used."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.run = Run(argv, cwd, env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def cached_line(label: str, runs: list[Timed]) -> str:
    wall, cpu = med([t.run.seconds for t in runs]), med([t.cpu for t in runs])
    rcs = sorted({t.run.rc for t in runs})
    return (
        f"  {label:26} {ms(wall)} wall, {ms(cpu)} CPU   {wall / GOAL_S:.2f}x the "
        f"{GOAL_S:.0f} s goal (medians of {len(runs)}, exit {rcs})"
    )


def measure(
    cli: list[str], pattern: list[str], root: Path, env: dict[str, str], args: argparse.Namespace
) -> dict[str, Timed]:
    """Each command cold once, then its cached runs, those of ``--before`` taking turns."""
    state = root / "build" / ".state"
    envs = {"": env}
    if args.before:
        envs["before: "] = dict(env, PYTHONPATH=str(args.before.resolve()))
    colds: dict[str, Timed] = {}
    for label, argv, memo in (
        ("coverage", [*cli, "coverage", *pattern], "coverage.json"),
        ("resources --check", [*cli, "resources", "--check", *pattern], "resources.json"),
    ):
        (state / memo).unlink(missing_ok=True)
        cold = colds[label] = Timed(argv, root, env)
        print(f"  {label:26} {ms(cold.run.seconds)} wall, {ms(cold.cpu)} CPU   cold, exit ", end="")
        print(f"{cold.run.rc}: {summary(cold.run)}")
        cached: dict[str, list[Timed]] = {tag: [] for tag in envs}
        for _ in range(args.reps):
            for tag, e in envs.items():
                cached[tag].append(Timed(argv, root, e))
        for tag, runs in cached.items():
            print(cached_line(f"{tag}{label}", runs))
        print(f"  {'':26} cached: {summary(cached[''][-1].run)}")
    return colds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", default=HERE / "out" / "gate")
    ap.add_argument("--scale", type=float, default=1.0, help="files per directory (0-1]")
    ap.add_argument("--reps", type=int, default=5, help="cached runs of each command")
    ap.add_argument("--jobs", type=int, default=1, help="doit -n for the build")
    ap.add_argument("--targets", metavar="PATTERN", help="only these (hw/model/quant wildcard)")
    ap.add_argument("--reuse", action="store_true", help="measure the tree built at OUT")
    ap.add_argument(
        "--before",
        type=Path,
        metavar="DIR",
        help="a tree of another revision: its cached runs take turns with this one's",
    )
    args = ap.parse_args()
    root: Path = args.out.resolve()
    if args.reuse:
        fakes = root / "fakes"
        found = {
            "FAKES_BIN": str(fakes / "bin"),
            "SCALE_HOME": str(fakes / "scale"),
            "METRALE_HIPCC": str(fakes / "bin" / "hipcc"),
        }  # what install_fakes returned when the tree was built
        env = bench_env(root, found, bytecode=True)
        return report(root, env, args)
    if root.exists():
        shutil.rmtree(root)
    tree = generate_real(root, scale=args.scale)
    chosen = sorted(fnmatch.filter(tree.targets, args.targets)) if args.targets else []
    if args.targets and not chosen:
        raise SystemExit(f"--targets {args.targets!r} selects no target of the tree")
    named = declare_kernels(root)
    fakes = install_fakes(root, nvcc=False)
    ptxas = install_nvcc(root)
    env = bench_env(root, fakes, bytecode=True)
    pairs = sum(len(m) for t, m in tree.targets.items() if not chosen or t in chosen)
    print(
        f"tree: {len(chosen or tree.targets)} target(s), {pairs} (target, module) pairs, scale "
        f"{args.scale}; {named} kernels declared in the NVIDIA commons; ptxas {ptxas}"
    )

    clean_build(root)
    jobs = ["-n", str(args.jobs), "-P", "process"] if args.jobs > 1 else []
    tasks = [f"build:{t}" for t in chosen] or ["build"]
    build = Run([PY, "-m", "doit", *jobs, *tasks], root, env)
    print(f"build (fake compilers, real ptxas later): {build.seconds:.1f} s, exit {build.rc}")
    cli = [str(Path(PY).parent / "metrale-orch"), "--root", str(root)]
    lock = Run([*cli, "resources", "--lock", *pattern(args)], root, env)
    print(f"resources --lock: {lock.seconds:.1f} s, exit {lock.rc}: {summary(lock)}")
    if lock.rc != 0:
        print(lock.out[-2000:] + lock.err[-2000:])
        return 1
    return report(root, env, args)


def pattern(args: argparse.Namespace) -> list[str]:
    return [args.targets] if args.targets else []


def report(root: Path, env: dict[str, str], args: argparse.Namespace) -> int:
    cli = [str(Path(PY).parent / "metrale-orch"), "--root", str(root)]
    print(f"\nrelease gate on the real-shaped tree (fresh processes, {root})")
    colds = measure(cli, pattern(args), root, env, args)
    print(f"  coverage problems per hardware: {problems_by_hw(colds['coverage'].run)}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"  load average (1, 5, 15 min) at the end: {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
