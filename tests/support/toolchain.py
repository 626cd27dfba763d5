"""Helpers the tests of the toolchain area share, the in-process ones
(``tests/unit/toolchain/``) and the ones that start processes
(``tests/scenarios/toolchain/``) alike.
"""

from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path

import pytest

from metrale_orch.toolchain.definitions import builtin_toolchains
from tests.support import REPO
from tests.support.build import FAKE_NVCC, fake_toolchain_env, write
from tests.support.project import DODO


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(0o755)
    return path


# ------------------------------------------------------------------------------ the tree

_SCALE = (
    '#include "../../common/warp.cuh"\n'
    'extern "C" __global__ void scale_k(float* x) {\n'
    "    x[threadIdx.x] = x[threadIdx.x] * SCALE + lanes();\n"
    "}\n"
)


_WARP = (
    "#pragma once\n"
    "#if HIP_VERSION_MAJOR < 6  // ROCm 5.2 has no __activemask() yet\n"
    "#define __activemask() __ballot(1)\n"
    "#endif\n"
    "__device__ inline float lanes() {\n"
    "    unsigned int m = __activemask();\n"  # the mirror widens this to 64 bits
    "    return (float)__popcll(m);\n"
    "}\n"
)


_SMOKE = (
    '[[case]]\nname = "scale_64"\nmodule = "scale"\nentry = "scale_k"\n'
    'grid = [1, 1, 1]\nblock = [64, 1, 1]\nreference = "scale"\n'
    'args = [{ name = "x", kind = "inout", dtype = "f32", shape = [64], init = "normal" }]\n'
)


FILES = {
    "dodo.py": DODO,
    # gfx90a (MI200): clang 15 builds it. extra_hip_flags is read by nothing (a warning).
    "kernels/mi200/HARDWARE.toml": (
        '[hardware]\nvendor = "hip"\narch = "gfx90a"\n'
        '[build]\nextra_nvcc_flags = ["--fmad=false"]\nextra_hip_flags = ["-DNOT_READ"]\n'
    ),
    "kernels/mi200/common/warp.cuh": _WARP,
    "kernels/mi200/m/MODEL.toml": "[model]\n",
    "kernels/mi200/m/q/KERNEL.toml": (
        '[build]\nextra_nvcc_flags = ["-ffp-contract=off", "-DSCALE=2.0f"]\n'
    ),
    "kernels/mi200/m/q/scale.cu": _SCALE,
    "kernels/mi200/m/q/SMOKE.toml": _SMOKE,
    # gfx1151 (Strix Halo): clang 15 does not know it.
    "kernels/strix/HARDWARE.toml": '[hardware]\nvendor = "hip"\narch = "gfx1151"\n',
    "kernels/strix/m/MODEL.toml": "[model]\n",
    "kernels/strix/m/q/k.cu": 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n',
}


NVCC = builtin_toolchains()["nvcc"]


#: A gcc stand-in that logs each call and prints a ``-v`` search list over two directories
#: of the test: INC (exists) and NEW (ignored as nonexistent until a test makes it).
FAKE_GCC = f"""#!{sys.executable}
import os, sys
with open(os.environ["PROBE_LOG"], "a") as fh:
    fh.write("gcc " + " ".join(sys.argv[1:]) + "\\n")
if "-###" in sys.argv:
    print(' "/usr/lib/fake/cc1plus" -E -quiet ' + os.environ.get("FAKE_GCC_DRYRUN", ""))
elif "-Wp,-v" in sys.argv:
    new = os.environ["FAKE_GCC_NEW"]
    print('ignoring nonexistent directory "' + new + '"' if not os.path.isdir(new) else "")
    print("#include <...> search starts here:")
    for d in (os.environ["FAKE_GCC_INC"], new):
        if os.path.isdir(d):
            print(" " + d)
    print("End of search list.")
else:
    print("gcc (Fake) 12.2.0")
"""


