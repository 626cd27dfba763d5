"""Tiny helpers that build kernel trees for the layout tests (SPEC section 1).

Every helper writes under a repository root (the directory holding ``kernels/``) and
returns the path it wrote, so a test reads as the tree it builds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from metrale_orch.tree import Target

__all__ = [
    "T",
    "files",
    "full_tree",
    "hw",
    "kernel_toml",
    "model",
    "overlay",
    "plain",
    "rel",
    "rels",
    "symlink",
    "toml_value",
    "write",
]


def write(root: Path, relpath: str, text: str | None = None) -> Path:
    """Write ``root/relpath`` (parents created); the default content names the file."""
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"// {relpath}\n" if text is None else text)
    return path


def files(root: Path, *relpaths: str) -> list[Path]:
    """Create each file (content = its own relative path, so no two files are identical)."""
    return [write(root, r) for r in relpaths]


def toml_value(value: object) -> str:
    """A TOML literal for str/int/bool/list values (JSON strings are valid TOML strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML literal for {value!r}")


def _table(name: str, values: Mapping[str, object]) -> str:
    lines = [f"[{name}]"]
    lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def hw(
    root: Path,
    name: str,
    *,
    vendor: object = None,
    arch: object = None,
    inherits: object = None,
    raw: str | None = None,
) -> Path:
    """``kernels/<name>/HARDWARE.toml`` with the given ``[hardware]`` keys (or ``raw`` text)."""
    if raw is None:
        keys = {
            k: v
            for k, v in (("vendor", vendor), ("arch", arch), ("inherits", inherits))
            if v is not None
        }
        raw = _table("hardware", keys)
    return write(root, f"kernels/{name}/HARDWARE.toml", raw)


def model(
    root: Path,
    hw_name: str,
    name: str,
    *,
    kernel_source: object = None,
    supported_quants: object = None,
    raw: str | None = None,
) -> Path:
    """``kernels/<hw>/<name>/MODEL.toml`` with the given ``[model]`` keys (or ``raw`` text)."""
    if raw is None:
        keys = {
            k: v
            for k, v in (("kernel_source", kernel_source), ("supported_quants", supported_quants))
            if v is not None
        }
        raw = _table("model", keys)
    return write(root, f"kernels/{hw_name}/{name}/MODEL.toml", raw)


def kernel_toml(
    root: Path,
    reldir: str,
    *,
    use: Iterable[str] | None = None,
    shadow: Mapping[str, str] | None = None,
    raw: str | None = None,
) -> Path:
    """``<reldir>/KERNEL.toml`` with ``[sources] use`` and ``[shadow]`` (or ``raw`` text)."""
    if raw is None:
        raw = ""
        if use is not None:
            raw += _table("sources", {"use": list(use)})
        if shadow is not None:
            raw += _table("shadow", dict(shadow))
    return write(root, f"{reldir}/KERNEL.toml", raw)


def symlink(root: Path, relpath: str, target: str) -> Path:
    """A symlink ``root/relpath`` -> ``target`` (as written, may dangle)."""
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)
    return path


def rel(root: Path, path: Path) -> str:
    """``path`` relative to ``root``, POSIX separators."""
    return path.relative_to(root).as_posix()


def T(text: str) -> Target:
    return Target.parse(text)


def plain(root: Path, hw_name: str = "h", model_name: str = "m", vendor: object = None) -> None:
    """A hardware tree with one model (empty ``[model]``)."""
    hw(root, hw_name, vendor=vendor)
    model(root, hw_name, model_name)


def overlay(root: Path) -> None:
    """Child tree ``c`` inheriting parent ``p``; both hold model ``m``."""
    hw(root, "p")
    hw(root, "c", inherits="p")
    model(root, "p", "m")
    model(root, "c", "m")


def rels(root: Path, paths: Iterable[Path]) -> list[str]:
    return [rel(root, p) for p in paths]


# --------------------------------------------------------------------------- the Layout


def full_tree(root: Path) -> None:
    hw(root, "p", arch="sm_90")
    hw(root, "c", inherits="p", arch="sm_100")
    model(root, "c", "m", kernel_source="s")
    model(root, "c", "s")
    model(root, "p", "s")
    files(
        root,
        "kernels/c/s/q/k1.cu",
        "kernels/c/s/q/k3.cu",
        "kernels/c/s/q/h1.cuh",
        "kernels/c/s/q/inc/deep/d.h",
        "kernels/p/s/q/k2.cu",
        "kernels/p/s/q/k3.cu",
        "kernels/p/s/q/inc/shadowed.h",
        "kernels/c/common/k1.cu",
        "kernels/c/common/k4.cu",
        "kernels/c/common/c.h",
        "kernels/p/common/k5.cu",
        "kernels/p/common/k4.cu",
        "kernels/p/common/pinc/x.cuh",
        "kernels/lib/used.cu",
    )
    kernel_toml(root, "kernels/c/s/q", shadow={"k1": "r1", "k3": "r3"})
    kernel_toml(root, "kernels/c/common", use=["../lib/used.cu"], shadow={"k4": "r4"})
    kernel_toml(root, "kernels/p/common")


HW = '[hardware]\nvendor = "nvidia"\narch = "sm_121f"\n'


KQUANT = (
    '#include "../../../gb10/qwen/nvfp4/q4k_vendor/mma.cuh"\n'
    '#include <cuda_bf16.h>\n#if 0\n#include "not_anywhere.cuh"\n#endif\n'
    'extern "C" __global__ void kquant(int* o) { o[0] = MMA; }\n'
)


def _tree(root: Path, extra: dict[str, str] | None = None) -> Path:
    files = {
        "kernels/gb10/HARDWARE.toml": HW,
        "kernels/gb10/dsv4/MODEL.toml": "[model]\n",
        "kernels/gb10/dsv4/nvfp4/kquant.cu": KQUANT,
        "kernels/gb10/qwen/MODEL.toml": "[model]\n",
        "kernels/gb10/qwen/nvfp4/gemv.cu": 'extern "C" __global__ void gemv() {}\n',
        "kernels/gb10/qwen/nvfp4/q4k_vendor/mma.cuh": '#pragma once\n#include "sib.cuh"\n',
        "kernels/gb10/qwen/nvfp4/q4k_vendor/sib.cuh": "#define MMA 7\n",
        **(extra or {}),
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def tree(root: Path) -> None:
    """gb10 (base) and hopper (inherits gb10), one model, a use, both kinds of shadow."""
    hw(root, "gb10", arch="sm_121f")
    hw(root, "hopper", arch="sm_90a", inherits="gb10")
    for h in ("gb10", "hopper"):
        model(root, h, "qwen")
    files(
        root,
        "kernels/gb10/common/rms.cu",
        "kernels/gb10/common/util.cuh",
        "kernels/gb10/common/vendor/v.h",
        "kernels/gb10/qwen/bf16/rms.cu",
        "kernels/hopper/common/util.cuh",
        "kernels/shared/extra.cu",
    )
    kernel_toml(root, "kernels/gb10/qwen/bf16", use=["../shared/extra.cu"], shadow={"rms": "q"})
    kernel_toml(root, "kernels/hopper/common", shadow={"util": "wider loads"})
