"""P3, P4 and the warm-remote rebuild: real nvcc builds of the sample tree, each against a peer.

    .venv/bin/python bench/bench_build.py [--reps 1] [--warm-reps 3] [--jobs 2]
        [--skip-ccache] [--skip-remote] [--work DIR]

A temporary project holds a copy of the repository's ``kernels/`` and the
one-line ``dodo.py``; every build is ``python -m doit ...`` in a subprocess,
as a user runs it, with its own local cache directory
(``METRALE_ORCH_LOCAL_CACHE``) and no other ``METRALE_ORCH_*`` setting.
"Clean" means: delete ``build/`` and ``.doit.db``. Scenarios, all in one run:

cold -n 1      clean, empty cache, ``doit build`` (``--reps`` times, median).
warm local     clean, keep the cache of the cold build, ``doit build`` and
               ``doit -n JOBS -P process build``                  (P3 vs cold).
ninja+ccache   one ninja edge per (target, module) compile exactly as metrale-orch
               runs it: in the staged role directory of the build above, the argv
               of ``compile.plan_target`` (``ModulePlan.argv``), output into a
               separate directory, prefixed with ``ccache`` (``CCACHE_DIR`` in the
               work dir). ccache 4.x treats an nvcc call without ``-c`` as a link
               and does not cache it ("Called for linking"), so the edges insert
               ``-c`` after ``nvcc`` (nvcc still writes the same PTX bytes, checked
               below). Filled once (cold), outputs deleted, then timed warm with
               ``ninja -j 1`` and ``-j JOBS``                     (P3 vs ccache).
cold -n JOBS   clean, empty cache, ``doit -n JOBS -P process build``    (P4 vs cold -n 1).
ceiling        the first ``--ceiling-edges`` compiles as plain nvcc under ninja, ``-j 1``
               then ``-j JOBS``: the parallel speed-up the (shared) machine gives now,
               the most P4 can show in this run.
S3 fill        a moto S3 server on 127.0.0.1 (this process); clean, empty local
               cache, ``METRALE_ORCH_CACHE=s3://...``: a cold build that uploads.
warm remote    clean, a fresh EMPTY local cache each rep, the same remote:
               every module comes from S3                          (vs cold -n 1).

Each scenario checks its outcome (``manifest.json`` module outcomes, ccache's
hit count, artefact bytes equal to the cold build's) and the script exits
non-zero if one does not hold. Cold builds take ~1-2 min each on 2 shared cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PY = sys.executable
DODO = "from metrale_orch.dodo import *  # noqa: F403\n"

sys.path.append(str(REPO))  # for tests.support.servers; PYTHONPATH wins


class BenchFailed(Exception):
    """A scenario did not do what it measures (a failed build, a missing cache hit)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    name: str
    seconds: float
    note: str = ""


# ----------------------------------------------------------------------------- helpers


def base_env() -> dict[str, str]:
    """The caller's environment without any metrale-orch setting, the venv's bin first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METRALE_ORCH_", "CCACHE_"))}
    env["PATH"] = f"{Path(PY).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def make_project(work: Path) -> Path:
    proj = work / "project"
    shutil.copytree(REPO / "kernels", proj / "kernels")
    (proj / "dodo.py").write_text(DODO)
    return proj


def clean(proj: Path) -> None:
    shutil.rmtree(proj / "build", ignore_errors=True)
    for db in proj.glob(".doit.db*"):
        db.unlink()


def timed(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> tuple[float, str]:
    """Run ``argv``; (seconds, stdout+stderr). Raises BenchFailed on a non-zero exit."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        list(argv), cwd=cwd, env=dict(env), capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise BenchFailed(f"exit {proc.returncode}: {shlex.join(argv)}\n{text[-4000:]}")
    return seconds, text


def doit(proj: Path, args: Sequence[str], env: Mapping[str, str]) -> tuple[float, str]:
    return timed([PY, "-m", "doit", *args], proj, env)


