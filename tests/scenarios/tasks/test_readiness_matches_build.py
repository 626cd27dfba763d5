"""``check`` skips exactly what ``doit build`` skips (issue 43, item 3).

The build treats a compiler that cannot build a hardware's arch (an old hipcc's clang
and a new gfx) as a missing toolchain: it skips the targets. ``check`` finds each
toolchain through the build's own function
(:func:`~metrale_orch.toolchain.readiness.ready_toolchain`), so its skipped targets and
count are the build's, with the same reason.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

from metrale_orch.cli import main
from tests.support.project import doit, make_project, project_env, use_fake_compiler

#: An installed hipcc whose clang does not know gfx9999 (as clang 15 and gfx1151).
OLD_HIPCC = f"""#!{sys.executable}
import sys
args = sys.argv[1:]
if "--version" in args:
    print("fake hipcc 1")
    sys.exit(0)
if "-###" in args:
    sys.exit(0)
if "--offload-arch=gfx9999" in args:
    sys.exit("clang: error: invalid target ID 'gfx9999'")
open(args[args.index("-o") + 1], "w").write("code object")
"""

NEW_ARCH = {
    "kernels/strix/HARDWARE.toml": '[hardware]\nvendor = "hip"\narch = "gfx9999"\n',
    "kernels/strix/m/MODEL.toml": "[model]\n",
    "kernels/strix/m/q/k.cu": 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n',
}


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The test project (fake nvcc, Metal not installed) with a HIP hardware whose arch
    the installed hipcc cannot build."""
    root = make_project(tmp_path / "proj")
    make_project(root, NEW_ARCH)
    use_fake_compiler(root, tmp_path / "bin")
    hipcc = tmp_path / "hip/hipcc"
    hipcc.parent.mkdir()
    hipcc.write_text(OLD_HIPCC)
    hipcc.chmod(0o755)
    env = project_env(tmp_path, fake_bin=tmp_path / "bin")
    env["METRALE_HIPCC"] = str(hipcc)
    return root, env


def _check(root: Path, env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), "check"], environ=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_check_skips_the_targets_and_count_the_build_skips(tmp_path: Path) -> None:
    root, env = _project(tmp_path)
    code, out, err = _check(root, env)
    assert code == 0, err
    # check: "skipped: <reason> [target a, b]"
    checked = {
        m[1]: m[2] for m in re.finditer(r"^skipped: (.*) \[target (.*)\]$", err, re.MULTILINE)
    }
    build = doit(root, ["build"], env)
    assert build.returncode == 0, build.text
    # build: "skipped N target(s): <reason> (a, b)"
    built = {
        m[1]: m[2]
        for m in re.finditer(r"^skipped \d+ target\(s\): (.*) \((.*)\)$", build.text, re.MULTILINE)
    }
    assert checked == built
    assert checked["toolchain 'hip' cannot build gfx9999: `hipcc` says: clang: error: "
                   "invalid target ID 'gfx9999'; to build it, install ROCm (set METRALE_HIPCC "
                   "to hipcc, install ROCm in /opt/rocm, or put hipcc on PATH) whose compiler "
                   "supports gfx9999"] == "strix/m/q"  # fmt: skip
    assert "4 built, 0 from cache, 0 up to date, 2 skipped, 0 failed" in build.text
    assert out == "check: ok (the build accepts all 6 targets; 2 skipped: cannot be built here)\n"


def test_check_does_not_call_an_installed_compiler_missing(tmp_path: Path) -> None:
    """The summary's word for the skips covers a hipcc that is installed but cannot build
    the arch: "compiler not installed" was false for it (issue 43 review)."""
    root, env = _project(tmp_path)
    (root / "kernels/apple").rename(tmp_path / "apple")  # only the arch skip is left
    code, out, err = _check(root, env)
    assert code == 0, err
    assert "cannot build gfx9999" in err
    assert out == "check: ok (the build accepts all 5 targets; 1 skipped: cannot be built here)\n"