LOGGING_NVCC = FAKE_NVCC.replace(
    "args = sys.argv[1:]\n",
    "args = sys.argv[1:]\n"
    'open(os.environ["PROBE_LOG"], "a").write("nvcc " + " ".join(args) + "\\n")\n',
    1,
)


def _setup(tmp_path: Path) -> dict[str, str]:
    env = fake_toolchain_env(tmp_path / "bin")
    (tmp_path / "bin" / "nvcc").write_text(LOGGING_NVCC)
    (tmp_path / "bin" / "gcc").write_text(FAKE_GCC)
    (tmp_path / "inc").mkdir()
    env.update(
        PROBE_LOG=str(tmp_path / "probe.log"),
        FAKE_GCC_INC=str(tmp_path / "inc"),
        FAKE_GCC_NEW=str(tmp_path / "new"),
    )
    return env


#: Where the built-in toolchains look before PATH / HOME: a machine with them installed
#: finds them first, which the discovery tests below cannot control.
_SYSTEM_INSTALLS = [Path("/opt/rocm/bin/hipcc"), *Path("/opt").glob("scale*")]


_needs_no_system_install = pytest.mark.skipif(
    any(p.exists() for p in _SYSTEM_INSTALLS), reason="ROCm or SCALE is installed in /opt"
)


# ------------------------------------------------------------------------------ fakes

FAKE = r'''#!{python}
"""A fake {kind}: see tests/scenarios/toolchain/test_vendors.py."""
import json, os, random, re, sys

KIND = {kind!r}
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
tool = KIND
if KIND == "xcrun":
    if args[:2] != ["-sdk", "macosx"]:
        sys.exit("xcrun: expected -sdk macosx, got %r" % args)
    tool, args = args[2], args[3:]
if "--version" in args:
    print("fake %s version 9.9%s" % (tool, os.environ.get("FAKE_VERSION", "")))
    print("Copyright (c) fake")
    sys.exit(0)
if "-###" in args:
    tmp = os.environ.get("TMPDIR", "/tmp")
    rnd = "%06x" % random.randrange(16 ** 6)
    words = [os.path.join(here, "clang-99"), "-cc1", *os.environ.get("FAKE_DRYRUN", "").split(),
             "-internal-isystem", os.path.normpath(os.path.join(here, "..", "include")),
             "-o", "%s/metrale_probe-%s.o" % (tmp, rnd), *[a for a in args if a != "-###"]]
    sys.stderr.write("fake clang version 99 (%s)\nInstalledDir: %s\n" % (tool, here))
    sys.stderr.write(" " + " ".join('"%s"' % w for w in words) + "\n")
    sys.exit(0)
entry = {{"kind": KIND, "tool": tool, "argv": sys.argv, "cwd": os.getcwd(), "read": {{}}}}
if tool == "metallib":
    src, out = args[0], args[args.index("-o") + 1]
    data = open(src).read()
    entry["read"][src] = data
    with open(os.environ["FAKE_LOG"], "a") as fh:
        fh.write(json.dumps(entry) + "\n")
    with open(out, "w") as fh:
        fh.write("metallib\n" + data)
    sys.exit(0)
takes_value = {{"-o", "-MF", "-include", "-x"}}
sources, dirs, pre = [], [], []
i = 0
while i < len(args):
    a = args[i]
    if a in takes_value:
        if a == "-include":
            pre.append(args[i + 1])
        i += 2
        continue
    if a.startswith("-I"):
        dirs.append(a[2:])
    elif not a.startswith("-"):
        sources.append(a)
    i += 1
out = args[args.index("-o") + 1]
toolkit = os.path.normpath(os.path.join(here, "..", "include"))
read = entry["read"]


def find(name, base):
    for d in ([base] if base is not None else []) + dirs + [toolkit]:
        cand = name if d == "" else os.path.join(d, name)
        if os.path.isfile(cand):
            return cand
    return None


def visit(path):
    if path in read:
        return
    text = open(path).read()
    read[path] = text
    for name in re.findall(r'^\s*#\s*include\s*"([^"]+)"', text, re.M):
        found = find(name, os.path.dirname(path))
        if found is not None:
            visit(found)


for name in pre:
    found = find(name, None)
    if found is None:
        sys.exit("fake %s: cannot find -include %s" % (tool, name))
    visit(found)
src = sources[-1]
visit(src)
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write(json.dumps(entry) + "\n")
if any("#error" in t for t in read.values()):
    sys.stderr.write(src + ":1: error: the fake compiler was told to fail\n")
    sys.exit(1)
with open(out, "w") as fh:
    fh.write("fake %s output\n%s" % (tool, read[src]))
if "-MF" in args:
    with open(args[args.index("-MF") + 1], "w") as fh:
        fh.write(out + ": " + " ".join(p.replace(" ", "\\ ") for p in read) + "\n")
'''


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_compiler(path: Path, kind: str) -> Path:
    """A fake ``kind`` (hipcc | scale | xcrun) at ``path``, with the ``clang-99`` its dry
    run names beside it and a toolkit include directory (``hip/hip_runtime.h``) above it."""
    _script(path, FAKE.format(python=sys.executable, kind=kind))
    write(path.parent, "clang-99", "fake clang binary v1\n")
    write(path.parent.parent, "include/hip/hip_runtime.h", "// toolkit hip_runtime.h\n")
    return path