def summary(text: str) -> str:
    """The reporter's ``build: ...`` and ``cache: ...`` lines."""
    keep = [ln for ln in text.splitlines() if ln.startswith(("build: ", "cache: ", "warning: "))]
    return " | ".join(keep)


def outcomes(proj: Path) -> Counter[str]:
    """Module outcomes over every ``manifest.json`` under ``build/``."""
    found: Counter[str] = Counter()
    for manifest in (proj / "build").rglob("manifest.json"):
        if manifest.relative_to(proj / "build").parts[0] == "stage":
            continue
        for module in json.loads(manifest.read_text())["modules"]:
            found[str(module["outcome"])] += 1
    return found


def artefacts(proj: Path) -> dict[str, bytes]:
    """Target-relative artefact path -> bytes (every file of each manifest's modules)."""
    out: dict[str, bytes] = {}
    build = proj / "build"
    for manifest in build.rglob("manifest.json"):
        if manifest.relative_to(build).parts[0] == "stage":
            continue
        for module in json.loads(manifest.read_text())["modules"]:
            path = manifest.parent / module["artefact"]
            out[path.relative_to(build).as_posix()] = path.read_bytes()
    return out


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise BenchFailed(what)


def tool_version(argv: Sequence[str], pattern: str) -> str:
    try:
        text = subprocess.run(list(argv), capture_output=True, text=True, check=False).stdout
    except OSError:
        return "not installed"
    m = re.search(pattern, text)
    return m.group(0) if m else text.strip().splitlines()[0] if text.strip() else "?"


def machine_line() -> str:
    load = os.getloadavg()
    ninja = tool_version([ninja_program(), "--version"], r"[0-9]+(\.[0-9]+)+")
    return (
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"nvcc {tool_version(['nvcc', '--version'], r'release [0-9.]+')}, "
        f"{tool_version(['ccache', '--version'], r'ccache version [0-9.]+')}, "
        f"ninja {ninja}, "
        f"load average at start {load[0]:.2f}"
    )


def ninja_program() -> str:
    local = Path(PY).parent / "ninja"
    return str(local) if local.exists() else "ninja"


# ----------------------------------------------------------------------------- doit scenarios


def cold_build(
    proj: Path, work: Path, env: Mapping[str, str], args: Sequence[str], label: str, rep: int
) -> tuple[float, str]:
    clean(proj)
    cache = work / f"cache-{label}-{rep}"
    shutil.rmtree(cache, ignore_errors=True)
    seconds, text = doit(proj, args, {**env, "METRALE_ORCH_LOCAL_CACHE": str(cache)})
    got = outcomes(proj)
    expect(got["compiled"] > 0 and not got["remote"], f"{label}: nothing compiled: {dict(got)}")
    return seconds, text


# ----------------------------------------------------------------------------- ninja + ccache


def ninja_escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def write_ninja(
    proj: Path,
    stage: Path,
    out: Path,
    env: Mapping[str, str],
    ninja_dir: Path,
    *,
    ccache: bool = True,
    limit: int | None = None,
) -> dict[str, str]:
    """build.ninja with one edge per (target, module); returns out path -> artefact key.

    ``ccache``: prefix ``ccache`` and insert ``-c``; ``limit``: only the first edges.
    """
    from metrale_orch.graph.generate import resolve_build_specs

    cwd = os.getcwd()
    os.chdir(proj)
    try:
        specs = resolve_build_specs(proj, env)
    finally:
        os.chdir(cwd)
    lines = [
        "rule cc",
        "  command = cd $dir && $cmd",
        "  description = $desc",
        "",
    ]
    edges: dict[str, str] = {}
    for spec in specs:
        if spec.kind != "build":
            continue
        for module in spec.plan.modules:
            if limit is not None and len(edges) >= limit:
                break
            argv = list(module.argv)
            dest = out / spec.target / module.artefact
            argv[argv.index("-o") + 1] = str(dest)
            if ccache:
                argv = ["ccache", argv[0], "-c", *argv[1:]]  # ccache caches only -c calls
            role = stage / spec.target / module.cwd
            source = role / module.entry
            expect(source.is_file(), f"staged source missing: {source}")
            lines += [
                f"build {ninja_escape(str(dest))}: cc {ninja_escape(str(source))}",
                f"  dir = {shlex.quote(str(role)).replace('$', '$$')}",
                f"  cmd = {shlex.join(argv).replace('$', '$$')}",
                f"  desc = {spec.target} {module.name}",
            ]
            edges[str(dest)] = f"{spec.target}/{module.artefact}"
    (ninja_dir / "build.ninja").write_text("\n".join(lines) + "\n")
    return edges


