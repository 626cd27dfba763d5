"""Helpers for the build-step tests: a small kernel tree and a recording fake compiler.

The fake ``nvcc`` (a Python script) answers ``--version``, appends each compile's
argv and cwd as one JSON line to ``$FAKE_NVCC_LOG``, fails like nvcc on a source
containing ``#error``, writes nothing for a source containing ``FAKE_NO_OUTPUT``,
and otherwise writes a PTX-like file holding the arch and the source text.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metrale_orch.cache import Cache, CacheSettings, open_cache
from metrale_orch.config import Config, load_config

__all__ = [
    "FAKE_NVCC",
    "compiles",
    "fake_toolchain_env",
    "make_cache",
    "make_config",
    "output_kinds_tree",
    "small_tree",
    "write",
]

FAKE_NVCC = f"""#!{sys.executable}
import json, os, re, sys
args = sys.argv[1:]
if args and args[0] == "--version":
    print("fake nvcc: NVIDIA (R) Cuda compiler driver")
    print("Copyright (c) fake")
    print("Cuda compilation tools, release 99.0" + os.environ.get("FAKE_NVCC_VERSION", ""))
    sys.exit(0)
if args and args[0] == "--dryrun":
    here = os.path.dirname(os.path.abspath(__file__))
    print("#$ _HERE_=" + here)
    print("#$ TOP=" + here + "/..")
    print("#$ gcc -E -x c++ " + os.environ.get("FAKE_NVCC_DRYRUN", "") + " " + " ".join(args[1:]))
    sys.exit(0)
log = os.environ.get("FAKE_NVCC_LOG")
if log:
    with open(log, "a") as fh:
        fh.write(json.dumps({{"argv": args, "cwd": os.getcwd()}}) + "\\n")
out = args[args.index("-o") + 1]
src = [a for a in args if a.endswith(".cu")][-1]
arch = [a for a in args if a.startswith("-arch=")]
text = open(src).read()
if "#error" in text:
    sys.stderr.write(src + "(1): error: the fake compiler was told to fail\\n")
    sys.exit(1)
if "FAKE_NO_OUTPUT" in text:
    sys.exit(0)
with open(out, "w") as fh:
    fh.write("// fake ptx\\n.target " + (arch[0][6:] if arch else "?") + "\\n" + text)
# The dependency list (-Xcompiler=-MD,-MF,<file>): the source and the quoted includes
# it reaches (from each including file's directory), like a preprocessor would.
dep = [a for a in args if a.startswith("-Xcompiler=-MD,-MF,")]
if dep and "FAKE_NO_DEPFILE" not in text:
    read, todo = [], [src]
    while todo:
        path = todo.pop()
        if path in read or not os.path.isfile(path):
            continue
        read.append(path)
        body = open(path).read()
        for name in re.findall(r'#\\s*include\\s*"([^"]+)"', body):
            todo.append(os.path.normpath(os.path.join(os.path.dirname(path), name)))
    with open(dep[0].split(",", 2)[2], "w") as fh:
        fh.write(out + ": " + " ".join(read) + "\\n")
