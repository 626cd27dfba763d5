"""The register/spill report (metrale_orch.resources) and ``metrale-orch resources``.

Real tools: two sample targets (hopper/qwen3-8b/bf16 for sm_90a, with the spilling
``spill_probe``; b200/qwen3-8b/bf16 for sm_100a) are built once with nvcc, and the report
runs the real ptxas on them. The parser and the diff are also checked on values.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from metrale_orch.paths import STATE_DIR
from metrale_orch.resources import (
    CACHE_NAME,
    KernelResources,
    ReportParseError,
    ResourceReport,
    TargetResources,
    collect_resources,
    diff_reports,
    parse_ptxas_report,
)
from metrale_orch.resources.report import ModuleResources
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support import REPO
from tests.support.build import make_cache, make_config, output_kinds_tree
from tests.support.resources import _cli

HOPPER = "hopper/qwen3-8b/bf16"
B200 = "b200/qwen3-8b/bf16"


#: Real `ptxas -v -arch=sm_90a` output (CUDA 13.0) for two PTX files, concatenated.
PTXAS_SM90 = """\
ptxas info    : 24 bytes gmem
ptxas info    : Compiling entry function 'rope_neox_bf16' for 'sm_90a'
ptxas info    : Function properties for rope_neox_bf16
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 26 registers, used 0 barriers, 32 bytes cumulative stack size
ptxas info    : Compile time = 20.113 ms
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spill_probe' for 'sm_90a'
ptxas info    : Function properties for spill_probe
    120 bytes stack frame, 236 bytes spill stores, 196 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 120 bytes cumulative stack size
ptxas info    : Compiling entry function 'rmsnorm_bf16' for 'sm_90a'
ptxas info    : Function properties for rmsnorm_bf16
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 1 barriers, 128 bytes smem
"""


def _kernel(name: str, arch: str = "sm_90a", *, regs: int = 16, spill: int = 0) -> KernelResources:
    return KernelResources(
        kernel=name,
        arch=arch,
        registers=regs,
        shared_bytes=0,
        stack_bytes=spill,
        spill_store_bytes=spill,
        spill_load_bytes=spill,
    )


def _report(kernels: Mapping[str, tuple[KernelResources, ...]]) -> ResourceReport:
    targets = tuple(
        TargetResources(
            target=target,
            status="ok",
            arch=ks[0].arch,
            modules=tuple(
                ModuleResources(module=k.kernel, artefact=f"{target}/{k.kernel}.ptx", kernels=(k,))
                for k in ks
            ),
        )
        for target, ks in sorted(kernels.items())
    )
    return ResourceReport(build_dir="build", targets=targets)


# --- parsing and diff: values ---------------------------------------------------------------


def test_parse_real_ptxas_output() -> None:
    kernels = {k.kernel: k for k in parse_ptxas_report(PTXAS_SM90)}
    assert list(kernels) == ["rmsnorm_bf16", "rope_neox_bf16", "spill_probe"]  # sorted
    assert kernels["rmsnorm_bf16"] == KernelResources(
        kernel="rmsnorm_bf16",
        arch="sm_90a",
        registers=16,
        shared_bytes=128,
        stack_bytes=0,
        spill_store_bytes=0,
        spill_load_bytes=0,
    )
    assert kernels["rope_neox_bf16"].stack_bytes == 32 and not kernels["rope_neox_bf16"].spills
    probe = kernels["spill_probe"]
    assert (probe.registers, probe.spill_store_bytes, probe.spill_load_bytes) == (32, 236, 196)
    assert probe.spills
    assert KernelResources.from_dict(probe.to_dict()) == probe


def test_parse_refuses_an_entry_without_its_register_line() -> None:
    used = "ptxas info    : Used 16 registers, used 1 barriers, 128 bytes smem\n"
    text = PTXAS_SM90.replace(used, "")
    with pytest.raises(ReportParseError, match=r"build/x\.ptx: .*'rmsnorm_bf16' has no register"):
        parse_ptxas_report(text, where="build/x.ptx")
    assert parse_ptxas_report("ptxas info    : 0 bytes gmem\n") == ()


def test_diff_reports_a_register_increase_and_a_new_spill() -> None:
    old = _report({HOPPER: (_kernel("rmsnorm_bf16", regs=64), _kernel("gone"), _kernel("same"))})
    new = _report(
        {
            HOPPER: (
                _kernel("rmsnorm_bf16", regs=96, spill=16),
                _kernel("same"),
                _kernel("fresh", regs=8),
            )
        }
    )
    changes = {c.kernel: c for c in diff_reports(old, new)}
    assert [c.kernel for c in diff_reports(old, new)] == ["fresh", "gone", "rmsnorm_bf16"]
    assert changes["rmsnorm_bf16"].kind == "changed" and changes["rmsnorm_bf16"].new_spill
    assert changes["gone"].kind == "removed" and not changes["gone"].new_spill
    assert changes["fresh"].kind == "added" and not changes["fresh"].new_spill
    # A register increase alone is a change, not a new spill; the reverse diff has none.
    regs_only = _report({HOPPER: (_kernel("rmsnorm_bf16", regs=96),)})
    (change,) = diff_reports(_report({HOPPER: (_kernel("rmsnorm_bf16", regs=64),)}), regs_only)
    assert (change.old and change.old.registers, change.new and change.new.registers) == (64, 96)
    assert not change.new_spill
    assert not any(c.new_spill for c in diff_reports(new, old))
    assert diff_reports(new, new) == ()
    assert ResourceReport.from_dict(json.loads(json.dumps(new.to_dict()))) == new


# --- the real thing: two sample targets built with nvcc ------------------------------------


@pytest.fixture(scope="module")
def sample_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``<tmp>/build`` holding hopper/qwen3-8b/bf16 and b200/qwen3-8b/bf16, really built."""
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc and ptxas are not installed")
    tmp = tmp_path_factory.mktemp("resources")
    build = tmp / "build"
    config = make_config(REPO, tmp / "cache", build_dir=str(build))
    cache = make_cache(config)
    for name in (HOPPER, B200):
        result = build_target(
            REPO, Target.parse(name), config=config, cache=cache, environ=dict(os.environ)
        )
        assert not result.failed, result.failure_text()
    yield build