def bench_ceiling(
    proj: Path, work: Path, env: Mapping[str, str], *, jobs: int, edges: int
) -> list[Row]:
    """The machine's parallel headroom now: the first ``edges`` plain nvcc compiles of the
    staged tree under ninja, ``-j 1`` then ``-j JOBS`` (no cache, outputs deleted between)."""
    ninja_dir = work / "ceiling"
    shutil.rmtree(ninja_dir, ignore_errors=True)
    ninja_dir.mkdir()
    stage = ninja_dir / "stage"
    shutil.copytree(proj / "build" / "stage", stage)
    out = ninja_dir / "out"
    n = len(write_ninja(proj, stage, out, env, ninja_dir, ccache=False, limit=edges))
    rows = []
    for j in (1, jobs):
        reset_outputs(ninja_dir, out)
        seconds, _ = timed([ninja_program(), "-j", str(j)], ninja_dir, env)
        rows.append(Row(name=f"plain nvcc x{n}, ninja -j {j}", seconds=seconds))
    return rows


def ccache_stats(env: Mapping[str, str]) -> dict[str, int]:
    """ccache's counters (``--print-stats``: name<TAB>value)."""
    text = subprocess.run(
        ["ccache", "--print-stats"], env=dict(env), capture_output=True, text=True, check=True
    ).stdout
    stats: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition("\t")
        if value.strip().isdigit():
            stats[name] = int(value)
    return stats


