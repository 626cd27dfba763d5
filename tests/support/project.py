"""Helpers for the doit integration tests: a small project tree and real doit runs.

The tree (:func:`make_project`) has three hardware trees and five targets:

- ``hopper`` (nvidia, sm_90a): ``common/`` with ``add.cu`` + ``util.cuh``, model
  ``qwen`` with quants ``w4`` (``scale.cu`` including ``../../common/util.cuh``)
  and ``w8`` (``mul.cu``);
- ``gb10`` (sm_121f) inherits ``hopper``: its own ``common/extra.cu`` and model
  ``qwen`` (quants from the parent's leaves);
- ``apple`` (Metal): one target, whose toolchain is not installed here.

:func:`use_fake_compiler` replaces nvcc with a small recording Python script
(``toolchains/nvcc.toml`` in the project names ``fakecc`` on a private PATH
entry) for the precision tests; the main scenarios run the real nvcc.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FILES",
    "TARGETS",
    "DoitRun",
    "doit",
    "fake_compiles",
    "make_project",
    "orch",
    "project_env",
    "python_code",
    "started_targets",
    "terminate_after",
    "use_fake_compiler",
]

DODO = "from metrale_orch.dodo import *  # noqa: F403\n"

TARGETS = (
    "apple/llama/f16",
    "gb10/qwen/w4",
    "gb10/qwen/w8",
    "hopper/qwen/w4",
    "hopper/qwen/w8",
)


def _kernel(name: str, include: str = "") -> str:
    inc = f'#include "{include}"\n' if include else ""
    return (
        f"{inc}"
        f'extern "C" __global__ void {name}(float* out) {{\n'
        f"    out[threadIdx.x] = out[threadIdx.x] * 2.0f + 1.0f;\n}}\n"
    )


FILES: Mapping[str, str] = {
    "dodo.py": DODO,
    "kernels/hopper/HARDWARE.toml": (
        '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\n\n'
        '[build]\nextra_nvcc_flags = ["-DHOPPER=1"]\n\n'
        "[defaults]\nlm_head_batchm_max = 8\n"
    ),
    "kernels/hopper/common/util.cuh": "#pragma once\n#define UTIL_SCALE 2.0f\n",
    "kernels/hopper/common/add.cu": _kernel("add_k", "util.cuh"),
    "kernels/hopper/qwen/MODEL.toml": "[model]\n",
    "kernels/hopper/qwen/w4/scale.cu": _kernel("scale_k", "../../common/util.cuh"),
    "kernels/hopper/qwen/w8/mul.cu": _kernel("mul_k"),
    "kernels/gb10/HARDWARE.toml": (
        '[hardware]\nvendor = "nvidia"\narch = "sm_121f"\ninherits = "hopper"\n'
    ),
    "kernels/gb10/common/extra.cu": _kernel("extra_k"),
    "kernels/gb10/qwen/MODEL.toml": "[model]\n",
    "kernels/apple/HARDWARE.toml": '[hardware]\nvendor = "apple"\narch = "metal3.1"\n',
    "kernels/apple/common/k.metal": "kernel void k() {}\n",
    "kernels/apple/llama/MODEL.toml": "[model]\n",
    "kernels/apple/llama/f16/.gitkeep": "",
}

FAKECC = '''\
"""A recording stand-in for nvcc: writes a PTX-looking file, logs what it compiled."""
import os, re, sys
argv = sys.argv[1:]
if argv == ["--version"]:
    probes = os.environ.get("FAKECC_PROBES")
    if probes:
        with open(probes, "a") as fh:
            fh.write(f"{os.getpid()}\\n")
    print("fakecc: release 1.0")
    sys.exit(0)
out = argv[argv.index("-o") + 1]
source = [a for a in argv if a.endswith(".cu")][-1]
arch = next((a.split("=", 1)[1] for a in argv if a.startswith("-arch=")), "sm_75")
text = open(source).read()
if "#error" in text:
    sys.stderr.write(f"{source}(1): error: forced failure\\n")
    sys.exit(1)
import time
times = os.environ.get("FAKECC_TIMES")
if times:
    with open(times, "a") as fh:
        fh.write(f"start {time.time_ns()} {os.getpid()} {os.path.basename(source)}\\n")
held = bytearray(int(os.environ.get("FAKECC_ALLOC_MB", "0") or 0) * 2**20)
for page in range(0, len(held), 4096):  # touched: resident, as a compiler's memory is
    held[page] = 1
delay = float(os.environ.get("FAKECC_DELAY", "0") or 0)
if delay:
    time.sleep(delay)
names = re.findall(r'extern "C" __global__ void (\\w+)\\(', text)
body = ".version 8.0\\n.target " + arch + "\\n.address_size 64\\n"
body += "".join(f".visible .entry {n}(\\n)\\n{{\\n ret;\\n}}\\n" for n in names)
body += "// " + " ".join(a for a in argv if a.startswith("-D")) + "\\n"
with open(out, "w") as fh:
    fh.write(body)
if times:
    with open(times, "a") as fh:
        fh.write(f"end {time.time_ns()} {os.getpid()} {os.path.basename(source)}\\n")
log = os.environ.get("FAKECC_LOG")
if log:
    with open(log, "a") as fh:
        fh.write(f"{arch} {os.path.basename(source)}\\n")
'''

FAKE_TOOLCHAIN = """\
[toolchain]
name = "nvcc"
vendors = ["nvidia", "cuda"]
program = "fakecc"
install_hint = "the fake compiler of the tests"
version_args = ["--version"]
output = "ptx"
flags_key = "extra_nvcc_flags"
argv = ["{program}", "{output_kind_flag}", "{arch_flags}", "{flags}", "-I{include}",
        "{source}", "-o", "{output}"]