def _recording_ptxas(tmp: Path) -> tuple[dict[str, str], Path]:
    """An environment whose nvcc is the real one, in a directory whose ptxas records each
    call in the returned log before running the real ptxas."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    log = tmp / "ptxas-calls.log"
    real_nvcc, real_ptxas = shutil.which("nvcc"), shutil.which("ptxas")
    assert real_nvcc and real_ptxas
    (bin_dir / "nvcc").symlink_to(real_nvcc)
    wrapper = bin_dir / "ptxas"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{real_ptxas}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    environ = dict(os.environ)
    environ["PATH"] = f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}"
    return environ, log


@pytest.mark.nvcc
def test_report_on_two_archs_shows_the_spill_and_caches(sample_build: Path, tmp_path: Path) -> None:
    environ, log = _recording_ptxas(tmp_path)
    (sample_build / STATE_DIR / CACHE_NAME).unlink(missing_ok=True)
    first = collect_resources(REPO, sample_build, "*/qwen3-8b/bf16", environ)
    targets = {t.target: t for t in first.report.targets}
    assert sorted(targets) == [B200, "b300/qwen3-8b/bf16", "gb10/qwen3-8b/bf16", HOPPER]
    assert targets["gb10/qwen3-8b/bf16"].status == "not-built"
    hopper, b200 = targets[HOPPER], targets[B200]
    assert (hopper.status, hopper.arch, b200.status, b200.arch) == ("ok", "sm_90a", "ok", "sm_100a")
    for target in (hopper, b200):
        assert {k.arch for k in target.kernels} == {target.arch}
        assert all(k.registers > 0 for k in target.kernels)
        assert {"rmsnorm_bf16", "gemv_bf16", "paged_attn_decode_bf16"} <= {
            k.kernel for k in target.kernels
        }
    probe = {k.kernel: k for k in hopper.kernels}["spill_probe"]
    assert probe.registers <= 32
    assert probe.spill_store_bytes and probe.spill_store_bytes > 0
    assert probe.spill_load_bytes and probe.spill_load_bytes > 0
    assert [k.kernel for k in hopper.kernels if k.spills] == ["spill_probe"]
    assert not any(k.spills for k in b200.kernels)  # the probe is Hopper's leaf alone
    ptx_modules = len(hopper.modules) + len(b200.modules)
    assert first.ptxas_runs == ptx_modules == len(log.read_text().splitlines())
    assert "-arch=sm_100a" in log.read_text() and "-arch=sm_90a" in log.read_text()

    # Second run: every answer from the cache, ptxas never called, the same report.
    log.unlink()
    second = collect_resources(REPO, sample_build, "*/qwen3-8b/bf16", environ)
    assert (second.ptxas_runs, second.cache_hits) == (0, ptx_modules)
    assert not log.exists()
    assert second.report == first.report
    # A changed artefact is asked again, alone.
    ptx = sample_build / HOPPER / "rmsnorm.ptx"
    original = ptx.read_bytes()
    try:
        ptx.write_bytes(original + b"\n// touched\n")
        third = collect_resources(REPO, sample_build, HOPPER, environ)
        assert third.ptxas_runs == 1 and len(log.read_text().splitlines()) == 1
    finally:
        ptx.write_bytes(original)


@pytest.mark.nvcc
def test_cli_report_text_and_json(sample_build: Path) -> None:
    environ = dict(os.environ)
    argv = ["--root", str(REPO), "--set", f"build_dir={sample_build}", "resources"]
    code, out, err = _cli(argv, environ)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == [
        "target",
        "kernel",
        "arch",
        "regs",
        "smem",
        "B",
        "stack",
        "B",
        "spill",
        "st",
        "B",
        "spill",
        "ld",
        "B",
    ]
    (probe,) = [ln for ln in lines if " spill_probe " in ln]
    assert probe.split()[:3] == [HOPPER, "spill_probe", "sm_90a"]
    assert int(probe.split()[6]) > 0
    assert f"{B200}  " in out and "sm_100a" in out
    # Vendors without a report and targets never built: one line each, no failure.
    assert "strix-hip/llama3-8b/bf16: no register report for toolchain 'hip'" in out
    assert "metal/llama3-8b/bf16: no register report for toolchain 'metal'" in out
    assert "gb10/qwen3-8b/bf16: not built (no " in out
    assert lines[-1].startswith("resources: ") and "1 spilling" in lines[-1]
    # A run over every target keeps only the cache entries it used: one per PTX artefact.
    cached = json.loads((sample_build / STATE_DIR / CACHE_NAME).read_text())["entries"]
    assert len(cached) == len(list((sample_build / "hopper").rglob("*.ptx"))) + len(
        list((sample_build / "b200").rglob("*.ptx"))
    )

    code, out, err = _cli([*argv, "build:hopper/*", "--json"], environ)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert out == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    report = ResourceReport.from_dict(doc)
    assert [t.target for t in report.targets] == sorted(t.target for t in report.targets)
    assert all(t.target.startswith("hopper/") for t in report.targets)
    artefacts = [m.artefact for t in report.targets for m in t.modules]
    assert f"{HOPPER}/spill_probe.ptx" in artefacts
    assert all(a.startswith("hopper/") for a in artefacts)
    assert report.build_dir == sample_build.as_posix()  # outside the root: as given
    assert str(REPO) not in out.replace(str(sample_build), "")


@pytest.mark.nvcc
def test_cli_diff_two_build_dirs(sample_build: Path, tmp_path: Path) -> None:
    """OTHER: the same build with spill_probe's register cap taken out of its PTX."""
    environ = dict(os.environ)
    other = tmp_path / "other"
    shutil.copytree(sample_build, other, ignore=shutil.ignore_patterns(STATE_DIR, "stage"))
    ptx = other / HOPPER / "spill_probe.ptx"
    text = ptx.read_text()
    assert ".maxnreg 32" in text
    ptx.write_text(text.replace(".maxnreg 32", ""))

    base = ["--root", str(REPO), "--set", f"build_dir={sample_build}", "resources", HOPPER]
    code, out, err = _cli([*base, "--diff", str(other)], environ)
    assert err == ""
    (line, summary) = out.splitlines()
    assert line.startswith(f"{HOPPER} spill_probe sm_90a: regs ")
    assert " → 32, " in line and "spill stores 0 → " in line and line.endswith("[new spill]")
    assert "1 kernel changed" in summary and "1 new spill" in summary
    assert code == 1

    # The other way round: registers go up (32 → more), the spill goes away: exit 0.
    reverse = ["--root", str(REPO), "--set", f"build_dir={other}", "resources", HOPPER]
    code, out, _ = _cli([*reverse, "--diff", str(sample_build), "--json"], environ)
    doc = json.loads(out)
    (change,) = doc["changes"]
    assert change["old"]["registers"] == 32 < change["new"]["registers"]
    assert change["new"]["spill_store_bytes"] == 0 and doc["new_spills"] == 0
    assert code == 0

    code, out, _ = _cli([*base, "--diff", str(sample_build)], environ)
    assert code == 0 and out.startswith("diff ") and "no change" in out