"""

FAKE_GCC = f"""#!{sys.executable}
print("gcc (Fake) 12.2.0")
"""


def write(root: Path, relpath: str, text: str) -> Path:
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_toolchain_env(bindir: Path, log: Path | None = None) -> dict[str, str]:
    """An environment whose PATH finds only the fake ``nvcc`` and ``gcc`` in ``bindir``."""
    _script(bindir / "nvcc", FAKE_NVCC)
    _script(bindir / "gcc", FAKE_GCC)
    env = {"PATH": str(bindir), "HOME": str(bindir.parent)}
    if log is not None:
        env["FAKE_NVCC_LOG"] = str(log)
    return env


def compiles(log: Path) -> list[dict[str, Any]]:
    """The compiles the fake recorded (argv, cwd), in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def small_tree(root: Path, extra: Mapping[str, str] | None = None) -> Path:
    """A one-hardware tree: common add/scale (+ headers), model m1 with quant q1.

    - ``common/add.cu`` includes ``util.cuh``, which includes ``deep.cuh`` under ``#if 0``;
    - ``common/unrelated.cuh`` is included by nobody;
    - ``m1/q1/leaf.cu`` includes ``../../common/util.cuh``;
    - flags: HARDWARE ``-DA=1 -DX``, common ``-DB=1 -DA=1``, leaf ``-DC=1 -DB=1``;
    - renames: common ``add = "vector_add"``, leaf ``scale = "scale_q1"``.
    """
    files = {
        "kernels/hw1/HARDWARE.toml": (
            '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\nsm_count = 100\n'
            '[build]\nextra_nvcc_flags = ["-DA=1", "-DX"]\n'
            "[defaults]\nlm_head_batchm_max = 12\n"
        ),
        "kernels/hw1/common/KERNEL.toml": (
            '[build]\nextra_nvcc_flags = ["-DB=1", "-DA=1"]\n[modules]\nadd = "vector_add"\n'
        ),
        "kernels/hw1/common/add.cu": '#include "util.cuh"\nextern "C" __global__ void add() {}\n',
        "kernels/hw1/common/scale.cu": 'extern "C" __global__ void scale() {}\n',
        "kernels/hw1/common/util.cuh": '#pragma once\n#if 0\n#include "deep.cuh"\n#endif\n',
        "kernels/hw1/common/deep.cuh": "// deep v1\n",
        "kernels/hw1/common/unrelated.cuh": "// unrelated v1\n",
        "kernels/hw1/m1/MODEL.toml": "[model]\n",
        "kernels/hw1/m1/q1/KERNEL.toml": (
            '[build]\nextra_nvcc_flags = ["-DC=1", "-DB=1"]\n[modules]\nscale = "scale_q1"\n'
        ),
        "kernels/hw1/m1/q1/leaf.cu": (
            '#include "../../common/util.cuh"\nextern "C" __global__ void leaf() {}\n'
        ),
    }
    files.update(extra or {})
    for rel, text in files.items():
        write(root, rel, text)
    return root


def make_config(root: Path, cache_dir: Path, **overrides: Any) -> Config:
    """The project's config with the local cache in ``cache_dir`` (no pyproject needed)."""
    return load_config(root, {}, {"local_cache": str(cache_dir), **overrides})


def make_cache(config: Config, mode: str = "read-write") -> Cache:
    """A real local-only cache in ``config.local_cache``."""
    return open_cache(CacheSettings(local_dir=config.local_cache, mode=mode))


def output_kinds_tree(root: Path, leaf: dict[str, str] | None = None) -> Path:
    """One kernel (``tiny``, reading a common header) under three hardware trees, built
    as PTX (``h``), a cubin (``hc``) and a fatbin (``hf``: sm_100a). ``leaf``: the sources
    of each ``m/q`` leaf instead (file name -> text)."""
    kernel = (
        '#include "../../common/scale.cuh"\n'
        'extern "C" __global__ void tiny(float* x) { x[threadIdx.x] *= SCALE; }\n'
    )
    sources = {"tiny.cu": kernel} if leaf is None else leaf
    files = {
        "kernels/h/HARDWARE.toml": '[hardware]\narch = "sm_90a"\n',
        "kernels/hc/HARDWARE.toml": '[hardware]\narch = "sm_90a"\n[build]\ntoolchain = "cubin"\n',
        "kernels/hf/HARDWARE.toml": '[hardware]\narch = "sm_100a"\n[build]\ntoolchain = "fat"\n',
        "toolchains/cubin.toml": '[toolchain]\nname = "cubin"\nextends = "nvcc"\noutput = "cubin"',
        "toolchains/fat.toml": '[toolchain]\nname = "fat"\nextends = "nvcc"\noutput = "fatbin"',
    }
    for hw in ("h", "hc", "hf"):
        files[f"kernels/{hw}/common/scale.cuh"] = "#define SCALE 2.0f\n"
        files[f"kernels/{hw}/m/MODEL.toml"] = "[model]\n"
        files.update({f"kernels/{hw}/m/q/{name}": text for name, text in sources.items()})
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root
