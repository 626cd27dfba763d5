"""Smoke tests (SPEC 3.5): conversions, cases, static checks on real nvcc output, reports.

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/smoke/test_smoke.py``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import numpy as np
import pytest

from metrale_orch import smoke
from metrale_orch.config import load_config
from metrale_orch.smoke import (
    DeviceInfo,
    DeviceStatus,
    SmokeCase,
    arch_runnable,
    probe_device,
    run_smoke,
    scan_cases,
)
from metrale_orch.smoke.dtypes import (
    bf16_decode,
    bf16_encode,
)
from metrale_orch.tasks.smoke import run_smoke_action
from tests.support import REPO
from tests.support.project import DODO, doit, project_env
from tests.support.smoke import (
    _sample_layouts,
    by_name,
    compile_target,
    make_tree,
    needs_nvcc,
    no_device,
)


def fake_device(cc: tuple[int, int]) -> smoke.DeviceProbe:
    def probe() -> DeviceStatus:
        return DeviceStatus(device=DeviceInfo(index=0, name="Fake GPU", cc=cc))

    return probe


def numpy_launcher(bias: float = 0.0) -> smoke.Launcher:
    """Emulates scale_add on the host (plus ``bias`` to make it wrong)."""

    def launch(artefact: Path, case: SmokeCase, params: Sequence[Any]) -> Mapping[str, Any]:
        assert artefact.is_file()
        _out, x, a, _n = params
        return {"out": bf16_encode(bf16_decode(x) * a + np.float32(1 + bias))}

    return launch


# ------------------------------------------------------------------ static checks, real nvcc


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize(("arch", "kind"), [("sm_90a", "ptx"), ("sm_121f", "cubin")])
def test_static_checks_pass_and_numbers_skip(tmp_path: Path, arch: str, kind: str) -> None:
    make_tree(tmp_path, arch)
    compile_target(tmp_path, arch, kind)
    report = run_smoke(tmp_path, "hw1", probe=no_device)
    results = by_name(report)
    assert set(results) == {"other::static", "scale::static", "scale::scale_128"}
    assert results["scale::static"].outcome == "passed", results["scale::static"].message
    assert results["other::static"].outcome == "passed"
    assert f"arch: {arch}" in results["scale::static"].detail
    assert "scale_add" in results["scale::static"].detail
    if kind == "cubin":
        assert "registers" in results["scale::static"].detail
    skipped = results["scale::scale_128"]
    assert skipped.outcome == "skipped" and "no CUDA device: test probe" in skipped.message
    assert report.ok


@pytest.mark.nvcc
@needs_nvcc
def test_static_missing_entry_fails(tmp_path: Path) -> None:
    make_tree(tmp_path)
    toml = (tmp_path / "kernels/hw1/common/SMOKE.toml").read_text()
    (tmp_path / "kernels/hw1/common/SMOKE.toml").write_text(
        toml.replace('entry = "scale_add"', 'entry = "scale_mul"')
    )
    compile_target(tmp_path, "sm_90a", "cubin")
    report = run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=numpy_launcher())
    static = by_name(report)["scale::static"]
    assert static.outcome == "failed"
    assert "'scale_mul' is missing" in static.message and "scale_add" in static.message
    numeric = by_name(report)["scale::scale_128"]
    assert numeric.outcome == "skipped" and "static check failed" in numeric.message
    assert not report.ok


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("kind", ["ptx", "cubin"])
def test_static_wrong_arch_fails(tmp_path: Path, kind: str) -> None:
    make_tree(tmp_path, "sm_90a")
    compile_target(tmp_path, "sm_121f", kind, manifest_arch="sm_90a")
    report = run_smoke(tmp_path, "hw1", probe=no_device)
    static = by_name(report)["scale::static"]
    assert static.outcome == "failed"
    assert "sm_121f" in static.message and "sm_90a" in static.message


@pytest.mark.nvcc
@needs_nvcc
def test_static_hash_mismatch_and_manifest_arch(tmp_path: Path) -> None:
    make_tree(tmp_path, "sm_90a")
    out = compile_target(tmp_path, "sm_90a")
    with (out / "scale.ptx").open("a") as fh:
        fh.write("\n// tampered\n")
    (tmp_path / "kernels/hw1/HARDWARE.toml").write_text('[hardware]\narch = "sm_100a"\n')
    results = by_name(run_smoke(tmp_path, "hw1", probe=no_device))
    assert "does not match the manifest's xxh3" in results["scale::static"].message
    assert results["other::static"].outcome == "passed"
    assert "declares 'sm_100a'" in results["(manifest)::arch"].message


# ------------------------------------------------------------------ numeric path, fake device


@pytest.mark.nvcc
@needs_nvcc
def test_numeric_pipeline_with_fake_device(tmp_path: Path) -> None:
    make_tree(tmp_path)
    compile_target(tmp_path, "sm_90a")
    good = by_name(run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=numpy_launcher()))
    case = good["scale::scale_128"]
    assert case.outcome == "passed", case.message
    assert case.max_abs_error is not None and case.max_abs_error <= 2e-2

    bad = by_name(
        run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=numpy_launcher(0.25))
    )
    failed = bad["scale::scale_128"]
    assert failed.outcome == "failed" and "elements outside" in failed.message
    assert failed.max_abs_error is not None and failed.max_abs_error >= 0.2

    other_gpu = by_name(run_smoke(tmp_path, "hw1", probe=fake_device((12, 1))))
    assert other_gpu["scale::scale_128"].outcome == "skipped"
    assert "Fake GPU" in other_gpu["scale::scale_128"].message
    assert "9.0" in other_gpu["scale::scale_128"].message


@pytest.mark.nvcc
@needs_nvcc
def test_numeric_errors_are_failures(tmp_path: Path) -> None:
    make_tree(tmp_path)
    compile_target(tmp_path, "sm_90a")

    def crash(artefact: Path, case: SmokeCase, params: Sequence[Any]) -> Mapping[str, Any]:
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

    r = by_name(run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=crash))
    assert r["scale::scale_128"].outcome == "failed"
    assert "ILLEGAL_ADDRESS" in r["scale::scale_128"].message

    def broken() -> DeviceStatus:
        return DeviceStatus(error="CUDA device 0 is present but failed: CUDA_ERROR_UNKNOWN")

    r = by_name(run_smoke(tmp_path, "hw1", probe=broken))
    assert r["scale::scale_128"].outcome == "failed"

    (tmp_path / "kernels/smoke_refs.py").write_text("def unrelated(args):\n    return {}\n")
    r = by_name(run_smoke(tmp_path, "hw1", probe=fake_device((9, 0)), launcher=numpy_launcher()))
    assert "'scale_add' is not defined in kernels/smoke_refs.py" in r["scale::scale_128"].message


def test_probe_on_this_machine() -> None:
    pytest.importorskip("cupy")
    status = probe_device()
    if status.device is not None:
        pytest.skip(f"a CUDA device is present here: {status.device.describe()}")
    assert not status.error
    assert status.reason.startswith(("no CUDA driver", "no CUDA device")), status.reason
    assert "libcuda" in status.reason or "device" in status.reason


@pytest.mark.nvcc
@needs_nvcc
def test_real_skip_reason_reaches_junit(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    make_tree(tmp_path)
    compile_target(tmp_path, "sm_90a")
    status = probe_device()
    if status.device is not None:
        pytest.skip("a CUDA device is present here")
    values = run_smoke_action(str(tmp_path), "hw1", ["hw1/m/q"], str(tmp_path / "build"))
    assert isinstance(values, dict) and values["failed"] == 0, values
    assert values["summary"] == (
        f"smoke hw1: 2 static passed, 1 numeric skipped ({status.reason.split(':')[0]}), 0 failed"
    )
    assert values["report"] == "build/smoke-hw1.xml"
    doc = ET.parse(tmp_path / "build" / "smoke-hw1.xml").getroot()
    assert doc.tag == "testsuites"
    assert (doc.get("tests"), doc.get("failures"), doc.get("skipped")) == ("3", "0", "1")
    (suite,) = doc.findall("testsuite")
    assert suite.get("name") == "hw1/m/q"
    cases = {tc.get("name"): tc for tc in suite.findall("testcase")}
    assert set(cases) == {"other::static", "scale::static", "scale::scale_128"}
    skipped = cases["scale::scale_128"].find("skipped")
    assert skipped is not None and status.reason in (skipped.get("message") or "")


@pytest.mark.nvcc
@needs_nvcc
def test_junit_failures_and_action_failure(tmp_path: Path) -> None:
    make_tree(tmp_path, "sm_90a")
    compile_target(tmp_path, "sm_121f", "ptx", manifest_arch="sm_90a")
    report = run_smoke(tmp_path, "hw1", probe=no_device)
    root = ET.fromstring(report.to_junit_xml())
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "2", "1")
    failures = [tc for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert sorted(str(tc.get("name")) for tc in failures) == ["other::static", "scale::static"]
    from doit.exceptions import TaskFailed

    result = run_smoke_action(str(tmp_path), "hw1", ["hw1/m/q"], str(tmp_path / "build"))
    assert isinstance(result, TaskFailed)
    assert "FAIL hw1/m/q scale::static" in str(result)
    assert (tmp_path / "build" / "smoke-hw1.xml").is_file()


@pytest.mark.nvcc
@pytest.mark.slow
@needs_nvcc
def test_sample_target_static_checks(tmp_path: Path) -> None:
    """Build one sample NVIDIA target with the real build step; every static check passes."""
    import metrale_orch.steps.target as compile_mod

    layouts = [
        lay
        for lay in _sample_layouts()
        if lay.hardware.source_ext == "cu" and lay.hardware.vendor in ("nvidia", "cuda")
    ]
    layout = next((lay for lay in layouts if scan_cases(REPO, lay)), None)
    assert layout is not None, "the sample tree has an NVIDIA target with smoke cases"
    env = dict(os.environ, METRALE_ORCH_BUILD_DIR=str(tmp_path / "build"))
    env["METRALE_ORCH_LOCAL_CACHE"] = str(tmp_path / "cache")
    config = load_config(REPO, environ=env)
    result = compile_mod.build_target(REPO, layout, config=config, cache=None, environ=env)
    assert not getattr(result, "failed", False)
    report = run_smoke(
        REPO, layout.target.hardware, build_dir=config.build_dir,
        layouts=[(layout.target, layout)], probe=no_device,
    )  # fmt: skip
    statics = [r for r in report.results if r.case == "static"]
    assert statics and all(r.outcome == "passed" for r in statics), report.failures()
    assert all(r.outcome == "skipped" for r in report.results if r.case != "static")


@pytest.mark.nvcc
@needs_nvcc
def test_doit_smoke_ends_with_its_summary_line(tmp_path: Path) -> None:
    """`doit smoke:<hw>` as a user runs it: a real build, then one line saying what passed
    (static checks) and what did not run (numbers without a device), and why."""
    make_tree(tmp_path)
    (tmp_path / "dodo.py").write_text(DODO)
    env = project_env(tmp_path)
    run = doit(tmp_path, ["smoke:hw1"], env)
    assert run.returncode == 0, run.text
    last = run.out.rstrip("\n").splitlines()[-1]
    status = probe_device()
    if status.device is None:
        short = status.reason.split(":", 1)[0]
        assert last == f"smoke hw1: 2 static passed, 1 numeric skipped ({short}), 0 failed"
    else:
        assert last.startswith("smoke hw1: 2 static passed, 1 numeric passed (on ")


@pytest.mark.gpu
@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("kind", ["ptx", "cubin"])
def test_gpu_synthetic_kernel(tmp_path: Path, kind: str) -> None:
    dev = _device_or_skip()
    arch = _device_arch(dev)
    make_tree(tmp_path, arch)
    compile_target(tmp_path, arch, kind)
    report = run_smoke(tmp_path, "hw1")
    results = by_name(report)
    assert report.device.device is not None
    case = results["scale::scale_128"]
    assert case.outcome == "passed", case.message
    assert case.max_abs_error is not None and case.max_abs_error < 2e-2
    assert report.ok, [r.message for r in report.failures()]


@pytest.mark.gpu
@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.slow
def test_gpu_sample_tree(tmp_path: Path) -> None:
    """Build every NVIDIA target of the sample tree for this device and run all its cases."""
    dev = _device_or_skip()
    import metrale_orch.steps.target as compile_mod
    from metrale_orch.tree import hardware, resolve_all

    repo = REPO
    shutil.copytree(repo / "kernels", tmp_path / "kernels")
    if (repo / "toolchains").is_dir():
        shutil.copytree(repo / "toolchains", tmp_path / "toolchains")
    arch = _device_arch(dev)
    nvidia = []
    for hw_dir in sorted((tmp_path / "kernels").iterdir()):
        manifest = hw_dir / "HARDWARE.toml"
        if not manifest.is_file():
            continue
        info = hardware(tmp_path / "kernels", hw_dir.name)
        if info.source_ext != "cu" or info.vendor not in ("nvidia", "cuda"):
            continue
        nvidia.append(hw_dir.name)
        if info.arch and arch_runnable(info.arch, "ptx", dev.cc) is None:
            continue
        text = manifest.read_text()
        manifest.write_text(text.replace(f'arch = "{info.arch}"', f'arch = "{arch}"'))
    env = dict(os.environ, METRALE_ORCH_LOCAL_CACHE=str(tmp_path / "cache"))
    config = load_config(tmp_path, environ=env)
    ran = 0
    for target, layout in resolve_all(tmp_path):
        if target.hardware not in nvidia or not hasattr(layout, "modules"):
            continue
        compile_mod.build_target(tmp_path, target, config=config, cache=None, environ=env)
    for hw in nvidia:
        report = run_smoke(tmp_path, hw, build_dir=config.build_dir)
        smoke.write_junit(report, config.build_dir / f"smoke-{hw}.xml")
        assert report.ok, "\n".join(f"{r.target} {r.module}::{r.case}: {r.message}"
                                    for r in report.failures())  # fmt: skip
        ran += report.count("passed")
    assert ran > 0


# ------------------------------------------------------------------ on a CUDA device


def _device_or_skip() -> DeviceInfo:
    status = probe_device()
    if status.device is None:
        pytest.skip(f"numeric smoke needs a CUDA device: {status.reason or status.error}")
    return status.device


def _device_arch(dev: DeviceInfo) -> str:
    major, minor = dev.cc
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")