def reset_outputs(ninja_dir: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    for name in (".ninja_log", ".ninja_deps"):
        with contextlib.suppress(FileNotFoundError):
            (ninja_dir / name).unlink()


def bench_ccache(
    proj: Path,
    work: Path,
    env: Mapping[str, str],
    *,
    jobs: int,
    warm_reps: int,
    reference: Mapping[str, bytes],
) -> list[Row]:
    if shutil.which("ccache", path=env.get("PATH")) is None:
        raise BenchFailed(
            "ccache is not installed (Debian: apt-get install -y ccache); or pass --skip-ccache"
        )
    ninja_dir = work / "ninja"
    shutil.rmtree(ninja_dir, ignore_errors=True)
    ninja_dir.mkdir()
    stage = ninja_dir / "stage"
    shutil.copytree(proj / "build" / "stage", stage)  # the staged tree of a metrale-orch build
    out = ninja_dir / "out"
    edges = write_ninja(proj, stage, out, env, ninja_dir)
    cenv = {**env, "CCACHE_DIR": str(work / "ccache")}
    shutil.rmtree(work / "ccache", ignore_errors=True)
    ninja = ninja_program()
    rows: list[Row] = []

    subprocess.run(["ccache", "-z"], env=cenv, capture_output=True, check=True)
    fill, _ = timed([ninja, "-j", str(jobs)], ninja_dir, cenv)
    stats = ccache_stats(cenv)
    misses = stats.get("direct_cache_miss", 0) + stats.get("preprocessed_cache_miss", 0)
    uncacheable = stats.get("called_for_link", 0) + stats.get("unsupported_compiler_option", 0)
    expect(uncacheable == 0, f"ccache refused to cache the compiles: {stats}")
    rows.append(
        Row(
            name=f"ninja+ccache cold fill (-j {jobs})",
            seconds=fill,
            note=f"{len(edges)} edges, {misses} ccache misses",
        )
    )
    identical = sum(Path(p).read_bytes() == reference.get(key) for p, key in edges.items())
    expect(
        identical == len(edges),
        f"ninja+ccache artefacts differ from metrale-orch's: {identical}/{len(edges)} equal",
    )

    for j in (1, jobs):
        times = []
        direct = pre = 0
        for _ in range(warm_reps):
            reset_outputs(ninja_dir, out)
            subprocess.run(["ccache", "-z"], env=cenv, capture_output=True, check=True)
            seconds, _ = timed([ninja, "-j", str(j)], ninja_dir, cenv)
            stats = ccache_stats(cenv)
            direct = stats.get("direct_cache_hit", 0)
            pre = stats.get("preprocessed_cache_hit", 0)
            expect(direct + pre == len(edges), f"warm ccache missed: {stats}")
            times.append(seconds)
        rows.append(
            Row(
                name=f"ninja+ccache warm (-j {j})",
                seconds=statistics.median(times),
                note=f"{direct} direct + {pre} preprocessed hits",
            )
        )
    return rows


# ----------------------------------------------------------------------------- remote


@contextlib.contextmanager
def s3() -> Iterator[Any]:
    from tests.support.servers import s3_server

    with s3_server() as server:
        yield server


def remote_env(env: Mapping[str, str], server: Any) -> dict[str, str]:
    return {
        **env,
        "METRALE_ORCH_CACHE": server.url("bench"),
        "METRALE_ORCH_STORAGE_OPTIONS": json.dumps(server.storage_options),
    }


# ----------------------------------------------------------------------------- main


def ratio_line(row: Row, peer: Row, goal: str) -> str:
    if row.seconds <= peer.seconds:
        verdict = f"{peer.seconds / row.seconds:7.1f}x faster"
    else:
        verdict = f"{row.seconds / peer.seconds:7.2f}x slower"
    return f"  {row.name:<34} vs {peer.name:<34} {verdict}   goal: {goal}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=1, help="repetitions of each cold build")
    ap.add_argument("--warm-reps", type=int, default=3, help="repetitions of each warm run")
    ap.add_argument("--jobs", type=int, default=2, help="parallel jobs of the P4 build")
    ap.add_argument(
        "--ceiling-edges", type=int, default=12, help="plain compiles timed for the P4 ceiling"
    )
    ap.add_argument("--skip-ccache", action="store_true")
    ap.add_argument("--skip-remote", action="store_true")
    ap.add_argument("--work", type=Path, help="work directory (kept); default: a temporary one")
    args = ap.parse_args(argv)

    print(f"machine: {machine_line()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}")
    with contextlib.ExitStack() as stack:
        if args.work is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-build-")))
        else:
            work = args.work.resolve()
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
        try:
            return run(work, args)
        except BenchFailed as exc:
            print(f"\nFAILED: {exc}", file=sys.stderr)
            return 1


def run(work: Path, args: argparse.Namespace) -> int:
    proj = make_project(work)
    env = base_env()
    rows: dict[str, Row] = {}

    def show(row: Row, text: str = "") -> None:
        rows[row.name] = row
        extra = f"  [{row.note}]" if row.note else ""
        print(f"{row.name:<36} {row.seconds:8.2f} s{extra}")
        if text:
            print(f"    {summary(text)}")

    # P3 peer and P4 baseline: cold -n 1
    times, text = [], ""
    for rep in range(args.reps):
        seconds, text = cold_build(proj, work, env, ["build"], "cold1", rep)
        times.append(seconds)
    cold_counts = outcomes(proj)
    reference = artefacts(proj)
    show(Row(name="cold build -n 1", seconds=statistics.median(times)), text)
    print(f"    modules: {dict(sorted(cold_counts.items()))} in {len(reference)} artefacts")
    warm_cache = work / f"cache-cold1-{args.reps - 1}"

    # P3: warm local rebuild, -n 1 and -n JOBS
    parallel = ["-n", str(args.jobs), "-P", "process"]
    for label, opts in (("-n 1", []), (f"-n {args.jobs} -P process", parallel)):
        times = []
        for _ in range(args.warm_reps):
            clean(proj)
            seconds, text = doit(
                proj, [*opts, "build"], {**env, "METRALE_ORCH_LOCAL_CACHE": str(warm_cache)}
            )
            got = outcomes(proj)
            expect(set(got) == {"local"}, f"warm local rebuild compiled something: {dict(got)}")
            expect(artefacts(proj) == reference, "warm local artefacts differ from the cold's")
            times.append(seconds)
        show(Row(name=f"warm local rebuild {label}", seconds=statistics.median(times)), text)

    if not args.skip_ccache:
        for row in bench_ccache(
            proj, work, env, jobs=args.jobs, warm_reps=args.warm_reps, reference=reference
        ):
            show(row)

    # P4: cold -n JOBS
    times = []
    for rep in range(args.reps):
        seconds, text = cold_build(
            proj, work, env, ["-n", str(args.jobs), "-P", "process", "build"], "coldN", rep
        )
        expect(artefacts(proj) == reference, "the parallel build's artefacts differ")
        times.append(seconds)
    show(Row(name=f"cold build -n {args.jobs} -P process", seconds=statistics.median(times)), text)
    ceiling = bench_ceiling(proj, work, env, jobs=args.jobs, edges=args.ceiling_edges)
    for row in ceiling:
        show(row)

    if not args.skip_remote:
        with s3() as server:
            renv = remote_env(env, server)
            fill_cache = work / "cache-fill"
            clean(proj)
            seconds, text = doit(
                proj, ["build"], {**renv, "METRALE_ORCH_LOCAL_CACHE": str(fill_cache)}
            )
            puts = len(server.writes())
            expect(puts > 0, "the fill build uploaded nothing")
            show(
                Row(name="cold build -n 1 + S3 upload", seconds=seconds, note=f"{puts} PUTs"), text
            )
            times = []
            for rep in range(args.warm_reps):
                clean(proj)
                empty = work / f"cache-remote-{rep}"
                mark = server.mark()
                seconds, text = doit(
                    proj, ["build"], {**renv, "METRALE_ORCH_LOCAL_CACHE": str(empty)}
                )
                got = outcomes(proj)
                expect(
                    got["remote"] > 0 and not got["compiled"],
                    f"warm remote rebuild compiled something: {dict(got)}",
                )
                expect(
                    artefacts(proj) == reference, "remote artefacts differ from the cold build's"
                )
                gets = sum(1 for method, _ in server.log()[mark:] if method == "GET")
                times.append(seconds)
            show(
                Row(
                    name="warm remote rebuild (S3) -n 1",
                    seconds=statistics.median(times),
                    note=f"{dict(sorted(got.items()))}, {gets} GETs",
                ),
                text,
            )

    cold = rows["cold build -n 1"]
    print("\nratios (each against a peer measured in this run)")
    print(ratio_line(rows["warm local rebuild -n 1"], cold, "P3 >= 50x faster"))
    ours_n = rows[f"warm local rebuild -n {args.jobs} -P process"]
    if "ninja+ccache warm (-j 1)" in rows:
        print(
            ratio_line(
                rows["warm local rebuild -n 1"], rows["ninja+ccache warm (-j 1)"], "P3 faster"
            )
        )
        peer = rows[f"ninja+ccache warm (-j {args.jobs})"]
        print(ratio_line(rows["warm local rebuild -n 1"], peer, "P3 faster"))
        print(ratio_line(ours_n, peer, "P3 faster"))
    print(
        ratio_line(
            rows[f"cold build -n {args.jobs} -P process"],
            cold,
            f"P4 >= 1.7x faster (-n {args.jobs})",
        )
    )
    print(
        ratio_line(
            ceiling[1], ceiling[0], f"none: the machine's -j {args.jobs} headroom now (P4 ceiling)"
        )
    )
    if "warm remote rebuild (S3) -n 1" in rows:
        print(ratio_line(rows["warm remote rebuild (S3) -n 1"], cold, "none (reported)"))
        print(ratio_line(rows["cold build -n 1 + S3 upload"], cold, "none (upload cost)"))
    print(f"\nreps: cold {args.reps}, warm {args.warm_reps} (medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
