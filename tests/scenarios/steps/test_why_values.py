"""``metrale-orch why`` names the values that changed, and a failed build keeps the record
of the last good one (real doit builds, fake compiler)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from metrale_orch.cli import main
from metrale_orch.steps.keyrecord import record_changes
from metrale_orch.views.status import signature_changes, signature_part
from tests.support.project import doit

W4 = "hopper/qwen/w4"
OUT = f"build/{W4}"


def why(root: Path, env: dict[str, str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), "why", W4], environ=env, out=out, err=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def status(root: Path, env: dict[str, str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), "status", W4, "--json"], environ=env, out=out, err=err)
    assert code == 0, err.getvalue()
    (only,) = json.loads(out.getvalue())["targets"]
    assert isinstance(only, dict)
    return only


def build(root: Path, env: dict[str, str], code: int = 0) -> str:
    run = doit(root, [f"build:{W4}"], env)
    assert run.returncode == code, run.text
    return run.out


def installed(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / OUT).iterdir())}


def test_why_names_the_flags_and_modules_that_changed(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    kernel = root / "kernels/hopper/qwen/w4/KERNEL.toml"
    kernel.write_text('[build]\nextra_nvcc_flags = ["-DFAST=0", "-lineinfo"]\n')
    build(root, env)
    kernel.write_text('[build]\nextra_nvcc_flags = ["-DFAST=1", "-DWIDE", "-O2"]\n')
    (root / "kernels/hopper/qwen/w4/extra.cu").write_text(
        'extern "C" __global__ void extra_k(float* out) {}\n'
    )
    out = why(root, env)
    assert out.splitlines() == [
        f"{W4} is stale:",
        "  changed input: kernels/hopper/qwen/w4/KERNEL.toml",
        "  new input: kernels/hopper/qwen/w4/extra.cu",
        "  flags: define FAST changed: 0 -> 1",
        "  flags: define added: WIDE",
        "  flags: flag added: -O2",
        "  flags: flag removed: -lineinfo",
        "  modules: added extra",
        "  signature part changed: layout",
    ], out
    assert {"part": "flags", "text": "define added: WIDE"} not in status(root, env).get(
        "signature_changes", []
    )  # only `why` plans the target afresh


def test_a_failed_build_keeps_the_last_good_record_and_artefacts(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    build(root, env)
    good = installed(root)
    hardware = root / "kernels/hopper/HARDWARE.toml"
    source = root / "kernels/hopper/qwen/w4/scale.cu"
    old_hardware, old_source = hardware.read_text(), source.read_text()
    hardware.write_text(old_hardware.replace('"-DHOPPER=1"', '"-DHOPPER=1", "-DFAST=1"'))
    source.write_text(old_source + "#error broken\n")
    assert "FAILED build:hopper/qwen/w4" in build(root, env, code=1)

    assert installed(root) == good  # nothing wrong installed, nothing lost
    out = why(root, env)
    assert "never built" not in out
    assert out.splitlines() == [
        f"{W4} is stale:",
        "  the last build failed: the last good build stays installed; since it:",
        "  changed input: kernels/hopper/HARDWARE.toml",
        "  changed input: kernels/hopper/qwen/w4/scale.cu",
        "  flags: define added: FAST=1",
    ], out
    st = status(root, env)
    assert st["last_failed"] is True and st["status"] == "stale"
    assert str(st["detail"]).startswith("last build failed; 2 changed input(s)")

    # Back to what the last good build was built from: up to date, nothing runs.
    hardware.write_text(old_hardware)
    source.write_text(old_source)
    assert why(root, env) == f"{W4} is up to date\n"
    assert ", 1 up to date," in build(root, env)
    # A fixed build succeeds and drops the mark.
    hardware.write_text(old_hardware.replace('"-DHOPPER=1"', '"-DHOPPER=1", "-DFAST=1"'))
    build(root, env)
    assert status(root, env) == {"target": W4, "status": "up to date"}
    source.write_text(old_source + "// edit\n")
    assert "last build failed" not in why(root, env)


def test_a_failed_build_drops_the_record_when_the_artefacts_are_not_intact(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    build(root, env)
    (root / OUT / "add.ptx").unlink()
    source = root / "kernels/hopper/qwen/w4/scale.cu"
    source.write_text(source.read_text() + "#error broken\n")
    build(root, env, code=1)
    assert "never built successfully, or forgotten" in why(root, env)


def test_plan_records_compare_through_why_miss_s_differ() -> None:
    stored = {
        "schema": 1,
        "arch": "sm_90a",
        "toolchain": "nvcc",
        "identity": "13.0 | host: gcc 12 | d1",
        "argv": ["nvcc", "-DA=1", "-O3"],
        "env": {},
        "modules": ["add", "mul"],
    }
    current = {**stored, "arch": "sm_100a", "argv": ["nvcc", "-DA=2"], "modules": ["add", "x"]}
    assert [(signature_part(c), c.text) for c in signature_changes(current, stored)] == [
        ("arch", "arch changed: sm_90a -> sm_100a"),
        ("flags", "define A changed: 1 -> 2"),
        ("flags", "flag removed: -O3"),
        ("modules", "added x"),
        ("modules", "removed mul"),
    ]
    # A module's key record has no `modules`: why-miss's answers are as before.
    module_record = {k: v for k, v in stored.items() if k != "modules"}
    assert record_changes(module_record, dict(module_record)) == ()
