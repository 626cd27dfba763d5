"""What each speed mechanism saves, measured alone: the sample tree's no-op with the package
as it is against copies of it with one mechanism switched off, interleaved.

    python bench/ab_mechanisms.py [--out /tmp/ab-mechanisms] [--reps 16] [NAME ...]

Each NAME (default: all of :data:`SWITCHED_OFF`) is a copy of this checkout's package with
one change that switches that mechanism off, put first on ``PYTHONPATH`` of its own copy of
``kernels/`` (every copy shares one local cache, so only the first builds for real). Then
``doit build`` and ``doit build:hopper/qwen3-8b/bf16`` run ``--reps`` times per copy, the
copies taking turns; every measured run must be a no-op. Prints the median and the fastest
run of each. A change that no longer applies to the package stops the benchmark.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loader_noop import REPO, TARGET, _doit, _tree  # the sample tree's copy and no-op run

#: mechanism -> (file under metrale_orch/, text, its replacement that switches it off).
SWITCHED_OFF: dict[str, tuple[str, str, str]] = {
    "early-dry-runs": (
        "dodo.py",
        "if not loader_present():\n    start_early_runs(",
        "if False:\n    start_early_runs(",
    ),
    "probe-records": (
        "toolchain/probe.py",
        "store = None if state_dir is None else RecordStore(Path(state_dir), memo_key)",
        "store = None",
    ),
    "gc-freeze": ("dodo.py", "    gc.freeze()\n", "    pass\n"),
    "scope": (
        "graph/scope.py",
        '    if selection is None or selection.command != "run":\n        return None',
        "    if True:\n        return None",
    ),
}


def _package(out: Path, name: str, changes: list[tuple[str, str, str]] | None = None) -> Path:
    """A copy of the package (``out/pkg-NAME/metrale_orch``) with ``name`` switched off
    (``changes``: its edits, by default :data:`SWITCHED_OFF`'s; "base": unchanged); the
    directory to put on ``PYTHONPATH``."""
    where = out / f"pkg-{name}"
    shutil.rmtree(where, ignore_errors=True)
    shutil.copytree(REPO / "metrale_orch", where / "metrale_orch")
    if name != "base":
        for rel, text, off in changes if changes is not None else [SWITCHED_OFF[name]]:
            path = where / "metrale_orch" / rel
            source = path.read_text()
            if source.count(text) != 1:
                sys.exit(f"{name}: {rel} no longer holds the text this benchmark switches off")
            path.write_text(source.replace(text, off))
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME", help=", ".join(SWITCHED_OFF))
    ap.add_argument("--out", type=Path, default=Path("/tmp/ab-mechanisms"))
    ap.add_argument("--reps", type=int, default=16)
    args = ap.parse_args()
    unknown = sorted(set(args.names) - set(SWITCHED_OFF))
    if unknown:
        ap.error(f"unknown mechanism {', '.join(unknown)} (known: {', '.join(SWITCHED_OFF)})")
    names = ["base", *(args.names or SWITCHED_OFF)]
    args.out.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("METRALE_")}
    base["METRALE_ORCH_LOCAL_CACHE"] = str(args.out / "cache")
    sides = {}
    for name in names:
        env = {**base, "PYTHONPATH": str(_package(args.out, name))}
        env["PYTHONPYCACHEPREFIX"] = str(args.out / f"pyc-{name}")
        sides[name] = (_tree(args.out, f"tree-{name}", False), env)
    selections = {"build": ["build"], "scoped": [f"build:{TARGET}"]}
    for tree, env in sides.values():
        for sel in selections.values():
            for _ in range(2):  # built, then the task cache and the probe plan written
                _doit(tree, sel, env)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.reps):
        for what, sel in selections.items():
            for name, (tree, env) in sides.items():
                seconds, text = _doit(tree, sel, env)
                if "0 built" not in text or " 0 failed" not in text:
                    sys.exit(f"{name} {what}: not a no-op:\n{text}")
                times.setdefault((what, name), []).append(seconds)
    for (what, name), got in sorted(times.items()):
        label = "as is" if name == "base" else f"without {name}"
        print(
            f"{what:6s} {label:24s} median {statistics.median(got) * 1000:5.0f} ms, "
            f"fastest {min(got) * 1000:5.0f} ms"
        )


if __name__ == "__main__":
    main()