# --- mistakes: one line, never a traceback -------------------------------------------------


@pytest.mark.nvcc
def test_no_matching_target_and_broken_manifest(sample_build: Path, tmp_path: Path) -> None:
    environ = dict(os.environ)
    code, out, err = _cli(
        ["--root", str(REPO), "--set", f"build_dir={sample_build}", "resources", "nope/*"],
        environ,
    )
    assert (code, out) == (2, "")
    assert (
        err == "error: no target matches 'nope/*'; `metrale-orch layout` lists every "
        "target (quote a wildcard: 'hopper/*')\n"
    )

    code, out, err = _cli(
        ["--root", str(REPO), "resources", "--diff", str(tmp_path / "nowhere")], environ
    )
    assert (code, out) == (2, "")
    assert err.startswith("error: --diff ") and err.endswith(
        ": not a directory; name the build directory to compare with\n"
    )

    broken = tmp_path / "broken"
    (broken / HOPPER).mkdir(parents=True)
    (broken / HOPPER / "manifest.json").write_text("{not json")
    code, out, err = _cli(
        ["--root", str(REPO), "--set", f"build_dir={broken}", "resources", "hopper/qwen3-8b/*"],
        environ,
    )
    assert code == 1 and err == ""
    (bad,) = [ln for ln in out.splitlines() if ln.startswith(f"{HOPPER}:")]
    assert f"{broken}/{HOPPER}/manifest.json: cannot be read" in bad
    assert "hopper/qwen3-8b/fp8: not built" in out


