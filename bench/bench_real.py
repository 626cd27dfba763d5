"""The real-shaped tree: check, layout, task generation, no-op and a cold build with fakes.

    python bench/bench_real.py [OUT] [--scale 1.0] [--reps 5] [--jobs 1] [--skip-build]
        [--real-nvcc]

Generates ``bench/gen_tree.py --profile real`` (8 hardware trees of four vendors,
60 targets, 224-255 modules per NVIDIA target, `use`-heavy commons, overlays,
cross-model includes, 17 levers, the project files other tools keep in the tree)
and measures, each as the median of ``--reps`` fresh processes and against a peer
measured in the same run:

- ``metrale-orch check`` and ``metrale-orch layout --json`` vs the I/O floor in a
  fresh process (Python start + ``os.scandir`` of every directory under
  ``kernels/`` + ``tomllib`` of every TOML file: bench_layout's floor);
- cold task generation (``doit list`` with the task cache removed) vs plain doit
  listing a dodo with the same tasks and file deps hard-coded;
- a full cold build of every target (``doit build``, empty cache, no ``build/``)
  with a fake compiler for every vendor (nvcc, SCALE's nvcc, hipcc, xcrun): the
  fakes log each call; replaying every logged call in a plain loop afterwards is
  the fakes' own time, and the orchestration overhead per module is (build wall
  time - replay time) / the (target, module) pairs the manifests list;
- the no-op ``doit build`` that follows vs plain doit (same deps) and ninja.

``--real-nvcc`` builds the NVIDIA targets with the real nvcc instead (a check that
the generated CUDA compiles as the orchestrator drives it; no overhead figure).

Then it prints one logged command line per hardware and step (what each vendor's
compiler was handed) and everything that does not build today, grouped by reason:
targets the build refuses (tree, configuration, toolchain), skipped targets, and
modules whose compile failed (with the fake's message: e.g. an include the stage
does not provide).

The fakes (Python, ``-I -S``) answer ``--version`` and ``--dryrun``, resolve
quoted includes as a preprocessor does (next to the including file, then each
``-I`` directory; one found nowhere fails the compile), write the output named
by ``-o`` and the dependency list asked for (``-MF <file>``, ``-MF<file>`` or
``-Xcompiler=-MD,-MF,<file>``). hipcc also counts hex warp masks left without
``ULL`` in what it was handed (SPEC 3.3: HIP compiles a mirrored source).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PY = sys.executable
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_noop import PLAIN_DODO, write_ninja  # noqa: E402
from gen_tree import RealTree, generate_real  # noqa: E402

#: The SCALE arches the fake SCALE install carries (one nvcc per arch, SPEC 3.3).
SCALE_ARCHES = ("gfx1151", "gfx1201")

FAKE = r'''#!{python} -IS
"""Benchmark stand-in for {kind} (bench/bench_real.py)."""
import json, os, re, sys, time

T0 = time.perf_counter()
KIND = {kind!r}
VERSION = {version!r}
args = sys.argv[1:]
log_path = os.environ.get("FAKE_COMPILER_LOG")


def finish(rc, **extra):
    if log_path:
        entry = {{"kind": KIND, "program": os.path.abspath(__file__), "argv": args,
                 "cwd": os.getcwd(), "rc": rc, "seconds": time.perf_counter() - T0, **extra}}
        with open(log_path, "a") as fh:
            fh.write(json.dumps(entry) + "\n")
    sys.exit(rc)


def value_of(flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


if "--version" in args:
    print(VERSION)
    finish(0, probe="version")
if "--dryrun" in args or "-###" in args:
    here = os.path.dirname(os.path.abspath(__file__))
    print("#$ _HERE_=" + here)
    print("#$ TOP=" + os.path.dirname(here))
    finish(0, probe="dryrun")

out = value_of("-o")
if KIND == "xcrun" and "metallib" in args:
    air = [a for a in args if a.endswith(".air")]
    if not air or not os.path.isfile(air[0]) or not out:
        sys.stderr.write("metallib: no readable .air input\n")
        finish(1, error="metallib: no readable .air input")
    with open(air[0], "rb") as fh:
        body = fh.read()
    with open(out, "wb") as fh:
        fh.write(b"MTLB fake metallib\n" + body)
    finish(0, step="metallib")

if out is not None and out.startswith("-"):
    sys.stderr.write(KIND + ": -o is followed by the option " + out + ", not a file\n")
    finish(1, error="-o is followed by an option")
sources = [a for a in args if a.endswith((".cu", ".metal", ".hip")) and os.path.isfile(a)]
if not sources or not out:
    sys.stderr.write(KIND + ": no source or no -o in " + " ".join(args) + "\n")
    finish(1, error="no source or no -o")
src = sources[-1]
dirs = []
for i, a in enumerate(args):
    if a == "-I" and i + 1 < len(args):
        dirs.append(args[i + 1])
    elif a.startswith("-I") and len(a) > 2:
        dirs.append(a[2:])
QUOTED = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
read, todo, texts = [], [src], []
while todo:
    path = todo.pop(0)
    if path in read:
        continue
    read.append(path)
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    texts.append(text)
    for name in QUOTED.findall(text):
        for base in [os.path.dirname(path), *dirs]:
            cand = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(cand):
                todo.append(cand)
                break
        else:
            msg = path + ": fatal error: " + name + ": No such file or directory"
            sys.stderr.write(msg + "\n")
            finish(1, error="include not found", include=name, source=src)
pre = value_of("-include")
if pre:
    for base in dirs:
        cand = os.path.join(base, pre)
        if os.path.isfile(cand):
            read.append(cand)
            break
arch = value_of("-arch") or value_of("--offload-arch") or value_of("-std") or {arch!r}
whole = "\n".join(texts)
if src.endswith(".metal"):
    names = re.findall(r"^kernel\s+void\s+(\w+)", whole, re.M)
else:
    names = re.findall(r"__global__\s+void\s+(\w+)", whole)
with open(out, "w") as fh:
    fh.write("// fake " + KIND + "\n.version 8.8\n.target " + str(arch) + "\n")
    fh.write("".join(".visible .entry " + n + "(\n" for n in names))
    fh.write("// " + str(len(whole)) + " bytes of source\n")
depfile = value_of("-MF")
for a in args:
    if a.startswith("-MF") and len(a) > 3 and not a.startswith("-MF="):
        depfile = a[3:]
    if a.startswith("-Xcompiler=") and ",-MF," in a:
        depfile = a.split(",-MF,", 1)[1].split(",")[0]
if depfile:
    with open(depfile, "w") as fh:
        fh.write(out + ": " + " ".join(p.replace(" ", "\\ ") for p in read) + "\n")
extra = {{}}
if KIND == "hipcc":
    warp = r"__(?:shfl(?:_up|_down|_xor)?|ballot)_sync\(\s*(0[xX][0-9a-fA-F]+\w*)"
    masks = re.findall(warp, whole)
    extra["unmirrored"] = sum(1 for m in masks if not m.upper().endswith("LL"))
finish(0, step="compile", source=src, **extra)
'''

VERSIONS = {
    "nvcc": "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, "
    "V13.0.88 (bench stand-in)",
    "scale-nvcc": "SCALE nvcc (bench stand-in) 1.4.0 for {arch}",
    "hipcc": "HIP version: 6.4.43482 (bench stand-in)\nAMD clang version 19.0.0",
    "xcrun": "Apple metal version 32023.404 (metalfe-32023.404) (bench stand-in)",
}


def _script(path: Path, kind: str, arch: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    version = VERSIONS[kind].format(arch=arch)
    path.write_text(FAKE.format(python=PY, kind=kind, version=version, arch=arch or "?"))
    path.chmod(0o755)


def install_fakes(root: Path, *, nvcc: bool = True) -> dict[str, str]:
    """The fake compilers under ``root/fakes``; returns the variables that point at them.
    ``nvcc=False``: no fake nvcc (the real one on PATH builds the NVIDIA targets)."""
    fakes = root / "fakes"
    if nvcc:
        _script(fakes / "bin" / "nvcc", "nvcc")
    _script(fakes / "bin" / "hipcc", "hipcc")
    _script(fakes / "bin" / "xcrun", "xcrun")
    scale = fakes / "scale"
    (scale / "bin").mkdir(parents=True, exist_ok=True)
    (scale / "bin" / "scaleenv").write_text("# fake SCALE environment script\n")
    for arch in SCALE_ARCHES:
        _script(scale / "targets" / arch / "bin" / "nvcc", "scale-nvcc", arch)
    return {
        "FAKES_BIN": str(fakes / "bin"),
        "SCALE_HOME": str(scale),
        "METRALE_HIPCC": str(fakes / "bin" / "hipcc"),
    }


def bench_env(root: Path, fakes: dict[str, str], bytecode: bool) -> dict[str, str]:
    """The environment of every measured process: the fakes first on PATH, the real
    gcc after them (nvcc's host compiler), no METRALE_* or toolkit variables of the caller."""
    drop = ("METRALE_", "CUDA_HOME", "CUDA_PATH", "ROCM_PATH", "HIP_PATH", "SCALE_", "NVCC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = os.pathsep.join([fakes["FAKES_BIN"], str(Path(PY).parent), env.get("PATH", "")])
    env["SCALE_HOME"] = fakes["SCALE_HOME"]
    env["METRALE_HIPCC"] = fakes["METRALE_HIPCC"]
    env["METRALE_ORCH_LOCAL_CACHE"] = str(root / "local-cache")
    env["FAKE_COMPILER_LOG"] = str(root / "fake-log.jsonl")
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(root / ".pycache")
    return env


class Run:
    """One finished subprocess: wall seconds, exit status, output."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        t0 = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        self.seconds = time.perf_counter() - t0
        self.rc = done.returncode
        self.out = done.stdout
        self.err = done.stderr
        self.argv = argv


def med(values: list[float]) -> float:
    return statistics.median(values)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.0f} ms"


def clean_build(root: Path) -> None:
    for name in ("build", "local-cache", "fake-log.jsonl"):
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for db in root.glob(".doit.db*"):
        db.unlink()


def drop_task_cache(root: Path) -> None:
    for entry in (root / "build" / ".state").glob("build-tasks.*.cache"):
        entry.unlink()


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _abs(cwd: str, path: str) -> str:
    return os.path.normpath(os.path.join(cwd, path))


def replay(entries: list[dict[str, Any]], env: dict[str, str], scratch: Path) -> float:
    """Run every logged call again in a plain loop (same argv and cwd, outputs and
    dependency files redirected to ``scratch``); returns the wall seconds of the loop."""
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    env = dict(env, FAKE_COMPILER_LOG=str(scratch / "replay-log.jsonl"))
    moved: dict[str, str] = {}
    plans: list[tuple[list[str], str]] = []
    for i, entry in enumerate(entries):
        argv, cwd = list(entry["argv"]), entry["cwd"]
        for j, arg in enumerate(argv):
            if j > 0 and argv[j - 1] in ("-o", "-MF"):
                new = str(scratch / f"{i}.{os.path.basename(arg)}")
                moved[_abs(cwd, arg)] = new
                argv[j] = new
            elif arg.startswith("-Xcompiler=") and ",-MF," in arg:
                head = arg.split(",-MF,", 1)[0]
                new = str(scratch / f"{i}.deps.d")
                argv[j] = f"{head},-MF,{new}"
            elif _abs(cwd, arg) in moved:
                argv[j] = moved[_abs(cwd, arg)]
        # A probe ran in a temporary directory that is gone: any directory will do.
        plans.append(([entry["program"], *argv], cwd if os.path.isdir(cwd) else str(scratch)))
    t0 = time.perf_counter()
    for argv, cwd in plans:
        subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=False)
    return time.perf_counter() - t0


def manifests(root: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((root / "build").glob("*/*/*/manifest.json")):
        out.append(json.loads(path.read_text()))
    return out


def _short(text: str, root: Path) -> str:
    text = text.replace(str(root), "<root>")
    return re.sub(r"(<root>/build/|(\.\./)+)\.tmp/[^/ ]+", "<tmp>", text)


def _hw_of(cwd: str, root: Path) -> str:
    rel = Path(cwd).relative_to(root / "build" / "stage") if "/stage/" in cwd else Path("?")
    return rel.parts[0] if rel.parts else "?"


def command_lines(entries: list[dict[str, Any]], root: Path) -> list[str]:
    """One logged compile per (hardware, program, step), as ``(cd DIR &&) argv``."""
    seen: set[tuple[str, str, str]] = set()
    lines = []
    for e in entries:
        if e.get("probe"):
            continue
        hw = _hw_of(e["cwd"], root)
        key = (hw, e["kind"], e.get("step", "compile"))
        if key in seen:
            continue
        seen.add(key)
        cwd = _short(e["cwd"], root)
        argv = " ".join(_short(a, root) for a in [e["kind"], *e["argv"]])
        status = "" if e["rc"] == 0 else f"   [exit {e['rc']}: {e.get('error', '')}]"
        lines.append(f"  {hw:10} {key[2]:8} (cd {cwd} &&) {argv}{status}")
    return sorted(lines)


def _normalise(message: str, target: str) -> str:
    hw = target.split("/")[0]
    message = message.replace(target, "<target>")
    return re.sub(rf"\bkernels/{re.escape(hw)}/", "kernels/<hw>/", message)


def group_specs(specs: list[Any]) -> list[str]:
    """Targets the build refuses or skips, grouped by their message (pure)."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in specs:
        if s.kind == "build":
            continue
        first = s.message.splitlines()[0] if s.message else "(no message)"
        groups[(s.kind, _normalise(first, s.target))].append(s.target)
    out = []
    for (kind, message), targets in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        hws = sorted({t.split("/")[0] for t in targets})
        out.append(f"    {len(targets):3} targets ({', '.join(hws)}) {kind}: {message}")
    return out


def group_failed_compiles(entries: list[dict[str, Any]], root: Path) -> list[str]:
    """Failed fake compiles grouped by what failed."""
    groups: dict[str, set[str]] = defaultdict(set)
    for e in entries:
        if e["rc"] == 0:
            continue
        what = e.get("error", "?")
        if e.get("include"):
            what += f' "{e["include"]}"'
        target = "/".join(Path(e["cwd"]).relative_to(root / "build" / "stage").parts[:3])
        groups[what].add(f"{target}:{Path(e.get('source', '?')).name}")
    out = []
    for what, mods in sorted(groups.items()):
        hws = ", ".join(sorted({m.split("/")[0] for m in mods}))
        out.append(f"    {len(mods):3} compiles ({hws}): {what} (e.g. {sorted(mods)[0]})")
    return out


_FAILED = re.compile(r"^FAILED build:([^:\s]+): (.*)$")


def group_build_failures(output: str, root: Path, explained: set[str]) -> list[str]:
    """``FAILED build:<target>: <reason>`` blocks of a doit run (with the first line of
    the compiler's output that says "error"), grouped by reason, for the targets not in
    ``explained``."""
    blocks: list[tuple[str, str, str]] = []
    for line in output.splitlines():
        m = _FAILED.match(line)
        if m:
            blocks.append((m[1], m[2], ""))
        elif (
            blocks
            and not blocks[-1][2]
            and "error" in line.lower()
            and not line.startswith(("  $", "build:", "cache:"))
        ):
            blocks[-1] = (blocks[-1][0], blocks[-1][1], line.strip())
    groups: dict[str, list[str]] = defaultdict(list)
    for target, reason, detail in blocks:
        if target not in explained:
            text = reason + (f" | {detail}" if detail else "")
            groups[_normalise(_short(text, root), target)].append(target)
    out = []
    for message, targets in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        hws = sorted({t.split("/")[0] for t in targets})
        out.append(f"    {len(targets):3} targets ({', '.join(hws)}): {message}")
    return out


def specs_of(root: Path, env: dict[str, str]) -> list[Any]:
    """Every build sub-task as our dodo generates it (in this process)."""
    from metrale_orch.graph.generate import resolve_build_specs

    cwd = os.getcwd()
    os.chdir(root)
    try:
        return resolve_build_specs(root, env)
    finally:
        os.chdir(cwd)


def shape(tree: RealTree, layout: dict[str, Any]) -> list[str]:
    """The generated shape, and whether ``layout --json`` agrees with the generator."""
    per_hw: dict[str, list[int]] = defaultdict(list)
    agree = 0
    for target, stems in tree.targets.items():
        view = layout.get(target, {})
        modules = set(view.get("modules", {}))
        agree += modules == set(stems)
        per_hw[target.split("/")[0]].append(len(stems))
    ranges = ", ".join(
        f"{hw} ({tree.vendors[hw]}) {len(v)}x {min(v)}-{max(v)}" for hw, v in sorted(per_hw.items())
    )
    errors = sum(1 for v in layout.values() if "error" in v)
    return [
        f"tree: {len(tree.targets)} targets, {tree.total_files} files under kernels/ "
        f"({tree.files.get('toml', 0)} TOML, {tree.files.get('cu', 0)} .cu, "
        f"{tree.files.get('cuh', 0) + tree.files.get('h', 0)} headers, "
        f"{tree.files.get('metal', 0)} .metal), {len(tree.vendors)} hardware trees",
        f"modules per target: {ranges}",
        f"layout --json: {len(layout)} targets, {errors} errors, "
        f"{agree}/{len(tree.targets)} module sets as generated",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", default=HERE / "out" / "real")
    ap.add_argument("--scale", type=float, default=1.0, help="files per directory (0-1]")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1, help="doit -n for the cold build")
    ap.add_argument("--skip-build", action="store_true", help="only check, layout, generation")
    ap.add_argument(
        "--real-nvcc",
        action="store_true",
        help="build the NVIDIA targets with the nvcc on PATH (no overhead figure then)",
    )
    ap.add_argument(
        "--no-bytecode", action="store_true", help="leave PYTHONDONTWRITEBYTECODE as it is"
    )
    args = ap.parse_args()
    root: Path = args.out.resolve()
    if root.exists():
        shutil.rmtree(root)
    tree = generate_real(root, scale=args.scale)
    fakes = install_fakes(root, nvcc=not args.real_nvcc)
    env = bench_env(root, fakes, bytecode=not args.no_bytecode)
    cli = [str(Path(PY).parent / "metrale-orch"), "--root", str(root)]
    doit = [PY, "-m", "doit"]

    layout_run = Run([*cli, "layout", "--json"], root, env)
    layout = json.loads(layout_run.out) if layout_run.rc == 0 else {}
    for line in shape(tree, layout):
        print(line)
    if layout_run.rc != 0:
        print(f"layout --json failed ({layout_run.rc}): {layout_run.err.strip()}")
    specs = specs_of(root, env)
    print(f"generated tasks: {Counter(s.kind for s in specs)} ({root})")

    # check, layout --json and the floor take turns.
    runs: dict[str, list[Run]] = {"check": [], "layout": [], "floor": []}
    for _ in range(args.reps):
        runs["check"].append(Run([*cli, "check"], root, env))
        runs["layout"].append(Run([*cli, "layout", "--json"], root, env))
        runs["floor"].append(Run([PY, str(HERE / "floor.py"), str(root)], root, env))
    check, lay, floor = (med([r.seconds for r in runs[k]]) for k in ("check", "layout", "floor"))
    last_check = runs["check"][-1]
    print(f"\ncheck, layout (median of {args.reps}, interleaved)")
    print(f"  metrale-orch check          {ms(check)}   ratio to floor {check / floor:.2f}x")
    print(f"  metrale-orch layout --json  {ms(lay)}   ratio to floor {lay / floor:.2f}x")
    print(f"  floor: python + scandir + tomllib {ms(floor)}")
    print(f"  check exit {last_check.rc}; its output:")
    for line in (last_check.out + last_check.err).strip().splitlines():
        print(f"    {_short(line, root)}")

    # Cold task generation: doit list with the task cache removed, vs plain doit list.
    deps = {s.target: list(s.file_dep) for s in specs if s.kind == "build"}
    (root / "plain-deps.json").write_text(json.dumps(deps))
    (root / "dodo_plain.py").write_text(PLAIN_DODO)
    plain = [*doit, "-f", "dodo_plain.py"]
    gen: list[float] = []
    plain_list: list[float] = []
    Run([*doit, "list"], root, env)  # writes bytecode once
    for _ in range(args.reps):
        drop_task_cache(root)
        gen.append(Run([*doit, "list"], root, env).seconds)
        plain_list.append(Run([*plain, "list"], root, env).seconds)
    warm_list = med([Run([*doit, "list"], root, env).seconds for _ in range(args.reps)])
    g, pl = med(gen), med(plain_list)
    print(f"\ntask generation (median of {args.reps}, {len(specs)} targets, {len(deps)} build)")
    print(f"  doit list, no task cache    {ms(g)}   ratio to plain doit list {g / pl:.2f}x")
    print(f"  plain doit list, same deps  {ms(pl)}")
    print(f"  (doit list, task cache kept {ms(warm_list)})")

    failing = group_specs(specs)
    if args.skip_build:
        print("\nnot built (--skip-build). Targets the build refuses or skips:")
        print("\n".join(failing) or "    none")
        return 0

    # The full cold build with the fakes.
    clean_build(root)
    jobs = ["-n", str(args.jobs), "-P", "process"] if args.jobs > 1 else []
    cold = Run([*doit, *jobs, "build"], root, env)
    entries = read_log(root / "fake-log.jsonl")
    built = manifests(root)
    pairs = sum(len(m["modules"]) for m in built)
    outcomes = Counter(mod["outcome"] for m in built for mod in m["modules"])
    compiles = [e for e in entries if not e.get("probe")]
    probes = len(entries) - len(compiles)
    fake_time = replay(entries, env, root / "replay")
    which = "fake compilers" + (" (the real nvcc for NVIDIA)" if args.real_nvcc else "")
    print(f"\ncold build, {which}, doit {' '.join(jobs) or '-n 1'} (exit {cold.rc})")
    print(f"  wall                        {cold.seconds:8.1f} s")
    inside = sum(e["seconds"] for e in entries)
    print(
        f"  fakes' own time (replay)    {fake_time:8.1f} s   "
        f"({len(compiles)} compiles, {probes} probes; inside the fakes {inside:.1f} s)"
    )
    print(f"  targets with a manifest     {len(built):8d} / {len(tree.targets)}")
    print(f"  (target, module) pairs      {pairs:8d}   outcomes {dict(outcomes)}")
    if pairs and args.jobs == 1 and not args.real_nvcc:
        over = cold.seconds - fake_time
        print(
            f"  orchestration overhead      {over / pairs * 1000:8.2f} ms per module "
            f"({over:.1f} s; {over / max(1, len(compiles)) * 1000:.2f} ms per compile)"
        )
    for line in cold.out.strip().splitlines()[-4:]:
        print(f"  | {_short(line, root)}")

    # No-op after it, against plain doit with the same deps and ninja: over the targets
    # that built (named on the command line), and as a user runs it (every target,
    # failing ones included: they run again each time).
    built_deps = {m["target"]: deps[m["target"]] for m in built if m["target"] in deps}
    (root / "plain-deps.json").write_text(json.dumps(built_deps))
    Run(plain, root, env)
    write_ninja(root, built_deps)
    ninja_bin = Path(PY).parent / "ninja"
    ninja = [str(ninja_bin)] if ninja_bin.exists() else ["ninja"]
    Run(ninja, root, env)
    named = [*doit, *(f"build:{t}" for t in sorted(built_deps))]
    log = root / "fake-log.jsonl"
    calls: list[int] = []
    noop: dict[str, list[float]] = {"named": [], "all": [], "plain": [], "ninja": []}
    rcs: dict[str, set[int]] = {"named": set(), "all": set()}
    for _ in range(args.reps):
        for key, argv in (("named", named), ("all", [*doit, "build"])):
            before = len(read_log(log))
            ours = Run(argv, root, env)
            if key == "named":
                calls.append(len(read_log(log)) - before)
            rcs[key].add(ours.rc)
            noop[key].append(ours.seconds)
        noop["plain"].append(Run(plain, root, env).seconds)
        noop["ninja"].append(Run(ninja, root, env).seconds)
    o, a, p, n = (med(noop[k]) for k in ("named", "all", "plain", "ninja"))
    print(f"\nno-op doit build (median of {args.reps}, interleaved)")
    print(
        f"  doit build:<each built target> {ms(o)}   ({len(built_deps)} targets, "
        f"exit {sorted(rcs['named'])})"
    )
    print(f"  plain doit, same deps          {ms(p)}   ratio {o / p:.2f}x")
    print(f"  ninja, same deps               {ms(n)}   ratio {o / n:.2f}x")
    per_call = fake_time / max(1, len(entries))
    probes = med([float(c) for c in calls])
    print(
        f"  (of which the toolchain probes: {probes:.0f} fake calls per run, "
        f"~{probes * per_call * 1000:.0f} ms at the fakes' {per_call * 1000:.0f} ms per call)"
    )
    failing_too = len(tree.targets) - len(built_deps)
    print(
        f"  doit build (all {len(tree.targets)} targets)   {ms(a)}   (exit {sorted(rcs['all'])}"
        + (f"; the {failing_too} that do not build run again)" if failing_too else ")")
    )

    print("\ncommand lines from the fakes' log, one per hardware and step:")
    print("\n".join(command_lines(compiles, root)) or "  none")
    hip = [e for e in compiles if e["kind"] == "hipcc" and e["rc"] == 0]
    if hip:
        bad = sum(1 for e in hip if e.get("unmirrored"))
        print(f"  hipcc: {bad}/{len(hip)} compiles were handed hex warp masks without ULL")
    print("\nwhat does not build today:")
    print("  refused before building:")
    print("\n".join(failing) or "    none: every target generates a build task")
    print("  failed while building:")
    failed = group_failed_compiles(compiles, root)
    refused = {s.target for s in specs if s.kind != "build"}
    fake_targets = {
        "/".join(Path(e["cwd"]).relative_to(root / "build" / "stage").parts[:3])
        for e in compiles
        if e["rc"] != 0
    }
    others = group_build_failures(cold.out + cold.err, root, refused | fake_targets)
    print("\n".join([*failed, *others]) or "    none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