def scale_root(root: Path, arches: tuple[str, ...] = ("gfx1151",)) -> Path:
    """A SCALE installation: bin/scaleenv, targets/<arch>/bin/nvcc per arch."""
    write(root, "bin/scaleenv", "# fake scaleenv\n")
    for arch in arches:
        fake_compiler(root / "targets" / arch / "bin" / "nvcc", "scale")
    return root


def _sample(tmp_path: Path) -> Path:
    """A copy of the sample tree (its kernels/ only)."""
    root = tmp_path / "proj"
    shutil.copytree(REPO / "kernels", root / "kernels")
    return root


_HIP = {
    "kernels/amd/HARDWARE.toml": (
        '[hardware]\nvendor = "hip"\narch = "gfx1201"\n'
        '[build]\nextra_nvcc_flags = ["--fmad=false", "-DHDIM=128"]\nextra_hip_flags = ["-DNO"]\n'
    ),
    "kernels/amd/common/KERNEL.toml": "",
    "kernels/amd/common/reduce.cuh": (
        "#pragma once\n"
        "__device__ float red(float v) {\n"
        "    unsigned int mask = __activemask();  // unsigned int stays in this comment\n"
        "    unsigned int lanes = 32;\n"
        "    return __shfl_down_sync(mask, v, 1) + __shfl_up_sync(0xFFFFFFFFUL, v, 1)\n"
        "        + __ballot_sync(0x0000ffffLL, v > 0);\n"
        "}\n"
    ),
    "kernels/amd/common/vendor/sub.cuh": "#define SUB_MASK __shfl_sync(0xffffffffu, 1, 0)\n",
    "kernels/amd/m/MODEL.toml": "[model]\n",
    "kernels/amd/m/q/KERNEL.toml": (
        '[build]\nextra_nvcc_flags = ["-ffp-contract=off", "--fmad=true", "--fmad=maybe"]\n'
    ),  # hipcc gets -ffp-contract=off once (it is in effect from the hardware's --fmad=false)
    "kernels/amd/m/q/k.cu": (
        '#include "../../common/reduce.cuh"\n'
        '#include "vendor/sub.cuh"\n'
        'extern "C" __global__ void k(float* o) {\n'
        "    o[0] = __shfl_xor_sync(0xffffffff, red(1.f), 1);\n"
        "}\n"
    ),
    "kernels/amd/m/q/vendor/sub.cuh": "#define LEAF_SUB __shfl_sync(0xffffffffu, 2, 0)\n",
}
