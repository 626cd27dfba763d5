"""Dump every task a tree generates, canonically, to compare generations byte for byte.

    python bench/dump_tasks.py ROOT [--bench-env] > tasks.txt

Runs ``task_build`` of ``metrale_orch.dodo`` in this process with ``ROOT`` as the
working directory, twice: with the task cache removed (cold generation) and then
from the task cache it wrote (a hit), and prints each task dict with callables by
qualified name and each ``SignatureCheck`` by its parts, then the full signature of
every build plan as generation made it (sorted JSON). The two passes must print the
same tasks; ``--bench-env`` runs under the environment of ``bench/bench_real.py``
(its fake compilers, reinstalled under ``ROOT/fakes``). A change to task generation
that must not change the tasks leaves this output identical.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def canon(value: Any) -> Any:
    """``value`` as plain, printable data."""
    from metrale_orch.tasks.checker import SignatureCheck

    if isinstance(value, SignatureCheck):
        return {"SignatureCheck": canon(value.parts)}
    if callable(value):
        return f"<{value.__module__}.{value.__qualname__}>"
    if isinstance(value, Mapping):
        return {str(k): canon(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canon(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root", type=Path)
    ap.add_argument("--bench-env", action="store_true")
    args = ap.parse_args()
    root = args.root.resolve()
    if args.bench_env:
        from bench_real import bench_env, install_fakes

        env = bench_env(root, install_fakes(root), bytecode=True)
        os.environ.clear()
        os.environ.update(env)
    os.chdir(root)
    sys.argv = ["doit", "list"]
    from metrale_orch import dodo
    from metrale_orch.graph.generate import generate_specs

    passes = []
    for drop in (True, False):
        if drop:
            for entry in (root / "build" / ".state").glob("build-tasks.*.cache"):
                entry.unlink()
        tasks = [canon(t) for t in dodo.task_build()]
        passes.append(json.dumps(tasks, indent=1, sort_keys=True))
    print(passes[0])
    if passes[0] != passes[1]:
        print("MISMATCH: the task cache's tasks differ from generation", file=sys.stderr)
        return 1
    specs, cacheable = generate_specs(root, os.environ, [])
    print(f"cacheable {cacheable}")
    for spec in specs:
        sig = spec.plan.signature if spec.plan is not None else None
        print(spec.target, spec.kind, json.dumps(canon(sig), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
