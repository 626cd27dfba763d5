"""Synthetic kernel-tree generator for benchmarks.

Writes a project root (``kernels/`` + a one-line ``dodo.py``) shaped like a
production tree: base hardware trees, overlay trees that inherit them,
models with quant leaves, `use` of shared files, and declared shadows of
both kinds (own over parent, leaf over common). Every target resolves.

    python bench/gen_tree.py OUT [--hardware 4] [--overlays 4] [--models 25]
        [--quants 5] [--files 14] [--use-density 0.2] [--shadow-density 0.2] [--seed 0]

The default is 8 hardware trees x 25 models x 5 quants = 1000 targets, each
reading about 40 inputs.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

ARCHES = ("sm_90a", "sm_100a", "sm_103a", "sm_121f", "sm_80", "sm_89", "sm_120a", "sm_86")


def _kernel(name: str, tag: str) -> str:
    ident = "".join(c if c.isalnum() else "_" for c in f"{name}_{tag}")
    return (
        f'#include "hdr0.cuh"\n'
        f'extern "C" __global__ void k_{ident}(float* out) {{\n'
        f"    out[threadIdx.x] = {len(ident)}.0f;\n}}\n"
    )


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def generate(
    out: Path,
    *,
    hardware: int = 4,
    overlays: int = 4,
    models: int = 25,
    quants: int = 5,
    files: int = 14,
    use_density: float = 0.2,
    shadow_density: float = 0.2,
    seed: int = 0,
) -> int:
    """Write the tree under ``out``; returns the number of targets it has."""
    rng = random.Random(seed)
    kernels = out / "kernels"
    _write(out / "dodo.py", "from metrale_orch.dodo import *  # noqa: F403\n")
    shared = [f"u{j}.cu" for j in range(max(4, files))]
    for name in shared:
        _write(kernels / "_shared" / name, _kernel(name, "shared"))
        _write(kernels / "_shared" / ("v" + name[1:]), _kernel("v" + name[1:], "shared"))
    _write(kernels / "_shared" / "hdr0.cuh", "#pragma once\n")

    n_common = max(2, files - 2)
    common_names = [f"c{j}.cu" for j in range(n_common)]
    bases = [f"base{i}" for i in range(hardware)]
    for i, hw in enumerate(bases):
        _write(
            kernels / hw / "HARDWARE.toml",
            f'[hardware]\nvendor = "nvidia"\narch = "{ARCHES[i % len(ARCHES)]}"\n',
        )
        common = kernels / hw / "common"
        for name in common_names:
            _write(common / name, _kernel(name, hw))
        _write(common / "hdr0.cuh", f"#pragma once\n// {hw}\n")
        _write(common / "hdr1.cuh", f"#pragma once\n// {hw} 1\n")
        _write(common / "vendor" / "v.h", f"// vendored {hw}\n")
        for m in range(models):
            _model(
                rng,
                kernels / hw / f"model{m}",
                hw,
                quants,
                files,
                common_names,
                shared,
                use_density,
                shadow_density,
                parent=None,
            )

    for i in range(overlays):
        hw = f"ovl{i}"
        parent = bases[i % len(bases)] if bases else None
        if parent is None:
            break
        _write(
            kernels / hw / "HARDWARE.toml",
            f'[hardware]\nvendor = "nvidia"\narch = "{ARCHES[(i + 3) % len(ARCHES)]}"\n'
            f'inherits = "{parent}"\n',
        )
        common = kernels / hw / "common"
        replaced = [n for n in common_names if rng.random() < shadow_density] or common_names[:1]
        for name in replaced:
            _write(common / name, _kernel(name, hw))
        for j in range(max(1, files - len(replaced))):
            _write(common / f"o{j}.cu", _kernel(f"o{j}", hw))
        shadow = "".join(f'c{n[1:-3]} = "tuned for {hw}"\n' for n in replaced)
        _write(common / "KERNEL.toml", f"[shadow]\n{shadow}")
        for m in range(models):
            _model(
                rng,
                kernels / hw / f"model{m}",
                hw,
                quants,
                files,
                common_names,
                shared,
                use_density,
                shadow_density,
                parent=parent,
            )
    return (hardware + (overlays if bases else 0)) * models * quants


def _model(
    rng: random.Random,
    model_dir: Path,
    hw: str,
    quants: int,
    files: int,
    common_names: list[str],
    shared: list[str],
    use_density: float,
    shadow_density: float,
    parent: str | None,
) -> None:
    _write(model_dir / "MODEL.toml", "[model]\n")
    if parent is not None:
        # Overlays own only some quants; the rest come from the parent's leaves.
        own = [q for q in range(quants) if rng.random() < 0.5]
    else:
        own = list(range(quants))
    for q in own:
        leaf = model_dir / f"q{q}"
        names = [f"l{j}.cu" for j in range(max(1, files - 2))]
        shadows: dict[str, str] = {}
        if parent is None:
            # Leaf over common: a leaf source named like a common one.
            for name in common_names:
                if rng.random() < shadow_density / 2:
                    names.append(name)
                    shadows[name[:-3]] = "model-specific variant"
        else:
            # Own over parent: the overlay replaces some of the parent's leaf files.
            for j in range(max(1, files - 2)):
                if rng.random() < shadow_density:
                    shadows[f"l{j}"] = f"retuned for {hw}"
            names = [f"l{j}.cu" for j in range(max(1, files - 2)) if f"l{j}" in shadows]
            names.append(f"x{q}.cu")
        for name in names:
            _write(leaf / name, _kernel(name, f"{hw}_{model_dir.name}_q{q}"))
        header = "leaf.cuh" if parent is None else "overlay.cuh"
        _write(leaf / header, f"#pragma once\n// {hw} {model_dir.name} {q}\n")
        # Base leaves use u*.cu and overlay leaves v*.cu, so an overlay never uses a file
        # its parent leaf already brings in (that would be a self-shadow).
        prefix = "u" if parent is None else "v"
        uses = sorted({prefix + s[1:] for s in shared if rng.random() < use_density})
        lines = []
        if uses:
            lines.append(f"[sources]\nuse = {_toml_list(['../_shared/' + u for u in uses])}\n")
        if shadows:
            lines.append("[shadow]\n" + "".join(f'{k} = "{v}"\n' for k, v in shadows.items()))
        if lines:
            _write(leaf / "KERNEL.toml", "\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--hardware", type=int, default=4)
    ap.add_argument("--overlays", type=int, default=4)
    ap.add_argument("--models", type=int, default=25)
    ap.add_argument("--quants", type=int, default=5)
    ap.add_argument("--files", type=int, default=14)
    ap.add_argument("--use-density", type=float, default=0.2)
    ap.add_argument("--shadow-density", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    n = generate(
        a.out,
        hardware=a.hardware,
        overlays=a.overlays,
        models=a.models,
        quants=a.quants,
        files=a.files,
        use_density=a.use_density,
        shadow_density=a.shadow_density,
        seed=a.seed,
    )
    print(f"{a.out}: {n} targets")


if __name__ == "__main__":
    main()