# --- cubin and fatbin artefacts: the cubin's own records -----------------------------------


@pytest.mark.nvcc
def test_cubin_and_fatbin_artefacts(tmp_path: Path) -> None:
    if shutil.which("nvcc") is None or shutil.which("ptxas") is None:
        pytest.skip("nvcc and ptxas are not installed")
    root = output_kinds_tree(tmp_path / "tree")
    config = make_config(root, tmp_path / "cache", cache_mode="off")
    environ = dict(os.environ)
    for hw in ("h", "hc", "hf"):
        target = Target(hardware=hw, model="m", quant="q")
        result = build_target(root, target, config=config, cache=None, environ=environ)
        assert not result.failed, result.failure_text()
    got = collect_resources(root, root / "build", None, environ)
    assert got.report.build_dir == "build"
    by_target = {t.target: t for t in got.report.targets}
    assert [t.status for t in got.report.targets] == ["ok", "ok", "ok"], got.report
    (from_ptxas,) = by_target["h/m/q"].kernels
    (from_cubin,) = by_target["hc/m/q"].kernels
    assert from_ptxas.spill_store_bytes == 0 and from_cubin.spill_store_bytes is None
    assert (from_cubin.kernel, from_cubin.arch) == ("tiny", "sm_90a")
    # The cubin records what ptxas printed for the same kernel.
    assert (from_cubin.registers, from_cubin.shared_bytes, from_cubin.stack_bytes) == (
        from_ptxas.registers,
        from_ptxas.shared_bytes,
        from_ptxas.stack_bytes,
    )
    assert [m.artefact for m in by_target["hc/m/q"].modules] == ["hc/m/q/tiny.cubin"]
    (from_fatbin,) = by_target["hf/m/q"].kernels
    assert (from_fatbin.kernel, from_fatbin.arch) == ("tiny", "sm_100a")
    assert got.ptxas_runs == 1  # only the PTX target asks ptxas
    code, out, _ = _cli(["--root", str(root), "resources", "hc/*"], environ)
    assert code == 0 and out.splitlines()[1].split()[-2:] == ["?", "?"]