"""


def make_project(root: Path, files: Mapping[str, str] = FILES) -> Path:
    """Write the project tree under ``root``; returns ``root``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def use_fake_compiler(root: Path, bin_dir: Path) -> None:
    """Point the project's nvcc toolchain at the recording fake compiler in ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "fakecc"
    script.write_text(f"#!{sys.executable}\n" + FAKECC)
    script.chmod(0o755)
    (root / "toolchains").mkdir(exist_ok=True)
    (root / "toolchains" / "nvcc.toml").write_text(FAKE_TOOLCHAIN)


def project_env(tmp: Path, *, fake_bin: Path | None = None) -> dict[str, str]:
    """The environment of a doit run: a private cache, no remote, optional fake compiler."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("METRALE_ORCH_", "METRALE_", "FAKECC_", "NVCC_"))
    }
    env["METRALE_ORCH_LOCAL_CACHE"] = str(tmp / "local-cache")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if fake_bin is not None:
        env["PATH"] = f"{fake_bin}{os.pathsep}{env.get('PATH', '')}"
        env["FAKECC_LOG"] = str(tmp / "fakecc.log")
    return env


@dataclass(frozen=True)
class DoitRun:
    returncode: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def doit(
    root: Path,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float = 240,
) -> DoitRun:
    """Run ``python -m doit ARGS`` in ``root``."""
    return _python_module("doit", root, args, env, timeout)


def orch(
    root: Path, args: Sequence[str], env: Mapping[str, str], *, timeout: float = 240
) -> DoitRun:
    """Run ``python -m metrale_orch ARGS`` (``metrale-orch``) in ``root``, as a user does:
    its own process, so a ``doit`` it runs builds that project."""
    return _python_module("metrale_orch", root, args, env, timeout)


def python_code(
    root: Path, code: str, args: Sequence[str], env: Mapping[str, str], *, timeout: float = 240
) -> DoitRun:
    """Run ``python -c CODE ARGS`` in ``root`` (a process that drives doit its own way)."""
    return _python(["-c", code, *args], root, env, timeout)


def _python_module(
    module: str, root: Path, args: Sequence[str], env: Mapping[str, str], timeout: float
) -> DoitRun:
    return _python(["-m", module, *args], root, env, timeout)


def _python(argv: Sequence[str], root: Path, env: Mapping[str, str], timeout: float) -> DoitRun:
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=root,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return DoitRun(proc.returncode, proc.stdout, proc.stderr)


def started_targets(run: DoitRun) -> list[str]:
    """Targets whose build task ran, from the reporter's ``[i/n] build:<target>`` lines."""
    found = []
    for line in run.out.splitlines():
        if line.startswith("[") and "] build:" in line:
            found.append(line.split("] build:", 1)[1].strip())
    return sorted(found)


def fake_compiles(tmp: Path, *, clear: bool = True) -> list[str]:
    """``arch source`` lines the fake compiler recorded (then forgets them)."""
    log = tmp / "fakecc.log"
    if not log.exists():
        return []
    lines = sorted(log.read_text().splitlines())
    if clear:
        log.unlink()
    return lines


def terminate_after(proc: subprocess.Popen[str], marker: Path, timeout: float = 60) -> None:
    """Send SIGTERM to ``proc`` once ``marker`` exists (polled)."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            return
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)


def start_doit(root: Path, args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
    """Start ``python -m doit ARGS`` in ``root`` (its output, stderr included, piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "doit", *args],
        cwd=root,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
